"""Attention masks, all in one convention: boolean, ``True`` = "may attend".

That is the convention of ``torch.nn.functional.scaled_dot_product_attention`` and of
:func:`attn_course.self_attention`. A mask has shape ``[..., N_q, N_k]``: row ``i``
says which keys query ``i`` may look at.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attn_course import _validate

__all__ = [
    "causal_mask",
    "padding_mask",
    "sliding_window_mask",
    "combine_masks",
    "to_additive",
    "to_boolean",
]


def causal_mask(
    n_q: int,
    n_k: int | None = None,
    *,
    offset: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean mask that lets each query see only keys at its own position or earlier.

    Query ``i`` sits at absolute position ``offset + i``; key ``j`` at position ``j``.
    The mask is ``True`` where ``j <= offset + i``.

    Args:
        n_q: number of queries ``N_q``.
        n_k: number of keys ``N_k``; defaults to ``n_q``.
        offset: absolute position of the first query. Defaults to ``n_k - n_q``:
            the queries are the *last* ``n_q`` tokens, as when a model decodes new
            tokens after ``n_k - n_q`` cached ones. (``F.scaled_dot_product_attention``'s
            ``is_causal`` instead aligns the first query with the first key, offset 0;
            the two agree when ``n_q == n_k``.)
        device: where to create the mask.

    Returns:
        ``[N_q, N_k]`` boolean tensor, lower triangular when ``n_q == n_k``.

    Raises:
        TypeError: a size or offset that is not an int.
        ValueError: a size below 1.

    Example:
        >>> causal_mask(3).int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    where = "causal_mask"
    n_q = _validate.integer(where, "n_q", n_q, minimum=1)
    n_k = n_q if n_k is None else _validate.integer(where, "n_k", n_k, minimum=1)
    offset = n_k - n_q if offset is None else _validate.integer(where, "offset", offset)
    query_position = torch.arange(n_q, device=device).unsqueeze(1) + offset  # [N_q, 1]
    key_position = torch.arange(n_k, device=device).unsqueeze(0)             # [1, N_k]
    return key_position <= query_position                                    # [N_q, N_k]


def padding_mask(lengths: torch.Tensor | Sequence[int], n: int) -> torch.Tensor:
    """Boolean mask that hides the padding at the end of each sequence in a batch.

    Sequence ``b`` has ``lengths[b]`` real tokens followed by padding up to ``n``.
    Only keys are masked: a padded *query* still gets a (meaningless) output, which
    the caller ignores, so no row is fully masked unless a length is 0.

    Args:
        lengths: ``[B]`` integers between 0 and ``n``.
        n: padded length ``N_k``.

    Returns:
        ``[B, 1, N_k]`` boolean tensor, which broadcasts against scores
        ``[B, N_q, N_k]``. For per-head scores ``[B, H, N_q, N_k]`` use
        ``padding_mask(lengths, n).unsqueeze(1)``.

    Raises:
        TypeError: non-integer lengths or n.
        ValueError: lengths that are not 1-D, or outside ``0..n``.

    Example:
        >>> padding_mask([2, 3], 3).int()
        tensor([[[1, 1, 0]],
        <BLANKLINE>
                [[1, 1, 1]]], dtype=torch.int32)
    """
    where = "padding_mask"
    n = _validate.integer(where, "n", n, minimum=1)
    if not isinstance(lengths, torch.Tensor):
        if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
            raise TypeError(
                f"{where}: lengths must be a 1-D integer tensor or a sequence of ints, "
                f"got {type(lengths).__name__}"
            )
        for index, length in enumerate(lengths):
            _validate.integer(where, f"lengths[{index}]", length)
        lengths = torch.tensor(list(lengths), dtype=torch.long)
    if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise TypeError(f"{where}: lengths must hold integers, got dtype {lengths.dtype}")
    if lengths.dim() != 1:
        raise ValueError(
            f"{where}: lengths must be 1-D [B], got shape {_validate.shape_str(lengths)}"
        )
    if lengths.numel() and (lengths.min() < 0 or lengths.max() > n):
        raise ValueError(
            f"{where}: every length must lie in 0..n={n}, got {lengths.tolist()}"
        )
    positions = torch.arange(n, device=lengths.device)              # [N_k]
    return (positions < lengths.unsqueeze(1)).unsqueeze(1)          # [B, 1, N_k]


def sliding_window_mask(
    n_q: int,
    n_k: int | None = None,
    *,
    window: int,
    offset: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Causal mask that also forgets the distant past: each query sees its last ``window`` keys.

    Query ``i`` (absolute position ``offset + i``) may attend key ``j`` when
    ``offset + i - window < j <= offset + i``. Used by Longformer-style local attention
    and Mistral; memory per query is ``window`` instead of ``N``.

    Args:
        n_q, n_k, offset, device: as in :func:`causal_mask`.
        window: how many keys each query sees, itself included (``>= 1``).

    Returns:
        ``[N_q, N_k]`` boolean tensor.

    Raises:
        TypeError: non-int sizes.
        ValueError: sizes or window below 1.

    Example:
        >>> sliding_window_mask(4, window=2).int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    where = "sliding_window_mask"
    window = _validate.integer(where, "window", window, minimum=1)
    n_q = _validate.integer(where, "n_q", n_q, minimum=1)
    n_k = n_q if n_k is None else _validate.integer(where, "n_k", n_k, minimum=1)
    offset = n_k - n_q if offset is None else _validate.integer(where, "offset", offset)
    causal = causal_mask(n_q, n_k, offset=offset, device=device)
    query_position = torch.arange(n_q, device=device).unsqueeze(1) + offset  # [N_q, 1]
    key_position = torch.arange(n_k, device=device).unsqueeze(0)             # [1, N_k]
    return causal & (key_position > query_position - window)


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Combine boolean masks: a key is visible only if every mask allows it (logical AND).

    ``None`` entries are skipped. The result has the broadcast shape of the inputs, e.g.
    ``combine_masks(causal_mask(N), padding_mask(lengths, N))`` is ``[B, N, N]``.

    Raises:
        TypeError: a mask that is not a boolean tensor.
        ValueError: masks that do not broadcast.
    """
    present = [m for m in masks if m is not None]
    for index, mask in enumerate(present):
        _validate.tensor("combine_masks", f"masks[{index}]", mask)
        if mask.dtype != torch.bool:
            raise TypeError(
                f"combine_masks: masks[{index}] must be boolean (True = may attend), got dtype "
                f"{mask.dtype}; convert an additive mask with to_boolean()"
            )
    if not present:
        return None
    _validate.broadcast_batch("combine_masks", **{f"masks[{i}]": m.shape for i, m in enumerate(present)})
    combined = present[0]
    for mask in present[1:]:
        combined = combined & mask
    return combined


def to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean mask (True = may attend) to an additive one: 0 where allowed, ``-inf`` elsewhere.

    Raises:
        TypeError: ``mask`` not boolean, or ``dtype`` not floating.
    """
    _validate.tensor("to_additive", "mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"to_additive: mask must be boolean, got dtype {mask.dtype}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"to_additive: dtype must be a floating torch.dtype, got {dtype!r}")
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return additive.masked_fill(~mask, float("-inf"))


def to_boolean(mask: torch.Tensor) -> torch.Tensor:
    """Additive mask to a boolean one: True wherever the added value is not ``-inf``.

    Finite negative values (such as a soft bias, or the classic ``-1e9``) count as allowed,
    because they only lower a score; use ``mask > threshold`` to treat them as blocked.

    Raises:
        TypeError: ``mask`` not floating.
    """
    _validate.floating_tensor("to_boolean", "mask", mask)
    return mask != float("-inf")
