"""The FlashAttention algorithm in plain PyTorch: online softmax over blocks of keys.

A softmax needs the maximum and the sum of exponentials of a whole row before any weight
is known. The *online* softmax keeps, for each row, a running maximum ``m`` and a running
sum ``l = Σ exp(s - m)``; when a new block of scores raises the maximum to ``m'``, the old
sum (and the old weighted sum of values) is rescaled by ``exp(m - m')``. One pass over the
key blocks then gives exactly the attention output, while only one ``block_q × block_k``
tile of scores exists at a time.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from attn_course import _validate
from attn_course.flash.tiled_backward import tiled_attention_backward

__all__ = ["online_softmax", "merge_softmax_blocks", "merge_attention_outputs", "tiled_attention",
           "TiledAttentionFunction"]


def merge_softmax_blocks(
    max_a: torch.Tensor, sum_a: torch.Tensor, max_b: torch.Tensor, sum_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the softmax statistics of two blocks of the same rows.

    Block ``a`` has maximum ``max_a`` and ``sum_a = Σ exp(s - max_a)``; likewise ``b``. The
    merged maximum is ``m = max(max_a, max_b)`` and the merged sum rescales each part:
    ``sum_a · exp(max_a - m) + sum_b · exp(max_b - m)``. Rows where both maxima are ``-inf``
    (nothing seen yet) keep a sum of 0.

    Returns:
        ``(max, sum)`` of the union of the two blocks, same shapes as the inputs.
    """
    merged_max = torch.maximum(max_a, max_b)
    safe_max = merged_max.masked_fill(merged_max == float("-inf"), 0.0)   # avoid -inf - (-inf)
    merged_sum = sum_a * torch.exp(max_a - safe_max) + sum_b * torch.exp(max_b - safe_max)
    return merged_max, merged_sum


def merge_attention_outputs(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attentions of the same queries over disjoint sets of keys into attention over both.

    ``out_a`` is the softmax-weighted mix of the values of key set ``a`` and ``lse_a`` its
    log-sum-exp, ``log Σ_a exp(s)``; likewise ``b``. The log-sum-exp is a softmax's
    ``(max, sum)`` in one number (``max = lse``, ``sum = 1``), so :func:`merge_softmax_blocks`
    merges it: ``lse = log(exp(lse_a) + exp(lse_b))``. Each output was normalised by its own
    sum; renormalised by the merged one it weighs ``exp(lse_a - lse)``:
    ``out = exp(lse_a - lse) · out_a + exp(lse_b - lse) · out_b``. Only differences of
    log-sum-exps are exponentiated, so large scores cannot overflow. A row where one side saw
    no key (``lse = -inf``) takes the other side as it is, whatever that side's output holds
    (zeros, even NaN); a row where neither saw a key gets output 0 and ``lse = -inf``.

    This is the step ring attention repeats at every hop of the ring
    (:func:`~attn_course.distributed.ring.ring_attention`), and chapter 06's exercise
    (:func:`~attn_course.checks.flash.check_merge_partial_attention`).

    Args:
        out_a: ``[..., N, d_v]``, attention over key set ``a``.
        lse_a: ``[..., N]``, the natural log-sum-exp of each row's scaled scores over ``a``
            (``-inf`` where the row saw no key of ``a``).
        out_b, lse_b: the same over key set ``b``, shaped like ``out_a`` and ``lse_a``.

    Returns:
        ``(out [..., N, d_v], lse [..., N])``: attention over both key sets and its log-sum-exp,
        in the inputs' dtype.

    Raises:
        TypeError: inputs that are not floating tensors of one dtype.
        ValueError: ``out_a``/``out_b`` of different shapes, ``lse_a``/``lse_b`` not
            ``out_a.shape[:-1]``, tensors on different devices.

    Example:
        >>> q, k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 10, 4), torch.randn(1, 1, 10, 4)
        >>> def part(keys):
        ...     s = q @ k[:, :, keys].transpose(-2, -1) / 2.0            # scale 1 / sqrt(4)
        ...     return torch.softmax(s, -1) @ v[:, :, keys], torch.logsumexp(s, -1)
        >>> out, lse = merge_attention_outputs(*part(slice(0, 6)), *part(slice(6, 10)))
        >>> torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-6)
        True
    """
    where = "merge_attention_outputs"
    for name, value in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        _validate.floating_tensor(where, name, value, min_dim=1 if name.startswith("lse") else 2)
    _validate.same_dtype_and_device(where, out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b)
    if out_a.shape != out_b.shape:
        raise ValueError(f"{where}: out_a and out_b must have one shape [..., N, d_v], got "
                         f"{_validate.shape_str(out_a)} and {_validate.shape_str(out_b)}")
    for name, value in (("lse_a", lse_a), ("lse_b", lse_b)):
        if value.shape != out_a.shape[:-1]:
            raise ValueError(f"{where}: {name} must be out_a's shape without its last dimension, "
                             f"{list(out_a.shape[:-1])}, got {_validate.shape_str(value)}")
    # The merged log-sum-exp: (max, sum) = (lse, 1) on each side, merged as chapter 06 merges blocks.
    ones = torch.ones_like(lse_a)
    merged_max, merged_sum = merge_softmax_blocks(lse_a, ones, lse_b, ones)
    lse = merged_max + torch.log(merged_sum)                                 # -inf where both are empty
    # Renormalise each side by the merged sum: weight exp(lse_side - lse), 0 for an empty side.
    safe_lse = lse.masked_fill(lse == float("-inf"), 0.0)                    # avoid -inf - (-inf)
    weight_a = torch.exp(lse_a - safe_lse).unsqueeze(-1)                     # [..., N, 1]
    weight_b = torch.exp(lse_b - safe_lse).unsqueeze(-1)
    part_a = torch.where(weight_a > 0, weight_a * out_a, 0.0)               # an empty side adds nothing
    part_b = torch.where(weight_b > 0, weight_b * out_b, 0.0)
    return part_a + part_b, lse


def online_softmax(scores: torch.Tensor, *, block_size: int = 4) -> torch.Tensor:
    """Softmax over the last dimension, computed by streaming over blocks of it.

    The statistics (maximum and sum of exponentials) come from one pass over the blocks with
    :func:`merge_softmax_blocks`; the weights then need one more pass. FlashAttention folds
    that second pass into the weighted sum of values (:func:`tiled_attention`).

    Args:
        scores: ``[..., N]``.
        block_size: how many scores are looked at per step.

    Returns:
        ``[..., N]``, equal to ``torch.softmax(scores, -1)`` up to round-off.

    Raises:
        TypeError, ValueError: scores not floating with at least one entry per row, or a
            block size below 1.

    Example:
        >>> s = torch.tensor([1.0, 3.0, 2.0, 5.0, 0.0])
        >>> torch.allclose(online_softmax(s, block_size=2), torch.softmax(s, -1))
        True
    """
    where = "online_softmax"
    scores = _validate.floating_tensor(where, "scores", scores, min_dim=1)
    block_size = _validate.integer(where, "block_size", block_size, minimum=1)
    if scores.shape[-1] == 0:
        raise ValueError(f"{where}: scores must have at least one entry per row, got {_validate.shape_str(scores)}")
    running_max = torch.full(scores.shape[:-1], float("-inf"), dtype=scores.dtype, device=scores.device)
    running_sum = torch.zeros_like(running_max)
    for start in range(0, scores.shape[-1], block_size):
        block = scores[..., start : start + block_size]                      # [..., block]
        block_max = block.amax(dim=-1)
        block_sum = torch.exp(block - block_max.unsqueeze(-1)).sum(dim=-1)
        running_max, running_sum = merge_softmax_blocks(running_max, running_sum, block_max, block_sum)
    return torch.exp(scores - running_max.unsqueeze(-1)) / running_sum.unsqueeze(-1)


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    block_q: int = 64,
    block_k: int = 64,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact attention, one ``block_q × block_k`` tile of scores at a time (FlashAttention).

    For each block of queries, walk over the blocks of keys keeping per row the running
    maximum ``m``, the running sum ``l`` and the unnormalised output ``acc``; a new block
    rescales the old ``l`` and ``acc`` by ``exp(m_old - m_new)``. With ``causal``, key blocks
    entirely in the future of a query block are skipped.

    When an input requires a gradient, the same loop runs inside
    :class:`TiledAttentionFunction`, which keeps only the
    output and the log-sum-exp and recomputes each tile of weights in the backward pass
    (FlashAttention-2's backward): training memory grows as N, not N².

    Args:
        q: ``[B, H, N_q, d]``.
        k: ``[B, H, N_k, d]``.
        v: ``[B, H, N_k, d_v]``.
        causal: query ``i`` sees keys ``0..i + N_k - N_q``: the queries are the last ``N_q`` of the
            ``N_k`` positions, as after a KV cache (bottom-right aligned, as in
            :func:`~attn_course.flash.flash_attention`; requires ``N_q <= N_k``; with ``N_q == N_k``
            the usual ``0..i``).
        scale: defaults to ``1 / sqrt(d)``.
        block_q, block_k: tile sizes.
        return_lse: also return the log-sum-exp of each row's scaled scores, ``[B, H, N_q]``
            (what the backward pass of FlashAttention keeps instead of the weights).

    Returns:
        ``output [B, H, N_q, d_v]``, or ``(output, lse)``.

    Raises:
        TypeError, ValueError: inputs that are not 4-D floating tensors of one dtype and
            device with matching sizes, ``causal`` with ``N_q > N_k``, a bad scale or block size.

    Example:
        >>> q = k = v = torch.randn(1, 2, 100, 16)
        >>> out = tiled_attention(q, k, v, causal=True, block_q=32, block_k=32)
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> torch.allclose(out, ref, atol=1e-5)
        True
    """
    where = "tiled_attention"
    scale = _validate.attention_inputs(where, q, k, v, causal=causal, scale=scale)
    n_q, n_k = q.shape[2], k.shape[2]
    block_q = _validate.integer(where, "block_q", block_q, minimum=1)
    block_k = _validate.integer(where, "block_k", block_k, minimum=1)
    return_lse = _validate.boolean(where, "return_lse", return_lse)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        # Training: keep O and the log-sum-exp only; the backward recomputes the tiles.
        output, lse = TiledAttentionFunction.apply(q, k, v, causal, scale, block_q, block_k)
        return (output, lse) if return_lse else output

    outputs, lses = [], []
    for q_start in range(0, n_q, block_q):
        q_block = q[:, :, q_start : q_start + block_q]                       # [B, H, bq, d]
        rows = q_block.shape[2]
        row_max = q.new_full((*q.shape[:2], rows), float("-inf"))             # m: [B, H, bq]
        row_sum = q.new_zeros((*q.shape[:2], rows))                           # l: [B, H, bq]
        acc = q.new_zeros((*q.shape[:2], rows, v.shape[-1]))                  # [B, H, bq, d_v]
        # Query i sits at position i + N_k - N_q of the text; causal, it sees no key after that.
        first_position = q_start + n_k - n_q
        k_end = min(n_k, first_position + rows) if causal else n_k            # skip the future
        for k_start in range(0, k_end, block_k):
            # Load a tile of scores: the only N-by-N-sized thing, block_q × block_k of it.
            scores = q_block @ k[:, :, k_start : k_start + block_k].transpose(-2, -1) * scale  # [B, H, bq, bk]
            if causal:
                query_pos = torch.arange(first_position, first_position + rows, device=q.device)[:, None]
                key_pos = torch.arange(k_start, k_start + scores.shape[-1], device=q.device)[None, :]
                scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
            # Update the running maximum; rows that have seen nothing yet stay at -inf.
            new_max = torch.maximum(row_max, scores.amax(dim=-1))
            safe_max = new_max.masked_fill(new_max == float("-inf"), 0.0)
            # Rescale what was accumulated under the old maximum, then add this tile.
            correction = torch.exp(row_max - safe_max)                        # [B, H, bq]
            probabilities = torch.exp(scores - safe_max.unsqueeze(-1))        # [B, H, bq, bk]
            row_sum = row_sum * correction + probabilities.sum(dim=-1)
            acc = acc * correction.unsqueeze(-1) + probabilities @ v[:, :, k_start : k_start + block_k]
            row_max = new_max
        # Normalise once at the end; l > 0 for every row that saw at least one key.
        outputs.append(acc / row_sum.clamp_min(torch.finfo(row_sum.dtype).tiny).unsqueeze(-1))
        lses.append(row_max + torch.log(row_sum))
    output = torch.cat(outputs, dim=2)                                        # [B, H, N_q, d_v]
    return (output, torch.cat(lses, dim=2)) if return_lse else output


class TiledAttentionFunction(torch.autograd.Function):
    """Tiled attention whose backward recomputes the weights tile by tile (FlashAttention-2).

    ``TiledAttentionFunction.apply(q, k, v, causal, scale, block_q, block_k)`` returns
    ``(output, lse)`` like ``tiled_attention(..., return_lse=True)``; both may receive
    gradients. Saved for the backward: ``q``, ``k``, ``v``, the output and the log-sum-exp,
    nothing of size ``N_q × N_k``. :func:`~attn_course.flash.tiled_attention` calls it
    whenever one of its inputs requires a gradient.

    Args (of ``apply``):
        q: ``[B, H, N_q, d]``; k: ``[B, H, N_k, d]``; v: ``[B, H, N_k, d_v]``.
        causal: query ``i`` sees keys ``0..i + N_k - N_q`` (``N_q <= N_k``).
        scale: a positive float, or ``None`` for ``1 / sqrt(d)``.
        block_q, block_k: tile sizes, ``>= 1``.

    Returns:
        ``(output [B, H, N_q, d_v], lse [B, H, N_q])``.

    Raises:
        TypeError, ValueError: as :func:`~attn_course.flash.tiled_attention` does.

    Example:
        >>> q, k, v = (torch.randn(1, 2, 70, 16, requires_grad=True) for _ in range(3))
        >>> out, lse = TiledAttentionFunction.apply(q, k, v, True, None, 32, 32)
        >>> out.sum().backward()
        >>> q.grad.shape
        torch.Size([1, 2, 70, 16])
    """

    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None, block_q=64, block_k=64):
        scale = _validate.attention_inputs("TiledAttentionFunction", q, k, v, causal=causal, scale=scale)
        with torch.no_grad():                                  # the loop runs once, untracked
            output, lse = tiled_attention(q, k, v, causal=causal, scale=scale, block_q=block_q,
                                          block_k=block_k, return_lse=True)
        ctx.save_for_backward(q, k, v, output, lse)            # O(N) per (batch, head)
        ctx.options = (causal, scale, block_q, block_k)
        return output, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output, grad_lse):
        q, k, v, output, lse = ctx.saved_tensors
        causal, scale, block_q, block_k = ctx.options
        dq, dk, dv = tiled_attention_backward(q, k, v, output, lse, grad_output, grad_lse, causal=causal,
                                              scale=scale, block_q=block_q, block_k=block_k)
        return dq, dk, dv, None, None, None, None
