"""Attention over the key blocks each query selects: MoBA's gate and NSA's three branches, as FlexAttention masks.

Both cut the keys into blocks of ``b`` tokens and let each query read only a few blocks, chosen from the
data; what differs is how they choose.

- **MoBA** (Lu et al., 2025): query ``i`` scores each earlier *complete* block ``j`` by ``q_i · mean(k in j)``,
  keeps the ``top_k`` best, and always reads its own block (causally). :func:`moba_blocks`.
- **NSA** (Yuan et al., 2025, native sparse attention) runs three branches and mixes them with gates:
  *compressed*, attention over one key and value per block (the paper compresses a block with a small
  learned MLP; here its mean, which keeps the selection's logic and needs no training); *selected*, full
  attention over the ``top_n`` blocks whose compressed keys took the most of the compressed attention
  (plus the first block and the query's own); *sliding*, the last ``window`` tokens. :func:`nsa_attention`.

A selection is a bool tensor ``chosen [B, H, N, n_blocks]``; :func:`block_mask_mod` turns it into a
FlexAttention ``mask_mod`` (chapter 09's :func:`~attn_course.variants.flex_attention.flex_attend`), and
:func:`dense_block_mask` into the ``[B, H, N, N]`` mask it stands for, to check one against the other and
to count the scores a selection computes.
"""

from __future__ import annotations

import math

import torch

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.variants.flex_attention import MaskMod, flex_attend, sliding_window

__all__ = ["block_means", "moba_blocks", "block_mask_mod", "dense_block_mask", "nsa_attention"]


def _blocks(where: str, k: torch.Tensor, block_size: object) -> tuple[int, int]:
    block_size = _validate.integer(where, "block_size", block_size, minimum=1)
    if k.shape[2] % block_size:
        raise ValueError(f"{where}: the keys' length {k.shape[2]} must be a multiple of block_size={block_size}")
    return block_size, k.shape[2] // block_size


def block_means(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[B, H, n_blocks, d]``: the mean of each block of ``block_size`` tokens of ``x [B, H, N, d]``."""
    return x.unflatten(2, (-1, block_size)).mean(dim=3)


def _top_blocks(scores: torch.Tensor, allowed: torch.Tensor, count: int) -> torch.Tensor:
    """``[B, H, N, n]`` bool: the ``count`` best allowed blocks of each row (fewer where fewer are allowed)."""
    ranked = scores.masked_fill(~allowed, float("-inf")).topk(min(count, scores.shape[-1]), dim=-1).indices
    return torch.zeros_like(allowed).scatter(-1, ranked, True) & allowed


def _own_block(tokens: int, blocks: int, block_size: int, device) -> torch.Tensor:
    """``[N, n]`` bool: each query's own block."""
    return (torch.arange(tokens, device=device)[:, None] // block_size) == torch.arange(blocks, device=device)


def moba_blocks(q: torch.Tensor, k: torch.Tensor, *, block_size: int, top_k: int) -> torch.Tensor:
    """MoBA's choice: for each query, its own block and the ``top_k`` earlier complete blocks of highest ``q·mean(k)``.

    Args:
        q, k: ``[B, H, N, d]``, queries at positions ``0 .. N-1`` and their keys; ``N`` a multiple of ``block_size``.

    Returns:
        ``chosen [B, H, N, n_blocks]`` bool.

    Example:
        >>> q, k = torch.ones(1, 1, 8, 1), torch.arange(8.0).view(1, 1, 8, 1)   # block means 0.5, 2.5, 4.5, 6.5
        >>> moba_blocks(q, k, block_size=2, top_k=1)[0, 0].int().tolist()[-1]   # the last query: the best + its own
        [0, 0, 1, 1]
    """
    where = "moba_blocks"
    _validate.four_d(where, q=q, k=k)
    block_size, blocks = _blocks(where, k, block_size)
    top_k = _validate.integer(where, "top_k", top_k, minimum=0)
    scores = q @ block_means(k, block_size).transpose(-1, -2)                          # [B, H, N, n]
    own = _own_block(q.shape[2], blocks, block_size, q.device)                         # [N, n]
    earlier = torch.arange(blocks, device=q.device) < torch.arange(q.shape[2], device=q.device)[:, None] // block_size
    chosen = _top_blocks(scores, earlier.expand_as(scores), top_k) if top_k else torch.zeros_like(scores, dtype=bool)
    return chosen | own


def block_mask_mod(chosen: torch.Tensor, block_size: int) -> MaskMod:
    """A FlexAttention ``mask_mod``: query ``i`` sees key ``j ≤ i`` when ``j``'s block is chosen for ``i``."""
    chosen = _validate.tensor("block_mask_mod", "chosen", chosen)
    block_size = _validate.integer("block_mask_mod", "block_size", block_size, minimum=1)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & chosen[b, h, q_idx, kv_idx // block_size]
    return mask_mod


def dense_block_mask(chosen: torch.Tensor, block_size: int) -> torch.Tensor:
    """The ``[B, H, N, N]`` bool mask a selection stands for: causal, within the chosen blocks."""
    chosen = _validate.tensor("dense_block_mask", "chosen", chosen)
    expanded = chosen.repeat_interleave(block_size, dim=-1)                            # [B, H, N, N]
    return expanded & causal_mask(chosen.shape[2], expanded.shape[-1], device=chosen.device)


def nsa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor, *, block_size: int,
                  top_n: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """NSA's three branches, mixed by ``gates [B, H, N, 3]`` (compressed, selected, sliding; each in ``(0, 1)``).

    Returns:
        ``(output [B, H, N, d_v], chosen [B, H, N, n_blocks])``: the mixed output and the selected branch's blocks.

    Raises:
        TypeError, ValueError: inputs that are not 4-D floating tensors of one dtype, a length that is not a
            multiple of ``block_size``, ``gates`` of another shape, counts below 1.
    """
    where = "nsa_attention"
    _validate.four_d(where, q=q, k=k, v=v, gates=gates)
    block_size, blocks = _blocks(where, k, block_size)
    if gates.shape != (*q.shape[:3], 3):
        raise ValueError(f"{where}: gates must be [B, H, N, 3], got {_validate.shape_str(gates)}")
    top_n = _validate.integer(where, "top_n", top_n, minimum=1)
    window = _validate.integer(where, "window", window, minimum=1)
    tokens, scale = q.shape[2], 1.0 / math.sqrt(q.shape[-1])

    # Compressed: one key and value per block, visible once the block is complete.
    ends = (torch.arange(blocks, device=q.device) + 1) * block_size - 1                # [n]: each block's last token
    complete = ends <= torch.arange(tokens, device=q.device)[:, None]                  # [N, n]
    compressed, weights = self_attention(q, block_means(k, block_size), block_means(v, block_size), complete,
                                         scale=scale)                                 # [B, H, N, d_v], [B, H, N, n]

    # Selected: the blocks the compressed attention weighted most, the first block and the query's own.
    always = _own_block(tokens, blocks, block_size, q.device) | (torch.arange(blocks, device=q.device) == 0)
    chosen = _top_blocks(weights, complete.expand_as(weights), top_n) | always
    selected = flex_attend(q, k, v, mask_mod=block_mask_mod(chosen, block_size), scale=scale)

    # Sliding: the last `window` tokens.
    local = flex_attend(q, k, v, mask_mod=sliding_window(window), scale=scale)
    return gates[..., :1] * compressed + gates[..., 1:2] * selected + gates[..., 2:] * local, chosen
