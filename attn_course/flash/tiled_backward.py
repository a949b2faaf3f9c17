"""FlashAttention's backward pass in plain PyTorch: training memory linear in N, on any device.

Autograd through :func:`~attn_course.flash.tiled_attention`'s loop would keep every tile of
weights it computed, ``N_q × N_k`` numbers per (batch, head) in all.
:class:`~attn_course.flash.TiledAttentionFunction` keeps only what FlashAttention-2 keeps: the
inputs, the output ``O`` and one log-sum-exp per row; its backward,
:func:`tiled_attention_backward`, walks the tiles again, recomputing
each tile of weights from the log-sum-exp, ``P = exp(S - LSE)``, and with ``dO`` the gradient
of the output and ``Δ = rowsum(dO ∘ O)``:

    dV += Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP - Δ),   dQ += scale · dS K,   dK += scale · dSᵀ Q.

Key tiles are the outer loop (each key tile's ``dK``, ``dV`` are summed over query tiles and
written once), query tiles the inner one, as in the FlashAttention-2 backward kernel.
"""

from __future__ import annotations

import torch

from attn_course import _validate

__all__ = ["tiled_attention_backward"]


def tiled_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    output: torch.Tensor,
    lse: torch.Tensor,
    grad_output: torch.Tensor | None,
    grad_lse: torch.Tensor | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    block_q: int = 64,
    block_k: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of attention from its output and log-sum-exp, one tile of weights at a time.

    Args:
        q: ``[B, H, N_q, d]``; k: ``[B, H, N_k, d]``; v: ``[B, H, N_k, d_v]``.
        output: ``[B, H, N_q, d_v]``, the attention output ``O``.
        lse: ``[B, H, N_q]``, the log-sum-exp of each row of scaled (masked) scores.
        grad_output: ``[B, H, N_q, d_v]``, ``dO``, or ``None`` for zeros.
        grad_lse: ``[B, H, N_q]``, the gradient of the log-sum-exp, or ``None`` for zeros.
        causal, scale, block_q, block_k: as in :func:`~attn_course.flash.tiled_attention`.

    Returns:
        ``(dq, dk, dv)``, shaped like ``q``, ``k``, ``v``.

    Raises:
        TypeError, ValueError: inputs not shaped, typed or placed as above, a bad scale or block size.

    Example:
        >>> q, k, v, g = (torch.randn(1, 1, 50, 8, dtype=torch.float64) for _ in range(4))
        >>> from attn_course.flash import tiled_attention
        >>> out, lse = tiled_attention(q, k, v, return_lse=True)
        >>> dq, dk, dv = tiled_attention_backward(q, k, v, out, lse, g, block_q=16, block_k=16)
        >>> q1, k1, v1 = (t.clone().requires_grad_() for t in (q, k, v))
        >>> torch.nn.functional.scaled_dot_product_attention(q1, k1, v1).backward(g)
        >>> torch.allclose(dq, q1.grad) and torch.allclose(dk, k1.grad) and torch.allclose(dv, v1.grad)
        True
    """
    where = "tiled_attention_backward"
    scale = _validate.attention_inputs(where, q, k, v, causal=causal, scale=scale)
    block_q = _validate.integer(where, "block_q", block_q, minimum=1)
    block_k = _validate.integer(where, "block_k", block_k, minimum=1)
    out_shape, row_shape = (*q.shape[:3], v.shape[-1]), tuple(q.shape[:3])
    for name, tensor, shape in (("output", output, out_shape), ("lse", lse, row_shape),
                                ("grad_output", grad_output, out_shape), ("grad_lse", grad_lse, row_shape)):
        if tensor is None and name in ("grad_output", "grad_lse"):
            continue
        tensor = _validate.floating_tensor(where, name, tensor)
        if tuple(tensor.shape) != shape or tensor.device != q.device:
            raise ValueError(f"{where}: {name} must be {list(shape)} on {q.device}, got "
                             f"{_validate.shape_str(tensor)} on {tensor.device}")
    n_q, n_k = q.shape[2], k.shape[2]
    if grad_output is None:
        grad_output = torch.zeros_like(output)
    # Δ_i = Σ_j P_ij dP_ij = dO_i · o_i: one dot product per row, no N_k-long sum.
    delta = (grad_output * output).sum(dim=-1).to(q.dtype)                     # [B, H, N_q]
    if grad_lse is not None:
        delta = delta - grad_lse.to(q.dtype)                                   # ∂LSE_i/∂S_ij = P_ij
    lse = lse.to(q.dtype)
    # A row that saw no key has LSE = -inf and no weights: keep exp(S - LSE) at 0, not NaN.
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))
    grad_output = grad_output.to(q.dtype)
    dq = torch.zeros_like(q)                                                   # [B, H, N_q, d]
    dk = torch.zeros_like(k)                                                   # [B, H, N_k, d]
    dv = torch.zeros_like(v)                                                   # [B, H, N_k, d_v]
    for k_start in range(0, n_k, block_k):
        # Load a tile of keys and values; its dK, dV accumulate over the query tiles.
        k_tile = k[:, :, k_start : k_start + block_k]                          # [B, H, bk, d]
        v_tile = v[:, :, k_start : k_start + block_k]                          # [B, H, bk, d_v]
        dk_tile, dv_tile = torch.zeros_like(k_tile), torch.zeros_like(v_tile)
        # Query i sits at position i + N_k - N_q of the text: causal, the query tiles before the
        # one that reaches k_start see none of this key tile.
        first_q = (max(k_start - (n_k - n_q), 0) // block_q) * block_q if causal else 0
        for q_start in range(first_q, n_q, block_q):
            q_tile = q[:, :, q_start : q_start + block_q]                      # [B, H, bq, d]
            rows = q_tile.shape[2]
            # Recompute the tile of weights from the log-sum-exp: P = exp(S - LSE).
            scores = q_tile @ k_tile.transpose(-2, -1) * scale                 # [B, H, bq, bk]
            if causal:
                first_position = q_start + n_k - n_q
                query_pos = torch.arange(first_position, first_position + rows, device=q.device)[:, None]
                key_pos = torch.arange(k_start, k_start + scores.shape[-1], device=q.device)[None, :]
                scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
            weights = torch.exp(scores - lse[:, :, q_start : q_start + rows, None])   # [B, H, bq, bk]
            # dV = Pᵀ dO, then dP = dO Vᵀ and the softmax's backward dS = P ∘ (dP - Δ).
            grad_out_tile = grad_output[:, :, q_start : q_start + rows]        # [B, H, bq, d_v]
            dv_tile += weights.transpose(-2, -1) @ grad_out_tile
            grad_weights = grad_out_tile @ v_tile.transpose(-2, -1)            # [B, H, bq, bk]
            grad_scores = weights * (grad_weights - delta[:, :, q_start : q_start + rows, None])
            # dQ and dK through S = scale · Q Kᵀ.
            dq[:, :, q_start : q_start + rows] += scale * (grad_scores @ k_tile)
            dk_tile += scale * (grad_scores.transpose(-2, -1) @ q_tile)
        dk[:, :, k_start : k_start + block_k] = dk_tile
        dv[:, :, k_start : k_start + block_k] = dv_tile
    return dq, dk, dv
