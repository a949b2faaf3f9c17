"""What a head attends to, as one number per head: the previous-token, induction and duplicate-token scores.

For attention weights ``pattern [..., N, N]`` (query rows, key columns, rows summing to 1):

- previous-token score: the mean over queries ``i ≥ 1`` of ``pattern[..., i, i − 1]``, the weight on the
  token just before (1 for a perfect previous-token head);
- induction score, on a sequence of period ``P`` (token ``i`` equals token ``i − P``): the mean over
  ``i ≥ P`` of ``pattern[..., i, i − P + 1]``, the weight on the token *after* the earlier occurrence of
  the current one, the token an induction head copies (Olsson et al. 2022's "prefix matching");
- duplicate-token score, on the same sequence: the mean over ``i ≥ P`` of ``pattern[..., i, i − P]``, the
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


def _pattern_and_period(where: str, pattern: object, period: object) -> tuple[torch.Tensor, int]:
    """``(pattern, period)`` checked for a score over a sequence of period ``period`` (``1 .. N − 1``)."""
    pattern = check_pattern(where, pattern)
    period = _validate.integer(where, "period", period)
    tokens = pattern.shape[-1]
    if not 1 <= period <= tokens - 1:
        raise ValueError(f"{where}: period must be in 1 .. N - 1 = {tokens - 1} for a pattern of "
                         f"shape {_validate.shape_str(pattern)}, got {period}")
    return pattern, period


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


def induction_score(pattern: torch.Tensor, period: int) -> torch.Tensor:
    """The mean weight each query puts on the token after the earlier occurrence of its own token.

    Args:
        pattern: attention weights ``[..., N, N]`` on a sequence whose token ``i`` equals token
            ``i − period`` for ``i ≥ period`` (e.g. :func:`~attn_course.data.repeated_tokens.repeated_random_tokens`
            with ``half_length = period``).
        period: ``P``, in ``1 .. N − 1``.

    Returns:
        ``pattern.shape[:-2]``: the mean over ``i = P .. N − 1`` of ``pattern[..., i, i − P + 1]``.

    Raises:
        TypeError: ``pattern`` not a floating tensor, ``period`` not an int.
        ValueError: not square, ``N < 2``, NaN in it, or ``period`` outside ``1 .. N − 1``.

    Example:
        >>> n, p = 6, 3
        >>> perfect = torch.zeros(n, n)
        >>> perfect[torch.arange(p, n), torch.arange(1, n - p + 1)] = 1.0   # i -> i - 3 + 1
        >>> induction_score(perfect, p)
        tensor(1.)
    """
    pattern, period = _pattern_and_period("induction_score", pattern, period)
    # Entries (i, i - P + 1) for i >= P: the diagonal at offset -(P - 1), from its row P - 1 + 1 on.
    diagonal = torch.diagonal(pattern, offset=-(period - 1), dim1=-2, dim2=-1)   # [..., N - P + 1], rows P-1 ..
    return diagonal[..., 1:].mean(dim=-1)                                         # rows P .. N - 1


def duplicate_token_score(pattern: torch.Tensor, period: int) -> torch.Tensor:
    """The mean weight each query puts on the earlier occurrence of its own token (``period`` back).

    Args:
        pattern: attention weights ``[..., N, N]`` on a sequence whose token ``i`` equals token ``i − period``.
        period: ``P``, in ``1 .. N − 1``.

    Returns:
        ``pattern.shape[:-2]``: the mean over ``i = P .. N − 1`` of ``pattern[..., i, i − P]``.

    Raises:
        TypeError: ``pattern`` not a floating tensor, ``period`` not an int.
        ValueError: not square, ``N < 2``, NaN in it, or ``period`` outside ``1 .. N − 1``.

    Example:
        >>> twin = torch.zeros(6, 6)
        >>> twin[torch.arange(3, 6), torch.arange(0, 3)] = 1.0          # i -> i - 3
        >>> duplicate_token_score(twin, 3), induction_score(twin, 3)
        (tensor(1.), tensor(0.))
    """
    pattern, period = _pattern_and_period("duplicate_token_score", pattern, period)
    return torch.diagonal(pattern, offset=-period, dim1=-2, dim2=-1).mean(dim=-1)   # rows P .. N - 1
