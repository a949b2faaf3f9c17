"""Chapters 06's and 07's exercise checks: each planted mistake gets its hint, and the solutions pass."""

from __future__ import annotations

import linecache
import math

import pytest
import torch

from attn_course.flash import use_interpreter_without_gpu

use_interpreter_without_gpu()     # as chapter 07's first cell: before Triton is imported, the cells' kernels too

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from attn_course.checks import CheckFailed  # noqa: E402
from attn_course.checks.flash import (  # noqa: E402
    check_attention_backward,
    check_merge_partial_attention,
    check_streaming_attention,
)
from attn_course.checks.flash_causal_kernel import check_causal_kernel  # noqa: E402
from attn_course.checks.flash_io import check_forward_hbm_bytes  # noqa: E402
from attn_course.checks.flash_kernel import TAU, check_rescale_kernel, lazy_rescaling  # noqa: E402
from attn_course.checks.flash_tiles import check_window_tile_counts  # noqa: E402

from support.planted import planted_06, planted_07  # noqa: E402
from support.planted.planted_07 import ALWAYS, UPDATE, kernel_with  # noqa: E402

# Chapter 06 keeps the exercises in PyTorch; chapter 07 has the tile count and the two Triton kernels.
PLANTED = {student: {**planted_06.PLANTED.get(student, {}), **planted_07.PLANTED.get(student, {})}
           for student in {*planted_06.PLANTED, *planted_07.PLANTED}}
SOLUTIONS = {**planted_06.SOLUTIONS, **planted_07.SOLUTIONS}

CHECKS = {
    "merge_partial_attention": check_merge_partial_attention,
    "window_tile_counts": check_window_tile_counts,
    "fixed_streaming_attention": check_streaming_attention,
    "small_attention_kernel": check_rescale_kernel,
    "attention_backward": check_attention_backward,
    "forward_hbm_bytes": check_forward_hbm_bytes,
    "fixed_causal_kernel": check_causal_kernel,
}


def define(source: str, name: str):
    """Execute a cell's code as the notebook would, with the notebook's imports, and return ``name``."""
    namespace = {"math": math, "torch": torch, "triton": triton, "tl": tl}
    path = f"<cell {name} {abs(hash(source))}>"

    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    exec(compile(source, path, "exec"), namespace)
    return namespace[name]


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_solution_passes(name):
    assert CHECKS[name](define(SOLUTIONS[name], name)) is True


@pytest.mark.parametrize(("student", "name"), [(s, n) for s, functions in PLANTED.items() for n in functions])
def test_planted_mistake_gets_its_hint(student, name):
    code, _, hint = PLANTED[student][name]
    with pytest.raises(CheckFailed) as failure:
        CHECKS[name](define(code, name))
    assert hint in str(failure.value)


def test_streaming_solution_passes_and_a_softmax_over_all_keys_is_refused():
    def fixed(q, k, v, block):                  # the statement's loop, its accumulator rescaled
        row_max = torch.full((q.shape[0],), float("-inf"))
        row_sum, acc = torch.zeros(q.shape[0]), torch.zeros(q.shape[0], v.shape[1])
        for start in range(0, k.shape[0], block):
            scores = q @ k[start:start + block].T / math.sqrt(q.shape[1])
            new_max = torch.maximum(row_max, scores.amax(dim=1))
            correction, weights = torch.exp(row_max - new_max), torch.exp(scores - new_max[:, None])
            row_sum = row_sum * correction + weights.sum(dim=1)
            acc = acc * correction[:, None] + weights @ v[start:start + block]
            row_max = new_max
        return acc / row_sum[:, None]

    def not_streaming(q, k, v, block):
        return torch.softmax(q @ k.T / math.sqrt(q.shape[1]), -1) @ v

    assert check_streaming_attention(fixed)
    with pytest.raises(CheckFailed, match="calls torch.softmax, which this exercise forbids"):
        check_streaming_attention(not_streaming)


KERNELS = ("small_attention_kernel", "fixed_causal_kernel")   # a kernel, not a function: refused by the launcher


@pytest.mark.parametrize("name", [name for name in CHECKS if name not in KERNELS])
def test_unanswered_exercise_says_so_without_crashing(name):
    def unanswered(*args):
        ...
    with pytest.raises(CheckFailed, match="returns nothing yet"):
        CHECKS[name](unanswered)


def test_kernel_with_its_update_left_as_dots_is_told_what_is_missing():
    with pytest.raises(CheckFailed, match="a step of the update is missing"):
        check_rescale_kernel(define(kernel_with("        ..."), "small_attention_kernel"))


def test_a_crashing_answer_names_the_exception():
    def crashes(out_a, lse_a, out_b, lse_b):
        raise IndexError("oops")
    with pytest.raises(CheckFailed, match="raised IndexError: oops"):
        check_merge_partial_attention(crashes)


@pytest.mark.parametrize("wrong, message", [
    (lambda n, bq, bk, w: 3, "should return two ints"),
    (lambda n, bq, bk, w: ("a", "b"), "should return two ints"),
])
def test_tile_counts_of_the_wrong_kind_are_named(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        check_window_tile_counts(wrong)


def test_tile_counts_swapped_are_named():
    right = define(SOLUTIONS["window_tile_counts"], "window_tile_counts")
    with pytest.raises(CheckFailed, match=r"returned \(masked, computed\)"):
        check_window_tile_counts(lambda *args: right(*args)[::-1])


def _window_counts_by_entries(n, block_q, block_k, window):
    """The counts from every (query, key) pair, in plain Python: an independent reference."""
    computed = masked = 0
    for q_start in range(0, n, block_q):
        for k_start in range(0, n, block_k):
            seen = [q - window < k <= q for q in range(q_start, min(q_start + block_q, n))
                    for k in range(k_start, min(k_start + block_k, n))]
            computed += any(seen)
            masked += any(seen) and not all(seen)
    return computed, masked


@pytest.mark.parametrize("n, block_q, block_k, window", [(300, 64, 64, 100), (200, 32, 128, 50), (64, 64, 64, 64),
                                                         (100, 16, 48, 1)])
def test_window_solution_agrees_with_every_entry(n, block_q, block_k, window):
    right = define(SOLUTIONS["window_tile_counts"], "window_tile_counts")
    assert right(n, block_q, block_k, window) == _window_counts_by_entries(n, block_q, block_k, window)


def test_window_counts_of_a_hand_worked_case():
    # n = 8, tiles of 4, window 2: query tile 0 sees key tile 0 (masked); query tile 1 sees key 3 from
    # query 4 (tile (1, 0), masked) and keys 4-7 (tile (1, 1), masked): 3 computed, 3 masked.
    right = define(SOLUTIONS["window_tile_counts"], "window_tile_counts")
    assert right(8, 4, 4, 2) == (3, 3)
    assert right(8, 4, 4, 8) == (3, 2)            # causal: the tile below the diagonal is full


def test_lazy_rescaling_matches_attention_and_keeps_the_maximum_within_tau():
    generator = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(8, 16, generator=generator), torch.randn(64, 16, generator=generator), torch.randn(64, 4)
    k[16:] *= 1.5                      # larger scores later, but never by more than TAU
    out, row_max = lazy_rescaling(q, k, v, 16, TAU)
    scores = (q.double() @ k.double().T / 4) * 1.4426950408889634           # base 2
    assert torch.allclose(out, torch.softmax(scores / 1.4426950408889634, -1) @ v.double())
    true_max = scores.amax(-1)
    assert (row_max <= true_max).all() and (true_max - row_max <= TAU).all()
    assert (row_max < true_max).any()                                      # some rescalings were skipped


def test_the_chapters_always_rescaling_update_is_named():
    assert ALWAYS != UPDATE
    with pytest.raises(CheckFailed, match="raised m_i whenever"):
        check_rescale_kernel(define(kernel_with(ALWAYS), "small_attention_kernel"))


@pytest.mark.parametrize("n, d, block_q, size", [(4096, 64, 128, 2), (300, 64, 128, 4)])
def test_forward_bytes_solution_agrees_with_a_count_program_by_program(n, d, block_q, size):
    count = define(SOLUTIONS["forward_hbm_bytes"], "forward_hbm_bytes")
    by_program = 0
    for start in range(0, n, block_q):
        rows = min(block_q, n - start)
        by_program += rows * d * size + 2 * n * d * size + rows * d * size + 4 * rows   # Q, K and V, O, LSE
    assert count(n, d, block_q, size) == by_program
