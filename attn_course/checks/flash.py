"""Check chapter 06's exercises (FlashAttention in PyTorch) against PyTorch (SDPA, ``torch.logsumexp``,
autograd in float64): merging two partial attentions, the tile loop that keeps its output normalised,
the backward pass of soft-capped scores from the log-sum-exp (the fourth, HBM traffic:
:mod:`attn_course.checks.flash_io`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attn_course.checks.diagnosis import CheckFailed, call_answer, check_close, check_shape, returned_tensors, watched
from attn_course.checks.forbidden import Forbidden

__all__ = ["check_merge_partial_attention", "check_streaming_attention", "check_attention_backward"]


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


#: What chapter 06's merge exercise may not call: the merges the course already has.
MERGE_RULES = (
    Forbidden("attn_course.flash.tiled.merge_attention_outputs",
              "the exercise is to write the merge yourself"),
    Forbidden("attn_course.flash.tiled.merge_softmax_blocks",
              "the exercise is to write the merge yourself"),
)


def check_merge_partial_attention(merge: Callable) -> bool:
    """Check ``merge(out_a, lse_a, out_b, lse_b) -> (out, lse)``.

    ``out_a [B, H, N, d_v]`` and ``lse_a [B, H, N]`` are attention over one set of keys, ``b`` over another;
    the answer must be attention over both and its log-sum-exp. The last case's scores are near ±300.

    Raises:
        CheckFailed: naming the mistake (outputs averaged, weights not normalised, the merged
            log-sum-exp taken as a max or a sum, ``exp`` overflowing), else what differs.

    Example (a wrong answer, and what it is told):
        >>> check_merge_partial_attention(
        ...     lambda out_a, lse_a, out_b, lse_b: ((out_a + out_b) / 2, torch.maximum(lse_a, lse_b)))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your merged lse is the larger of lse_a and lse_b: the two sums of ...
    """
    merge = watched("check_merge_partial_attention", merge, MERGE_RULES)
    generator = torch.Generator().manual_seed(60)
    for logit_scale, split in ((1.0, 5), (4.0, 17), (60.0, 9)):
        q = torch.randn(2, 3, 6, 8, generator=generator, dtype=torch.float64) * logit_scale
        k, v = (torch.randn(2, 3, 24, 8, generator=generator, dtype=torch.float64) for _ in range(2))
        parts = []
        for keys in (slice(0, split), slice(split, None)):
            scores = _scores(q, k[:, :, keys])                                   # [B, H, N, n_part]
            parts += [torch.softmax(scores, -1) @ v[:, :, keys], torch.logsumexp(scores, -1)]
        out_a, lse_a, out_b, lse_b = (t.float() for t in parts)
        expected_out = F.scaled_dot_product_attention(q, k, v).float()
        expected_lse = torch.logsumexp(_scores(q, k), -1).float()
        described = "out_a, lse_a, out_b, lse_b of shapes [2, 3, 6, 8] and [2, 3, 6]"
        result = call_answer("check_merge_partial_attention", merge, out_a, lse_a, out_b, lse_b, described=described)
        got_out, got_lse = returned_tensors(result, 2, "out, lse")
        check_shape(got_out, expected_out, "Your merged out")      # before any arithmetic on the answer
        check_shape(got_lse, expected_lse, "Your merged lse")
        if logit_scale > 10 and not (torch.isfinite(got_out).all() and torch.isfinite(got_lse).all()):
            raise CheckFailed("With scores near ±300 your answer holds inf or NaN: exp(lse_a) overflows float32 "
                              "(above about 88). Work with differences, exp(lse_a - lse), where lse is the merged "
                              "log-sum-exp (torch.logaddexp computes it safely).")
        check_close(got_lse, expected_lse, what="Your merged lse", rtol=1e-4, atol=1e-4, mistakes=[
            ("Your merged lse is the larger of lse_a and lse_b: the two sums of exponentials add up, so "
             "lse = log(exp(lse_a) + exp(lse_b)) (torch.logaddexp).", torch.maximum(lse_a, lse_b)),
            ("Your merged lse is lse_a + lse_b, the log of the *product* of the two sums: it is "
             "log(exp(lse_a) + exp(lse_b)).", lse_a + lse_b),
        ], hint="the merged lse is log(exp(lse_a) + exp(lse_b)).")
        check_close(got_out, expected_out, what="Your merged out", rtol=1e-4, atol=1e-4, mistakes=[
            ("You averaged out_a and out_b: each must be weighted by its share of the row's total, "
             "exp(lse_a - lse) and exp(lse_b - lse), which is not 1/2 unless the two sums are equal.",
             (out_a + out_b) / 2),
            ("You added out_a and out_b without weights: each is already normalised over its own keys; "
             "weight them by exp(lse_a - lse) and exp(lse_b - lse).", out_a + out_b),
            ("Your weights exp(lse_a), exp(lse_b) do not sum to one: divide them by exp(lse), i.e. use "
             "exp(lse_a - lse) and exp(lse_b - lse).",
             torch.exp(lse_a)[..., None] * out_a + torch.exp(lse_b)[..., None] * out_b),
        ], hint="out = exp(lse_a - lse) · out_a + exp(lse_b - lse) · out_b, row by row.")
    return True


def _normalised_stream(q, tiles, *, old_sum=True, correction=True):
    """The loop over ``tiles`` of ``(k, v)`` that keeps its output normalised after every tile (FlashAttention-1's
    Algorithm 1), float64: ``(out, lse)``; ``old_sum`` or ``correction`` False leave that factor out of the
    update (the mistakes)."""
    q = q.double()
    scale = 1 / math.sqrt(q.shape[-1])
    row_max = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    row_sum = torch.zeros(q.shape[:-1], dtype=q.dtype)
    out = torch.zeros(*q.shape[:-1], tiles[0][1].shape[-1], dtype=q.dtype)
    for k, v in tiles:
        scores = q @ k.double().T * scale
        new_max = torch.maximum(row_max, scores.amax(dim=-1))
        rescale = torch.exp(row_max - new_max)
        weights = torch.exp(scores - new_max[:, None])
        new_sum = row_sum * rescale + weights.sum(-1)
        kept = (row_sum if old_sum else 1.0) * (rescale if correction else 1.0)
        out = (out * kept[:, None] + weights @ v.double()) / new_sum[:, None]
        row_max, row_sum = new_max, new_sum
    return out, row_max + torch.log(row_sum)


NO_OLD_SUM = ("Your output after each tile is divided by the new sum l_new, but what you carried was already "
              "divided by the old sum l_old: multiply it back by l_old before adding the tile, "
              "out = (l_old · exp(m_old - m_new) · out + P V) / l_new.")
NO_CORRECTION = ("When a tile raises the running maximum, what you carried was weighted against the old maximum: "
                 "rescale it by exp(m_old - m_new) too, as the running sum is.")
LSE_WITHOUT_MAX = ("Your output is right; your lse is log(l), the log of the running sum, which was measured "
                   "against the running maximum m: LSE = m + log(l).")
STREAM_TOGETHER = "the exercise is to go through the tiles one at a time; joining them holds every key at once"
STREAM_OTHER_WAY = "the exercise is to fix the tile loop, not to compute attention another way"

#: What chapter 06's streaming exercise may not call: attention, a softmax or a log-sum-exp over all the keys
#: at once, joining the tiles, or the course's tiles.
STREAMING_RULES = (
    Forbidden("torch.softmax", "the exercise is to fix the tile loop; a softmax over all the keys is not a loop"),
    Forbidden("torch.logsumexp", "the exercise is to keep a running maximum and sum, not a log-sum-exp at once"),
    *(Forbidden(name, STREAM_TOGETHER) for name in ("torch.cat", "torch.concat", "torch.concatenate", "torch.stack")),
    *(Forbidden(name, STREAM_OTHER_WAY) for name in (
        "torch.nn.functional.scaled_dot_product_attention", "attn_course.core.attention.self_attention",
        "attn_course.core.attention.scaled_dot_product", "attn_course.flash.tiled.tiled_attention",
        "attn_course.flash.tiled.online_softmax", "attn_course.flash.tiled.merge_softmax_blocks",
        "attn_course.flash.tiled.merge_attention_outputs")),
)

#: (N_q, d, d_v, tile sizes): the largest scores in a late tile, uneven tiles, one tile holding every key.
STREAM_CASES = ((6, 8, 8, (2, 2, 2, 2, 2, 2)), (9, 16, 5, (7, 3, 7, 1, 7, 5)), (4, 8, 3, (10,)))


def check_streaming_attention(attention: Callable) -> bool:
    """Check ``attention(q [N_q, d], kv_tiles) -> (out [N_q, d_v], lse [N_q])``: attention over keys and values
    handed over as a list of ``(k [b, d], v [b, d_v])`` tiles, compared with SDPA and ``torch.logsumexp``, with
    the largest scores in a late tile, tiles of uneven sizes and a single tile.

    Raises:
        CheckFailed: naming the carried output not multiplied back by the old sum (the classmate's
            loop), not rescaled by the correction, a log-sum-exp without the maximum, else the first
            entry that differs.

    Example (a wrong answer, and what it is told):
        >>> def all_at_once(q, kv_tiles):
        ...     k, v = (torch.cat(parts) for parts in zip(*kv_tiles))
        ...     return torch.softmax(q @ k.T / q.shape[-1] ** 0.5, -1) @ v, None
        >>> check_streaming_attention(all_at_once)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_streaming_attention: your answer calls torch.cat, which ...
    """
    attention = watched("check_streaming_attention", attention, STREAMING_RULES)
    generator = torch.Generator().manual_seed(62)
    for n_q, d, d_v, sizes in STREAM_CASES:
        n_k = sum(sizes)
        q = torch.randn(n_q, d, generator=generator)
        k, v = torch.randn(n_k, d, generator=generator), torch.randn(n_k, d_v, generator=generator)
        k[-1] *= 4                                           # the largest scores sit in the last tile
        tiles = list(zip(k.split(list(sizes)), v.split(list(sizes))))
        expected_out, expected_lse = F.scaled_dot_product_attention(q, k, v), torch.logsumexp(_scores(q, k), -1)
        mistakes = [(message, _normalised_stream(q, tiles, **{option: False})[0].float())
                    for option, message in (("old_sum", NO_OLD_SUM), ("correction", NO_CORRECTION))]
        handed = [(k_tile.clone(), v_tile.clone()) for k_tile, v_tile in tiles]    # its own copies
        result = call_answer("check_streaming_attention", attention, q, handed,
                             described=f"q [{n_q}, {d}] and {len(sizes)} tiles of sizes {list(sizes)}, d_v = {d_v}")
        out, lse = returned_tensors(result, 2, "out, lse")
        check_close(out, expected_out, what="Your out", mistakes=mistakes,
                    hint="follow one row through two tiles: what does out hold after the first, and what must "
                         "the second multiply it by before adding its own terms?")
        row_max = _scores(q.double(), k.double()).amax(-1)
        without_max = torch.logsumexp(_scores(q.double(), k.double()), -1) - row_max
        check_close(lse, expected_lse, what="Your lse", mistakes=[(LSE_WITHOUT_MAX, without_max.float())],
                    hint="the log-sum-exp of each row of scaled scores: m + log(l) at the end of the loop.")
    return True


#: What chapter 06's backward exercise may not call: autograd, or the course's backward.
BACKWARD_RULES = (
    Forbidden("autograd",
              "the exercise is to derive the gradients by hand, from the log-sum-exp"),
    Forbidden("attn_course.flash.tiled_backward.tiled_attention_backward",
              "the exercise is to write the backward pass yourself"),
    Forbidden("attn_course.flash.tiled.TiledAttentionFunction",
              "the exercise is to write the backward pass yourself"),
)


def check_attention_backward(backward: Callable) -> bool:
    """Check ``backward(q, k, v, out, lse, grad_out, grad_lse, cap) -> (dq, dk, dv)`` against autograd in float64.

    ``q [N_q, d]``, ``k [N_k, d]``, ``v [N_k, d_v]``, no mask, the scores soft-capped at ``cap``:
    ``S = cap · tanh(Q Kᵀ / (√d · cap))``; the loss depends on ``out`` and ``lse`` (``grad_out`` is
    ``dO [N_q, d_v]``, ``grad_lse`` ``dLSE [N_q]``).

    Raises:
        CheckFailed: naming the mistake (``grad_lse`` ignored, added with the wrong sign or without
            the factor P, Δ left out, Δ as rowsum(dP), P without the log-sum-exp, the cap's tanh left
            out of the chain rule or differentiated as 1 - tanh, the scale left out of dQ and dK), else
            what differs.

    Example (a wrong answer, and what it is told):
        >>> def backward(q, k, v, out, lse, grad_out, grad_lse, cap):
        ...     q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        ...     return torch.autograd.grad(torch.softmax(q @ k.T / q.shape[-1] ** 0.5, -1) @ v, (q, k, v), grad_out)
        >>> check_attention_backward(backward)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_attention_backward: your answer calls Tensor.requires_grad_, ...
    """
    backward = watched("check_attention_backward", backward, BACKWARD_RULES)
    generator = torch.Generator().manual_seed(66)
    for n_q, n_k, d, d_v, cap in ((5, 7, 8, 4, 2.0), (12, 9, 16, 16, 1.5)):
        q, k, v, grad_out = (torch.randn(*shape, generator=generator, dtype=torch.float64) * 1.5
                             for shape in ((n_q, d), (n_k, d), (n_k, d_v), (n_q, d_v)))
        grad_lse = torch.randn(n_q, generator=generator, dtype=torch.float64)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        scores = cap * torch.tanh(_scores(leaves[0], leaves[1]) / cap)
        out, lse = torch.softmax(scores, -1) @ leaves[2], torch.logsumexp(scores, -1)
        torch.autograd.backward((out, lse), (grad_out, grad_lse))
        expected = [t.grad for t in leaves]
        out, lse = out.detach(), lse.detach()
        described = f"q [{n_q}, {d}], k [{n_k}, {d}], v [{n_k}, {d_v}], out, lse, grad_out, grad_lse, cap = {cap}"
        result = call_answer("check_attention_backward", backward, q, k, v, out, lse, grad_out, grad_lse, cap,
                             described=described)
        got = returned_tensors(result, 3, "dq, dk, dv")
        scale = 1 / math.sqrt(d)
        s = cap * torch.tanh(q @ k.T * scale / cap)                     # the capped scores
        p, grad_p = torch.exp(s - lse[:, None]), grad_out @ v.T
        delta, g = (grad_out * out).sum(-1, keepdim=True), grad_lse[:, None]
        p_raw = torch.exp(s)
        through_tanh = 1 - (s / cap) ** 2                               # d(cap · tanh(x / cap)) / dx
        ways = {
            "right": p * (grad_p - delta + g),
            "no lse": p * (grad_p - delta),
            "lse sign": p * (grad_p - delta - g),
            "lse without p": p * (grad_p - delta) + g,
            "no delta": p * (grad_p + g),
            "delta of dP": p * (grad_p - grad_p.sum(-1, keepdim=True) + g),
            "raw p": p_raw * (grad_p - (p_raw * grad_p).sum(-1, keepdim=True) + g),
        }
        ways = {way: grad_s * through_tanh for way, grad_s in ways.items()}
        ways["no tanh"] = ways["right"] / through_tanh
        ways["tanh unsquared"] = ways["no tanh"] * (1 - s / cap)
        messages = {
            "no lse": "Your gradients ignore grad_lse: the loss depends on the LSE too, and LSE_i depends on every "
                      "score S_ij of its row. Differentiate LSE_i = log Σ_j exp(S_ij) and add that term to dS.",
            "lse sign": "Your grad_lse term has the wrong sign: the LSE grows with every score, so dLSE_i adds to "
                        "dS_ij with the factor ∂LSE_i/∂S_ij, which is positive.",
            "lse without p": "You added grad_lse to dS as it is, but ∂LSE_i/∂S_ij is not 1: differentiate "
                             "log Σ_j exp(S_ij) with respect to S_ij.",
            "no delta": "Your dS leaves out Δ: the softmax's backward is dS = P ∘ (dP - Δ) with "
                        "Δ_i = Σ_j P_ij dP_ij, which equals rowsum(dO ∘ O).",
            "delta of dP": "Your Δ is rowsum(dP), but it is Σ_j P_ij dP_ij, the weighted sum, which equals "
                           "rowsum(dO ∘ O).",
            "raw p": "Your weights were recomputed as exp(S) without the log-sum-exp: P = exp(S - LSE), which is the "
                     "softmax (rows sum to one).",
            "no tanh": "Your dS is right for the capped scores S, but Q and K reach S through the cap: "
                       "S = cap · tanh(X / cap) with X = Q Kᵀ / √d, so dX = dS times dS/dX. Find that derivative.",
            "tanh unsquared": "Your derivative of the cap is 1 - tanh(X / cap); the derivative of tanh is "
                              "1 - tanh², so dS/dX = 1 - (S / cap)².",
        }
        check_close(got[2], expected[2], what="Your dv", mistakes=[
            ("Your dV uses exp(S) as the weights: recompute P = exp(S - LSE), the softmax.", p_raw.T @ grad_out),
            ("Your weights come from the scores before the cap: P = exp(S - LSE) with S = cap · tanh(X / cap), the "
             "scores the forward pass used.", torch.exp(q @ k.T * scale - lse[:, None]).T @ grad_out),
        ], hint="dV = Pᵀ dO with P = exp(S - LSE); the LSE does not depend on V.")
        check_close(got[0], expected[0], what="Your dq", mistakes=[
            *((messages[way], scale * ways[way] @ k) for way in messages),
            ("Your dQ is missing the scale: X = scale · Q Kᵀ, so dQ = scale · dX K.", ways["right"] @ k),
        ], hint="dQ = scale · dX K, with dX the gradient of the scores before the cap; find dS from the two paths "
                "by which a score reaches the loss, through P and through the LSE, then go back through the cap.")
        check_close(got[1], expected[1], what="Your dk", mistakes=[
            ("Your dK is missing the scale: dK = scale · dXᵀ Q.", ways["right"].T @ q),
            *((messages[way], scale * ways[way].T @ q) for way in messages),
        ], hint="dK = scale · dXᵀ Q, the same dX as for dQ.")
    return True
