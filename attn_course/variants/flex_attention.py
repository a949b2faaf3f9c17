"""Attention variants as FlexAttention functions (``torch.nn.attention.flex_attention``, PyTorch 2.5+).

Most of today's variants change attention in only one of two places: *which* pairs may
attend (a mask: causal, a sliding window, sinks, documents packed in one sequence) or *how*
a score is adjusted before the softmax (ALiBi's distance penalty, Gemma 2's soft-capping).
FlexAttention takes exactly those two things as small Python functions:

* a ``mask_mod(b, h, q_idx, kv_idx) -> bool``: may query ``q_idx`` attend key ``kv_idx``
  (for batch ``b``, head ``h``)? ``create_block_mask`` evaluates it at every (query, key) pair
  (in PyTorch 2.13, eagerly, it builds the whole ``[B, H, N_q, N_k]`` boolean mask with
  ``create_mask``; only compiled, ``torch.compile(create_block_mask)``, does it avoid holding it),
  then cuts that mask into tiles of 128 × 128 and records each as empty, full or partial, so that
  a fused kernel skips the empty tiles and applies ``mask_mod`` only inside the partial ones (the
  same three kinds as chapter 07's Triton kernel; :func:`tile_kinds` reads them back);
* a ``score_mod(score, b, h, q_idx, kv_idx) -> score``: the scaled score ``q · k / sqrt(d)``
  after any change.

Under ``torch.compile`` PyTorch turns them into one fused FlashAttention-style kernel. Called
without it, as on this course's CPU, ``flex_attention`` computes the whole score matrix (with a
warning saying so): the same numbers, without the speed, which is what the checks here need.

Each factory below returns such a function, written from the variant's definition; the tests
check each against the package's own implementation of the same variant (:mod:`attn_course.core.masks`,
:mod:`attn_course.positions.alibi`, :func:`soft_capped_attention`). Queries are numbered from ``offset``
(the number of cached tokens before them; 0 without a cache), keys from 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_course import _validate
from attn_course.core.attention import softmax_with_empty_rows

__all__ = [
    "causal",
    "sliding_window",
    "attention_sinks",
    "documents",
    "alibi",
    "soft_capping",
    "soft_capped_attention",
    "flex_attend",
    "EMPTY",
    "PARTIAL",
    "FULL",
    "tile_kinds",
]

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _offset(where: str, offset: object) -> int:
    return _validate.integer(where, "offset", offset, minimum=0)


def causal(*, offset: int = 0) -> MaskMod:
    """``mask_mod``: query ``q`` (position ``offset + q``) sees keys ``kv <= offset + q``.

    Example:
        >>> mask_mod = causal()
        >>> bool(mask_mod(0, 0, torch.tensor(2), torch.tensor(3)))
        False
    """
    offset = _offset("causal", offset)

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset
    return mask_mod


def sliding_window(window: int, *, offset: int = 0) -> MaskMod:
    """``mask_mod``: causal, and only the last ``window`` keys (``offset + q - window < kv``), as
    :func:`~attn_course.variants.masks.sliding_window_mask`.

    Raises:
        TypeError, ValueError: ``window`` not an int ``>= 1``, a negative ``offset``.
    """
    window = _validate.integer("sliding_window", "window", window, minimum=1)
    offset = _offset("sliding_window", offset)

    def mask_mod(b, h, q_idx, kv_idx):
        position = q_idx + offset
        return (kv_idx <= position) & (kv_idx > position - window)
    return mask_mod


def attention_sinks(window: int, sinks: int, *, offset: int = 0) -> MaskMod:
    """``mask_mod``: the sliding window plus the first ``sinks`` keys, as
    :func:`~attn_course.variants.masks.attention_sink_mask` (StreamingLLM).

    Raises:
        TypeError, ValueError: ``window < 1``, ``sinks < 0``, ``sinks > window``, a negative ``offset``.
    """
    where = "attention_sinks"
    window = _validate.integer(where, "window", window, minimum=1)
    sinks = _validate.integer(where, "sinks", sinks, minimum=0)
    if sinks > window:
        raise ValueError(f"{where}: sinks must be at most window, got sinks={sinks}, window={window}")
    offset = _offset(where, offset)

    def mask_mod(b, h, q_idx, kv_idx):
        position = q_idx + offset
        return (kv_idx <= position) & ((kv_idx < sinks) | (kv_idx > position - window))
    return mask_mod


def documents(document_ids: torch.Tensor, *, causal: bool = False) -> MaskMod:
    """``mask_mod`` for packed sequences: a token sees only tokens of its own document, as
    :func:`~attn_course.variants.masks.document_mask`.

    Args:
        document_ids: integer ``[B, N]`` (or ``[N]`` for every batch entry), the document of each token.
        causal: also hide later tokens.

    Raises:
        TypeError, ValueError: ``document_ids`` not a 1-D or 2-D integer tensor, ``causal`` not a bool.
    """
    where = "documents"
    document_ids = _validate.integer_tensor(where, "document_ids", document_ids)
    _validate.boolean(where, "causal", causal)
    if document_ids.dim() not in (1, 2):
        raise ValueError(f"{where}: document_ids must be [N] or [B, N], got {_validate.shape_str(document_ids)}")
    ids = document_ids if document_ids.dim() == 2 else document_ids.unsqueeze(0)          # [B | 1, N]
    per_batch = ids.shape[0] > 1

    def mask_mod(b, h, q_idx, kv_idx):
        row = ids[b] if per_batch else ids[0]
        same = row[q_idx] == row[kv_idx]
        return same & (kv_idx <= q_idx) if causal else same
    return mask_mod


def alibi(slopes: torch.Tensor, *, offset: int = 0) -> ScoreMod:
    """``score_mod``: ALiBi's ``score - m_h · (position - kv)`` with the per-head ``slopes``
    (:func:`~attn_course.positions.alibi.alibi_slopes`).

    Raises:
        TypeError, ValueError: ``slopes`` not a floating 1-D tensor, a negative ``offset``.
    """
    slopes = _validate.tensor("alibi", "slopes", slopes)
    if not slopes.is_floating_point() or slopes.dim() != 1:
        raise TypeError(f"alibi: slopes must be a floating [H] tensor, got {_validate.shape_str(slopes)} "
                        f"{slopes.dtype}")
    offset = _offset("alibi", offset)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx - offset)
    return score_mod


def soft_capping(cap: float) -> ScoreMod:
    """``score_mod``: Gemma 2's ``cap · tanh(score / cap)``, which keeps every score in ``(-cap, cap)``.

    Raises:
        TypeError, ValueError: ``cap`` not a positive finite number.
    """
    cap = _validate.positive_finite("soft_capping", "cap", cap)

    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return score_mod


def soft_capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, cap: float,
                          mask: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Attention with Gemma 2's logit soft-capping, written out: ``softmax(cap · tanh(s / cap)) v``.

    ``s = q kᵀ · scale`` are the scaled scores. Gemma 2 (Gemma Team, 2024) caps attention logits at
    50 (``attn_logit_softcapping`` in its Hugging Face config): large scores are squashed smoothly
    instead of growing without bound, which its authors found to stabilise training.

    Args:
        q, k, v: ``[..., N_q, d]``, ``[..., N_k, d]``, ``[..., N_k, d_v]``.
        cap: the cap, a positive number.
        mask: optional boolean, broadcastable to ``[..., N_q, N_k]``, ``True`` = may attend.
        scale: defaults to ``1 / sqrt(d)``.

    Returns:
        ``[..., N_q, d_v]``.

    Raises:
        TypeError, ValueError: non-floating or mismatched inputs, a non-boolean mask, a bad ``cap`` or ``scale``.

    Example:
        >>> q = k = v = torch.randn(4, 8)
        >>> soft_capped_attention(q, k, v, cap=50.0).shape
        torch.Size([4, 8])
    """
    where = "soft_capped_attention"
    cap = _validate.positive_finite(where, "cap", cap)
    for name, value in (("q", q), ("k", k), ("v", v)):
        _validate.floating_tensor(where, name, value, min_dim=2)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{where}: expected q [..., N_q, d], k [..., N_k, d], v [..., N_k, d_v], got q "
                         f"{_validate.shape_str(q)}, k {_validate.shape_str(k)}, v {_validate.shape_str(v)}")
    scale = q.shape[-1] ** -0.5 if scale is None else _validate.positive_finite(where, "scale", scale)
    scores = cap * torch.tanh((q @ k.transpose(-2, -1)) * scale / cap)                     # [..., N_q, N_k]
    if mask is not None:
        mask = _validate.tensor(where, "mask", mask)
        if mask.dtype != torch.bool:
            raise TypeError(f"{where}: mask must be boolean (True = may attend), got {mask.dtype}")
        scores = scores.masked_fill(~mask, float("-inf"))
    return softmax_with_empty_rows(scores) @ v


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask_mod: MaskMod | None = None,
                score_mod: ScoreMod | None = None, scale: float | None = None) -> torch.Tensor:
    """Run ``torch.nn.attention.flex_attention`` with a ``mask_mod`` and/or a ``score_mod``.

    Builds the block mask from ``mask_mod`` (``create_block_mask`` on the inputs' device) and calls
    ``flex_attention``. Without ``torch.compile`` PyTorch warns that it materialises the scores.

    Args:
        q: ``[B, H, N_q, d]``; k, v: ``[B, H, N_k, d]`` (FlexAttention's layout).
        mask_mod, score_mod: from the factories of this module, or your own.
        scale: defaults to ``1 / sqrt(d)``.

    Returns:
        ``[B, H, N_q, d]``.

    Raises:
        TypeError, ValueError: inputs that are not 4-D tensors of one dtype, mods that are not callable.

    Example:
        >>> q = k = v = torch.randn(1, 2, 16, 8)
        >>> out = flex_attend(q, k, v, mask_mod=causal())          # doctest: +SKIP
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    where = "flex_attend"
    _validate.four_d(where, q=q, k=k, v=v)
    for name, mod in (("mask_mod", mask_mod), ("score_mod", score_mod)):
        if mod is not None and not callable(mod):
            raise TypeError(f"{where}: {name} must be callable or None, got {type(mod).__name__}")
    if scale is not None:
        scale = _validate.positive_finite(where, "scale", scale)
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, q.shape[0], q.shape[1], q.shape[2], k.shape[2], device=q.device)
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


#: The kinds of tile :func:`tile_kinds` reports: no pair may attend, some may, all may.
EMPTY, PARTIAL, FULL = 0, 1, 2


def tile_kinds(block_mask) -> torch.Tensor:
    """Which tiles of a FlexAttention ``BlockMask`` are empty, partial or full.

    A ``BlockMask`` stores, for each row of query tiles, the key tiles to visit in two lists: the
    partial ones (``kv_num_blocks``, ``kv_indices``: ``mask_mod`` must be applied inside) and the
    full ones (``full_kv_num_blocks``, ``full_kv_indices``: every pair may attend). A tile in
    neither list is empty and is skipped. This reads both lists back into one grid.

    Args:
        block_mask: a ``torch.nn.attention.flex_attention.BlockMask`` (from ``create_block_mask``).

    Returns:
        ``[B, H, N_q / tile, N_k / tile]`` int64 tensor of :data:`EMPTY` (0), :data:`PARTIAL` (1) and
        :data:`FULL` (2), on the CPU.

    Raises:
        TypeError: ``block_mask`` is not a ``BlockMask``.

    Example:
        >>> from torch.nn.attention.flex_attention import create_block_mask
        >>> block_mask = create_block_mask(causal(), 1, 1, 256, 256, device="cpu")
        >>> tile_kinds(block_mask)[0, 0].tolist()          # the diagonal partial, below it full
        [[1, 0], [2, 1]]
    """
    from torch.nn.attention.flex_attention import BlockMask

    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"tile_kinds: block_mask must be a torch.nn.attention.flex_attention.BlockMask, "
                        f"got {type(block_mask).__name__}")
    count, indices = block_mask.kv_num_blocks.cpu(), block_mask.kv_indices.cpu()     # [B, H, Qt], [B, H, Qt, Kt]
    kinds = torch.full(indices.shape, EMPTY, dtype=torch.int64)                       # [B, H, Qt, Kt]
    lists = [(count, indices, PARTIAL)]
    if block_mask.full_kv_num_blocks is not None:
        lists.append((block_mask.full_kv_num_blocks.cpu(), block_mask.full_kv_indices.cpu(), FULL))
    tiles = indices.shape[-1]
    for number, where, kind in lists:
        listed = torch.arange(where.shape[-1]) < number[..., None]                    # [B, H, Qt, slots]
        column = torch.where(listed, where.long(), tiles)                             # unlisted: a spare column
        hit = torch.zeros(*where.shape[:-1], tiles + 1, dtype=torch.bool).scatter_(-1, column, True)
        kinds[hit[..., :tiles]] = kind
    return kinds
