"""Checks for chapter 06's exercises (FlashAttention), each naming the mistake it recognises.

* :func:`check_merge_partial_attention`: merge two attentions over disjoint sets of keys from
  their outputs and log-sum-exps.
* :func:`check_causal_tile_counts`: predict how many tiles causal tiled attention computes, and
  how many of those need the mask.
* :func:`check_streaming_attention`: the corrected online-softmax loop of the find-the-bug exercise.
* :func:`check_rescale_kernel`: a small Triton kernel whose rescaling step the student wrote.
* :func:`check_attention_backward`: dQ, dK, dV from the output and the log-sum-exp.

Each returns ``True`` or raises :class:`~attn_course.checks.diagnosis.CheckFailed`. The expected
answers come from PyTorch (SDPA, ``torch.logsumexp``, autograd in float64) or, for the tile count,
from walking the tiles as :func:`~attn_course.flash.tiled_attention` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attn_course.checks.diagnosis import CheckFailed, call_answer, check_close, watched
from attn_course.checks.forbidden import Forbidden

__all__ = ["check_merge_partial_attention", "check_causal_tile_counts", "check_streaming_attention",
           "check_rescale_kernel", "check_attention_backward"]

LOG2_E = 1.4426950408889634


def _tensors(result: object, count: int, names: str) -> tuple[torch.Tensor, ...]:
    if not isinstance(result, (tuple, list)) or len(result) != count:
        raise CheckFailed(f"Your function should return {count} tensors, ({names}), but it returned "
                          f"{type(result).__name__}"
                          + (f" of length {len(result)}." if isinstance(result, (tuple, list)) else "."))
    for name, value in zip(names.split(", "), result):
        if not isinstance(value, torch.Tensor):
            raise CheckFailed(f"Your {name} should be a torch.Tensor, but it is a {type(value).__name__}.")
    return tuple(result)


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


#: What chapter 06's merge exercise may not call: the merges the course already has.
MERGE_RULES = (
    Forbidden("attn_course.flash.tiled.merge_attention_outputs",
              "the exercise is to write the merge yourself"),
    Forbidden("attn_course.flash.tiled.merge_softmax_blocks",
              "the exercise is to write the merge yourself"),
)


# --- 1. merging two partial attentions --------------------------------------------------------

def check_merge_partial_attention(merge: Callable) -> bool:
    """Check ``merge(out_a, lse_a, out_b, lse_b) -> (out, lse)``.

    ``out_a [B, H, N, d_v]`` and ``lse_a [B, H, N]`` are attention over one set of keys, ``b``
    over another; the answer must equal attention over both (``F.scaled_dot_product_attention``)
    and its log-sum-exp (``torch.logsumexp`` of all the scores). The last case has scores near
    ±300, where ``exp(lse)`` overflows float32.

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
        got_out, got_lse = _tensors(call_answer("check_merge_partial_attention", merge, out_a, lse_a, out_b, lse_b,
                                                described=described), 2, "out, lse")
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


# --- 2. predicting the tiles of causal tiled attention ----------------------------------------

def _walk_tiles(n: int, block_q: int, block_k: int) -> tuple[int, int]:
    """(computed, masked) tile pairs of causal ``tiled_attention``, walked as its loops walk them."""
    computed = masked = 0
    for q_start in range(0, n, block_q):
        rows = min(block_q, n - q_start)
        for k_start in range(0, min(n, q_start + rows), block_k):
            computed += 1
            last_key = min(k_start + block_k, n) - 1
            masked += last_key > q_start           # some key of the tile is after some query
    return computed, masked


def _square_only(n, block_q, block_k):
    return _walk_tiles(n, block_q, block_q)


def _full_tiles_only(n, block_q, block_k):
    return _walk_tiles((n // block_q) * block_q, block_q, block_k) if n >= block_q else (0, 0)


def _diagonal_only(n, block_q, block_k):
    return _walk_tiles(n, block_q, block_k)[0], math.ceil(n / block_q)


#: What chapter 06's tile prediction may not call: the code that walks or counts the tiles.
TILE_COUNT_RULES = (
    Forbidden("attn_course.flash.tiled.tiled_attention",
              "the statement asks you not to call tiled_attention: count the tiles yourself"),
    Forbidden("attn_course.teaching.flash_diagrams.tile_counts",
              "the exercise is to count the tiles yourself"),
    Forbidden("attn_course.teaching.flash_diagrams.tile_kinds",
              "the exercise is to count the tiles yourself"),
    Forbidden("attn_course.teaching.flash_diagrams.tile_schedule",
              "the exercise is to count the tiles yourself"),
)


def check_causal_tile_counts(counts: Callable) -> bool:
    """Check ``counts(n, block_q, block_k) -> (computed, masked)`` for causal ``tiled_attention``.

    ``computed`` is the number of (query tile, key tile) pairs the causal loop computes,
    ``masked`` how many of those hold at least one future key (the mask changes something there).
    Cases include ``block_q != block_k`` and ``n`` not a multiple of either.

    Raises:
        CheckFailed: naming the mistake (tiles taken square, the partial last tile forgotten, only
            the diagonal tiles counted as masked, the two numbers swapped), else the case that is wrong.

    Example (a wrong answer, and what it is told):
        >>> check_causal_tile_counts(lambda n, block_q, block_k: (n // block_q * (n // block_q + 1) // 2, n // block_q))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You forgot the last, partial query tile: with n = 300 and block_q ...
    """
    counts = watched("check_causal_tile_counts", counts, TILE_COUNT_RULES)
    cases = [(512, 64, 64), (300, 64, 64), (256, 128, 64), (1000, 128, 64), (200, 32, 128), (100, 64, 32)]
    wrong_ways = [
        ("You used block_q for the key tiles too: with block_q = {bq} and block_k = {bk} the key tiles are "
         "{bk} wide.", _square_only),
        ("You forgot the last, partial query tile: with n = {n} and block_q = {bq} there are "
         "ceil(n / block_q) = {tiles} query tiles.", _full_tiles_only),
        ("You counted one masked tile per query tile (the diagonal), but when block_k < block_q several key "
         "tiles of a query tile reach past its first query, and when block_k > block_q the diagonal tile "
         "may be the only one.", _diagonal_only),
    ]
    for n, bq, bk in cases:
        expected = _walk_tiles(n, bq, bk)
        result = call_answer("check_causal_tile_counts", counts, n, bq, bk)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise CheckFailed(f"Your function should return two ints, (computed, masked), but it returned "
                              f"{type(result).__name__}.")
        try:
            got = tuple(int(x) for x in result)
        except (TypeError, ValueError):
            raise CheckFailed("Your function should return two ints, (computed, masked).") from None
        if got == expected:
            continue
        if got == expected[::-1]:
            raise CheckFailed("You returned (masked, computed): the first number is the tiles computed.")
        for message, wrong in wrong_ways:
            if got == wrong(n, bq, bk) and wrong(n, bq, bk) != expected:
                raise CheckFailed(message.format(n=n, bq=bq, bk=bk, tiles=math.ceil(n / bq)))
        raise CheckFailed(f"For n = {n}, block_q = {bq}, block_k = {bk} you said {got}, but causal tiled attention "
                          f"computes {expected[0]} tile pairs, {expected[1]} of them with a masked entry. Walk its "
                          f"loops: query tiles of block_q rows, then key tiles up to the tile's last query.")
    return True


# --- 3. the corrected streaming attention -----------------------------------------------------

def _stream(q, k, v, block, *, rescale_acc=True, rescale_sum=True, base2=False, update_max=True):
    """The online-softmax loop with one of its steps optionally left out (the mistakes)."""
    scale = 1 / math.sqrt(q.shape[-1]) * (LOG2_E if base2 else 1.0)
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


def _stream_mistakes(q, k, v, block, *, kernel=False):
    mistakes = [
        ("When a tile raises the running maximum, what was accumulated so far was weighted against the old "
         "maximum: rescale the accumulated output by the correction too.", dict(rescale_acc=False)),
        ("The running sum must be rescaled by the correction, like the accumulated output: "
         "l = l · correction + rowsum(weights).", dict(rescale_sum=False)),
        ("Your output is attention over the last tile of keys only: the running maximum is never updated "
         "(m_i = m_new), so the correction exp(m_i - m_new) wipes out every earlier tile.", dict(update_max=False)),
    ]
    if kernel:
        mistakes.append(("The scores were multiplied by log2(e) = 1.4427 (base 2): use tl.exp2, not tl.exp, so that "
                         "exp2(s · log2 e) = e^s.", dict(base2=True)))
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
    """Check ``attention(q, k, v, block) -> [N_q, d_v]``, the online-softmax loop, against SDPA.

    Cases put each row's largest score in a late block, use a last block that is only partly
    filled, and one block that holds every key.

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
                    hint="compare your loop with the four steps of section 4, one by one.")
    return True


# --- 4. the Triton kernel's rescaling step ----------------------------------------------------

def check_rescale_kernel(kernel: object) -> bool:
    """Check a one-program Triton attention kernel against SDPA (see :mod:`attn_course.flash.small_kernel`).

    The kernel runs on the GPU or in Triton's interpreter, for 16 queries against 40 keys in tiles
    of 16 (the last one partial) with the largest scores in the last tile, then against 16 keys
    (one tile), then 32 queries against 70 keys.

    Raises:
        CheckFailed: the kernel crashes or returns NaN (a step left out), or names the mistake
            (``tl.exp`` instead of ``tl.exp2``, the accumulator or the sum not rescaled, the maximum
            not updated), else the first entry that differs.
    """
    from attn_course.flash.small_kernel import launch_small_attention  # imports Triton

    generator = torch.Generator().manual_seed(64)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for n_q, n_k, d in ((16, 40, 16), (16, 16, 16), (32, 70, 16)):
        q, k, v = (torch.randn(n, d, generator=generator) for n in (n_q, n_k, n_k))
        k[-n_k // 4:] *= 3                                    # the largest scores come late
        got = call_answer("check_rescale_kernel", launch_small_attention, kernel, q.to(device), k.to(device),
                          v.to(device), described=f"q [{n_q}, {d}], k and v [{n_k}, {d}], BLOCK_N = 16").cpu()
        if torch.isnan(got).any():
            raise CheckFailed("Your kernel's output holds NaN: a step of the update is missing (every one of m_i, l_i "
                              "and acc must be updated in each tile), or a correction computes -inf - (-inf).")
        check_close(got, F.scaled_dot_product_attention(q, k, v), what="Your kernel's output",
                    mistakes=_stream_mistakes(q, k, v, 16, kernel=True),
                    hint="compare each line of your update with step 5 of the forward kernel, in base 2.")
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


# --- 5. the backward pass from the output and the log-sum-exp ---------------------------------

def check_attention_backward(backward: Callable) -> bool:
    """Check ``backward(q, k, v, out, lse, grad_out) -> (dq, dk, dv)`` against autograd in float64.

    ``q [N_q, d]``, ``k [N_k, d]``, ``v [N_k, d_v]``, scale ``1/√d``, no mask; ``out`` and ``lse``
    come from the forward pass, ``grad_out`` is ``dO [N_q, d_v]``. ``N_q != N_k`` in every case.

    Raises:
        CheckFailed: naming the mistake (Δ left out, Δ as rowsum(dP), P without the log-sum-exp,
            the scale left out of dQ and dK), else what differs.

    Example (a wrong answer, and what it is told):
        >>> def backward(q, k, v, out, lse, grad_out):
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
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        scores = _scores(leaves[0], leaves[1])
        out = torch.softmax(scores, -1) @ leaves[2]
        out.backward(grad_out)
        expected = [t.grad for t in leaves]
        out, lse = out.detach(), torch.logsumexp(scores.detach(), -1)
        got = _tensors(call_answer("check_attention_backward", backward, q, k, v, out, lse, grad_out,
                                   described=f"q [{n_q}, {d}], k [{n_k}, {d}], v [{n_k}, {d_v}], out, lse, grad_out"),
                       3, "dq, dk, dv")
        scale = 1 / math.sqrt(d)
        s = q @ k.T * scale
        p, grad_p = torch.exp(s - lse[:, None]), grad_out @ v.T
        delta = (grad_out * out).sum(-1, keepdim=True)
        ways = {"no delta": p * grad_p, "delta of dP": p * (grad_p - grad_p.sum(-1, keepdim=True)),
                "right": p * (grad_p - delta)}
        p_raw = torch.exp(s)
        wrong_dq = [
            ("Your dQ leaves out Δ: the softmax's backward is dS = P ∘ (dP - Δ) with Δ_i = Σ_j P_ij dP_ij, "
             "which equals rowsum(dO ∘ O).", scale * ways["no delta"] @ k),
            ("Your Δ is rowsum(dP), but it is Σ_j P_ij dP_ij, the weighted sum, which equals rowsum(dO ∘ O).",
             scale * ways["delta of dP"] @ k),
            ("Your dQ is missing the scale: S = scale · Q Kᵀ, so dQ = scale · dS K.", ways["right"] @ k),
            ("Your weights were recomputed as exp(S) without the log-sum-exp: P = exp(S - LSE), which is the "
             "softmax (rows sum to one).", scale * (p_raw * (grad_out @ v.T - (p_raw * (grad_out @ v.T)).sum(
                 -1, keepdim=True))) @ k),
        ]
        check_close(got[2], expected[2], what="Your dv", mistakes=[
            ("Your dV uses exp(S) as the weights: recompute P = exp(S - LSE), the softmax.", p_raw.T @ grad_out),
        ], hint="dV = Pᵀ dO with P = exp(S - LSE).")
        check_close(got[0], expected[0], what="Your dq", mistakes=wrong_dq,
                    hint="dQ = scale · dS K with dS = P ∘ (dP - Δ).")
        check_close(got[1], expected[1], what="Your dk", mistakes=[
            ("Your dK is missing the scale: dK = scale · dSᵀ Q.", ways["right"].T @ q),
            ("Your dK leaves out Δ: dS = P ∘ (dP - Δ).", scale * ways["no delta"].T @ q),
        ], hint="dK = scale · dSᵀ Q, the same dS as for dQ.")
    return True
