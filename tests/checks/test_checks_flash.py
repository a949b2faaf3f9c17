"""Chapter 06's exercise checks: each planted mistake gets its hint, and the solutions pass."""

from __future__ import annotations

import linecache
import math

import pytest
import torch

from attn_course.flash import use_interpreter_without_gpu

use_interpreter_without_gpu()     # as chapter 06's first cell: before Triton is imported, the cells' kernels too

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from attn_course.checks import CheckFailed  # noqa: E402
from attn_course.checks.flash import (  # noqa: E402
    check_attention_backward,
    check_causal_tile_counts,
    check_merge_partial_attention,
    check_rescale_kernel,
    check_streaming_attention,
)

from support.planted.planted_06 import PLANTED, SOLUTIONS, kernel_with  # noqa: E402

CHECKS = {
    "merge_partial_attention": check_merge_partial_attention,
    "causal_tile_counts": check_causal_tile_counts,
    "fixed_streaming_attention": check_streaming_attention,
    "small_attention_kernel": check_rescale_kernel,
    "attention_backward": check_attention_backward,
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


@pytest.mark.parametrize("name", [name for name in CHECKS if name != "small_attention_kernel"])
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
    (lambda n, bq, bk: 3, "should return two ints"),
    (lambda n, bq, bk: ("a", "b"), "should return two ints"),
])
def test_tile_counts_of_the_wrong_kind_are_named(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        check_causal_tile_counts(wrong)


def test_tile_counts_swapped_are_named():
    from support.planted.planted_06 import SOLUTIONS as solutions
    right = define(solutions["causal_tile_counts"], "causal_tile_counts")
    with pytest.raises(CheckFailed, match=r"returned \(masked, computed\)"):
        check_causal_tile_counts(lambda *args: right(*args)[::-1])
