"""Check chapter 05's exercises against :class:`~attn_course.positions.rope.RotaryEmbedding`: positions for a
left-padded batch, the pair that makes a given number of turns within a context, the newest token's scores
during decoding, RoPE's rotation itself, and LLaMA 3.1's frequency scaling."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import (
    CheckFailed,
    call_answer,
    call_student,
    check_shape,
    diagnose,
    name_mistake,
    number,
    watched,
)
from attn_course.checks.forbidden import Forbidden
from attn_course.positions.rope import RotaryEmbedding
from attn_course.positions.rope_scaling import Llama3Scaling

__all__ = ["check_left_padded_positions", "check_pair_making_turns", "check_last_token_scores",
           "check_rotate_pairs", "check_llama3_frequencies"]

SHARED_POSITIONS = (
    "You gave every row the positions 0 .. N-1 of the padded batch, so a sequence with p padding tokens "
    "starts at position p. Its real tokens must be at 0, 1, 2, ... as if it were alone: count only the "
    "real tokens (a cumulative sum of the mask does that)."
)
STARTS_AT_ONE = ("Your positions start at 1: the first real token of each sequence is at position 0. "
                 "A cumulative sum of the mask counts the token itself; subtract 1.")
COUNTS_DOWN = ("Your positions count down towards the end of the row. Positions grow from the first real "
               "token (0) to the last (length - 1).")
POSITIONS_NOT_INTEGERS = ("Your positions are {dtype}: RotaryEmbedding takes integer positions (torch.long); "
                          "convert with .long().")


def _left_padded_masks() -> list[torch.Tensor]:
    """``[B, N]`` 0/1 masks (1 = real token), each row padded on the left."""
    cases = [([3, 6, 1, 5], 6), ([2, 2], 4), ([7], 7), ([4, 9, 6], 9)]
    return [torch.stack([(torch.arange(n) >= n - length).long() for length in lengths]) for lengths, n in cases]


def _positions_variants(mask: torch.Tensor) -> tuple[torch.Tensor, list[tuple[str, torch.Tensor]]]:
    n = mask.shape[-1]
    count = mask.cumsum(-1)                                                      # [B, N]
    expected = (count - 1).clamp(min=0)
    arange = torch.arange(n).expand_as(mask)
    mistakes = [
        (SHARED_POSITIONS, arange),
        (STARTS_AT_ONE, count),
        (COUNTS_DOWN, mask.flip(-1).cumsum(-1).flip(-1) - 1),
    ]
    return expected, mistakes


#: What chapter 05's first exercise may not call: the Llama model's own positions from a padding mask.
LEFT_PADDED_RULES = (
    Forbidden("attn_course.models.llama.block.positions_from_attention_mask",
              "the exercise is to work out the positions from the mask yourself"),
)


def check_left_padded_positions(positions_fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(attention_mask [B, N]) -> positions [B, N]`` for a left-padded batch (1 a real token, 0
    padding): each sequence's real tokens at ``0, 1, ..., length - 1``, the padding slots anything. Tried on
    four batches, one with a single sequence and no padding.

    Raises:
        CheckFailed: naming shared positions ``0 .. N-1``, positions that start at 1 or count down,
            non-integer positions, or the first real token that differs.

    Example (a wrong answer, and what it is told):
        >>> check_left_padded_positions(lambda mask: torch.arange(mask.shape[-1]).expand(mask.shape))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You gave every row the positions 0 .. N-1 of the padded batch, so ...
    """
    positions_fn = watched("check_left_padded_positions", positions_fn, LEFT_PADDED_RULES)
    for mask in _left_padded_masks():
        got = call_student("check_left_padded_positions", positions_fn, mask)
        expected, mistakes = _positions_variants(mask)
        if type(got) is torch.Tensor and (got.is_floating_point() or got.is_complex() or got.dtype == torch.bool):
            raise CheckFailed(POSITIONS_NOT_INTEGERS.format(dtype=got.dtype))
        check_shape(got, expected, "Your positions")
        real = mask.bool()
        if torch.equal(got[real], expected[real]):
            continue
        name_mistake(got[real], [(message, wrong[real]) for message, wrong in mistakes], torch.equal)
        b, t = (int(i) for i in (~(got == expected) & real).nonzero()[0])
        raise CheckFailed(
            f"Your positions are not right for the mask {mask[b].tolist()}: the real token in slot {t} should be "
            f"at position {int(expected[b, t])}, you gave {int(got[b, t])}."
        )
    return True


NO_TWO_PI = ("You solved base^(2i/d) = context / turns, but a full turn is 2π radians: pair i completes one "
             "every 2π/θ_i = 2π · base^(2i/d) tokens, so it makes context / (2π · base^(2i/d)) turns.")
FEATURE_INDEX = ("Your index is twice too large: you used θ_i = base^(-i/d), as if i counted features. i counts "
                 "pairs (0 .. d/2 - 1), and pair i turns by base^(-2i/d) radians per token.")
TURNS_INVERTED = ("You solved for a wavelength of turns · context tokens. A pair that makes `turns` turns within "
                  "the context has a wavelength of context / turns: more turns, shorter wavelength, smaller i.")
ROUNDED = ("Your answer is a whole number, but the pair that makes exactly that many turns usually falls "
           "between two pairs: return the real number (YaRN rounds the ends of its ramp itself, down and up).")
MIXED_LOGS = ("Your answer is off by a factor of ln 10 = 2.303: you mixed a base-10 logarithm with a natural "
              "one. Any logarithm will do, as long as both sides of the equation use the same.")
SIGN_REVERSED = ("Your answer has the wrong sign: you divided 2π · turns by the context instead of the context by "
                 "2π · turns. Slower pairs (fewer turns) have larger i.")
FROM_THE_END = ("You counted from the slowest pair (d/2 - 1 - i, or d/2 - i): i counts from pair 0, the fastest, "
                "which turns by 1 radian per token.")
TURNS_WRONG = ("Your pair is not right for d={d}, base={base:g}, context={context}, turns={turns:g}: expected "
               "{expected:.4f}, got {got}. Pair i makes context / (2π · base^(2i/d)) turns within the context; "
               "solve that for i.")

#: (d, base, context, turns): LLaMA 3's head at YaRN's two ends, and other heads.
TURNS_CASES = [(128, 500_000.0, 8192, 32.0), (128, 500_000.0, 8192, 1.0), (64, 10_000.0, 2048, 4.0),
               (96, 1_000_000.0, 32_768, 2.5), (16, 100.0, 50, 1.0)]


def _pair_from_wavelengths(d: int, base: float, context: int, turns: float) -> float:
    """The real pair index with wavelength ``context / turns``, read off the (geometric) wavelengths."""
    wavelength = RotaryEmbedding(d, base=base).wavelengths()                    # [d/2], float64
    return math.log(context / turns / wavelength[0].item()) / math.log((wavelength[1] / wavelength[0]).item())


def check_pair_making_turns(pair_fn: Callable[[int, float, int, float], float]) -> bool:
    """Check ``fn(d, base, context, turns) -> float``: the (real) pair index ``i`` at which a head's pair
    makes exactly ``turns`` full turns within ``context`` tokens, read off ``RotaryEmbedding(d,
    base=base).wavelengths()``, for five heads, among them LLaMA 3's at YaRN's 32 and 1 turns.

    Raises:
        CheckFailed: naming a missing 2π, a feature index for a pair index, the turns inverted, a
            rounded index, mixed logarithms, a reversed sign, an index counted from the slow end, or
            the first case that differs.

    Example (a wrong answer, and what it is told):
        >>> check_pair_making_turns(lambda d, base, context, turns: d / 2 * math.log(context / turns) / math.log(base))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You solved base^(2i/d) = context / turns, but a full turn is 2π ...
    """
    got, expected = [], []
    for d, base, context, turns in TURNS_CASES:
        got.append(float(number(call_answer("check_pair_making_turns", pair_fn, d, base, context, turns),
                                "Your function should return a number (a float), but it returned {type}.")))
        expected.append(_pair_from_wavelengths(d, base, context, turns))

    def close(got: list[float], values: list[float]) -> bool:
        return all(math.isclose(g, v, rel_tol=1e-6, abs_tol=1e-6) for g, v in zip(got, values))

    if close(got, expected):
        return True
    ln = math.log
    mistakes = [
        (NO_TWO_PI, [d / 2 * ln(c / t) / ln(b) for d, b, c, t in TURNS_CASES]),
        (FEATURE_INDEX, [2 * e for e in expected]),
        (TURNS_INVERTED, [d / 2 * ln(c * t / (2 * math.pi)) / ln(b) for d, b, c, t in TURNS_CASES]),
        (MIXED_LOGS, [e / ln(10) for e in expected]),
        (MIXED_LOGS, [e * ln(10) for e in expected]),
        (SIGN_REVERSED, [-e for e in expected]),
        (FROM_THE_END, [d / 2 - 1 - e for (d, *_), e in zip(TURNS_CASES, expected)]),
        (FROM_THE_END, [d / 2 - e for (d, *_), e in zip(TURNS_CASES, expected)]),
    ]
    name_mistake(got, mistakes, close)
    if all(g == round(g) for g in got) and all(abs(g - e) <= 1 for g, e in zip(got, expected)):
        raise CheckFailed(ROUNDED)
    index = next(i for i, (g, e) in enumerate(zip(got, expected)) if not math.isclose(g, e, rel_tol=1e-6, abs_tol=1e-6))
    d, base, context, turns = TURNS_CASES[index]
    raise CheckFailed(TURNS_WRONG.format(d=d, base=base, context=context, turns=turns, expected=expected[index],
                                         got=f"{got[index]:.4f}"))


QUERY_AT_ZERO = (
    "Your query is rotated at position 0 (RotaryEmbedding's default for a single vector), while the keys "
    "sit at 0 .. N-1. The newest token is at position N - 1: pass its position, "
    "rope(q_last[None], torch.tensor([N - 1])), so each score sees the true distance."
)
QUERY_ONE_PAST = ("Your query is rotated at position N, one past the newest token: the keys are at 0 .. N-1 "
                  "and the newest of them is the token itself, at N - 1.")
KEYS_NOT_ROTATED = ("Your keys are not rotated: RoPE turns the keys by their positions too, or the score "
                    "would depend on the query's position alone.")
SCORES_SCALED = ("Your scores are divided by √d. The function returns the plain dot products q · k, as the "
                 "original one does; the scaling happens later, in the attention.")


def check_last_token_scores(scores_fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]) -> bool:
    """Check ``fn(q_last [d], keys [N, d], base) -> scores [N]``: the newest token's row of RoPE scores, the
    last row of ``rope(queries) @ rope(keys).T``, for ``N = 6, d = 16`` and ``N = 9, d = 32``.

    Raises:
        CheckFailed: naming a query rotated at position 0 or N, keys left unrotated, scores divided
            by √d, or the first entry that differs.
    """
    generator = torch.Generator().manual_seed(53)
    for tokens, d, base in [(6, 16, 10_000.0), (9, 32, 500.0)]:
        queries, keys = torch.randn(tokens, d, generator=generator), torch.randn(tokens, d, generator=generator)
        rope = RotaryEmbedding(d, base=base)
        got = call_student("check_last_token_scores", scores_fn, queries[-1], keys, base)
        k = rope(keys)                                                         # [N, d]
        expected = rope(queries)[-1] @ k.T                                     # [N]
        diagnose(got, expected, [
            (QUERY_AT_ZERO, queries[-1] @ k.T),
            (QUERY_ONE_PAST, rope(queries[-1:], torch.tensor([tokens]))[0] @ k.T),
            (KEYS_NOT_ROTATED, rope(queries)[-1] @ keys.T),
            (SCORES_SCALED, expected / math.sqrt(d)),
        ], ("key",), "Your row of scores")
    return True


OTHER_PAIRING = ("You paired the features the other way: with interleaved={interleaved}, feature {example} turns "
                 "together with feature {partner}. Half split pairs feature i with i + d/2; interleaved pairs "
                 "2i with 2i + 1.")
ROTATED_BACKWARDS = ("You turn each pair by -m·θ_i: the rotation goes the other way. Turning (x, y) by φ gives "
                     "(x cos φ - y sin φ, x sin φ + y cos φ).")
FEATURE_EXPONENT = ("Your frequencies are θ_i = base^(-i/d): the exponent counts features, not pairs. Pair i "
                    "turns by θ_i = base^(-2i/d), so the slowest pair, i = d/2 - 1, turns by about 1/base.")
GROWING_FREQUENCIES = ("Your frequencies grow with the pair: θ_i = base^(+2i/d). The exponent is negative: pair 0 "
                       "turns by 1 radian per token and each later pair more slowly.")
NOTHING_TURNED = "Your output is the input: nothing is turned. Pair i of the token at position m turns by m·θ_i."
ANGLES_LAID_OUT = ("Your pairs are right but each feature gets the angle of another pair: with "
                   "interleaved={interleaved}, features {example} and {partner} must both use the angle of pair "
                   "{pair}. Lay the d/2 angles out as the pairs lie: {layout}.")
ROTATION_CASES = [((6, 8), 10_000.0, False, 0), ((6, 8), 10_000.0, True, 0),
                  ((2, 3, 5, 64), 500_000.0, False, 200), ((2, 3, 5, 64), 100.0, True, 37)]


def _turned(x: torch.Tensor, angles: torch.Tensor, interleaved: bool, *, layout_of: bool | None = None) -> torch.Tensor:
    """``x`` turned pair by pair by ``angles [N, d/2]`` in float64, the pairs as ``interleaved`` says; the
    angles laid out over the features as ``layout_of`` says (default: the same as the pairs)."""
    layout_of = interleaved if layout_of is None else layout_of
    per_feature = angles.repeat_interleave(2, dim=-1) if layout_of else torch.cat((angles, angles), dim=-1)
    x64 = x.double()
    if interleaved:                                   # the partner of (a, b) is (-b, a), pair by pair
        partner = torch.stack((-x64[..., 1::2], x64[..., 0::2]), dim=-1).flatten(-2)
    else:
        first, second = x64.chunk(2, dim=-1)
        partner = torch.cat((-second, first), dim=-1)
    return (x64 * per_feature.cos() + partner * per_feature.sin()).to(x.dtype)


#: What chapter 05's rotation exercise may not call: the module whose rotation it asks for.
ROTATION_RULES = (
    Forbidden("attn_course.positions.rope.RotaryEmbedding",
              "the exercise is to write the rotation yourself, without RotaryEmbedding"),
)


def check_rotate_pairs(rotate_fn: Callable) -> bool:
    """Check ``fn(x [..., N, d], positions [N], base, interleaved) -> [..., N, d]``: RoPE's rotation, compared
    with ``RotaryEmbedding(d, base=base, interleaved=interleaved)(x, positions)`` for both pairings, heads of 8
    and 64 features, positions from 0, 37 and 200, and a ``[2, 3, N, d]`` batch of heads.

    Raises:
        CheckFailed: naming the other pairing, a rotation the wrong way, frequencies with the exponent
            -i/d or +2i/d, nothing turned, angles laid out for the other pairing, or the first entry that
            differs.
    """
    rotate_fn = watched("check_rotate_pairs", rotate_fn, ROTATION_RULES)
    generator = torch.Generator().manual_seed(54)
    for shape, base, interleaved, start in ROTATION_CASES:
        d, n = shape[-1], shape[-2]
        x, positions = torch.randn(*shape, generator=generator), torch.arange(start, start + n)
        got = call_student("check_rotate_pairs", rotate_fn, x, positions, base, interleaved)
        expected = RotaryEmbedding(d, base=base, interleaved=interleaved)(x, positions)
        pair = torch.arange(d // 2, dtype=torch.float64)
        m = positions.double()[:, None]                                          # [N, 1]
        right, by_features, growing = (m * base ** (e * pair / d) for e in (-2, -1, 2))   # [N, d/2] angles
        example, partner = (2, 3) if interleaved else (1, 1 + d // 2)
        other_example, other_partner = (1, 1 + d // 2) if interleaved else (2, 3)
        layout = ("θ_0, θ_0, θ_1, θ_1, ... (repeat_interleave)" if interleaved
                  else "θ_0 ... θ_{d/2-1} twice (cat of the angles with themselves)")
        diagnose(got, expected, [
            (OTHER_PAIRING.format(interleaved=interleaved, example=other_example, partner=other_partner),
             _turned(x, right, not interleaved)),
            (ROTATED_BACKWARDS, _turned(x, -right, interleaved)),
            (FEATURE_EXPONENT, _turned(x, by_features, interleaved)),
            (GROWING_FREQUENCIES, _turned(x, growing, interleaved)),
            (NOTHING_TURNED, x),
            (ANGLES_LAID_OUT.format(interleaved=interleaved, example=example, partner=partner, pair=1, layout=layout),
             _turned(x, right, interleaved, layout_of=not interleaved)),
        ], ("", "", "token", "feature"), "Your rotated vectors")
    return True


LINEAR_IN_WAVELENGTH = (
    "Your blend is linear in the wavelength λ_i. LLaMA 3.1 blends linearly in the number of turns within "
    "the context, L/λ_i: a = (L/λ_i - low) / (high - low), 0 at λ_i = L/low and 1 at λ_i = L/high."
)
MIX_REVERSED = (
    "Your mix is the wrong way round: at λ_i = L/low (the slow end of the blend) the pair must be fully "
    "slowed, θ_i / factor, and at λ_i = L/high fully kept, θ_i. With a = (L/λ_i - low) / (high - low), "
    "the new frequency is (1 - a)·θ_i/factor + a·θ_i."
)
ALL_SLOWED = ("You divided every frequency by the factor: that is Position Interpolation. LLaMA 3.1 keeps the "
              "fast pairs (wavelength below L/high) as trained and only slows the slow ones.")
FAST_SLOWED = ("You slowed the fast pairs and kept the slow ones: the pairs to slow are those whose wavelength "
               "is *longer* than L/low (they do not complete a turn within the context).")
MULTIPLIED = "You multiplied by the factor: slowing a pair divides its frequency (and multiplies its wavelength)."
LLAMA3_CASES = [(128, 500_000.0, 8.0, 8192, 1.0, 4.0), (64, 10_000.0, 4.0, 2048, 2.0, 8.0)]


def _llama3_variant(theta: torch.Tensor, factor: float, context: int, low: float, high: float, *,
                    blend: str = "turns", reversed_mix: bool = False) -> torch.Tensor:
    wavelength = 2 * math.pi / theta
    if blend == "turns":
        a = (context / wavelength - low) / (high - low)
    else:
        a = (context / low - wavelength) / (context / low - context / high)
    if reversed_mix:
        mixed = a * theta / factor + (1 - a) * theta
    else:
        mixed = (1 - a) * theta / factor + a * theta
    out = torch.where(wavelength > context / low, theta / factor, theta)
    return torch.where((wavelength >= context / high) & (wavelength <= context / low), mixed, out)


#: What chapter 05's Llama 3 exercise may not call: the scaling it asks for.
LLAMA3_RULES = (
    Forbidden("attn_course.positions.rope_scaling.Llama3Scaling",
              "the exercise is to write Llama 3's rule yourself, without Llama3Scaling"),
)


def check_llama3_frequencies(frequencies_fn: Callable) -> bool:
    """Check ``fn(theta [d/2], factor, context, low, high) -> [d/2]``: LLaMA 3.1's scaled frequencies, compared
    (as the ratio new / trained of each pair) with ``RotaryEmbedding(d, base=base,
    scaling=Llama3Scaling(factor, context, low, high)).frequencies()`` for LLaMA 3.1's numbers and others.

    Raises:
        CheckFailed: naming a blend linear in the wavelength, a reversed mix, every pair or the fast
            pairs slowed, a multiplication by the factor, or the first pair that differs.
    """
    frequencies_fn = watched("check_llama3_frequencies", frequencies_fn, LLAMA3_RULES)
    for d, base, factor, context, low, high in LLAMA3_CASES:
        theta = RotaryEmbedding(d, base=base).frequencies()                    # [d/2], float64
        expected = RotaryEmbedding(d, base=base, scaling=Llama3Scaling(factor, context, low, high)).frequencies()
        got = call_student("check_llama3_frequencies", frequencies_fn, theta, factor, context, low, high)
        check_shape(got, expected, "Your frequencies")
        wavelength = 2 * math.pi / theta
        mistakes = [
            (LINEAR_IN_WAVELENGTH, _llama3_variant(theta, factor, context, low, high, blend="wavelength")),
            (MIX_REVERSED, _llama3_variant(theta, factor, context, low, high, reversed_mix=True)),
            (ALL_SLOWED, theta / factor),
            (FAST_SLOWED, torch.where(wavelength < context / high, theta / factor, theta)),
            (MULTIPLIED, _llama3_variant(theta, 1 / factor, context, low, high)),
        ]
        diagnose(got.double() / theta, expected / theta, [(m, w / theta) for m, w in mistakes], ("pair",),
                 "Your new / trained frequency ratio")                       # per pair, new / trained
    return True
