"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"): what a model can look up in its context.

A sequence lists ``P`` key–value pairs, then asks for some of the keys again; after each asked key the model
must say its value::

    k_1 v_1 k_2 v_2 … k_P v_P   q_1 q_2 … q_Q        (each q_i one of the k_j, every q_i a different one)
                                 ↓   ↓       ↓
                                 v(q_1) …    v(q_Q)   the targets, at the query positions only

Keys are ids ``0 .. KEYS − 1`` and values ``KEYS .. KEYS + VALUES − 1`` (two disjoint ranges, as in Zoology), so a
token says by itself whether it is a key or a value. The ``P`` keys of a sequence are distinct, the values
drawn independently (two keys may share a value); ``Q = min(P, MAX_QUERIES)`` of the keys are asked, in a
random order. Only the answers are scored: a model that recalls nothing gets ``1 / VALUES`` of them right.

Softmax attention keeps every pair in its KV cache and can look any of them up; a recurrent model must
write all ``P`` pairs into a state of fixed size first, which is the capacity the experiment measures.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_course import _validate

__all__ = ["KEYS", "VALUES", "VOCAB_SIZE", "MAX_QUERIES", "RecallBatch", "sequence_length", "recall_batch"]

KEYS = 64              # key ids 0 .. 63
VALUES = 64            # value ids 64 .. 127
VOCAB_SIZE = KEYS + VALUES
MAX_QUERIES = 32       # keys asked per sequence, at most (P of them when P is smaller)


@dataclass(frozen=True)
class RecallBatch:
    """A batch of MQAR sequences with ``P`` pairs each.

    Attributes:
        inputs: ``[B, N]`` ids, ``N = 2 P + Q``: the pairs, then the asked keys.
        targets: ``[B, N]`` the value of the asked key at each query position, ``-100`` elsewhere (the
            ``ignore_index`` of ``F.cross_entropy``).
        queries: ``[B, N]`` bool, True at the query positions (the last ``Q``).
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    queries: torch.Tensor


def sequence_length(pairs: int) -> int:
    """``N = 2 P + min(P, MAX_QUERIES)``, the tokens of a sequence with ``pairs`` pairs.

    Raises:
        TypeError, ValueError: ``pairs`` not an int in ``1 .. KEYS``.

    Example:
        >>> sequence_length(8), sequence_length(64)
        (24, 160)
    """
    return _pairs("sequence_length", pairs) * 2 + min(pairs, MAX_QUERIES)


def _pairs(where: str, pairs: object) -> int:
    pairs = _validate.integer(where, "pairs", pairs, minimum=1)
    if pairs > KEYS:
        raise ValueError(f"{where}: pairs must be at most KEYS={KEYS} (the keys of a sequence are distinct), "
                         f"got {pairs}")
    return pairs


def recall_batch(pairs: int, batch: int, generator: torch.Generator) -> RecallBatch:
    """``batch`` MQAR sequences of ``pairs`` key–value pairs each, drawn with ``generator``.

    Args:
        pairs: ``P``, in ``1 .. KEYS``.
        batch: ``B >= 1``.
        generator: a ``torch.Generator``; the same state gives the same batch.

    Returns:
        a :class:`RecallBatch` with ``N = sequence_length(pairs)`` tokens per sequence.

    Raises:
        TypeError: ``pairs`` or ``batch`` not an int, ``generator`` not a torch.Generator.
        ValueError: ``pairs`` outside ``1 .. KEYS``, ``batch`` below 1.

    Example:
        >>> b = recall_batch(3, 1, torch.Generator().manual_seed(0))
        >>> b.inputs.shape, b.queries.sum().item(), bool((b.inputs[0, 1:6:2] >= KEYS).all())
        (torch.Size([1, 9]), 3, True)
    """
    where = "recall_batch"
    pairs = _pairs(where, pairs)
    batch = _validate.integer(where, "batch", batch, minimum=1)
    _validate.instance(where, "generator", generator, torch.Generator)
    asked = min(pairs, MAX_QUERIES)
    keys = torch.rand(batch, KEYS, generator=generator).argsort(-1)[:, :pairs]               # [B, P] distinct
    values = KEYS + torch.randint(VALUES, (batch, pairs), generator=generator)               # [B, P]
    which = torch.rand(batch, pairs, generator=generator).argsort(-1)[:, :asked]             # [B, Q] distinct
    context = torch.stack((keys, values), dim=-1).flatten(1)                                # [B, 2P]: k v k v …
    inputs = torch.cat((context, keys.gather(1, which)), dim=1)                              # [B, N]
    targets = torch.full_like(inputs, -100)
    targets[:, 2 * pairs:] = values.gather(1, which)                                         # the asked values
    queries = torch.zeros_like(inputs, dtype=torch.bool)
    queries[:, 2 * pairs:] = True
    return RecallBatch(inputs, targets, queries)
