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
from attn_course.checks.flash_io import check_forward_hbm_bytes  # noqa: E402
from attn_course.checks.flash_kernel import TAU, check_rescale_kernel, lazy_rescaling  # noqa: E402
from attn_course.checks.flash_tiles import check_window_tile_counts  # noqa: E402
from attn_course.checks.flash_window_kernel import check_window_kernel  # noqa: E402

from support.planted import planted_06, planted_07  # noqa: E402
from support.planted.planted_07 import ALWAYS, NO_BRANCH, UPDATE, kernel_with  # noqa: E402

# Chapter 06 keeps the exercises in PyTorch; chapter 07 has the tile count and the two Triton kernels.
PLANTED = {student: {**planted_06.PLANTED.get(student, {}), **planted_07.PLANTED.get(student, {})}
           for student in {*planted_06.PLANTED, *planted_07.PLANTED}}
SOLUTIONS = {**planted_06.SOLUTIONS, **planted_07.SOLUTIONS}

CHECKS = {
    "merge_partial_attention": check_merge_partial_attention,
    "window_tile_counts": check_window_tile_counts,
    "streaming_attention": check_streaming_attention,
    "small_attention_kernel": check_rescale_kernel,
    "attention_backward": check_attention_backward,
    "forward_hbm_bytes": check_forward_hbm_bytes,
    "fixed_window_kernel": check_window_kernel,
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


def streaming(q, kv_tiles, *, old_sum=True):
    """The exercise's loop, its output kept normalised after every tile; ``old_sum=False`` is the classmate's."""
    scale = 1 / math.sqrt(q.shape[1])
    row_max, row_sum = torch.full((q.shape[0],), float("-inf")), torch.zeros(q.shape[0])
    out = torch.zeros(q.shape[0], kv_tiles[0][1].shape[1])
    for k, v in kv_tiles:
        scores = q @ k.T * scale
        new_max = torch.maximum(row_max, scores.amax(dim=1))
        correction, weights = torch.exp(row_max - new_max), torch.exp(scores - new_max[:, None])
        new_sum = row_sum * correction + weights.sum(dim=1)
        kept = (row_sum if old_sum else 1) * correction
        out = (out * kept[:, None] + weights @ v) / new_sum[:, None]
        row_max, row_sum = new_max, new_sum
    return out, row_max + torch.log(row_sum)


def test_streaming_solution_passes_and_joining_the_tiles_is_refused():
    def all_at_once(q, kv_tiles):
        k, v = (torch.stack(list(parts)).flatten(0, 1) for parts in zip(*kv_tiles))
        return torch.softmax(q @ k.T / math.sqrt(q.shape[1]), -1) @ v, None

    assert check_streaming_attention(streaming)
    with pytest.raises(CheckFailed, match="calls torch.stack, which this exercise forbids"):
        check_streaming_attention(all_at_once)


def test_the_classmates_loop_is_right_on_one_tile_and_named_on_more():
    generator = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(5, 8, generator=generator), torch.randn(12, 8, generator=generator), torch.randn(12, 3)
    out, _ = streaming(q, [(k, v)], old_sum=False)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    with pytest.raises(CheckFailed, match="multiply it back by l_old"):
        check_streaming_attention(lambda q, kv_tiles: streaming(q, kv_tiles, old_sum=False))


KERNELS = ("small_attention_kernel", "fixed_window_kernel")   # a kernel, not a function: refused by the launcher


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


def capped_backward(q, k, v, out, lse, grad_out, grad_lse, cap, *, chain="right", weights_from="capped"):
    """Exercise 3's answer, with the derivative of the cap (``chain``) or the weights' scores made wrong."""
    scale = 1 / math.sqrt(q.shape[-1])
    x = q @ k.T * scale
    s = cap * torch.tanh(x / cap)
    p = torch.exp((s if weights_from == "capped" else x) - lse[:, None])
    grad_s = p * (grad_out @ v.T - (grad_out * out).sum(-1, keepdim=True) + grad_lse[:, None])
    grad_x = grad_s * {"right": 1 - (s / cap) ** 2, "unsquared": 1 - s / cap}[chain]
    return scale * grad_x @ k, scale * grad_x.T @ q, p.T @ grad_out


@pytest.mark.parametrize(("options", "message"), [
    (dict(chain="unsquared"), "the derivative of tanh is 1 - tanh²"),
    (dict(weights_from="raw"), "the scores before the cap"),
])
def test_backward_through_the_cap_mistakes_are_named(options, message):
    assert check_attention_backward(capped_backward)
    with pytest.raises(CheckFailed, match=message):
        check_attention_backward(lambda *args: capped_backward(*args, **options))


@pytest.mark.parametrize(("update", "message"), [
    (UPDATE.replace("tl.exp2", "tl.exp"), "use tl.exp2, not tl.exp"),
    (NO_BRANCH, "its loop has no `if`"),
])
def test_rescale_kernel_mistakes_beyond_the_planted_ones_are_named(update, message):
    with pytest.raises(CheckFailed, match=message):
        check_rescale_kernel(define(kernel_with(update), "small_attention_kernel"))


def test_the_branch_rule_reads_a_graded_kernel_from_the_cells_handed_in():
    """Under `make grade` the check holds the grader's stand-in for the kernel (``fn`` None): the rule that
    the rescaling sits under an ``if`` reads the definition from the submitted cells instead."""
    from types import SimpleNamespace

    from attn_course.checks.flash_kernel import _branches_in_loop
    from attn_course_grading.proxies import RemoteKernel

    for update, branches in ((UPDATE, True), (NO_BRANCH, False)):
        cells = ["import triton", kernel_with(update)]
        kernel = RemoteKernel(SimpleNamespace(cells=cells), "small_attention_kernel")
        assert kernel.fn is None and "def small_attention_kernel" in kernel.source
        assert _branches_in_loop(kernel) is branches
