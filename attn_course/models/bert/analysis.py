"""Reading a BERT's outputs: sentence embeddings by pooling, and where its heads put their attention."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from attn_course import _validate

__all__ = ["mean_pool", "HeadWeight", "strongest_head", "attention_share"]


def mean_pool(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Average the token embeddings of each sequence, skipping padding (sentence-transformers' pooling).

    Args:
        last_hidden_state: ``[B, N, E]``.
        attention_mask: ``[B, N]``, 1 for a token, 0 for padding (default: all tokens).

    Returns:
        ``[B, E]``; a sequence of only padding gives zeros. Normalise with
        ``F.normalize(pooled, dim=-1)`` for cosine similarities.

    Raises:
        TypeError: a ``last_hidden_state`` that is not a floating tensor, or a mask that is
            not a tensor.
        ValueError: a ``last_hidden_state`` that is not 3-D, or a mask of another shape than ``[B, N]``.

    Example:
        >>> hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]]])     # [B, N, E]
        >>> mean_pool(hidden, torch.tensor([[1, 1, 0]]))                       # [B, E]
        tensor([[2., 3.]])
    """
    where = "mean_pool"
    hidden = _validate.floating_tensor(where, "last_hidden_state", last_hidden_state, min_dim=3)
    if hidden.dim() != 3:
        raise ValueError(f"{where}: last_hidden_state must be [B, N, E], got {_validate.shape_str(hidden)}")
    if attention_mask is None:
        return hidden.mean(dim=1)                                             # [B, E]
    _validate.tensor(where, "attention_mask", attention_mask)
    if attention_mask.shape != hidden.shape[:2]:
        raise ValueError(
            f"{where}: attention_mask must be [B, N] = {list(hidden.shape[:2])}, "
            f"got {_validate.shape_str(attention_mask)}"
        )
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)                   # [B, N, 1]
    total = (hidden * weights).sum(dim=1)                                     # [B, E]
    return total / weights.sum(dim=1).clamp_min(1e-9)                         # [B, E]


class HeadWeight(NamedTuple):
    """One head of one layer, and a weight it gives: what :func:`strongest_head` returns.

    Attributes:
        layer: the layer, counted from 0 (the first encoder block).
        head: the head within that layer, counted from 0.
        weight: the attention weight, in ``[0, 1]``.
    """

    layer: int
    head: int
    weight: float


def strongest_head(attentions: Sequence[torch.Tensor], query: int, key: int, *, sequence: int = 0) -> HeadWeight:
    """Find the layer and head in which token ``query`` puts the most weight on token ``key``.

    Args:
        attentions: a model's attention weights, one ``[B, H, N, N]`` tensor per layer
            (``BertModel``'s ``attentions``, or Hugging Face's with ``output_attentions=True``).
        query: position of the attending token (a row), ``0 <= query < N``.
        key: position of the attended token (a column), ``0 <= key < N``.
        sequence: which sequence of the batch to look at.

    Returns:
        :class:`HeadWeight` ``(layer, head, weight)`` of the largest ``attentions[layer][sequence,
        head, query, key]``; on a tie, the first layer and head.

    Raises:
        TypeError: ``attentions`` not a non-empty sequence of floating tensors, or a position
            that is not an int.
        ValueError: tensors that are not ``[B, H, N, N]`` of one shape, or a position or
            ``sequence`` out of range.

    Example:
        >>> from attn_course.models.bert import load_pretrained
        >>> model, tokenizer = load_pretrained()
        >>> batch = tokenizer(["The bank of the river was muddy."])
        >>> tokens = batch.tokens[0]
        >>> found = strongest_head(model(batch.input_ids).attentions, tokens.index("bank"), tokens.index("river"))
        >>> found.layer, found.head, round(found.weight, 2)
        (0, 4, 0.52)
    """
    where = "strongest_head"
    batch, _, tokens, _ = _layer_maps(where, "attentions", attentions)
    for name, value, limit in (("query", query, tokens), ("key", key, tokens), ("sequence", sequence, batch)):
        value = _validate.integer(where, name, value, minimum=0)
        if value >= limit:
            raise ValueError(f"{where}: {name}={value} is out of range; it must be below {limit}")
    weights = torch.stack([layer[sequence, :, query, key] for layer in attentions]).detach()   # [L, H]
    best = int(weights.flatten().argmax())
    layer, head = divmod(best, weights.shape[1])
    return HeadWeight(layer, head, float(weights[layer, head]))


def attention_share(maps: Sequence[torch.Tensor], keys: int | Sequence[int], *, sequence: int = 0) -> torch.Tensor:
    """How much of each head's attention goes to the tokens at ``keys``, averaged over the queries.

    For every layer ``l`` and head ``h`` this is ``mean_i  Σ_{j in keys} m_ij / Σ_j m_ij`` with
    ``m = maps[l][sequence, h]``. For attention weights the rows already sum to 1, so it is
    the average weight on those keys; for contributions (``norm_attribution(...).contributions``)
    it is the share of what the heads add that comes from those tokens. ``keys=[0, -1]`` in a
    sequence without padding are ``[CLS]`` and ``[SEP]``.

    Args:
        maps: one ``[B, H, N, N]`` tensor per layer, non-negative: attention weights
            (``BertModel``'s ``attentions``) or contributions.
        keys: a position or a list of distinct positions ``j`` (columns); negative ones count
            from the end, as in Python.
        sequence: which sequence of the batch to look at. With padding, every query row is
            averaged, padded ones too; slice the real tokens first to leave them out.

    Returns:
        ``[L, H]``: the share per layer and head, in ``[0, 1]`` (0 for rows that are all 0).

    Raises:
        TypeError: ``maps`` not a non-empty sequence of floating tensors, or ``keys`` or
            ``sequence`` not ints.
        ValueError: tensors that are not ``[B, H, N, N]`` of one shape, or a position out of
            range or given twice.

    Example:
        >>> from attn_course.models.bert import load_pretrained
        >>> model, tokenizer = load_pretrained()
        >>> attentions = model(tokenizer("The bank of the river was muddy.").input_ids).attentions
        >>> share = attention_share(attentions, keys=[0])                     # [L, H]: on [CLS]
        >>> share.shape, [round(v, 2) for v in share.mean(-1).tolist()]
        (torch.Size([6, 12]), [0.28, 0.61, 0.68, 0.56, 0.6, 0.4])
    """
    where = "attention_share"
    batch, _, tokens, _ = _layer_maps(where, "maps", maps)
    sequence = _validate.integer(where, "sequence", sequence, minimum=0)
    if sequence >= batch:
        raise ValueError(f"{where}: sequence={sequence} is out of range; it must be below {batch}")
    if isinstance(keys, int) and not isinstance(keys, bool):
        keys = [keys]
    keys = _validate.integer_sequence(where, "keys", keys)
    if not keys:
        raise ValueError(f"{where}: keys must name at least one position")
    for key in keys:
        if not -tokens <= key < tokens:
            raise ValueError(f"{where}: key {key} is out of range for N={tokens} tokens")
    positions = [key % tokens for key in keys]
    if len(set(positions)) != len(positions):
        raise ValueError(f"{where}: keys name a position twice, got {keys} for N={tokens}")
    shares = []
    for layer in maps:
        m = layer[sequence].detach()                                              # [H, N, N]
        total = m.sum(-1).clamp_min(torch.finfo(m.dtype).tiny)                    # [H, N]
        shares.append((m[:, :, positions].sum(-1) / total).mean(-1))              # [H]
    return torch.stack(shares)                                                    # [L, H]


def _layer_maps(where: str, name: str, maps: object) -> torch.Size:
    """Check one ``[B, H, N, N]`` floating tensor per layer, all of one shape; return that shape."""
    if isinstance(maps, torch.Tensor) or not isinstance(maps, Sequence) or not maps:
        raise TypeError(f"{where}: {name} must be a non-empty sequence of [B, H, N, N] tensors "
                        f"(one per layer), got {type(maps).__name__}")
    shape = None
    for index, weights in enumerate(maps):
        weights = _validate.floating_tensor(where, f"{name}[{index}]", weights)
        if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
            raise ValueError(f"{where}: {name}[{index}] must be [B, H, N, N], got {_validate.shape_str(weights)}")
        if shape is not None and weights.shape != shape:
            raise ValueError(f"{where}: every layer's {name} must have one shape; {name}[{index}] is "
                             f"{_validate.shape_str(weights)}, {name}[0] is [{', '.join(map(str, shape))}]")
        shape = weights.shape
    return shape
