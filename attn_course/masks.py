"""Attention masks, all in one convention: boolean, ``True`` = "may attend".

That is the convention of ``torch.nn.functional.scaled_dot_product_attention`` and of
:func:`attn_course.self_attention`. A mask has shape ``[..., N_q, N_k]``: row ``i``
says which keys query ``i`` may look at.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attn_course import _validate

__all__ = ["causal_mask", "padding_mask"]


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
