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
    "check_mask",
    "causal_mask",
    "padding_mask",
    "combine_masks",
    "to_additive",
    "to_boolean",
    "to_score_shape",
    "restrict_mask",
    "key_padding_to_boolean",
]


def check_mask(where: str, mask: object, *, name: str = "mask") -> torch.Tensor:
    """``mask`` if it is a boolean (True = may attend) or floating (added to the scores) tensor.

    Every function that takes a mask calls this first, so a wrong one reads the same everywhere.

    Args:
        where: the name that error messages start with (the public function that was called).
        mask: the mask to check.
        name: the argument's name in error messages.

    Returns:
        ``mask``, unchanged.

    Raises:
        TypeError: not a tensor, or a dtype that is neither boolean nor floating.

    Example:
        >>> check_mask("demo", torch.ones(2, 2)).dtype
        torch.float32
    """
    mask = _validate.tensor(where, name, mask)
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise TypeError(f"{where}: {name} must be boolean or floating, got dtype {mask.dtype} "
                        f"(boolean: True = may attend; floating: added to the scores)")
    return mask


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
        lengths = torch.tensor(_validate.integer_sequence(where, "lengths", lengths), dtype=torch.long)
    lengths = _validate.integer_tensor(where, "lengths", lengths)
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


def to_score_shape(
    mask: torch.Tensor | None,
    batch: int,
    heads: int,
    n_q: int,
    n_k: int,
    *,
    caller: str = "to_score_shape",
    name: str = "mask",
) -> torch.Tensor | None:
    """Bring a mask to the 4-D shape of multi-head scores, ``[B|1, H|1, N_q|1, N_k]``, or say why it does not fit.

    Accepted shapes are ``[N_q, N_k]`` (one mask for everything), ``[B, N_q, N_k]`` (one per
    sequence; ``[B, 1, N_k]`` from :func:`padding_mask`) and ``[B, H, N_q, N_k]``, where any of
    B, H and N_q may be 1 to broadcast. The mask itself is not copied: size-1 dimensions are
    added in front as views.

    Args:
        mask: boolean (True = may attend) or additive floating mask, or None.
        batch, heads, n_q, n_k: the scores' sizes ``B``, ``H``, ``N_q``, ``N_k``.
        caller: the name that error messages start with (the public function that was called).
        name: the argument's name in error messages.

    Returns:
        The mask as ``[B|1, H|1, N_q|1, N_k]``, or None when ``mask`` is None.

    Raises:
        TypeError: a mask that is not a boolean or floating tensor.
        ValueError: a mask whose shape does not broadcast to ``[B, H, N_q, N_k]``.

    Example:
        >>> to_score_shape(causal_mask(3), batch=2, heads=4, n_q=3, n_k=3).shape
        torch.Size([1, 1, 3, 3])
        >>> to_score_shape(padding_mask([2, 3], 3), batch=2, heads=4, n_q=3, n_k=3).shape
        torch.Size([2, 1, 1, 3])
    """
    if mask is None:
        return None
    mask = check_mask(caller, mask, name=name)
    if mask.dim() == 2:
        mask = mask[None, None]                                   # [1, 1, N_q, N_k]
    elif mask.dim() == 3:
        mask = mask[:, None]                                      # [B, 1, N_q, N_k]
    expected = (batch, heads, n_q, n_k)
    fits = mask.dim() == 4 and all(m in (1, e) for m, e in zip(mask.shape, expected))
    if not fits or mask.shape[-1] != n_k:
        raise ValueError(
            f"{caller}: {name} of shape {_validate.shape_str(mask)} does not fit scores "
            f"[B, H, N_q, N_k] = {list(expected)}; use [N_q, N_k], [B, N_q, N_k] or [B, H, N_q, N_k]"
        )
    return mask


def restrict_mask(mask: torch.Tensor | None, allowed: torch.Tensor) -> torch.Tensor:
    """Block, in a boolean or additive ``mask``, every position that the boolean ``allowed`` blocks.

    A boolean mask is and-ed with ``allowed``; an additive one gets ``-inf`` where ``allowed``
    is False and keeps its own values elsewhere (a soft bias stays a soft bias). This is how a
    causal or padding mask is added on top of whatever mask the caller passed.

    Args:
        mask: boolean (True = may attend) or additive floating mask, or None.
        allowed: boolean mask that broadcasts against ``mask``.

    Returns:
        A mask of ``mask``'s kind with the broadcast shape of both; ``allowed`` itself when
        ``mask`` is None.

    Raises:
        TypeError: ``allowed`` not boolean, or ``mask`` neither boolean nor floating.
        ValueError: shapes that do not broadcast.

    Example:
        >>> additive = torch.tensor([[0.0, -1.0], [0.0, -1.0]])
        >>> restrict_mask(additive, causal_mask(2))
        tensor([[ 0., -inf],
                [ 0., -1.]])
    """
    where = "restrict_mask"
    allowed = _validate.tensor(where, "allowed", allowed)
    if allowed.dtype != torch.bool:
        raise TypeError(f"{where}: allowed must be boolean (True = may attend), got dtype {allowed.dtype}")
    if mask is None:
        return allowed
    mask = check_mask(where, mask)
    _validate.broadcast_batch(where, mask=mask.shape, allowed=allowed.shape)
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))


def key_padding_to_boolean(
    key_padding_mask: torch.Tensor,
    batch: int,
    n: int,
    *,
    device: torch.device | str | None = None,
    caller: str = "key_padding_to_boolean",
    name: str = "key_padding_mask",
) -> torch.Tensor:
    """A ``[B, N]`` key padding mask of 1/True (token) and 0/False (padding) as booleans.

    This is Hugging Face's ``attention_mask`` convention, the same as ours: True (or 1) marks a
    real token that may be attended to. (``torch.nn.MultiheadAttention``'s
    ``key_padding_mask`` is the opposite: True marks padding.)

    Args:
        key_padding_mask: ``[B, N]`` boolean tensor, or integers/floats that are all 0 or 1.
        batch, n: the expected ``B`` and ``N``.
        device: move the result there (default: where it is).
        caller: the name that error messages start with (the public function that was called).
        name: the argument's name in error messages.

    Returns:
        ``[B, N]`` boolean tensor, True for real tokens.

    Raises:
        TypeError: not a tensor, or a complex one.
        ValueError: a shape other than ``[batch, n]``, or values other than 0 and 1.

    Example:
        >>> key_padding_to_boolean(torch.tensor([[1, 1, 0]]), batch=1, n=3)
        tensor([[ True,  True, False]])
    """
    mask = _validate.tensor(caller, name, key_padding_mask)
    if mask.shape != (batch, n):
        raise ValueError(
            f"{caller}: {name} must be [B, N] = [{batch}, {n}] like the input, "
            f"got shape {_validate.shape_str(mask)}"
        )
    if mask.is_complex():
        raise TypeError(f"{caller}: {name} must be boolean or hold 0/1, got dtype {mask.dtype}")
    if mask.dtype != torch.bool:
        if not torch.all((mask == 0) | (mask == 1)):
            raise ValueError(
                f"{caller}: {name} must hold only 0 (padding) and 1 (token), "
                f"got values {torch.unique(mask).tolist()[:6]}"
            )
        mask = mask != 0
    return mask if device is None else mask.to(device)
