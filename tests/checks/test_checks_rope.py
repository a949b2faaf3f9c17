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
    check_rotate_pairs,
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


# --- the rotation itself -------------------------------------------------------------------------

def rotate_pairs(x, positions, base, interleaved, *, sign=1.0, exponent=-2.0, pairing=None, layout=None):
    """The exercise's answer written from the formula (no RotaryEmbedding), with knobs for each mistake."""
    d = x.shape[-1]
    pairing = interleaved if pairing is None else pairing
    layout = pairing if layout is None else layout
    theta = base ** (exponent * torch.arange(d // 2, dtype=torch.float64) / d)       # [d/2]
    angles = sign * positions.double()[:, None] * theta                               # [N, d/2]
    angles = angles.repeat_interleave(2, -1) if layout else torch.cat((angles, angles), -1)
    if pairing:
        partner = torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
    else:
        partner = torch.cat((-x[..., d // 2:], x[..., : d // 2]), -1)
    return (x.double() * angles.cos() + partner.double() * angles.sin()).to(x.dtype)


def test_rotate_pairs_solution_passes():
    assert check_rotate_pairs(rotate_pairs)


@pytest.mark.parametrize("interleaved", [False, True])
def test_the_rotation_the_check_accepts_is_hugging_faces(interleaved):
    """The check's reference is RotaryEmbedding; an answer it accepts must also be what Hugging Face computes:
    Llama's rotate_half for the half split, GPT-J's rotate_every_two for the interleaved pairs."""
    gen = torch.Generator().manual_seed(3)
    x, positions, d = torch.randn(2, 3, 7, 16, generator=gen), torch.arange(40, 47), 16
    if interleaved:
        gptj = pytest.importorskip("transformers.models.gptj.modeling_gptj")
        table = gptj.create_sinusoidal_positions(64, d)                                # [P, d]: sin | cos
        sin, cos = torch.split(table[positions], d // 2, dim=-1)                        # [N, d/2] each
        expected = gptj.apply_rotary_pos_emb(x.transpose(1, 2), sin[None], cos[None]).transpose(1, 2)
    else:
        llama = pytest.importorskip("transformers.models.llama.modeling_llama")
        from transformers import LlamaConfig

        config = LlamaConfig(hidden_size=32, num_attention_heads=2, head_dim=d, rope_theta=10_000.0)
        cos, sin = llama.LlamaRotaryEmbedding(config)(x, positions[None])              # [1, N, d] each
        expected, _ = llama.apply_rotary_pos_emb(x, x, cos, sin)
    assert check_rotate_pairs(rotate_pairs)
    torch.testing.assert_close(rotate_pairs(x, positions, 10_000.0, interleaved), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "mistake, fragment",
    [
        (dict(pairing="other"), "paired the features the other way"),
        (dict(sign=-1.0), "the rotation goes the other way"),
        (dict(exponent=-1.0), "the exponent counts features"),
        (dict(exponent=2.0), "Your frequencies grow"),
        (dict(sign=0.0), "nothing is turned"),
        (dict(layout="other"), "each feature gets the angle of another pair"),
    ],
)
def test_rotation_mistakes_get_their_hint(mistake, fragment):
    def answer(x, positions, base, interleaved):
        knobs = {key: (not interleaved if value == "other" else value) for key, value in mistake.items()}
        return rotate_pairs(x, positions, base, interleaved, **knobs)

    assert fragment in hint(check_rotate_pairs, answer)


def test_calling_rotary_embedding_is_refused():
    def answer(x, positions, base, interleaved):
        return RotaryEmbedding(x.shape[-1], base=base, interleaved=interleaved)(x, positions)

    assert "RotaryEmbedding" in hint(check_rotate_pairs, answer)


# --- the planted mistakes of tests/support/planted/planted_05.py, checked without otter ------------------------

CHECK_OF_QUESTION = {
    "q1_left_padded_positions": check_left_padded_positions,
    "q2_pair_making_turns": check_pair_making_turns,
    "q3_find_the_bug_cache_position": check_last_token_scores,
    "q4_rotate_pairs": check_rotate_pairs,
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
