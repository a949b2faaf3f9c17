"""Random token sequences that repeat themselves: the data on which induction heads form (chapter 11).

- :func:`repeated_random_tokens`: ``B`` sequences of ``2·L`` tokens whose second half repeats the first
  (period ``L``): the evaluation data of chapter 11, on which the induction score is read;
- :func:`placed_repeats`: random sequences holding a segment said twice, its length and its place drawn
  for each sequence, with a no-repeat control (:class:`PlacedRepeats`): chapter 11's training and evaluation
  data. A repeat of one length at one place could be learnt by position alone (attend 19 back from token
  39, whatever the tokens); one of any length anywhere can only be found by looking at the tokens, which is
  what an induction head does;
- :func:`character_windows`: random windows of a character text (the rhymes), the second dataset.

No BOS token: token 0 is as random as the others; in a sequence of :func:`repeated_random_tokens`,
``tokens[i] == tokens[i − L]`` for every ``i ≥ L`` and nothing else is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_course import _validate

__all__ = ["repeated_random_tokens", "PlacedRepeats", "placed_repeats", "character_windows"]


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


@dataclass(frozen=True)
class PlacedRepeats:
    """Random sequences, each holding one segment said twice at a random place, and their no-repeat control.

    Sequence ``b`` is uniform random tokens, except that the ``P_b`` tokens from ``start_b + P_b`` on repeat
    the ``P_b`` before them: ``tokens[b, i] = tokens[b, i − P_b]`` for ``start_b + P_b ≤ i < start_b + 2·P_b``.
    ``control`` is the same batch with the *first* copy replaced by fresh random tokens: the same tokens to
    predict, at the same places, with nothing earlier in the context to copy them from.

    Attributes:
        tokens: ``[B, N]`` int64, the sequences with their repeat.
        control: ``[B, N]`` int64, the sequences without it.
        periods: ``[B]`` int64, ``P_b``.
        starts: ``[B]`` int64, where the first copy begins.
    """

    tokens: torch.Tensor
    control: torch.Tensor
    periods: torch.Tensor
    starts: torch.Tensor

    @property
    def second_copy(self) -> torch.Tensor:
        """``[B, N]`` bool: the positions ``i`` of the second copy, whose token equals token ``i − P_b``.

        These are the queries the induction and duplicate-token scores read
        (:func:`~attn_course.circuits.scores.induction_score`).
        """
        position = torch.arange(self.tokens.shape[1])[None, :]                           # [1, N]
        begin = (self.starts + self.periods)[:, None]                                    # [B, 1]
        return (position >= begin) & (position < begin + self.periods[:, None])

    @property
    def predictable(self) -> torch.Tensor:
        """``[B, N]`` bool: the tokens a copier can predict, the second copy but its first token (the token
        before it is not a repeat, so nothing announces it)."""
        second = self.second_copy
        return second & torch.roll(second, 1, dims=1)


def placed_repeats(batch: int, length: int, vocab_size: int, *, periods: tuple[int, int],
                   generator: torch.Generator | None = None) -> PlacedRepeats:
    """``batch`` random sequences of ``length`` tokens, each with a random segment said twice at a random place.

    For each sequence: a period ``P`` uniform over ``periods[0] .. periods[1]`` (both included), a start
    uniform over ``0 .. N − 2P``, uniform random tokens, and tokens ``start + P .. start + 2P − 1`` set to the
    ``P`` before them. Random tokens come before the first copy and after the second, so neither a position
    nor a distance says where the repeat is: only its tokens do. See :class:`PlacedRepeats`.

    Args:
        batch: ``B``, at least 1.
        length: ``N``, tokens per sequence, at least 2.
        vocab_size: ``V``, at least 2.
        periods: ``(P_min, P_max)`` with ``1 ≤ P_min ≤ P_max ≤ N / 2``.
        generator: a ``torch.Generator`` for reproducible draws (None: torch's global one).

    Returns:
        a :class:`PlacedRepeats`.

    Raises:
        TypeError: a size that is not an int, ``periods`` not a pair of ints, a generator of another kind.
        ValueError: sizes too small, or periods outside ``1 .. N / 2`` or in the wrong order.

    Example:
        >>> batch = placed_repeats(4, 12, 50, periods=(2, 6), generator=torch.Generator().manual_seed(0))
        >>> batch.tokens.shape, bool((batch.tokens[batch.second_copy] == batch.tokens.gather(
        ...     1, (torch.arange(12) - batch.periods[:, None]).clamp(min=0))[batch.second_copy]).all())
        (torch.Size([4, 12]), True)
    """
    where = "placed_repeats"
    batch = _validate.integer(where, "batch", batch, minimum=1)
    length = _validate.integer(where, "length", length, minimum=2)
    vocab_size = _validate.integer(where, "vocab_size", vocab_size, minimum=2)
    pair = _validate.integer_sequence(where, "periods", periods)
    if len(pair) != 2 or not 1 <= pair[0] <= pair[1] <= length // 2:
        raise ValueError(f"{where}: periods must be (P_min, P_max) with 1 <= P_min <= P_max <= length // 2 = "
                         f"{length // 2}, got {tuple(pair)}")
    generator = _generator(where, generator)
    period = torch.randint(pair[0], pair[1] + 1, (batch,), generator=generator)                # [B]
    start = (torch.rand(batch, generator=generator, dtype=torch.float64)
             * (length - 2 * period + 1)).floor().long()                                       # [B]: 0 .. N - 2P
    fresh = torch.randint(vocab_size, (batch, length), generator=generator)                    # [B, N]
    other = torch.randint(vocab_size, (batch, length), generator=generator)                    # [B, N]
    position = torch.arange(length)[None, :]                                                   # [1, N]
    first = (position >= start[:, None]) & (position < (start + period)[:, None])              # [B, N]
    second = (position >= (start + period)[:, None]) & (position < (start + 2 * period)[:, None])    # [B, N]
    source = torch.where(second, position - period[:, None], position)                         # [B, N]
    tokens = fresh.gather(1, source)
    return PlacedRepeats(tokens, torch.where(first, other, tokens), period, start)


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
