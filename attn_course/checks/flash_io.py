"""Check chapter 06's IO-model exercise: the fused forward kernel's HBM bytes, against
:func:`attn_course.flash.io_model.fused_forward_bytes` and the counts the usual mistakes give."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from attn_course.checks.diagnosis import CheckFailed, call_answer, name_mistake, watched
from attn_course.checks.forbidden import Forbidden
from attn_course.flash.io_model import fused_forward_bytes

__all__ = ["check_forward_hbm_bytes"]

#: What the IO-model exercise may not call: the course's own count.
HBM_BYTES_RULES = (
    Forbidden("attn_course.flash.io_model.fused_forward_bytes", "the exercise is to count the bytes yourself"),
    Forbidden("attn_course.flash.io_model.fused_forward_step", "the exercise is to count the bytes yourself"),
    Forbidden("attn_course.flash.io_model.training_traffic", "the exercise is to count the bytes yourself"),
)


def _count(n, d, block_q, size, *, tiles=None, kv_once=False, output=True, lse_bytes=4):
    tiles = math.ceil(n / block_q) if tiles is None else tiles
    kv_reads = 1 if kv_once else tiles
    return (n * d + 2 * n * d * kv_reads + (n * d if output else 0)) * size + lse_bytes * n


def _mistakes(n, d, block_q, size):
    tiles = math.ceil(n / block_q)
    return [
        (f"You counted K and V once, as if L2 served every re-read: here nothing is cached, and each of the "
         f"ceil(N / block_q) = {tiles} programs reads all of K and V.", _count(n, d, block_q, size, kv_once=True)),
        (f"You counted numbers, not bytes: each number of Q, K, V and O takes bytes_per_number = {size} bytes "
         "(the log-sum-exp is float32, 4 bytes).", _count(n, d, block_q, 1, lse_bytes=1)),
        (f"You counted numbers, not bytes, for Q, K, V and O: each takes bytes_per_number = {size} bytes.",
         _count(n, d, block_q, 1)),
        ("You forgot to write the output: each program stores its block_q × d tile of O.",
         _count(n, d, block_q, size, output=False)),
        ("You forgot the log-sum-exp: each program also writes one float32 (4 bytes) per query row, for the "
         "backward pass.", _count(n, d, block_q, size, lse_bytes=0)),
        (f"The log-sum-exp is float32, 4 bytes a row, whatever bytes_per_number ({size}) is.",
         _count(n, d, block_q, size, lse_bytes=size)),
        (f"You forgot the last, partial query tile: with N = {n} and block_q = {block_q} there are "
         f"ceil(N / block_q) = {tiles} programs, each reading all of K and V.",
         _count(n, d, block_q, size, tiles=n // block_q)),
    ]


def check_forward_hbm_bytes(count: Callable) -> bool:
    """Check ``count(n, d, block_q, bytes_per_number) -> bytes`` for the fused forward kernel, one head: one
    program per tile of ``block_q`` queries reads its Q tile and all of K and V from HBM (nothing cached),
    and writes its O tile and one float32 log-sum-exp per row.

    Raises:
        CheckFailed: naming the mistake (K and V counted once, numbers for bytes, O or the LSE not
            written, the LSE at ``bytes_per_number``, the partial tile forgotten), else the case.

    Example (a wrong answer, and what it is told):
        >>> check_forward_hbm_bytes(lambda n, d, block_q, bytes_per_number: 4 * n * d * bytes_per_number + 4 * n)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You counted K and V once, as if L2 served every re-read: ...
    """
    count = watched("check_forward_hbm_bytes", count, HBM_BYTES_RULES)
    for n, d, block_q, size in ((4096, 64, 128, 2), (1000, 128, 64, 2), (300, 64, 128, 4), (64, 32, 64, 2)):
        expected = fused_forward_bytes(n, d, block_q, bytes_per_number=size)
        got = call_answer("check_forward_hbm_bytes", count, n, d, block_q, size)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise CheckFailed(f"Your function should return a number of bytes, but it returned {type(got).__name__}.")
        if math.isclose(got, expected, rel_tol=1e-9):
            continue
        name_mistake(got, _mistakes(n, d, block_q, size), functools.partial(math.isclose, rel_tol=1e-9))
        raise CheckFailed(f"For N = {n}, d = {d}, block_q = {block_q}, bytes_per_number = {size} you said {got:,.0f} "
                          f"bytes, but the kernel moves {expected:,} bytes. List what each program reads and writes, "
                          "then multiply by the number of programs.")
    return True
