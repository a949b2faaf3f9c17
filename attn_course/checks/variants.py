"""Check chapter 09's exercises: RMSNorm, the SwiGLU feed-forward and the eviction of a cache with attention
sinks, against references written out here in float64 (the latent decoding costs:
:mod:`attn_course.checks.latent_costs`)."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attn_course.checks.diagnosis import CheckFailed, call_answer, call_student, check_shape, diagnose, same, watched
from attn_course.checks.forbidden import Forbidden

__all__ = ["check_rms_norm", "check_swiglu", "check_sink_eviction"]

SUBTRACTS_MEAN = ("Your function subtracts the mean: that is LayerNorm. RMSNorm only divides by the root "
                  "mean square, sqrt(mean(x²) + eps), and has no mean to remove.")
NO_SQUARE_ROOT = "You divide by mean(x²) + eps: take its square root, the *root* mean square."
EPS_OUTSIDE = ("You add eps after the square root, x / (sqrt(mean(x²)) + eps). It goes inside: "
               "x / sqrt(mean(x²) + eps), as Llama (and Hugging Face's LlamaRMSNorm) compute it.")
L2_NORM = ("You divide by the length of the vector, sqrt(sum(x²)), not by its root mean square: "
           "average the squares over the E features instead of adding them up.")
WRONG_AXIS = ("You averaged the squares over the wrong dimension: each token's vector is normalised "
              "on its own, over the last dimension (E features).")
NO_WEIGHT = "You normalise but do not multiply by the learned weight [E] at the end."
ADDS_WEIGHT = "You add the weight. It is a scale: multiply the normalised vector by it."


def _rms_cases() -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """``(x, weight, eps)``: token vectors, a weight away from 1, a large eps (where it goes shows) and a small one."""
    generator = torch.Generator().manual_seed(81)
    return [
        (torch.randn(2, 5, 8, generator=generator) * 0.3 + 0.2, 1 + 0.3 * torch.randn(8, generator=generator), 0.1),
        (torch.randn(3, 16, generator=generator) * 2.0, 1 + 0.3 * torch.randn(16, generator=generator), 1e-6),
    ]


_WITH_TENSOR_OPERATIONS = "the exercise is to write RMSNorm with plain tensor operations"
#: What chapter 09's RMSNorm exercise may not call: RMSNorm itself, the course's or PyTorch's.
RMS_NORM_RULES = (
    Forbidden("torch.nn.functional.rms_norm", _WITH_TENSOR_OPERATIONS),
    Forbidden("torch.nn.modules.normalization.RMSNorm.forward", _WITH_TENSOR_OPERATIONS),
    Forbidden("attn_course.core.norms.RMSNorm.forward", _WITH_TENSOR_OPERATIONS),
)


NO_KEEPDIM = ("Your mean over the features drops their dimension: for x [..., E], x.pow(2).mean(-1) is [...], and "
              "PyTorch lines up the last dimensions, so x against it pairs the E features with the tokens and "
              "cannot broadcast. Keep the dimension: mean(-1, keepdim=True) is [..., 1], one number per token "
              "that every feature is divided by.")
_BROADCAST_ERROR = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def _dropped_keepdim(failed: CheckFailed, x: torch.Tensor) -> bool:
    """Whether the answer crashed dividing ``x [..., N, E]`` by a per-token reduction without its last dimension."""
    found = _BROADCAST_ERROR.search(str(failed.__cause__ or ""))
    return x.dim() >= 2 and found is not None and {int(found[1]), int(found[2])} == {x.shape[-1], x.shape[-2]}


def check_rms_norm(norm_fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]) -> bool:
    """Check ``fn(x [..., E], weight [E], eps) -> [..., E]``: RMSNorm, ``x / sqrt(mean(x²) + eps) · weight``,
    with ``eps = 0.1`` and ``1e-6``.

    Raises:
        CheckFailed: naming a mean subtracted (LayerNorm), a missing square root, eps outside the
            root, the vector's length used instead of its RMS, the wrong axis, a reduction that drops
            its dimension, the weight missing or added, or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_rms_norm(lambda x, w, eps: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You add eps after the square root, x / (sqrt(mean(x²)) + eps). ...
    """
    norm_fn = watched("check_rms_norm", norm_fn, RMS_NORM_RULES)
    for x, weight, eps in _rms_cases():
        try:
            got = call_student("check_rms_norm", norm_fn, x, weight, eps)
        except CheckFailed as failed:
            if _dropped_keepdim(failed, x):
                raise CheckFailed(NO_KEEPDIM) from None
            raise
        wide, w = x.double(), weight.double()
        mean_square = wide.pow(2).mean(-1, keepdim=True)                       # [..., 1]
        expected = wide / (mean_square + eps).sqrt() * w                         # [..., E]
        centred = wide - wide.mean(-1, keepdim=True)
        diagnose(got, expected, [
            (SUBTRACTS_MEAN, centred / (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w),
            (SUBTRACTS_MEAN, F.layer_norm(wide, wide.shape[-1:], eps=eps) * w),
            (NO_SQUARE_ROOT, wide / (mean_square + eps) * w),
            (EPS_OUTSIDE, wide / (mean_square.sqrt() + eps) * w),
            (L2_NORM, wide / (wide.pow(2).sum(-1, keepdim=True) + eps).sqrt() * w),
            (WRONG_AXIS, wide / (wide.pow(2).mean(0, keepdim=True) + eps).sqrt() * w),
            (NO_WEIGHT, wide / (mean_square + eps).sqrt()),
            (ADDS_WEIGHT, wide / (mean_square + eps).sqrt() + w),
        ], ("", "token", "feature")[-x.dim():], "Your output")
    return True


GATE_AND_UP_SWAPPED = ("You apply SiLU to the up projection and multiply by the gate projection: the SiLU goes "
                       "on w_gate's output, silu(x W_gate^T) ⊙ (x W_up^T).")
GELU_NOT_SILU = "You use GELU; SwiGLU's gate is SiLU (Swish), silu(z) = z · sigmoid(z)."
RELU_NOT_SILU = "You use ReLU; SwiGLU's gate is SiLU (Swish), silu(z) = z · sigmoid(z)."
SIGMOID_NOT_SILU = ("You gate with sigmoid(x W_gate^T): that is the original GLU. SwiGLU uses SiLU, "
                    "z · sigmoid(z), as its gate.")
NO_GATE = ("There is no gate: you apply SiLU to one projection and never multiply by the other. SwiGLU "
           "multiplies silu(x W_gate^T) by x W_up^T, element by element.")
PLAIN_LINEAR = ("Your feed-forward is a plain linear map: x W_gate^T W_down^T (or through W_up) has no "
                "nonlinearity, so two matrices in a row are one matrix and the block adds nothing a single "
                "linear layer could not. SwiGLU is (SiLU(x W_gate^T) ⊙ x W_up^T) W_down^T: a SiLU on the gate, "
                "times the up projection.")
PRODUCT_WITHOUT_SILU = ("You multiply the two projections but apply no SiLU: (x W_gate^T ⊙ x W_up^T) W_down^T is a "
                        "bilinear GLU. SwiGLU puts SiLU on the gate projection before the product.")
SILU_AFTER_PRODUCT = ("You apply SiLU to the product of both projections; only the gate projection goes "
                      "through SiLU: silu(x W_gate^T) ⊙ (x W_up^T).")
NO_DOWN = "You stop before the down projection: the hidden [..., F] vector goes back to E features by W_down."
SILU_ON_BOTH = ("You apply SiLU to both projections; only the gate goes through it: silu(x W_gate^T) ⊙ (x W_up^T), "
                "the up projection stays linear.")
UNTRANSPOSED = ("You use the weights as [in, out], x @ w_gate: they are stored as nn.Linear stores them, [out, in] "
                "(w_gate is [F, E]), so a projection is x @ w_gate.T. Given the weights transposed, your function "
                "gives the right output.")

#: What chapter 09's feed-forward exercise may not call: the Llama model's own.
SWIGLU_RULES = (
    Forbidden("attn_course.models.llama.feed_forward.SwiGLU",
              "the exercise is to write SwiGLU yourself"),
)


def _right_when_transposed(ffn_fn: Callable[..., torch.Tensor], expected: torch.Tensor, x: torch.Tensor,
                           *weights: torch.Tensor) -> bool:
    """Whether the answer, given each weight transposed ([in, out]), returns ``expected``: it reads them so."""
    try:
        again = call_student("check_swiglu", ffn_fn, x, *(w.T.contiguous() for w in weights))
    except CheckFailed:
        return False
    return same(again, expected.to(again.dtype))


def check_swiglu(ffn_fn: Callable[..., torch.Tensor]) -> bool:
    """Check ``fn(x [..., E], w_gate [F, E], w_up [F, E], w_down [E, F]) -> [..., E]``: Llama's feed-forward,
    ``(silu(x W_gate^T) ⊙ x W_up^T) W_down^T``, the weights ``[out, in]`` as ``nn.Linear`` stores them.

    Raises:
        CheckFailed: naming gate and up swapped, GELU / ReLU / sigmoid instead of SiLU, no gate, SiLU
            after the product or on both projections, no SiLU at all, a plain linear map, a missing
            down projection, weights read as [in, out], or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_swiglu(lambda x, w_gate, w_up, w_down: x @ w_gate.T @ w_down.T)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your feed-forward is a plain linear map: x W_gate^T W_down^T (or ...
    """
    ffn_fn = watched("check_swiglu", ffn_fn, SWIGLU_RULES)
    generator = torch.Generator().manual_seed(82)
    for batch, embed, hidden in [((2, 3), 8, 12), ((5,), 6, 16)]:
        x = torch.randn(*batch, embed, generator=generator)
        w_gate, w_up = torch.randn(hidden, embed, generator=generator), torch.randn(hidden, embed, generator=generator)
        w_down = torch.randn(embed, hidden, generator=generator) / hidden**0.5
        x64, g, u, d = x.double(), w_gate.double(), w_up.double(), w_down.double()
        gate, up = x64 @ g.T, x64 @ u.T                                           # [..., F] each
        expected = (F.silu(gate) * up) @ d.T                                      # [..., E]
        try:
            got = call_student("check_swiglu", ffn_fn, x, w_gate, w_up, w_down)
        except CheckFailed as failed:
            if failed.__cause__ is not None and _right_when_transposed(ffn_fn, expected, x, w_gate, w_up, w_down):
                raise CheckFailed(UNTRANSPOSED) from None
            raise
        if got.shape[-1] == hidden and got.shape[:-1] == expected.shape[:-1]:
            raise CheckFailed(NO_DOWN)
        diagnose(got, expected, [
            (GATE_AND_UP_SWAPPED, (F.silu(up) * gate) @ d.T),
            (GELU_NOT_SILU, (F.gelu(gate) * up) @ d.T),
            (GELU_NOT_SILU, (F.gelu(gate, approximate="tanh") * up) @ d.T),
            (RELU_NOT_SILU, (F.relu(gate) * up) @ d.T),
            (SIGMOID_NOT_SILU, (torch.sigmoid(gate) * up) @ d.T),
            (NO_GATE, F.silu(gate) @ d.T),
            (NO_GATE, F.silu(up) @ d.T),
            (SILU_AFTER_PRODUCT, F.silu(gate * up) @ d.T),
            (SILU_ON_BOTH, (F.silu(gate) * F.silu(up)) @ d.T),
            (PLAIN_LINEAR, gate @ d.T),
            (PLAIN_LINEAR, up @ d.T),
            (PLAIN_LINEAR, (gate + up) @ d.T),
            (PRODUCT_WITHOUT_SILU, (gate * up) @ d.T),
        ], ("", "token", "feature")[-x.dim():], "Your output")
    return True


EVICTS_SINKS = ("Your cache keeps the last sinks + recent tokens, so once the text is longer than that, the first "
                "tokens are evicted like any other: the sinks are gone. Keep the first `sinks` tokens always, "
                "and the `recent` newest after them.")
DUPLICATES = ("While the text is still short (N < sinks + recent) your cache holds some tokens twice: the first "
              "`sinks` and the last `recent` overlap. Until the cache is full, keep every token once.")
NEGATIVE_ZERO_SLICE = ("With recent = 0 your cache keeps the sinks and then every token again: x[:, :, -recent:] "
                       "is x[:, :, -0:], and -0 is 0, so the slice is the whole sequence, not an empty one. "
                       "Slice the recent tokens from n - recent: x[:, :, n - recent:] is empty when recent = 0.")
SINKS_LAST = ("You keep the right tokens in the wrong order: the sinks go first, then the recent tokens, oldest to "
              "newest, because their order in the cache is their position (StreamingLLM numbers positions inside "
              "the cache).")
ONE_SHORT = "You keep one recent token too few: the `recent` newest tokens are kept, the newest included."
VALUES_NOT_KEYS = "Your keys are right, but your values are not the same tokens' values: evict both alike."
KEPT_WRONG = ("For N = {n}, sinks = {sinks}, recent = {recent} the cache should hold the tokens at positions "
              "{expected}; yours holds {got}.")


def _positions_kept(kept: torch.Tensor, keys: torch.Tensor) -> list[int] | None:
    """The positions (along dim 2 of ``keys``) of the kept vectors, or None if one is not found."""
    found = []
    for slot in range(kept.shape[2]):
        matches = [p for p in range(keys.shape[2]) if torch.equal(kept[:, :, slot], keys[:, :, p])]
        if not matches:
            return None
        found.append(matches[0])
    return found


#: What chapter 09's find-the-bug exercise may not call: the course's sink cache.
SINK_RULES = (
    Forbidden("attn_course.variants.attention_sinks.SinkKVCache",
              "the exercise is to fix the classmate's eviction, not to run the course's cache"),
    Forbidden("attn_course.variants.attention_sinks.CachePositions",
              "the exercise is to fix the classmate's eviction, not to run the course's cache"),
)


def check_sink_eviction(evict_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Check ``fn(keys [B, H, N, d], values [B, H, N, d_v], sinks, recent) -> (keys, values)``: what a
    cache with attention sinks keeps of ``N`` tokens: all of them while ``N <= sinks + recent``, else the
    first ``sinks`` and the last ``recent``, in that order (StreamingLLM), for texts shorter and longer.

    Raises:
        CheckFailed: naming the mistake, where it is one of the common ones (finding the
            classmate's is the exercise), or the positions that differ.

    Example (a wrong answer, and what it is told):
        >>> check_sink_eviction(lambda k, v, sinks, recent: (k[:, :, -recent:], v[:, :, -recent:]))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: For N = 20, sinks = 4, recent = 6 the cache should hold the tokens ...
    """
    evict_fn = watched("check_sink_eviction", evict_fn, SINK_RULES)
    generator = torch.Generator().manual_seed(84)
    # Longer and shorter than the cache, no sinks, and no recent tokens (a `-recent:` slice keeps all).
    for n, sinks, recent in [(20, 4, 6), (7, 4, 6), (10, 4, 6), (11, 2, 3), (9, 0, 5), (3, 0, 5), (12, 3, 0)]:
        keys = torch.randn(2, 3, n, 4, generator=generator)
        values = torch.randn(2, 3, n, 5, generator=generator)
        result = call_answer("check_sink_eviction", evict_fn, keys, values, sinks, recent,
                             described=f"keys and values of N = {n} tokens, sinks={sinks}, recent={recent}")
        if not (isinstance(result, tuple) and len(result) == 2):
            raise CheckFailed(f"Your function should return (keys, values), got {type(result).__name__}.")
        got_keys, got_values = result
        for name, tensor in (("keys", got_keys), ("values", got_values)):
            if not isinstance(tensor, torch.Tensor):
                raise CheckFailed(f"Your {name} should be a torch.Tensor, got {type(tensor).__name__}.")
        keep = list(range(n)) if n <= sinks + recent else [*range(sinks), *range(n - recent, n)]
        expected_keys, expected_values = keys[:, :, keep], values[:, :, keep]
        if got_keys.dim() == 4 and got_keys.shape[:2] == keys.shape[:2] and got_keys.shape[3] == keys.shape[3]:
            kept = _positions_kept(got_keys, keys)
            if kept is not None and kept != keep:
                if kept == list(range(max(0, n - sinks - recent), n)):
                    raise CheckFailed(EVICTS_SINKS)
                if n < sinks + recent and kept == [*range(min(sinks, n)), *range(max(0, n - recent), n)]:
                    raise CheckFailed(DUPLICATES)
                if recent == 0 and kept == [*range(sinks), *range(n)]:
                    raise CheckFailed(NEGATIVE_ZERO_SLICE)
                if sorted(kept) == keep:
                    raise CheckFailed(SINKS_LAST)
                if kept == [*range(sinks), *range(n - recent + 1, n)]:
                    raise CheckFailed(ONE_SHORT)
                raise CheckFailed(KEPT_WRONG.format(n=n, sinks=sinks, recent=recent, expected=keep, got=kept))
        diagnose(got_keys, expected_keys, [], ("", "head", "slot", "feature"), "Your keys")
        check_shape(got_values, expected_values, "Your values")
        if not same(got_values, expected_values):
            raise CheckFailed(VALUES_NOT_KEYS)
    return True
