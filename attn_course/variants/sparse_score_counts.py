"""How many query–key scores causal attention computes per sequence: dense, DeepSeek-V3.2's top-k, MoBA's blocks.

For one attention head and one sequence of ``N`` tokens, query ``i`` (positions ``0 .. N-1``) may read the
``i + 1`` keys ``t ≤ i``:

=================  ========================================  =========================================
scheme             selection scores (cheap)                  attention scores (full width)
=================  ========================================  =========================================
dense              none                                      ``Σ_i (i + 1) = N (N + 1) / 2``
top-k (indexer)    ``N (N + 1) / 2`` indexer scores          ``Σ_i min(k, i + 1)``
MoBA blocks        ``Σ_i ⌊i / B⌋`` block scores               ``Σ_i (i mod B + 1) + B · min(top, ⌊i / B⌋)``
=================  ========================================  =========================================

Each count is what the package's code keeps, causality included: :func:`top_k_keys` keeps ``min(k, i + 1)``
keys (an early query keeps all it has); :func:`moba_blocks` scores query ``i`` against the mean key of each
earlier *complete* block (the ``⌊i / B⌋`` blocks before its own) and keeps the ``min(top, ⌊i / B⌋)`` best
plus its own block up to itself. (The package computes the lesson's way, the whole score matrix then a
mask: ``LightningIndexer`` all ``N²`` pairs, ``moba_blocks`` all ``N · N/B`` block scores; a kernel skips
what the mask hides, and that is what is counted here.)

An indexer score costs ``H_I · d_I`` multiply-adds (its heads and their width) and serves every attention
head (one selection per token); an attention score costs ``d_k`` per head; a MoBA block score is a query of
one head against a mean key, ``d_k``. :func:`score_count_rows` sets the three side by side for one layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from attn_course import _validate

__all__ = ["dense_scores", "top_k_scores", "block_scores", "ScoreCountRow", "score_count_rows"]


def dense_scores(n: int) -> int:
    """Scores of dense causal attention over ``n`` tokens, ``n (n + 1) / 2`` (also the indexer's).

    Example:
        >>> dense_scores(4)            # 1 + 2 + 3 + 4
        10
    """
    n = _validate.integer("dense_scores", "n", n, minimum=1)
    return n * (n + 1) // 2


def top_k_scores(n: int, k: int) -> int:
    """Attention scores when each query keeps its ``k`` best keys among the ``i + 1`` it may read:
    ``Σ_i min(k, i + 1)``.

    Example:
        >>> top_k_scores(5, 2)         # 1 + 2 + 2 + 2 + 2
        9
    """
    where = "top_k_scores"
    n, k = _validate.integers(where, minimum=1, n=n, k=k)
    if k >= n:
        return n * (n + 1) // 2
    return k * (k + 1) // 2 + (n - k) * k


def block_scores(n: int, block_size: int, top_blocks: int) -> tuple[int, int]:
    """``(block scores, attention scores)`` of MoBA's selection over ``n`` tokens (module docstring's table).

    Args:
        n: ``N``, a multiple of ``block_size`` (as :func:`moba_blocks` requires).
        block_size: ``B``.
        top_blocks: earlier blocks each query keeps beside its own, ``>= 0``.

    Raises:
        TypeError: an argument that is not an int.
        ValueError: ``n`` or ``block_size`` below 1, ``top_blocks`` below 0, ``n`` not a multiple of ``block_size``.

    Example:
        >>> block_scores(8, 2, 1)      # queries 2..7 score 1, 1, 2, 2, 3, 3 blocks; read 1, 2, 3, 4, 3, 4, 3, 4
        (12, 24)
    """
    where = "block_scores"
    n, block_size = _validate.integers(where, minimum=1, n=n, block_size=block_size)
    top_blocks = _validate.integer(where, "top_blocks", top_blocks, minimum=0)
    if n % block_size:
        raise ValueError(f"{where}: n must be a multiple of block_size={block_size}, got {n}")
    blocks = n // block_size
    selection = block_size * blocks * (blocks - 1) // 2                       # Σ over blocks b of B · b
    own = blocks * block_size * (block_size + 1) // 2                         # each block's causal triangle
    kept = sum(min(top_blocks, b) for b in range(blocks))                     # earlier blocks kept, per block
    return selection, own + block_size * block_size * kept


@dataclasses.dataclass(frozen=True)
class ScoreCountRow:
    """One scheme at one ``N`` of :func:`score_count_rows`.

    Attributes:
        scheme: ``"dense"``, ``"top-k"`` or ``"MoBA blocks"``.
        n: ``N``.
        selection_scores: the indexer's scores (top-k) or the block scores of one head (MoBA); 0 for dense.
        attention_scores: full-width scores of one head.
        multiply_adds: of all scores for the layer: ``heads · d_k`` per attention score and per MoBA block
            score, ``H_I · d_I`` per indexer score (q·k products only; the values' weighted sum is apart).
        of_dense: ``multiply_adds`` over dense attention's.
    """

    scheme: str
    n: int
    selection_scores: int
    attention_scores: int
    multiply_adds: int
    of_dense: float


def score_count_rows(lengths: Sequence[int] = (1024, 4096, 16384), *, k: int = 2048, block_size: int = 512,
                     top_blocks: int = 3, heads: int = 128, head_dim: int = 192, indexer_heads: int = 64,
                     indexer_dim: int = 128) -> list[ScoreCountRow]:
    """Scores and multiply-adds of dense, top-k and MoBA attention for one layer and sequence, per ``N``.

    The defaults are DeepSeek-V3.2's: ``k = 2048`` (``index_topk``), 128 heads whose scores are 192 wide
    (``qk_nope_head_dim + qk_rope_head_dim``, unabsorbed, as in prefill), an indexer of 64 heads of 128
    (``index_n_heads``, ``index_head_dim``); MoBA's block 512 with 3 blocks is an illustration at the same
    heads, not a published configuration.

    Args:
        lengths: the ``N``, each a multiple of ``block_size``.
        k, block_size, top_blocks: the selections' budgets (``top_blocks >= 0``, the others ``>= 1``).
        heads, head_dim: the attention's heads and their score width ``d_k``.
        indexer_heads, indexer_dim: ``H_I`` and ``d_I``.

    Returns:
        Three rows per ``N`` (dense, top-k, MoBA blocks), ``N`` in the order given.

    Raises:
        TypeError: ``lengths`` not a sequence, a size that is not an int.
        ValueError: no lengths, a size below its minimum, an ``N`` that ``block_size`` does not divide.

    Example:
        >>> rows = score_count_rows((4096,), k=1024, block_size=512, top_blocks=1, heads=1, head_dim=1,
        ...                         indexer_heads=1, indexer_dim=1)
        >>> [(row.scheme, row.selection_scores, row.attention_scores) for row in rows]
        [('dense', 0, 8390656), ('top-k', 8390656, 3670528), ('MoBA blocks', 14336, 2885632)]
    """
    where = "score_count_rows"
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1, nonempty=True)
    k, block_size, heads, head_dim, indexer_heads, indexer_dim = _validate.integers(
        where, minimum=1, k=k, block_size=block_size, heads=heads, head_dim=head_dim, indexer_heads=indexer_heads,
        indexer_dim=indexer_dim)
    top_blocks = _validate.integer(where, "top_blocks", top_blocks, minimum=0)
    for index, n in enumerate(lengths):
        if n % block_size:
            raise ValueError(f"{where}: lengths[{index}] must be a multiple of block_size={block_size}, got {n}")
    width, indexer_width = heads * head_dim, indexer_heads * indexer_dim        # multiply-adds per score
    rows = []
    for n in lengths:
        dense = dense_scores(n)
        selected = top_k_scores(n, k)
        blocks, within = block_scores(n, block_size, top_blocks)
        for scheme, selection, attention, cost in (
                ("dense", 0, dense, dense * width),
                ("top-k", dense, selected, dense * indexer_width + selected * width),
                ("MoBA blocks", blocks, within, (blocks + within) * width)):
            rows.append(ScoreCountRow(scheme, n, selection, attention, cost, cost / (dense * width)))
    return rows
