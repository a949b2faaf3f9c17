"""Chapter 05's exercise checks: the solutions pass, and each known mistake gets its own hint."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.checks import CheckFailed
from attn_course.checks.rope import (
    check_last_token_scores,
    check_left_padded_positions,
    check_llama3_frequencies,
    check_pairs_slower_than_context,
    check_rope_attention,
)
from attn_course.core.attention import self_attention
from attn_course.positions.rope import RotaryEmbedding

from support.planted import planted_05


def hint(check, fn) -> str:
    with pytest.raises(CheckFailed) as failed:
        check(fn)
    return str(failed.value)


# --- positions of a left-padded batch ------------------------------------------------------------

def positions_solution(mask):
    return (mask.cumsum(-1) - 1).clamp(min=0)


def test_left_padded_positions_solutions_pass():
    assert check_left_padded_positions(positions_solution)
    assert check_left_padded_positions(lambda mask: mask.cumsum(-1) - 1)                 # padding at -1: fine
    assert check_left_padded_positions(lambda mask: (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1))   # as HF


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda mask: torch.arange(mask.shape[-1]).expand_as(mask), "positions 0 .. N-1 of the padded batch"),
        (lambda mask: mask.cumsum(-1), "start at 1"),
        (lambda mask: mask.flip(-1).cumsum(-1).flip(-1) - 1, "count down"),
        (lambda mask: (mask.cumsum(-1) - 1).float(), "convert with .long()"),
        (lambda mask: mask.cumsum(-1)[:, 1:], "should have shape"),
        (lambda mask: (mask.cumsum(-1) - 1) * 2, "the real token in slot"),
        (lambda mask: ..., "returns nothing yet"),
        (lambda mask: mask.foo(), "Your function raised AttributeError"),
    ],
)
def test_left_padded_positions_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_left_padded_positions, fn)


# --- pairs slower than the context ---------------------------------------------------------------

def slower_solution(d, base, context):
    return sum(2 * math.pi * base ** (2 * i / d) > context for i in range(d // 2))


def test_pairs_slower_than_context_solutions_pass():
    assert check_pairs_slower_than_context(slower_solution)
    # Solved for i instead of counted: the first slow pair is ceil(d/2 · log(context / 2π) / log base).
    assert check_pairs_slower_than_context(
        lambda d, base, context: d // 2 - math.floor(d / 2 * math.log(context / (2 * math.pi)) / math.log(base)) - 1)
    assert check_pairs_slower_than_context(lambda d, base, context: torch.tensor(slower_solution(d, base, context)))


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda d, base, context: sum(base ** (2 * i / d) > context for i in range(d // 2)), "a full turn is 2π"),
        (lambda d, base, context: sum(2 * math.pi * base ** (i / d) > context for i in range(d // 2)),
         "as if i counted features"),
        (lambda d, base, context: d // 2 - slower_solution(d, base, context), "the fast ones"),
        (lambda d, base, context: 2 * slower_solution(d, base, context), "counted features, not pairs"),
        (lambda d, base, context: slower_solution(d, base, context) + 1,
         "d=128, base=10000, context=4096: expected 18, got 19"),
        (lambda d, base, context: "many", "should return a number"),
    ],
)
def test_pairs_slower_than_context_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_pairs_slower_than_context, fn)


# --- the newest token's scores -------------------------------------------------------------------

def last_scores(q_last, keys, base, *, query_position=None, rotate_keys=True, scale=1.0):
    rope = RotaryEmbedding(keys.shape[-1], base=base)
    position = keys.shape[0] - 1 if query_position is None else query_position
    q = rope(q_last[None], torch.tensor([position]))                    # [1, d]
    k = rope(keys) if rotate_keys else keys                             # [N, d]
    return (q @ k.T)[0] * scale


def test_last_token_scores_solution_passes():
    assert check_last_token_scores(last_scores)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda q, keys, base: last_scores(q, keys, base, query_position=0), "rotated at position 0"),
        (lambda q, keys, base: last_scores(q, keys, base, query_position=keys.shape[0]), "one past the newest"),
        (lambda q, keys, base: last_scores(q, keys, base, rotate_keys=False), "keys are not rotated"),
        (lambda q, keys, base: last_scores(q, keys, base, scale=keys.shape[-1] ** -0.5), "divided by √d"),
        (lambda q, keys, base: last_scores(q, keys, base)[:-1], "should have shape [6]"),
        (lambda q, keys, base: last_scores(q, keys, base) + 1, "The first entry that differs"),
    ],
)
def test_last_token_scores_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_last_token_scores, fn)


# --- attention with RoPE -------------------------------------------------------------------------

def rope_attention(q, k, v, base, *, rotate=(True, True, False)):
    rope = RotaryEmbedding(q.shape[-1], base=base)
    q, k = (rope(q) if rotate[0] else q), (rope(k) if rotate[1] else k)
    return self_attention(q, k, rope(v) if rotate[2] else v)[0]


def test_rope_attention_solution_passes():
    assert check_rope_attention(rope_attention)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda q, k, v, base: rope_attention(q, k, v, base, rotate=(True, True, True)), "You rotate the values too"),
        (lambda q, k, v, base: rope_attention(q, k, v, base, rotate=(False, False, False)), "Nothing is rotated"),
        (lambda q, k, v, base: rope_attention(q, k, v, base, rotate=(True, False, False)), "Only the queries"),
        (lambda q, k, v, base: rope_attention(q, k, v, base, rotate=(False, True, False)), "Only the keys"),
        (lambda q, k, v, base: rope_attention(q, k, v + 0 * q, base), "the values are narrower"),
        (lambda q, k, v, base: rope_attention(q, k, v, 10_000.0), "The first entry that differs"),
    ],
)
def test_rope_attention_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_rope_attention, fn)


def test_rotating_values_crashes_on_narrow_values_with_the_values_hint():
    def buggy(q, k, v, base):
        rope = RotaryEmbedding(q.shape[-1], base=base)
        return self_attention(rope(q), rope(k), rope(v))[0]

    # Passes d_v = d only if the values are left alone; the first case names the mistake.
    assert "You rotate the values too" in hint(check_rope_attention, buggy)


# --- the planted mistakes of tests/support/planted/planted_05.py, checked without otter ------------------------

CHECK_OF_QUESTION = {
    "q1_left_padded_positions": check_left_padded_positions,
    "q2_predict_slow_pairs": check_pairs_slower_than_context,
    "q3_find_the_bug_cache_position": check_last_token_scores,
    "q4_find_the_bug_values": check_rope_attention,
    "q5_llama3_frequencies": check_llama3_frequencies,
}


@pytest.mark.parametrize(
    "student, name",
    [(student, name) for student, functions in planted_05.PLANTED.items() for name in functions],
)
def test_each_planted_mistake_gets_its_hint_from_the_check(student, name):
    code, question, phrase = planted_05.PLANTED[student][name]
    namespace = {"torch": torch, "math": math, "RotaryEmbedding": RotaryEmbedding, "self_attention": self_attention}
    exec(code, namespace)
    assert phrase in hint(CHECK_OF_QUESTION[question], namespace[name])


# --- LLaMA 3.1's frequency scaling -------------------------------------------------------------

def llama3_solution(theta, factor, context, low, high, *, blend="turns", reversed_mix=False, divide=True):
    wavelength = 2 * math.pi / theta
    slowed = theta / factor if divide else theta * factor
    if blend == "turns":
        a = (context / wavelength - low) / (high - low)
    else:
        a = (context / low - wavelength) / (context / low - context / high)
    mixed = a * slowed + (1 - a) * theta if reversed_mix else (1 - a) * slowed + a * theta
    out = torch.where(wavelength > context / low, slowed, theta)
    return torch.where((wavelength >= context / high) & (wavelength <= context / low), mixed, out)


def test_llama3_frequencies_solution_passes():
    assert check_llama3_frequencies(llama3_solution)
    assert check_llama3_frequencies(lambda theta, *rest: llama3_solution(theta, *rest).float())   # float32 is fine


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda *args: llama3_solution(*args, blend="wavelength"), "linear in the wavelength"),
        (lambda *args: llama3_solution(*args, reversed_mix=True), "the wrong way round"),
        (lambda theta, factor, *rest: theta / factor, "Position Interpolation"),
        (lambda theta, factor, context, low, high: torch.where(2 * math.pi / theta < context / high,
                                                               theta / factor, theta), "slowed the fast pairs"),
        (lambda *args: llama3_solution(*args, divide=False), "You multiplied by the factor"),
        (lambda *args: llama3_solution(*args) * 1.01, "The first entry that differs"),
        (lambda *args: llama3_solution(*args)[:-1], "should have shape [64]"),
    ],
)
def test_llama3_frequencies_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_llama3_frequencies, fn)
