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
    check_pair_making_turns,
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


# --- the pair that makes a given number of turns ----------------------------------------------------

def turns_solution(d, base, context, turns):
    return d / 2 * math.log(context / (2 * math.pi * turns)) / math.log(base)


def test_pair_making_turns_solutions_pass():
    assert check_pair_making_turns(turns_solution)
    # Another logarithm, on both sides, and a tensor answer are fine.
    assert check_pair_making_turns(
        lambda d, base, context, turns: d / 2 * math.log10(context / (2 * math.pi * turns)) / math.log10(base))
    assert check_pair_making_turns(lambda *args: torch.tensor(turns_solution(*args), dtype=torch.float64))


def test_pair_making_turns_reference_agrees_with_hugging_face_yarn():
    # HF's YaRN keeps the pairs up to floor(i at beta_fast turns) and interpolates those from
    # ceil(i at beta_slow turns): the counts of kept and fully slowed pairs give both ends.
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for d, base, context in [(128, 500_000.0, 8192), (64, 10_000.0, 2048)]:
        config = LlamaConfig(hidden_size=2 * d, num_attention_heads=2, head_dim=d, max_position_embeddings=8 * context,
                             rope_parameters={"rope_type": "yarn", "rope_theta": base, "factor": 8.0,
                                              "original_max_position_embeddings": context})
        theirs, _ = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
        ratio = RotaryEmbedding(d, base=base).frequencies() / theirs.double()       # [d/2]: 1 kept, 8 slowed
        kept, slowed = int((ratio < 1 + 1e-5).sum()), int((ratio > 8 - 1e-4).sum())
        assert kept == math.floor(turns_solution(d, base, context, 32.0)) + 1
        assert slowed == d // 2 - math.ceil(turns_solution(d, base, context, 1.0))


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda d, base, context, turns: d / 2 * math.log(context / turns) / math.log(base), "a full turn is 2π"),
        (lambda d, base, context, turns: d * math.log(context / (2 * math.pi * turns)) / math.log(base),
         "as if i counted features"),
        (lambda d, base, context, turns: d / 2 * math.log(context * turns / (2 * math.pi)) / math.log(base),
         "a wavelength of turns · context"),
        (lambda *args: math.floor(turns_solution(*args)), "a whole number"),
        (lambda *args: round(turns_solution(*args)), "a whole number"),
        (lambda d, base, context, turns: d / 2 * math.log10(context / (2 * math.pi * turns)) / math.log(base),
         "mixed a base-10 logarithm"),
        (lambda d, base, context, turns: d / 2 * math.log(context / (2 * math.pi * turns)) / math.log10(base),
         "mixed a base-10 logarithm"),
        (lambda *args: -turns_solution(*args), "the wrong sign"),
        (lambda d, *rest: d / 2 - 1 - turns_solution(d, *rest), "counted from the slowest pair"),
        (lambda *args: turns_solution(*args) + 0.5,
         "d=128, base=500000, context=8192, turns=32: expected 18.0811, got 18.5811"),
        (lambda *args: "pair 18", "should return a number"),
    ],
)
def test_pair_making_turns_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_pair_making_turns, fn)


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
    "q2_pair_making_turns": check_pair_making_turns,
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
