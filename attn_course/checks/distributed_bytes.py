"""Check chapter 10's exercise 2: the bytes one rank sends, by method, with grouped-query heads, against
formulas written out here (it calls no course code)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from attn_course.checks.diagnosis import NOTHING_YET, CheckFailed, call_answer, name_mistake, number, watched
from attn_course.checks.forbidden import forbid

__all__ = ["BITS", "check_bytes_sent_per_rank", "number_of_bytes"]

BITS = "You counted bits; there are 8 bits in a byte: use the bytes per element."


def number_of_bytes(value: object, what: str) -> float:
    """``value`` as a plain number (a one-element tensor too), or the failure saying what came instead."""
    if value is Ellipsis or value is None:
        raise CheckFailed(NOTHING_YET)
    return number(value, f"{what} should be a number of bytes, got {{type}}.")


RING_AT_H_HEADS = ("You counted the ring's K and V blocks at H heads. With grouped-query attention they have "
                   "H_kv heads, and only those travel: a block is B · H_kv · (N/P) · d numbers (for Llama 3, "
                   "8 heads, not 32).")
RING_P_HOPS = ("You counted P transfers of K and V for the ring; a rank passes its block on P - 1 times "
               "(after P - 1 steps every rank has seen every block, and its own one it had already).")
RING_K_ONLY = "You counted only the keys; the ring passes the values along with them: two tensors per step."
RING_FULL_N = "You counted blocks of the whole sequence; each rank holds, and passes on, a block of N / P tokens."
GRAD_SUMS_AT_INPUT_SIZE = ("You counted the dK and dV sums at the input's element size. They are accumulated, and "
                           "sent, in float32 when the inputs are half precision: max(element size, 4) bytes per "
                           "number. In bfloat16 that doubles them: with Llama 3's heads over P = 2 ranks, enough to "
                           "turn the ring's training traffic from less than Ulysses' into more.")
GRAD_SUMS_P_MINUS_1 = ("You counted P - 1 hops of the dK and dV sums; they make P: after P - 1 hops each sum has met "
                       "every rank's queries, and one more brings it home to the rank that owns those keys.")
GRAD_SUMS_MISSING = ("Your ring backward passes K and V again but not the dK and dV sums that travel with them "
                     "(P hops each).")
BACKWARD_FORGOTTEN = ("With backward=True your function returns the forward pass's bytes: the backward pass sends "
                      "more, on top of them.")
ULYSSES_ALL_AT_H = ("You counted all four of Ulysses' all-to-alls at H heads. q and the output have H heads, but k "
                    "and v only H_kv: each rank gets H_kv / P of them.")
ULYSSES_ALL_AT_H_KV = ("You counted all four of Ulysses' all-to-alls at H_kv heads; only k and v have H_kv heads, "
                       "q and the output have H.")
ULYSSES_NO_OUTPUT = ("You counted three all-to-alls for Ulysses; there are four: q, k and v go to the head layout, and "
                     "the output comes back to the sequence layout.")
ULYSSES_KEEPS_NOTHING = ("In an all-to-all a rank keeps its own part: it sends (P - 1) / P of each tensor, not all "
                         "of it.")
ULYSSES_GRADS_IN_FLOAT32 = ("You counted Ulysses' backward in float32. Its all-to-alls move the gradients of q, "
                            "k, v and the output once each, in the input's dtype; only the ring's dK and dV sums, "
                            "added to at every step, are kept in float32 on their way.")
BYTES_WRONG = ("Your count for {method} with {case} is not right: expected {expected:,} bytes, got {got:,}. "
               "A query shard is B · H · (N / P) · d numbers, a K or V shard B · H_kv · (N / P) · d.")

BYTES_CASES = [   # the first tells every mistake below from every other (and from a few pairs of them)
    dict(batch=1, heads=20, kv_heads=4, n=2048, head_dim=64, world_size=4, bytes_per_element=2),
    dict(batch=2, heads=8, kv_heads=8, n=1024, head_dim=32, world_size=2, bytes_per_element=4),
    dict(batch=1, heads=12, kv_heads=6, n=96, head_dim=16, world_size=3, bytes_per_element=8),
]


def _ring_bytes(p: int, kv: int, e: int, backward: bool, *, hops: int | None = None, sums: int | None = None,
                sum_bytes: int | None = None, tensors: int = 2) -> int:
    """The ring's bytes per rank for K/V shards of ``kv`` numbers: ``tensors`` blocks passed ``hops`` times
    forward and again backward, and the dK/dV sums ``sums`` times at ``sum_bytes`` each."""
    hops = p - 1 if hops is None else hops
    forward = tensors * hops * kv * e
    if not backward:
        return forward
    sums = p if sums is None else sums
    sum_bytes = max(e, 4) if sum_bytes is None else sum_bytes
    return 2 * forward + tensors * sums * kv * sum_bytes


def _ulysses_bytes(p: int, q: int, kv: int, e: int, backward: bool, *, kept: bool = False,
                   grad_bytes: int | None = None, without_output: bool = False) -> float:
    """Ulysses' bytes per rank for shards of ``q`` (query, output) and ``kv`` (key, value) numbers: the
    ``(P - 1) / P`` of each that belongs elsewhere (all with ``kept``), forward and backward at ``grad_bytes``."""
    numbers = (q if without_output else 2 * q) + 2 * kv
    share = numbers if kept else numbers * (p - 1) / p
    grad_bytes = e if grad_bytes is None else grad_bytes
    return share * e + (share * grad_bytes if backward else 0)


#: What chapter 10's prediction may not call: the course's byte counts and traffic meters.
BYTES_RULES = forbid(
    "the exercise is to work out the bytes yourself",
    "attn_course.distributed.ulysses.ulysses_bytes",
    "attn_course.distributed.schedule.formula_bytes",
    "attn_course.measure.distributed.taps.count_traffic",
    "attn_course.measure.distributed.taps.Traffic",
)


def check_bytes_sent_per_rank(bytes_fn: Callable[..., float]) -> bool:
    """Check ``fn(method, batch, heads, kv_heads, n, head_dim, world_size, bytes_per_element, backward) ->
    bytes``: what one rank sends for one attention layer, ``"ring"`` or ``"ulysses"``, forward only or
    (``backward=True``) forward and backward together.

    With ``S_q = B·H·(N/P)·d``, ``S_kv = B·H_kv·(N/P)·d`` and ``e`` bytes per element: ring forward
    ``2(P - 1)·S_kv·e``, ring forward + backward ``4(P - 1)·S_kv·e + 2P·S_kv·max(e, 4)`` (the dK, dV sums
    kept in float32); Ulysses forward ``(P - 1)/P·(2 S_q + 2 S_kv)·e``, twice that forward + backward.

    Raises:
        CheckFailed: naming the ring's K/V at ``H`` heads, ``P`` hops instead of ``P - 1``, keys without
            values, whole-sequence blocks, dK/dV at the input's element size, ``P - 1`` dK/dV hops, the
            dK/dV sums left out, the backward forgotten, Ulysses' tensors all at ``H`` or all at ``H_kv``
            heads, three all-to-alls instead of four, a rank that keeps nothing, Ulysses' gradients in
            float32, bits for bytes, or the first case that differs.

    Example (a wrong answer, and what it is told):
        >>> def sent(method, batch, heads, kv_heads, n, head_dim, world_size, bytes_per_element, backward):
        ...     kv_shard = batch * kv_heads * (n // world_size) * head_dim * bytes_per_element
        ...     return 2 * world_size * kv_shard
        >>> check_bytes_sent_per_rank(sent)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You counted P transfers of K and V for the ring; a rank passes its ...
    """
    bytes_fn = watched("check_bytes_sent_per_rank", bytes_fn, BYTES_RULES)
    for case in BYTES_CASES:
        p, e = case["world_size"], case["bytes_per_element"]
        per_rank = case["batch"] * (case["n"] // p) * case["head_dim"]
        q, kv = per_rank * case["heads"], per_rank * case["kv_heads"]           # S_q and S_kv, in numbers
        for method in ("ring", "ulysses"):
            for backward in (False, True):
                described = ", ".join(f"{k}={v}" for k, v in (*case.items(), ("backward", backward)))
                answer = call_answer("check_bytes_sent_per_rank", bytes_fn, method, *case.values(), backward,
                                     described=f"method={method!r}, {described}")
                got = number_of_bytes(answer, "Your function's answer")
                if method == "ring":
                    expected = _ring_bytes(p, kv, e, backward)
                    mistakes = [(RING_AT_H_HEADS, _ring_bytes(p, q, e, backward)),
                                (RING_P_HOPS, _ring_bytes(p, kv, e, backward, hops=p)),
                                (RING_K_ONLY, _ring_bytes(p, kv, e, backward, tensors=1)),
                                (RING_FULL_N, p * _ring_bytes(p, kv, e, backward))]
                    if backward:
                        mistakes += [(GRAD_SUMS_AT_INPUT_SIZE, _ring_bytes(p, kv, e, True, sum_bytes=e)),
                                     (GRAD_SUMS_P_MINUS_1, _ring_bytes(p, kv, e, True, sums=p - 1)),
                                     (GRAD_SUMS_MISSING, _ring_bytes(p, kv, e, True, sums=0)),
                                     (BACKWARD_FORGOTTEN, _ring_bytes(p, kv, e, False))]
                else:
                    expected = _ulysses_bytes(p, q, kv, e, backward)
                    mistakes = [(ULYSSES_ALL_AT_H, _ulysses_bytes(p, q, q, e, backward)),
                                (ULYSSES_ALL_AT_H_KV, _ulysses_bytes(p, kv, kv, e, backward)),
                                (ULYSSES_NO_OUTPUT, _ulysses_bytes(p, q, kv, e, backward, without_output=True)),
                                (ULYSSES_KEEPS_NOTHING, _ulysses_bytes(p, q, kv, e, backward, kept=True))]
                    if backward:
                        mistakes += [(ULYSSES_GRADS_IN_FLOAT32, _ulysses_bytes(p, q, kv, e, True,
                                                                               grad_bytes=max(e, 4))),
                                     (BACKWARD_FORGOTTEN, _ulysses_bytes(p, q, kv, e, False))]
                if math.isclose(got, expected, rel_tol=1e-9):
                    continue
                name_mistake(got, [*mistakes, (BITS, 8 * expected)], functools.partial(math.isclose, rel_tol=1e-9))
                raise CheckFailed(BYTES_WRONG.format(method=method, case=described, expected=round(expected),
                                                     got=int(got) if float(got).is_integer() else got))
    return True
