"""What a head attends to, as one number per head: the previous-token, induction and duplicate-token scores.

For attention weights ``pattern [..., N, N]`` (query rows, key columns, rows summing to 1):

- previous-token score: the mean over queries ``i ≥ 1`` of ``pattern[..., i, i − 1]``, the weight on the
  token just before (1 for a perfect previous-token head);
- induction score, on a sequence of period ``P`` (token ``i`` equals token ``i − P``): the mean over
  ``i ≥ P`` (or over the queries given, e.g. the second copy of a repeat placed anywhere, with a period per
  sequence) of ``pattern[..., i, i − P + 1]``, the weight on the token *after* the earlier occurrence of
  the current one, the token an induction head copies (Olsson et al. 2022's "prefix matching");
- duplicate-token score, on the same sequence: the mean over the same queries of ``pattern[..., i, i − P]``, the
  weight on the earlier copy of the current token itself (one position before the induction target: the
  off-by-one of the induction score). A layer-0 duplicate-token head is the other way a two-layer model
  can find the repeat: it tells position ``i`` where its twin sits, and a layer-1 head reads the position
  after it through Q-composition.
"""

from __future__ import annotations

import torch

from attn_course import _validate

__all__ = ["previous_token_score", "induction_score", "duplicate_token_score", "check_pattern"]


def check_pattern(where: str, pattern: object, name: str = "pattern") -> torch.Tensor:
    """``pattern`` if it is a floating ``[..., N, N]`` tensor (``N ≥ 2``) without NaN, else a clear error.

    Raises:
        TypeError: not a tensor, or not floating point.
        ValueError: fewer than 2 dimensions, not square in the last two, ``N < 2``, or NaN in it.
    """
    pattern = _validate.floating_tensor(where, name, pattern)
    if pattern.dim() < 2 or pattern.shape[-1] != pattern.shape[-2]:
        raise ValueError(f"{where}: {name} must be [..., N, N] (queries by keys, square), "
                         f"got shape {_validate.shape_str(pattern)}")
    if pattern.shape[-1] < 2:
        raise ValueError(f"{where}: {name} needs N >= 2 tokens to have a previous one, "
                         f"got shape {_validate.shape_str(pattern)}")
    if torch.isnan(pattern).any():
        raise ValueError(f"{where}: {name} contains NaN ({int(torch.isnan(pattern).sum())} entries)")
    return pattern


def _offset_score(where: str, pattern: object, period: object, queries: object, back: int) -> torch.Tensor:
    """The mean over the chosen queries ``i`` of ``pattern[..., i, i − P + 1 − back]``; see :func:`induction_score`."""
    pattern = check_pattern(where, pattern)
    n, shape = pattern.shape[-1], _validate.shape_str(pattern)
    per_sequence = isinstance(period, torch.Tensor) or queries is not None
    if per_sequence and pattern.dim() < 3:
        raise ValueError(f"{where}: a period tensor or queries need a pattern [B, ..., N, N] with the sequences "
                         f"first, got shape {shape}")
    if isinstance(period, torch.Tensor):
        period = _validate.integer_tensor(where, "period", period)
        if period.shape != pattern.shape[:1]:
            raise ValueError(f"{where}: period must be an int or one per sequence, [B] = [{pattern.shape[0]}], "
                             f"got shape {_validate.shape_str(period)}")
    else:
        period = torch.tensor([_validate.integer(where, "period", period)])
    if ((period < 1) | (period > n - 1)).any():
        raise ValueError(f"{where}: period must be in 1 .. N - 1 = {n - 1} for a pattern of shape {shape}, "
                         f"got {period.tolist() if period.numel() > 1 else period.item()}")
    rows = torch.arange(n)
    keys = rows - period[:, None] + 1 - back                                     # [B or 1, N]: each query's key
    if queries is None:
        queries = rows >= period[:, None]                                        # i >= P: a token whose twin is P back
    else:
        if not isinstance(queries, torch.Tensor) or queries.dtype != torch.bool:
            raise TypeError(f"{where}: queries must be a bool tensor [B, N], got {type(queries).__name__}"
                            + (f" of {queries.dtype}" if isinstance(queries, torch.Tensor) else ""))
        if queries.shape != (pattern.shape[0], n):
            raise ValueError(f"{where}: queries must be [B, N] = [{pattern.shape[0]}, {n}], got shape "
                             f"{_validate.shape_str(queries)}")
        if (queries & (keys < 0)).any():
            raise ValueError(f"{where}: queries selects a query i < P, which has no token P back to compare with")
        if not queries.any(dim=1).all():
            raise ValueError(f"{where}: every sequence needs at least one query; queries selects none in some rows")
    mask = queries.to(pattern.dtype)                                              # [B or 1, N]
    if pattern.dim() >= 3 and keys.shape[0] > 1:
        view = (keys.shape[0],) + (1,) * (pattern.dim() - 3) + (n,)              # per sequence: [B, 1.., N]
        keys, mask = keys.reshape(view), mask.reshape(view)
    else:
        keys, mask = keys[0], mask[0]                                             # one period for all: [N]
    index = keys.clamp(min=0).expand(pattern.shape[:-1]).unsqueeze(-1)           # [..., N, 1]
    weights = pattern.gather(-1, index).squeeze(-1)                               # [..., N]: pattern[..., i, key(i)]
    return (weights * mask).sum(-1) / mask.sum(-1)


def previous_token_score(pattern: torch.Tensor) -> torch.Tensor:
    """The mean weight each query puts on the token just before it.

    Args:
        pattern: attention weights ``[..., N, N]`` (e.g. ``[B, H, N, N]`` or ``[H, N, N]``), ``N ≥ 2``.

    Returns:
        ``pattern.shape[:-2]``: the mean over ``i = 1 .. N − 1`` of ``pattern[..., i, i − 1]``.

    Raises:
        TypeError: ``pattern`` not a floating tensor.
        ValueError: not square in its last two dimensions, ``N < 2``, or NaN in it.

    Example:
        >>> previous = torch.eye(4).roll(-1, dims=1).tril()          # row i has its 1 at column i - 1
        >>> previous[0, 0] = 1.0                                     # the first token can only see itself
        >>> previous_token_score(previous)
        tensor(1.)
    """
    pattern = check_pattern("previous_token_score", pattern)
    return torch.diagonal(pattern, offset=-1, dim1=-2, dim2=-1).mean(dim=-1)     # [...]: entries (i, i - 1)


def induction_score(pattern: torch.Tensor, period: int | torch.Tensor, queries: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """The mean weight each repeated token puts on the token after its earlier occurrence.

    Args:
        pattern: attention weights ``[..., N, N]``, on sequences whose token ``i`` equals token ``i − P`` at
            the queries scored (e.g. :func:`~attn_course.data.repeated_tokens.repeated_random_tokens` with
            ``half_length = P``).
        period: ``P``, an int in ``1 .. N − 1``, or one per sequence, an int tensor ``[B]`` (the pattern's
            first dimension is then the batch: ``[B, ..., N, N]``).
        queries: which queries to average over, a bool tensor ``[B, N]`` (e.g.
            :attr:`~attn_course.data.repeated_tokens.PlacedRepeats.second_copy`); default every ``i ≥ P``.

    Returns:
        ``pattern.shape[:-2]``: the mean over the queries ``i`` of ``pattern[..., i, i − P + 1]``.

    Raises:
        TypeError: ``pattern`` not a floating tensor, ``period`` not an int (or int tensor), ``queries`` not bool.
        ValueError: not square, ``N < 2``, NaN in it, ``period`` outside ``1 .. N − 1``, shapes that do not
            match, or a query ``i < P``.

    Example:
        >>> n, p = 6, 3
        >>> perfect = torch.zeros(n, n)
        >>> perfect[torch.arange(p, n), torch.arange(1, n - p + 1)] = 1.0   # i -> i - 3 + 1
        >>> induction_score(perfect, p)
        tensor(1.)
    """
    return _offset_score("induction_score", pattern, period, queries, back=0)


def duplicate_token_score(pattern: torch.Tensor, period: int | torch.Tensor, queries: torch.Tensor | None = None
                          ) -> torch.Tensor:
    """The mean weight each repeated token puts on its own earlier occurrence (``P`` back).

    Args:
        pattern, period, queries: as :func:`induction_score`.

    Returns:
        ``pattern.shape[:-2]``: the mean over the queries ``i`` of ``pattern[..., i, i − P]``.

    Raises:
        TypeError, ValueError: as :func:`induction_score`.

    Example:
        >>> twin = torch.zeros(6, 6)
        >>> twin[torch.arange(3, 6), torch.arange(0, 3)] = 1.0          # i -> i - 3
        >>> duplicate_token_score(twin, 3), induction_score(twin, 3)
        (tensor(1.), tensor(0.))
    """
    return _offset_score("duplicate_token_score", pattern, period, queries, back=1)
