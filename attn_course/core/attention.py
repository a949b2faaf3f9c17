"""Scaled dot-product attention: softmax(Q Kᵀ / √d_k) V.

The formula is a few lines, ``_scaled_dot_product``; the public functions check their inputs
once and call it: :func:`scaled_dot_product` as it is, :func:`self_attention` in float32 for
half-precision inputs, :func:`eager_attention` (the multi-head module's default backend) over
grouped heads. This is the course's reference implementation. Everything later (multi-head
attention, the causal language model, BERT, the FlashAttention kernels) is checked
against it, and it is itself checked against ``torch.nn.functional.
scaled_dot_product_attention`` and float64 math in ``tests/core/test_attention.py``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course.core.masks import causal_mask, check_mask, restrict_mask

__all__ = ["self_attention", "scaled_dot_product", "softmax_with_empty_rows", "eager_attention", "group_mask",
           "classic_self_attention"]


def self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                   scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, returning the output and the attention weights.

    Computes ``softmax(q @ kᵀ * scale + mask) @ v`` row by row: each query gets a
    probability distribution over the keys and receives the matching mix of values.
    It checks its inputs, then calls :func:`scaled_dot_product` (the formula itself) in
    float32 for float16/bfloat16 inputs, and casts the results back to their dtype.

    Args:
        q: queries, ``[..., N_q, d_k]``.
        k: keys, ``[..., N_k, d_k]``.
        v: values, ``[..., N_k, d_v]``. The batch dimensions (``...``) of ``q``,
            ``k`` and ``v`` broadcast against each other.
        mask: optional, broadcastable to ``[..., N_q, N_k]``. Boolean: ``True`` means
            "may attend" (the convention of ``F.scaled_dot_product_attention``).
            Floating: added to the scaled scores (use ``-inf`` to block a pair).
        scale: multiplies the scores; defaults to ``1 / sqrt(d_k)``.

    Returns:
        ``(output, attention_weights)``: ``output [..., N_q, d_v]`` and
        ``attention_weights [..., N_q, N_k]``, each row summing to 1.

        A query whose every key is masked (a *fully masked row*) gets all-zero
        weights and a zero output, never NaN. The widely copied version that fills
        masked scores with ``-1e9`` (:func:`classic_self_attention`) instead gives such
        a row *uniform* weights, silently averaging over keys it was told to ignore.

    Raises:
        TypeError: a non-tensor or integer input, or q, k, v of different dtypes.
        ValueError: d_k differing between q and k, N_k differing between k and v,
            batch dimensions or a mask that do not broadcast, inputs on different
            devices, or a scale that is not a positive finite number.

    Example:
        >>> q = k = v = torch.randn(2, 5, 8)            # [B, N, d]
        >>> output, attention_weights = self_attention(q, k, v)
        >>> output.shape, attention_weights.shape
        (torch.Size([2, 5, 8]), torch.Size([2, 5, 5]))
    """
    scale = _check_inputs("self_attention", q, k, v, mask, scale)
    return _self_attention(q, k, v, mask, scale)


def _self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`self_attention` on checked inputs: the formula, in float32 for half-precision inputs."""
    # Half precision loses too much in the exponentials and the sums: compute in float32.
    compute_dtype = torch.promote_types(q.dtype, torch.float32)
    if mask is not None and mask.is_floating_point():
        mask = mask.to(compute_dtype)
    output, attention_weights = _scaled_dot_product(
        q.to(compute_dtype), k.to(compute_dtype), v.to(compute_dtype), mask, scale
    )
    return output.to(q.dtype), attention_weights.to(q.dtype)


def scaled_dot_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                       scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula itself, ``softmax(q kᵀ · scale + mask) v``, in the inputs' own dtype.

    :func:`self_attention` checks its inputs, moves them to float32 (from float16 or
    bfloat16) and calls this. Called directly, nothing is upcast: float16 in, float16
    arithmetic throughout (chapter 02 shows what that costs).

    Args:
        q, k, v: ``[..., N_q, d_k]``, ``[..., N_k, d_k]``, ``[..., N_k, d_v]``, one dtype.
        mask: optional, broadcastable to ``[..., N_q, N_k]``; boolean (``True`` = may
            attend) or floating (added to the scaled scores).
        scale: multiplies the scores; defaults to ``1 / sqrt(d_k)``.

    Returns:
        ``(output [..., N_q, d_v], attention_weights [..., N_q, N_k])``; a fully masked
        row gets zero weights and a zero output.

    Raises:
        TypeError, ValueError: as :func:`self_attention`.

    Example:
        >>> q = k = v = torch.randn(5, 8)
        >>> torch.allclose(scaled_dot_product(q, k, v)[0], self_attention(q, k, v)[0])
        True
    """
    scale = _check_inputs("scaled_dot_product", q, k, v, mask, scale)
    return _scaled_dot_product(q, k, v, mask, scale)


def _scaled_dot_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula, on inputs that :func:`scaled_dot_product` or :func:`self_attention` checked once."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale          # [..., N_q, N_k]
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))          # blocked: weight 0
    elif mask is not None:
        scores = scores + mask.to(scores.dtype)                    # additive mask
    attention_weights = _softmax_with_empty_rows(scores)           # [..., N_q, N_k]
    output = torch.matmul(attention_weights, v)                    # [..., N_q, d_v]
    return output, attention_weights


def softmax_with_empty_rows(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension that maps a row of all ``-inf`` to all zeros.

    A plain softmax of such a row computes ``exp(-inf - (-inf)) = exp(nan)`` and
    returns NaN, which then spreads through every later layer. Here such a row's scores
    are replaced by zeros *before* the softmax (so no NaN arises, in the forward pass or
    in the gradient) and its weights by zeros after it.

    Args:
        scores: ``[..., N_k]``, floating; ``-inf`` marks a blocked key.

    Returns:
        ``[..., N_k]`` weights: each row sums to 1, or is all zeros if all its scores
        are ``-inf``.

    Raises:
        TypeError: scores not a floating-point tensor.
        ValueError: scores with no dimension.

    Example:
        >>> softmax_with_empty_rows(torch.tensor([[0.0, 0.0], [-math.inf, -math.inf]]))
        tensor([[0.5000, 0.5000],
                [0.0000, 0.0000]])
    """
    return _softmax_with_empty_rows(_validate.floating_tensor("softmax_with_empty_rows", "scores", scores, min_dim=1))


def _softmax_with_empty_rows(scores: torch.Tensor) -> torch.Tensor:
    """:func:`softmax_with_empty_rows` on checked scores."""
    if scores.shape[-1] == 0:  # no keys at all: every row is empty
        return torch.zeros_like(scores)
    empty_row = scores.amax(dim=-1, keepdim=True) == float("-inf")   # [..., N_q, 1]
    weights = torch.softmax(scores.masked_fill(empty_row, 0.0), dim=-1)
    return weights.masked_fill(empty_row, 0.0)


def group_mask(mask: torch.Tensor, kv_heads: int, groups: int) -> torch.Tensor:
    """``[B|1, H|1, N_q|1, N_k]`` to ``[B|1, H_kv|1, G|1, N_q|1, N_k]``, matching queries grouped by key/value head.

    Example:
        >>> group_mask(torch.ones(2, 6, 3, 5, dtype=torch.bool), kv_heads=2, groups=3).shape
        torch.Size([2, 2, 3, 3, 5])
    """
    if mask.shape[1] == 1:
        return mask.unsqueeze(2)
    return mask.unflatten(1, (kv_heads, groups))


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                    is_causal: bool = False, dropout: float = 0.0,
                    need_weights: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The course's attention over grouped heads, dropout on the weights: the ``"eager"`` backend
    of :mod:`attn_course.core.backends`, on inputs that the caller (the module) checked once.

    Args:
        q: ``[B, H, N_q, d]``; k, v: ``[B, H_kv, N_k, d]`` with ``H_kv`` dividing ``H``.
        mask: None or ``[B|1, H|1, N_q|1, N_k]`` (or ``[N_q, N_k]``), boolean or additive.
        is_causal: add the bottom-right causal mask (the queries are the last ``N_q`` positions).
        dropout: drop weights with this probability (and rescale, as ``nn.MultiheadAttention``).
        need_weights: return the weights.

    Returns:
        ``(output [B, H, N_q, d], weights [B, H, N_q, N_k] or None)``, the weights as used.

    Example:
        >>> q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)               # 4 query heads, 2 kv
        >>> output, weights = eager_attention(q, k, k, is_causal=True)
        >>> output.shape, weights.shape
        (torch.Size([1, 4, 3, 8]), torch.Size([1, 4, 3, 3]))
    """
    if is_causal:
        mask = restrict_mask(mask, causal_mask(q.shape[2], k.shape[2], device=q.device))   # queries are the newest
    # Grouped-query attention: view the H query heads as H_kv groups of G, so that each key/value
    # head broadcasts over its group instead of being copied G times.
    kv_heads, groups = k.shape[1], q.shape[1] // k.shape[1]
    q = q.unflatten(1, (kv_heads, groups))                            # [B, H_kv, G, N_q, d]
    k, v = k.unsqueeze(2), v.unsqueeze(2)                             # [B, H_kv, 1, N_k, d]
    if mask is not None and mask.dim() == 4:
        mask = group_mask(mask, kv_heads, groups)                     # [B|1, H_kv|1, G|1, N_q, N_k]
    output, weights = _self_attention(q, k, v, mask, 1.0 / math.sqrt(q.shape[-1]))   # [B, H_kv, G, N_q, d]
    if dropout > 0:
        weights = F.dropout(weights, p=dropout)                        # as torch: weights as used
        output = weights @ v
    return output.flatten(1, 2), (weights.flatten(1, 2) if need_weights else None)   # [B, H, N_q, d]


def classic_self_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook version of attention found in many tutorials, kept for comparison.

    It fills masked scores with ``-1e9`` instead of ``-inf`` and has no special case
    for fully masked rows, so such a row comes out *uniform*. In float16, whose
    largest value is 65504, ``-1e9`` cannot even be stored. Chapter 02 compares it
    with :func:`self_attention`; use that one in real code.

    Args:
        q, k, v: ``[..., N, d_k]`` queries, keys and values (floating point).
        mask: optional, ``0``/``False`` where attention is blocked.

    Returns:
        ``(output, attention_weights)`` as in :func:`self_attention`.

    Example:
        >>> q = k = v = torch.randn(1, 3, 4)
        >>> output, weights = classic_self_attention(q, k, v, torch.zeros(3, 3))
        >>> weights[0, 0]                               # blocked everywhere: uniform
        tensor([0.3333, 0.3333, 0.3333])
    """
    where = "classic_self_attention"
    for name, value in (("q", q), ("k", k), ("v", v)):
        _validate.floating_tensor(where, name, value, min_dim=2)
    if mask is not None:
        _validate.tensor(where, "mask", mask)
    d_k = q.size(-1)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    attention_weights = torch.softmax(scores, dim=-1)
    output = torch.matmul(attention_weights, v)
    return output, attention_weights


def _check_inputs(
    where: str, q: object, k: object, v: object, mask: object, scale: object
) -> float:
    """Every input check of :func:`self_attention`; returns the scale to use."""
    q = _validate.floating_tensor(where, "q", q, min_dim=2)
    k = _validate.floating_tensor(where, "k", k, min_dim=2)
    v = _validate.floating_tensor(where, "v", v, min_dim=2)
    _validate.same_dtype_and_device(where, q=q, k=k, v=v)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{where}: q and k must have the same last dimension d_k, got "
            f"q {_validate.shape_str(q)} (d_k={q.shape[-1]}) and "
            f"k {_validate.shape_str(k)} (d_k={k.shape[-1]})"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"{where}: k and v must have the same number of positions N_k (dimension -2), "
            f"got k {_validate.shape_str(k)} (N_k={k.shape[-2]}) and "
            f"v {_validate.shape_str(v)} (N_k={v.shape[-2]})"
        )
    batch = _validate.broadcast_batch(where, q=q.shape[:-2], k=k.shape[:-2], v=v.shape[:-2])
    if mask is not None:
        _check_mask(where, mask, q, (*batch, q.shape[-2], k.shape[-2]))
    if scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    return _validate.positive_finite(where, "scale", scale)


def _check_mask(where: str, mask: object, q: torch.Tensor, scores_shape: tuple) -> None:
    mask = check_mask(where, mask)
    if mask.device != q.device:
        raise ValueError(
            f"{where}: mask must be on the same device as q, got mask on {mask.device} "
            f"and q on {q.device}"
        )
    expected = "[" + ", ".join(str(size) for size in scores_shape) + "]"
    try:
        broadcast = _validate.broadcast_shapes(mask.shape, scores_shape)
    except ValueError:
        broadcast = None
    if broadcast != torch.Size(scores_shape):
        raise ValueError(
            f"{where}: mask of shape {_validate.shape_str(mask)} does not broadcast to the "
            f"scores' shape {expected} ([..., N_q, N_k])"
        )
