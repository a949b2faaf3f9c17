"""Check chapter 12's exercises on one layer of the open models of 2025–26: QK-norm in a head (Qwen3, Gemma 3),
the learned sink logit in the softmax's denominator (gpt-oss) and the output gate before ``W_o`` (Qwen3-Next),
each against a reference written out here in float64 (the cache ranking: :mod:`attn_course.checks.open_models_cache`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attn_course.checks.diagnosis import CheckFailed, call_student, diagnose, watched
from attn_course.checks.forbidden import forbid

__all__ = ["check_qk_norm_scores", "check_sink_softmax", "check_gated_output"]

_SCORE_AXES = ("", "head", "query", "key")


# --- 1. QK-norm in a head ----------------------------------------------------------------------------------------

WHOLE_VECTOR = ("You normalise each token's whole query (all H·d features of its heads together), as a layer's "
                "RMSNorm would. QK-norm normalises each head on its own: split [B, N, H·d] into heads [B, H, N, d] "
                "first, then take the root mean square over that head's d features.")
NO_NORM_WEIGHT = "You normalise q and k but never multiply by their weights [d] (q_weight, k_weight)."
NORM_EPS_OUTSIDE = ("You add eps after the square root, q / (sqrt(mean(q²)) + eps). It goes inside, "
                    "q / sqrt(mean(q²) + eps), as Qwen3's RMSNorm computes it.")
NORM_AFTER_ROPE = ("You rotate first and normalise afterwards. The norm comes first, then RoPE: the rotation keeps "
                   "each head's root mean square, but not the per-feature weight, which Qwen3 applies to the features "
                   "as projected (before they are mixed in pairs by the rotation).")
NO_ROPE = ("Your scores carry no positions: rotate the normalised q and k with "
           "`RotaryEmbedding(d, base=rope_base)` before the dot product.")
SCORE_SCALE = ("Your scores are √d times too large: divide q·k by √d after the norm. (A 1/√d applied to q or k before "
               "the norm is undone by it: the norm brings every head back to a root mean square of about 1.)")
ONLY_Q = "You normalise the queries only: QK-norm normalises the keys too, with their own weight k_weight."
ONLY_K = "You normalise the keys only: QK-norm normalises the queries too, with their own weight q_weight."
WEIGHTS_SWAPPED = "You scale the queries by k_weight and the keys by q_weight: each has its own weight."
HEADS_NOT_TRANSPOSED = ("You reshape [B, N, H·d] straight into [B, H, N, d], which mixes tokens and heads: the heads "
                        "sit side by side in the last dimension, so view it as [B, N, H, d], then transpose(1, 2).")

_WRITE_THE_NORM = "the exercise is to write QK-norm yourself: the mean of squares, the root, the weight"
#: What chapter 12's QK-norm exercise may not call: a norm written by someone else, or the layers that hold one.
QK_NORM_RULES = forbid(_WRITE_THE_NORM, "torch.nn.functional.rms_norm", "torch.nn.modules.normalization.RMSNorm",
                       "attn_course.core.norms.RMSNorm", "attn_course.core.qk_norm.HeadNormLinear",
                       "attn_course.models.decoder_attention.DecoderAttention")


def _rope64(t: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE written out in float64: feature ``i`` paired with ``i + d/2``, turned by ``m · base^(-2i/d)``."""
    n, d = t.shape[-2], t.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)                     # [d/2]
    angle = torch.arange(n, dtype=torch.float64)[:, None] * theta                         # [N, d/2]
    a, b = t[..., : d // 2], t[..., d // 2:]
    return torch.cat((a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()), dim=-1)


def _rms64(t: torch.Tensor, weight: torch.Tensor, eps: float, dims: tuple[int, ...] = (-1,),
           outside: bool = False) -> torch.Tensor:
    mean_square = t.pow(2).mean(dim=dims, keepdim=True)
    return t / (mean_square.sqrt() + eps if outside else (mean_square + eps).sqrt()) * weight


def qk_norm_reference(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                      base: float, *, plant: str | None = None) -> torch.Tensor:
    """The scores ``[B, H, N, N]`` of QK-norm in float64, or with one mistake planted (``plant``)."""
    d = q_weight.shape[0]
    b, n, width = q.shape
    heads = width // d
    wq, wk = q_weight.double(), k_weight.double()
    if plant == "swapped":
        wq, wk = wk, wq

    def split(t):                                                                         # [B, N, H·d] -> [B, H, N, d]
        t = t.double()
        return t.reshape(b, heads, n, d) if plant == "untransposed" else t.unflatten(-1, (heads, d)).transpose(1, 2)

    def norm(t, w, which):
        if plant == f"only_{'k' if which == 'q' else 'q'}":
            return t
        if plant == "no_weight":
            w = torch.ones_like(w)
        if plant == "scaled_first":
            t = t / math.sqrt(d)
        return _rms64(t, w, eps, (1, 3) if plant == "whole" else (-1,), outside=plant == "eps_outside")

    qh, kh = split(q), split(k)                                                           # [B, H, N, d]
    if plant == "after_rope":
        qh, kh = norm(_rope64(qh, base), wq, "q"), norm(_rope64(kh, base), wk, "k")
    elif plant == "no_rope":
        qh, kh = norm(qh, wq, "q"), norm(kh, wk, "k")
    else:
        qh, kh = _rope64(norm(qh, wq, "q"), base), _rope64(norm(kh, wk, "k"), base)
    scale = 1.0 if plant in ("unscaled", "scaled_first") else 1 / math.sqrt(d)
    return qh @ kh.transpose(-2, -1) * scale                                              # [B, H, N, N]


_QK_PLANTS = (("whole", WHOLE_VECTOR), ("untransposed", HEADS_NOT_TRANSPOSED), ("no_weight", NO_NORM_WEIGHT),
              ("eps_outside", NORM_EPS_OUTSIDE), ("after_rope", NORM_AFTER_ROPE), ("no_rope", NO_ROPE),
              ("unscaled", SCORE_SCALE), ("scaled_first", SCORE_SCALE), ("only_q", ONLY_Q), ("only_k", ONLY_K),
              ("swapped", WEIGHTS_SWAPPED))


def _qk_cases() -> list[tuple]:
    """``(q, k, q_weight, k_weight, eps, base)``: a large eps on small vectors (where eps goes shows), and a small one;
    weights away from 1 and unlike their RoPE partners (so that norming after the rotation shows)."""
    generator = torch.Generator().manual_seed(121)
    cases = []
    for b, n, heads, d, eps, base, size in [(2, 5, 3, 8, 0.1, 100.0, 0.4), (1, 7, 2, 16, 1e-6, 10000.0, 2.0)]:
        q, k = (torch.randn(b, n, heads * d, generator=generator) * size for _ in range(2))
        q_weight, k_weight = (1 + 0.5 * torch.randn(d, generator=generator) for _ in range(2))
        cases.append((q, k, q_weight, k_weight, eps, base))
    return cases


def check_qk_norm_scores(scores_fn: Callable[..., torch.Tensor]) -> bool:
    """Check ``fn(q [B, N, H·d], k [B, N, H·d], q_weight [d], k_weight [d], eps, rope_base) -> [B, H, N, N]``: each
    head's q and k RMS-normalised over its ``d`` features and scaled by its weight, then rotated by RoPE of base
    ``rope_base`` (positions ``0 .. N-1``), then ``q·k / √d``, against a float64 reference written out here.

    Raises:
        CheckFailed: naming a norm over the whole H·d vector, heads split without a transpose, the weight
            missing or swapped, eps outside the root, the norm after RoPE, no RoPE, the √d scale missing or
            before the norm, only q or only k normalised, or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> from attn_course.positions.rope import RotaryEmbedding
        >>> def whole(q, k, q_weight, k_weight, eps, rope_base):
        ...     d = q_weight.shape[0]
        ...     rope = RotaryEmbedding(d, base=rope_base)
        ...     def norm(t, w):
        ...         t = t / (t.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        ...         return rope(t.unflatten(-1, (-1, d)).transpose(1, 2) * w)
        ...     return norm(q, q_weight) @ norm(k, k_weight).transpose(-2, -1) / d ** 0.5
        >>> check_qk_norm_scores(whole)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You normalise each token's whole query (all H·d features of ...
    """
    where = "check_qk_norm_scores"
    scores_fn = watched(where, scores_fn, QK_NORM_RULES)
    for q, k, q_weight, k_weight, eps, base in _qk_cases():
        got = call_student(where, scores_fn, q, k, q_weight, k_weight, eps, base)
        reference = qk_norm_reference(q, k, q_weight, k_weight, eps, base)
        diagnose(got, reference, [(message, qk_norm_reference(q, k, q_weight, k_weight, eps, base, plant=plant))
                                  for plant, message in _QK_PLANTS], _SCORE_AXES, "Your scores")
    return True


# --- 2. the sink logit, in the denominator only ------------------------------------------------------------------

CLASSMATES_SINK = ("This is the classmate's code as it was: the scores are shifted by their largest value before exp, "
                   "but the sink is not, so exp(sink) is added to a sum of exp(s - max). Shift both by the same "
                   "number. (With every score 0, the classmate's test, the shift is 0 and the two agree.)")
SINK_IGNORED = ("Your rows sum to one: the sink takes no share. It is a logit in the denominator, "
                "exp(s_j) / (Σ_i exp(s_i) + exp(sink_h)), so each row of real keys sums to less than one.")
SINK_KEPT = ("You return N + 1 weights per row: the sink's own weight as well. It is no key and has no value; return "
             "the N real keys' weights only (they then sum to less than one).")
SINK_NOT_EXP = ("You add the sink itself to the sum of exponentials: it is a logit like the scores, so it enters the "
                "denominator as exp(sink_h), shifted by the same number as the scores.")
SINK_PER_QUERY = ("Your sink changes with the query, not with the head: sinks [H] lines up with the last dimension "
                  "it meets. For scores [..., H, N_q, N_k], view it as [H, 1, 1] so that head h uses sinks[h] in "
                  "every row.")
SINK_OVERFLOW = ("Your weights are inf or NaN where the scores are large (about 1000): exp overflows. Subtract one "
                 "number from the scores and the sink before exp, the largest of them all (the row's largest score, "
                 "or the sink where it is larger).")

_FIX_THE_ARITHMETIC = "the exercise is to fix the classmate's exp, max and sum, not to call a softmax"
#: What chapter 12's sink exercise may not call: a softmax that does the work, or the layer that holds the sink.
SINK_RULES = forbid(_FIX_THE_ARITHMETIC, "torch.softmax", "attn_course.core.attention.softmax_with_empty_rows",
                    "attn_course.models.decoder_attention.DecoderAttention")


def sink_softmax_reference(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """``exp(s_j) / (Σ_i exp(s_i) + exp(sink_h))`` over the last axis, in float64, head ``h`` at ``dim=-3``."""
    s, sink = scores.double(), sinks.double().view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.cat((s, sink), dim=-1).softmax(dim=-1)[..., :-1]


def _sink_cases() -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
    """``(scores, sinks, large)``: as many heads as queries first (a sink broadcast along the queries runs there),
    then other sizes and a batch of none, then scores near 1000 (exp overflows in float32 without a shift)."""
    generator = torch.Generator().manual_seed(122)
    cases = []
    for shape, size, offset in [((2, 4, 4, 6), 2.0, 0.0), ((3, 2, 5), 2.0, 1.5), ((1, 3, 2, 7), 1.0, 1000.0)]:
        scores = torch.randn(*shape, generator=generator) * size + offset
        sinks = torch.randn(shape[-3], generator=generator) * 2.0 + offset + torch.linspace(-1.0, 1.0, shape[-3])
        cases.append((scores, sinks, offset > 100))
    return cases


def check_sink_softmax(softmax_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(scores [..., H, N_q, N_k], sinks [H]) -> [..., H, N_q, N_k]``: gpt-oss's softmax with a learned sink
    logit per head in the denominator only, ``exp(s_j) / (Σ_i exp(s_i) + exp(sink_h))``, stable for scores near 1000.

    Raises:
        CheckFailed: naming the classmate's unshifted sink, the sink ignored, its weight returned, the sink
            added without exp, a sink per query instead of per head, an overflow, or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_sink_softmax(lambda scores, sinks: scores.exp() / scores.exp().sum(-1, keepdim=True))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your rows sum to one: the sink takes no share. It is a logit ...
    """
    where = "check_sink_softmax"
    softmax_fn = watched(where, softmax_fn, SINK_RULES)
    for scores, sinks, large in _sink_cases():
        got = call_student(where, softmax_fn, scores, sinks)
        expected = sink_softmax_reference(scores, sinks)
        if isinstance(got, torch.Tensor) and got.shape[:-1] == scores.shape[:-1] \
                and got.shape[-1] == scores.shape[-1] + 1:
            raise CheckFailed(SINK_KEPT)
        if large and isinstance(got, torch.Tensor) and got.shape == expected.shape and not got.isfinite().all():
            raise CheckFailed(SINK_OVERFLOW)
        s, shape = scores.double(), scores.shape
        top = s.amax(-1, keepdim=True)
        e = (s - top).exp()
        by_query = sinks.double()[:, None] if shape[-3] == shape[-2] else torch.full_like(top, math.nan)
        diagnose(got, expected, [
            (CLASSMATES_SINK, e / (e.sum(-1, keepdim=True) + sinks.double().view(-1, 1, 1).exp())),
            (SINK_IGNORED, s.softmax(-1)),
            (SINK_NOT_EXP, e / (e.sum(-1, keepdim=True) + sinks.double().view(-1, 1, 1) - top)),
            (SINK_NOT_EXP, s.exp() / (s.exp().sum(-1, keepdim=True) + sinks.double().view(-1, 1, 1))),
            (SINK_PER_QUERY, e / (e.sum(-1, keepdim=True) + (by_query - top).exp())),
        ], ("",) * (len(shape) - 3) + ("head", "query", "key"), "Your weights")
    return True


# --- 3. the output gate, before W_o ------------------------------------------------------------------------------

GATE_AFTER_OUT = ("You gate after the output projection: Qwen3-Next gates each head's features before W_o, "
                  "(heads ⊙ sigmoid(x W_gᵀ)) W_oᵀ, so that the gate can switch off a head's contribution before it "
                  "is mixed into the model's width.")
GATE_NO_SIGMOID = ("Your gate is x W_gᵀ itself: pass it through a sigmoid, so that each feature is multiplied by a "
                   "number between 0 and 1.")
GATE_SILU = ("You gate with SiLU, z · sigmoid(z), as SwiGLU does (chapter 09). The attention's output gate is the "
             "sigmoid alone: each feature is scaled by a number between 0 and 1.")
GATE_SWAPPED = ("You apply the sigmoid to the heads and multiply by x W_gᵀ: it goes the other way round, "
                "heads ⊙ sigmoid(x W_gᵀ). The gate is computed from the layer's input x; the heads pass through.")
GATE_ON_HEADS = ("Your gate is computed from the heads, sigmoid(heads): it is computed from the layer's input, "
                 "sigmoid(x W_gᵀ), the same x that the queries, keys and values are projected from.")
GATE_ADDED = "You add the gate to the heads: it multiplies them, feature by feature, heads ⊙ sigmoid(x W_gᵀ)."
GATE_NO_OUT = ("You stop before the output projection: the gated heads [B, N, H·d] go back to the model's width E "
               "through W_o, (heads ⊙ sigmoid(x W_gᵀ)) W_oᵀ.")
GATE_UNTRANSPOSED = ("You use the weights as [in, out], x @ w_gate: they are stored as nn.Linear stores them, "
                     "[out, in] (w_gate is [H·d, E]), so a projection is x @ w_gate.T.")

#: What chapter 12's gate exercise may not call: the layer that gates.
GATE_RULES = forbid("the exercise is to write the gate yourself",
                    "attn_course.models.decoder_attention.DecoderAttention")


def _gate_cases() -> list[tuple[torch.Tensor, ...]]:
    """``(heads, x, w_gate, w_out)``: first as wide as the model (H·d = E: a gate after W_o, or weights read as
    [in, out], run there), then narrower heads than the model, as in Qwen3-Next."""
    generator = torch.Generator().manual_seed(123)
    cases = []
    for batch, width, embed in [((2, 4), 12, 12), ((1, 5), 6, 10), ((3,), 8, 5)]:
        heads, x = torch.randn(*batch, width, generator=generator), torch.randn(*batch, embed, generator=generator)
        w_gate = torch.randn(width, embed, generator=generator) / embed ** 0.5
        w_out = torch.randn(embed, width, generator=generator) / width ** 0.5
        cases.append((heads, x, w_gate, w_out))
    return cases


def check_gated_output(gate_fn: Callable[..., torch.Tensor]) -> bool:
    """Check ``fn(heads [..., H·d], x [..., E], w_gate [H·d, E], w_out [E, H·d]) -> [..., E]``: Qwen3-Next's output
    gate, ``(heads ⊙ sigmoid(x w_gateᵀ)) w_outᵀ``, one gate per head and feature, before the output projection.

    Raises:
        CheckFailed: naming the gate after the output projection, no sigmoid, SiLU, the sigmoid on the heads,
            a gate computed from the heads, the gate added, no output projection, weights read as [in, out],
            or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_gated_output(lambda heads, x, w_gate, w_out: (heads * (x @ w_gate.T)) @ w_out.T)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your gate is x W_gᵀ itself: pass it through a sigmoid, so that ...
    """
    where = "check_gated_output"
    gate_fn = watched(where, gate_fn, GATE_RULES)
    for heads, x, w_gate, w_out in _gate_cases():
        got = call_student(where, gate_fn, heads, x, w_gate, w_out)
        h, x64, g, o = heads.double(), x.double(), w_gate.double(), w_out.double()
        logits = x64 @ g.T                                                                # [..., H·d]
        expected = (h * torch.sigmoid(logits)) @ o.T                                      # [..., E]
        if g.shape[0] != o.shape[0] and isinstance(got, torch.Tensor) and got.shape == h.shape:
            raise CheckFailed(GATE_NO_OUT)
        square = g.shape[0] == g.shape[1]
        unavailable = torch.full_like(expected, math.nan)
        diagnose(got, expected, [
            (GATE_AFTER_OUT, (h @ o.T) * torch.sigmoid(logits) if square else unavailable),
            (GATE_NO_SIGMOID, (h * logits) @ o.T),
            (GATE_SILU, (h * F.silu(logits)) @ o.T),
            (GATE_SWAPPED, (torch.sigmoid(h) * logits) @ o.T),
            (GATE_ON_HEADS, (h * torch.sigmoid(h)) @ o.T),
            (GATE_ADDED, (h + torch.sigmoid(logits)) @ o.T),
            (GATE_NO_OUT, h * torch.sigmoid(logits) if square else unavailable),
            (GATE_UNTRANSPOSED, (h * torch.sigmoid(x64 @ g)) @ o if square else unavailable),
        ], ("",) * (x.dim() - 1) + ("feature",), "Your output")
    return True
