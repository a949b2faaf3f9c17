"""Check chapter 06's exercises (FlashAttention in PyTorch) against PyTorch (SDPA, ``torch.logsumexp``,
autograd in float64): merging two partial attentions, the fixed online-softmax loop, the backward pass from
the log-sum-exp (the fourth, HBM traffic: :mod:`attn_course.checks.flash_io`)."""

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


def _stream(q, k, v, block, *, rescale_acc=True, rescale_sum=True, update_max=True):
    """The online-softmax loop with one of its steps optionally left out (the mistakes)."""
    scale = 1 / math.sqrt(q.shape[-1])
    row_max = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    row_sum = torch.zeros(q.shape[:-1], dtype=q.dtype)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for start in range(0, k.shape[0], block):
        scores = q @ k[start:start + block].T * scale
        new_max = torch.maximum(row_max, scores.amax(dim=-1))
        correction = torch.exp(row_max - new_max)
        weights = torch.exp(scores - new_max[:, None])
        row_sum = (row_sum * correction if rescale_sum else row_sum) + weights.sum(-1)
        acc = (acc * correction[:, None] if rescale_acc else acc) + weights @ v[start:start + block]
        row_max = new_max if update_max else row_max
    return acc / row_sum[:, None]


def _stream_mistakes(q, k, v, block):
    mistakes = [
        ("When a tile raises the running maximum, what was accumulated so far was weighted against the old "
         "maximum: rescale the accumulated output by the correction too.", dict(rescale_acc=False)),
        ("The running sum must be rescaled by the correction, like the accumulated output: "
         "l = l · correction + rowsum(weights).", dict(rescale_sum=False)),
        ("Your output is attention over the last tile of keys only: the running maximum is never updated "
         "(m_i = m_new), so the correction exp(m_i - m_new) wipes out every earlier tile.", dict(update_max=False)),
    ]
    return [(message, _stream(q.double(), k.double(), v.double(), block, **options).float())
            for message, options in mistakes]


#: What chapter 06's find-the-bug exercise may not call: attention over all keys at once, or the course's tiles.
STREAMING_RULES = (
    Forbidden("torch.softmax",
              "the exercise is to fix the streaming loop; a softmax over all the keys at once is not streaming"),
    Forbidden("torch.nn.functional.scaled_dot_product_attention",
              "the exercise is to fix the streaming loop, not to compute attention another way"),
    Forbidden("attn_course.core.attention.self_attention",
              "the exercise is to fix the streaming loop, not to compute attention another way"),
    Forbidden("attn_course.core.attention.scaled_dot_product",
              "the exercise is to fix the streaming loop, not to compute attention another way"),
    Forbidden("attn_course.flash.tiled.tiled_attention",
              "the exercise is to fix the classmate's loop, not to call the course's"),
    Forbidden("attn_course.flash.tiled.online_softmax",
              "the exercise is to fix the classmate's loop, not to call the course's"),
    Forbidden("attn_course.flash.tiled.merge_softmax_blocks",
              "the exercise is to fix the classmate's loop, not to call the course's"),
)


def check_streaming_attention(attention: Callable) -> bool:
    """Check ``attention(q, k, v, block) -> [N_q, d_v]``, the online-softmax loop, against SDPA, with the largest
    scores in a late block, a last block only partly filled, and one block holding every key.

    Raises:
        CheckFailed: naming the mistake (accumulated output or running sum not rescaled, running
            maximum not updated), else the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_streaming_attention(lambda q, k, v, block: torch.softmax(q @ k.T / q.shape[-1] ** 0.5, dim=-1) @ v)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_streaming_attention: your answer calls torch.softmax, which ...
    """
    attention = watched("check_streaming_attention", attention, STREAMING_RULES)
    generator = torch.Generator().manual_seed(62)
    for n_q, n_k, d, d_v, block in ((6, 12, 8, 8, 2), (9, 30, 16, 5, 7), (4, 10, 8, 3, 10)):
        q = torch.randn(n_q, d, generator=generator)
        k, v = torch.randn(n_k, d, generator=generator), torch.randn(n_k, d_v, generator=generator)
        k[-1] *= 4                                           # the largest scores sit in the last block
        got = call_answer("check_streaming_attention", attention, q, k, v, block,
                          described=f"q [{n_q}, {d}], k [{n_k}, {d}], v [{n_k}, {d_v}], block = {block}")
        check_close(got, F.scaled_dot_product_attention(q, k, v), what="Your output",
                    mistakes=_stream_mistakes(q, k, v, block),
                    hint="compare your loop with the four steps of section 2, one by one.")
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
    """Check ``backward(q, k, v, out, lse, grad_out, grad_lse) -> (dq, dk, dv)`` against autograd in float64.

    ``q [N_q, d]``, ``k [N_k, d]``, ``v [N_k, d_v]``, scale ``1/√d``, no mask; the loss depends on ``out`` and
    ``lse`` (``grad_out`` is ``dO [N_q, d_v]``, ``grad_lse`` ``dLSE [N_q]``).

    Raises:
        CheckFailed: naming the mistake (``grad_lse`` ignored, added with the wrong sign or without
            the factor P, Δ left out, Δ as rowsum(dP), P without the log-sum-exp, the scale left out
            of dQ and dK), else what differs.

    Example (a wrong answer, and what it is told):
        >>> def backward(q, k, v, out, lse, grad_out, grad_lse):
        ...     q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        ...     return torch.autograd.grad(torch.softmax(q @ k.T / q.shape[-1] ** 0.5, -1) @ v, (q, k, v), grad_out)
        >>> check_attention_backward(backward)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_attention_backward: your answer calls Tensor.requires_grad_, ...
    """
    backward = watched("check_attention_backward", backward, BACKWARD_RULES)
    generator = torch.Generator().manual_seed(66)
    for n_q, n_k, d, d_v in ((5, 7, 8, 4), (12, 9, 16, 16)):
        q, k, v, grad_out = (torch.randn(*shape, generator=generator, dtype=torch.float64)
                             for shape in ((n_q, d), (n_k, d), (n_k, d_v), (n_q, d_v)))
        grad_lse = torch.randn(n_q, generator=generator, dtype=torch.float64)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        scores = _scores(leaves[0], leaves[1])
        out, lse = torch.softmax(scores, -1) @ leaves[2], torch.logsumexp(scores, -1)
        torch.autograd.backward((out, lse), (grad_out, grad_lse))
        expected = [t.grad for t in leaves]
        out, lse = out.detach(), lse.detach()
        described = f"q [{n_q}, {d}], k [{n_k}, {d}], v [{n_k}, {d_v}], out, lse, grad_out, grad_lse"
        result = call_answer("check_attention_backward", backward, q, k, v, out, lse, grad_out, grad_lse,
                             described=described)
        got = returned_tensors(result, 3, "dq, dk, dv")
        scale = 1 / math.sqrt(d)
        s = q @ k.T * scale
        p, grad_p = torch.exp(s - lse[:, None]), grad_out @ v.T
        delta, g = (grad_out * out).sum(-1, keepdim=True), grad_lse[:, None]
        p_raw = torch.exp(s)
        ways = {
            "right": p * (grad_p - delta + g),
            "no lse": p * (grad_p - delta),
            "lse sign": p * (grad_p - delta - g),
            "lse without p": p * (grad_p - delta) + g,
            "no delta": p * (grad_p + g),
            "delta of dP": p * (grad_p - grad_p.sum(-1, keepdim=True) + g),
            "raw p": p_raw * (grad_p - (p_raw * grad_p).sum(-1, keepdim=True) + g),
        }
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
        }
        check_close(got[2], expected[2], what="Your dv", mistakes=[
            ("Your dV uses exp(S) as the weights: recompute P = exp(S - LSE), the softmax.", p_raw.T @ grad_out),
        ], hint="dV = Pᵀ dO with P = exp(S - LSE); the LSE does not depend on V.")
        check_close(got[0], expected[0], what="Your dq", mistakes=[
            *((messages[way], scale * ways[way] @ k) for way in messages),
            ("Your dQ is missing the scale: S = scale · Q Kᵀ, so dQ = scale · dS K.", ways["right"] @ k),
        ], hint="dQ = scale · dS K; find dS from the two paths by which a score reaches the loss, through P and "
                "through the LSE.")
        check_close(got[1], expected[1], what="Your dk", mistakes=[
            ("Your dK is missing the scale: dK = scale · dSᵀ Q.", ways["right"].T @ q),
            *((messages[way], scale * ways[way].T @ q) for way in messages),
        ], hint="dK = scale · dSᵀ Q, the same dS as for dQ.")
    return True
