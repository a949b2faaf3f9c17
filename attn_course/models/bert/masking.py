"""BERT's pre-training input: the masked-language-model corruption (the 80/10/10 rule).

A share of the ordinary tokens (15 % in BERT) is chosen; the model must predict the original
token at each chosen position. Of the chosen tokens 80 % are replaced by ``[MASK]``, 10 % by
a random token and 10 % left as they are, so that the model cannot rely on ``[MASK]`` marking
every position it is asked about (Devlin et al., 2019, section 3.1).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import NamedTuple

import torch

from attn_course import _validate

__all__ = ["IGNORE_INDEX", "MaskedTokens", "mask_tokens"]

#: The label of a position that is not predicted (``torch.nn.functional.cross_entropy``'s ``ignore_index``).
IGNORE_INDEX = -100


class MaskedTokens(NamedTuple):
    """What :func:`mask_tokens` returns; every field is ``[B, N]``.

    Attributes:
        input_ids: what the model reads: the ids with the chosen ones corrupted (``torch.long``).
        labels: the original id at each chosen position, :data:`IGNORE_INDEX` (-100) elsewhere.
        chosen: True where the model must predict the original token.
        to_mask: chosen and replaced by ``[MASK]`` (about 80 % of ``chosen``).
        to_random: chosen and replaced by a random token (about 10 %; by chance that can be the
            original token again).
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    chosen: torch.Tensor
    to_mask: torch.Tensor
    to_random: torch.Tensor

    @property
    def kept(self) -> torch.Tensor:
        """``[B, N]``: chosen but left unchanged by the rule (about 10 % of ``chosen``)."""
        return self.chosen & ~self.to_mask & ~self.to_random


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    special_ids: Sequence[int] | torch.Tensor,
    probability: float = 0.15,
    generator: torch.Generator | None = None,
) -> MaskedTokens:
    """Corrupt token ids for masked-language-model training with BERT's 80/10/10 rule.

    Each token whose id is not in ``special_ids`` is chosen with probability ``probability``,
    independently. A second uniform draw ``u`` decides what happens to a chosen token:
    ``u < 0.8`` gives ``[MASK]``, ``0.8 <= u < 0.9`` a random id from ``0..vocab_size-1``,
    and otherwise it is left as it is. The draws are, in this order, ``torch.rand`` (choice),
    ``torch.rand`` (fate) and ``torch.randint`` (random ids), each of ``input_ids``' shape, so
    a generator with a given seed always gives the same result.

    Args:
        input_ids: ``[B, N]`` integer token ids in ``0..vocab_size-1``.
        mask_id: the id of ``[MASK]``.
        vocab_size: the number of token ids; random replacements are drawn from all of them.
        special_ids: ids that are never chosen (``[CLS]``, ``[SEP]``; ``[PAD]`` in a padded batch).
        probability: the chance that an ordinary token is chosen, in ``[0, 1]``.
        generator: a ``torch.Generator`` on ``input_ids``' device for reproducible draws
            (default: PyTorch's global one).

    Returns:
        :class:`MaskedTokens` ``(input_ids, labels, chosen, to_mask, to_random)``, each ``[B, N]``.

    Raises:
        TypeError: ids that are not integers, a ``probability`` that is not a number, or a
            ``generator`` that is not a ``torch.Generator``.
        ValueError: ids out of ``0..vocab_size-1``, ``input_ids`` not 2-D, or a ``probability``
            outside ``[0, 1]``.

    Example:
        >>> ids = torch.tensor([[101, 7, 8, 9, 10, 102]])                      # [CLS] ... [SEP]
        >>> out = mask_tokens(ids, mask_id=103, vocab_size=200, special_ids=[101, 102],
        ...                   probability=0.5, generator=torch.Generator().manual_seed(0))
        >>> out.input_ids.tolist(), out.labels.tolist()
        ([[101, 7, 103, 103, 103, 102]], [[-100, -100, 8, 9, 10, -100]])
    """
    where = "mask_tokens"
    vocab_size = _validate.integer(where, "vocab_size", vocab_size, minimum=1)
    ids = _validate.integer_tensor(where, "input_ids", input_ids)
    if ids.dim() != 2:
        raise ValueError(f"{where}: input_ids must be [B, N], got shape {_validate.shape_str(ids)}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{where}: input_ids must lie in 0..{vocab_size - 1}, got values from "
                         f"{int(ids.min())} to {int(ids.max())}")
    mask_id = _validate.integer(where, "mask_id", mask_id, minimum=0)
    if mask_id >= vocab_size:
        raise ValueError(f"{where}: mask_id={mask_id} must be below vocab_size={vocab_size}")
    if isinstance(special_ids, torch.Tensor):
        special_ids = _validate.integer_tensor(where, "special_ids", special_ids).flatten().tolist()
    specials = torch.tensor(_validate.integer_sequence(where, "special_ids", special_ids),
                            dtype=torch.long, device=ids.device)                     # [S]
    if isinstance(probability, bool) or not isinstance(probability, numbers.Real):
        raise TypeError(f"{where}: probability must be a number in [0, 1], got {type(probability).__name__}")
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"{where}: probability must lie in [0, 1], got {probability}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{where}: generator must be a torch.Generator or None, got {type(generator).__name__}")

    ids = ids.long()                                                                  # [B, N]
    shape, device = ids.shape, ids.device
    chosen = (torch.rand(shape, generator=generator, device=device) < probability) & ~torch.isin(ids, specials)
    fate = torch.rand(shape, generator=generator, device=device)                     # decides 80 / 10 / 10
    random_ids = torch.randint(vocab_size, shape, generator=generator, device=device)  # [B, N]
    to_mask = chosen & (fate < 0.8)
    to_random = chosen & (fate >= 0.8) & (fate < 0.9)
    corrupted = torch.where(to_mask, mask_id, torch.where(to_random, random_ids, ids))  # [B, N]
    labels = torch.where(chosen, ids, IGNORE_INDEX)                                   # [B, N]
    return MaskedTokens(corrupted, labels, chosen, to_mask, to_random)
