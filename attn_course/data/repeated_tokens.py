"""Random token sequences that repeat themselves: the data on which induction heads form (chapter 11).

- :func:`repeated_random_tokens`: ``B`` sequences of ``2·L`` tokens whose second half repeats the first
  (period ``L``): the evaluation data of chapter 11, on which the induction score is read;
- :func:`repeated_segment_tokens`: sequences of one length that end in a segment said twice, its
  length varying from sequence to sequence: the training data. A fixed period could be learnt by position
  alone (attend ``L − 1`` back, whatever the tokens); a varying one can only be found by looking at the
  tokens, which is what an induction head does;
- :func:`character_windows`: random windows of a character text (the rhymes), the second dataset.

No BOS token: token 0 is as random as the others; in a sequence of :func:`repeated_random_tokens`,
``tokens[i] == tokens[i − L]`` for every ``i ≥ L`` and nothing else is fixed.
"""

from __future__ import annotations

import torch

from attn_course import _validate

__all__ = ["repeated_random_tokens", "repeated_segment_tokens", "character_windows"]


def _generator(where: str, generator: object) -> torch.Generator | None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{where}: generator must be a torch.Generator or None, got {type(generator).__name__}")
    return generator


def repeated_random_tokens(batch: int, half_length: int, vocab_size: int, *,
                           generator: torch.Generator | None = None) -> torch.Tensor:
    """``batch`` sequences of ``half_length`` uniform random tokens, each followed by itself again.

    Args:
        batch: ``B``, at least 1.
        half_length: ``L``, the period, at least 1.
        vocab_size: ``V``; tokens are drawn uniformly from ``0 .. V − 1`` (at least 2).
        generator: a ``torch.Generator`` for reproducible draws (None: torch's global one).

    Returns:
        ``[B, 2·L]`` int64 tokens with ``tokens[:, L:] == tokens[:, :L]``.

    Raises:
        TypeError: a size that is not an int, or a generator of another kind.
        ValueError: ``batch`` or ``half_length`` below 1, ``vocab_size`` below 2.

    Example:
        >>> tokens = repeated_random_tokens(2, 3, 10, generator=torch.Generator().manual_seed(0))
        >>> tokens.shape, bool((tokens[:, 3:] == tokens[:, :3]).all())
        (torch.Size([2, 6]), True)
    """
    where = "repeated_random_tokens"
    batch = _validate.integer(where, "batch", batch, minimum=1)
    half_length = _validate.integer(where, "half_length", half_length, minimum=1)
    vocab_size = _validate.integer(where, "vocab_size", vocab_size, minimum=2)
    first = torch.randint(vocab_size, (batch, half_length), generator=_generator(where, generator))   # [B, L]
    return torch.cat([first, first], dim=1)                                                           # [B, 2L]


def repeated_segment_tokens(batch: int, length: int, vocab_size: int, *, periods: tuple[int, int],
                            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sequences of one length that end in a random segment said twice, its length drawn per sequence.

    Sequence ``b`` is ``N − 2·P_b`` random tokens, then ``P_b`` random tokens, then the same ``P_b`` again:
    ``tokens[b, i] = tokens[b, i − P_b]`` for ``i ≥ N − P_b``; ``P_b`` is uniform over ``periods[0] ..
    periods[1]`` (both included). With ``P_b = N / 2`` it is :func:`repeated_random_tokens`.

    Args:
        batch: ``B``, at least 1.
        length: ``N``, tokens per sequence, at least 2.
        vocab_size: ``V``, at least 2.
        periods: ``(P_min, P_max)`` with ``1 ≤ P_min ≤ P_max ≤ N / 2``.
        generator: a ``torch.Generator`` for reproducible draws (None: torch's global one).

    Returns:
        ``(tokens [B, N] int64, periods [B] int64)``.

    Raises:
        TypeError: a size that is not an int, ``periods`` not a pair of ints, a generator of another kind.
        ValueError: sizes too small, or periods outside ``1 .. N / 2`` or in the wrong order.

    Example:
        >>> tokens, period = repeated_segment_tokens(4, 12, 50, periods=(3, 6),
        ...                                          generator=torch.Generator().manual_seed(0))
        >>> all(bool((row[12 - p:] == row[12 - 2 * p:12 - p]).all()) for row, p in zip(tokens, period.tolist()))
        True
    """
    where = "repeated_segment_tokens"
    batch = _validate.integer(where, "batch", batch, minimum=1)
    length = _validate.integer(where, "length", length, minimum=2)
    vocab_size = _validate.integer(where, "vocab_size", vocab_size, minimum=2)
    pair = _validate.integer_sequence(where, "periods", periods)
    if len(pair) != 2 or not 1 <= pair[0] <= pair[1] <= length // 2:
        raise ValueError(f"{where}: periods must be (P_min, P_max) with 1 <= P_min <= P_max <= length // 2 = "
                         f"{length // 2}, got {tuple(pair)}")
    generator = _generator(where, generator)
    period = torch.randint(pair[0], pair[1] + 1, (batch,), generator=generator)                # [B]
    fresh = torch.randint(vocab_size, (batch, length), generator=generator)                    # [B, N]
    position = torch.arange(length)[None, :]                                                   # [1, N]
    repeat = position >= length - period[:, None]                                              # [B, N]: second copy
    source = torch.where(repeat, position - period[:, None], position)                         # [B, N]
    return fresh.gather(1, source), period


def character_windows(ids: torch.Tensor, batch: int, length: int, *,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """``batch`` windows of ``length`` consecutive ids, at uniform random starts in ``ids``.

    Args:
        ids: ``[T]`` integer ids, e.g. ``CharTokenizer(text).encode(text)`` of the rhymes.
        batch: ``B``, at least 1.
        length: ``N``, at least 1 and at most ``T``.
        generator: a ``torch.Generator`` for reproducible draws.

    Returns:
        ``[B, N]`` ids.

    Raises:
        TypeError: ``ids`` not an integer tensor, a size not an int, a generator of another kind.
        ValueError: ``ids`` not 1-D, sizes below 1, or ``length`` longer than ``ids``.

    Example:
        >>> character_windows(torch.arange(10), 2, 4, generator=torch.Generator().manual_seed(0)).shape
        torch.Size([2, 4])
    """
    where = "character_windows"
    ids = _validate.integer_tensor(where, "ids", ids)
    batch = _validate.integer(where, "batch", batch, minimum=1)
    length = _validate.integer(where, "length", length, minimum=1)
    if ids.dim() != 1 or ids.numel() < length:
        raise ValueError(f"{where}: ids must be 1-D [T] with T >= length={length}, "
                         f"got shape {_validate.shape_str(ids)}")
    starts = torch.randint(ids.numel() - length + 1, (batch,), generator=_generator(where, generator))   # [B]
    return ids[starts[:, None] + torch.arange(length)]                                                   # [B, N]
