"""attn_course.checks.forbidden: each kind of forbidden call is seen under each of its spellings,
and nothing an honest answer does is mistaken for one."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course.checks.diagnosis import CHECKS_RULE, CheckFailed, call_answer
from attn_course.checks.forbidden import AUTOGRAD, RANDOM, Forbidden, watch_calls
from attn_course.core.attention import self_attention

SOFTMAX = Forbidden("torch.softmax", "write softmax from exp and sum")
SDPA = Forbidden("torch.nn.functional.scaled_dot_product_attention", "write the formula")
COURSE = Forbidden("attn_course.core.attention.self_attention", "this exercise is self_attention")
NO_AUTOGRAD = Forbidden(AUTOGRAD, "derive the gradient by hand")
NO_RANDOM = Forbidden(RANDOM, "the answer must follow from the input alone")


def by_hand(x):
    exp = (x - x.max(dim=-1, keepdim=True).values).exp()
    return exp / exp.sum(dim=-1, keepdim=True)


def called(rules, fn, *args):
    with watch_calls(rules) as seen:
        fn(*args)
    return [name for name, _ in seen]


@pytest.mark.parametrize("spelling", [
    lambda x: torch.softmax(x, -1), lambda x: F.softmax(x, dim=-1), lambda x: x.softmax(-1),
    lambda x: torch.special.softmax(x, -1), lambda x: F.log_softmax(x, -1).exp(),
])
def test_every_spelling_of_softmax_is_seen(spelling):
    x = torch.randn(3, 4)
    assert len(called([SOFTMAX], spelling, x)) == 1
    with pytest.raises(CheckFailed, match="your answer calls .*softmax, which this exercise forbids: write softmax"):
        call_answer("check", spelling, x, forbidden=[SOFTMAX])


def test_an_honest_answer_passes_and_its_value_comes_back():
    x = torch.randn(3, 4)
    rules = [SOFTMAX, SDPA, COURSE, NO_AUTOGRAD, NO_RANDOM]
    assert torch.allclose(call_answer("check", by_hand, x, forbidden=rules), torch.softmax(x, -1))


def test_sdpa_and_the_courses_own_function_are_seen_however_they_were_imported():
    q = torch.randn(1, 3, 4)
    assert called([SDPA], lambda: F.scaled_dot_product_attention(q, q, q)) == ["F.scaled_dot_product_attention"]
    alias = self_attention                               # bound under another name, as a notebook would
    assert called([COURSE], lambda: alias(q, q, q)) == ["self_attention"]


def test_autograd_in_any_form_is_seen():
    x = torch.randn(3)

    def backward():
        y = x.clone().requires_grad_()
        (y * 2).sum().backward()

    def grad():
        y = x.clone().requires_grad_()
        torch.autograd.grad((y ** 2).sum(), y)

    def func_grad():
        torch.func.grad(lambda t: (t ** 2).sum())(x)

    def enable_grad():
        with torch.no_grad(), torch.enable_grad():
            pass

    for fn in (backward, grad, func_grad, enable_grad):
        assert called([NO_AUTOGRAD], fn), fn.__name__
    with torch.no_grad():
        assert called([NO_AUTOGRAD], lambda: by_hand(x)) == []


def test_random_numbers_from_any_generator_are_seen():
    generator = torch.Generator().manual_seed(0)
    for fn in (lambda: torch.randn(3), lambda: torch.rand(2, generator=generator), lambda: torch.empty(2).uniform_(),
               lambda: random.random(), lambda: np.random.rand(2),
               lambda: F.dropout(torch.ones(4), 0.5)):
        assert called([NO_RANDOM], fn)
    assert called([NO_RANDOM], lambda: torch.zeros(3) + torch.arange(3)) == []


def test_the_guard_leaves_the_profile_hook_as_it_was_when_the_answer_crashes():
    before = torch.randn(2)
    with pytest.raises(CheckFailed, match="Your function raised ZeroDivisionError"):
        call_answer("check", lambda: 1 / 0, forbidden=[COURSE, NO_RANDOM])
    import sys
    assert sys.getprofile() is None
    assert torch.softmax(before, 0).shape == (2,)      # no mode is left behind


@pytest.mark.parametrize("bad, error, words", [
    (lambda: Forbidden("", "why"), TypeError, "name"),
    (lambda: Forbidden("torch.softmax", None), TypeError, "why"),
    (lambda: watch_calls("torch.softmax").__enter__(), TypeError, "rules"),
    (lambda: watch_calls([Forbidden("attn_course.no_such_function", "x")]).__enter__(), ValueError, "no_such_function"),
])
def test_bad_rules_are_named(bad, error, words):
    with pytest.raises(error, match=words):
        bad()


class WatchedElsewhere:
    """Stands for the grader's proxy: the answer runs elsewhere, which reports what it saw."""

    def __init__(self, fn):
        self.fn, self.rules = fn, None

    def __call__(self, *args):
        raise AssertionError("a watched call must go through call_watching")

    def call_watching(self, rules, *args):
        self.rules = rules
        with watch_calls(rules) as seen:
            value = self.fn(*args)
        return value, seen


def test_an_answer_that_runs_elsewhere_is_watched_there_under_the_same_rules():
    x = torch.randn(2, 3)
    remote = WatchedElsewhere(lambda t: t.softmax(-1))
    with pytest.raises(CheckFailed, match="calls Tensor.softmax, which this exercise forbids"):
        call_answer("check", remote, x, forbidden=[SOFTMAX])
    assert remote.rules == [SOFTMAX, CHECKS_RULE]        # every answer keeps the checks' code rule too
    assert torch.allclose(call_answer("check", WatchedElsewhere(by_hand), x, forbidden=[SOFTMAX]), by_hand(x))


def test_an_answer_that_is_or_calls_the_checks_own_reference_is_refused():
    from attn_course.checks import rope

    frequencies = torch.arange(1.0, 9.0)
    for answer, words in [(rope._llama3_variant, "your answer is attn_course.checks.rope._llama3_variant"),
                          (lambda *a: rope._llama3_variant(*a), "calls attn_course.checks.rope._llama3_variant")]:
        with pytest.raises(CheckFailed, match=re.escape(words)):
            call_answer("check", answer, frequencies, 8.0, 8192, 1.0, 4.0)
    # a function of the package outside the checks is no reference: watched by the exercise's own rules only
    assert torch.equal(call_answer("check", torch.flip, frequencies, [0]), frequencies.flip(0))


def test_a_course_functions_unchecked_core_is_seen_when_called_directly():
    from attn_course.core import attention

    q = torch.randn(1, 3, 4)
    assert called([COURSE], lambda: attention._self_attention(q, q, q, None, 0.5)) == ["_self_attention"]


def test_a_forbidden_context_manager_is_seen_when_entered_and_no_other_is_mistaken_for_it():
    # A @contextlib.contextmanager function's own code is a helper that every such function shares, PyTorch's
    # dispatch under the watch's function mode included: the rule watches the generator it wraps.
    from attn_course.circuits import ablate_head
    from attn_course.models.attention_only import AttentionOnlyTransformer

    rule = Forbidden("attn_course.circuits.ablation.ablate_head", "write the ablation yourself")
    x = torch.randn(2, 3, 4)
    assert called([rule], lambda: torch.einsum("bij,bkj->bik", x, x)) == []     # a Python-level torch function
    model = AttentionOnlyTransformer(10, n_heads=2, d_model=8, max_len=6)

    def ablated():
        with ablate_head(model, 0, 1):
            model(torch.zeros(1, 4, dtype=torch.long))

    assert called([rule], ablated)[:1] == ["ablate_head"]
