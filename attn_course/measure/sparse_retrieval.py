"""Does a query still find its needle when it may read only ``k`` keys? A retrieval task with no training
(chapter 13).

Every position ``i`` of a sequence of ``N`` random keys ``k_t ~ N(0, I_d)`` asks for one earlier token, its
*needle* ``j < i`` (drawn uniformly): its query is that key plus noise, ``q_i = k_j + σ·g``. The values are
random unit vectors; the attention output *decodes to the needle* when, among all ``N`` values, the needle's
has the largest dot product with it. Only the queries of the second half (``i ≥ N/2``, each with at least
``N/2`` keys behind it) are scored. Each query reads the keys one selection allows:

* ``dense``: every key ``t ≤ i`` (softmax attention, the reference);
* ``exact top-k``: the ``k`` keys of highest ``q·k`` (:func:`~attn_course.variants.sparse_attention.top_k_keys`
  on the exact scores): the best any indexer could pick, the *oracle*;
* ``indexer top-k``: the ``k`` keys of highest cheap score ``relu((q P) · (k P))``, the lightning indexer's
  form with one head. What stands in for the *trained* indexer is ``P`` ``[d, d_I]``, a random projection
  (entries ``N(0, 1/d_I)``, Johnson–Lindenstrauss): it keeps every dot product on average, with an error that
  shrinks as ``1/√d_I``. DeepSeek-V3.2 trains its indexer to imitate the main attention's distribution,
  which a random projection does not; read its curve as the price of a cheap score, not as V3.2's accuracy;
* ``MoBA blocks``: MoBA's gate (:func:`~attn_course.variants.block_selection.moba_blocks`): the query's own
  block and the ``top_blocks`` earlier blocks of ``B`` keys with the highest ``q · mean(k in block)``. The
  mean dilutes the needle's match among ``B - 1`` unrelated keys, so its block must win by a smaller margin.

:func:`retrieval_accuracy` returns a :class:`RetrievalRow` per selection and budget, averaged over seeds.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

import torch

from attn_course import _validate
from attn_course.core.masks import causal_mask
from attn_course.variants.block_selection import dense_block_mask, moba_blocks
from attn_course.variants.sparse_attention import top_k_keys

__all__ = ["SELECTIONS", "RetrievalRow", "retrieval_accuracy"]

SELECTIONS = ("dense", "exact top-k", "indexer top-k", "MoBA blocks")


@dataclasses.dataclass(frozen=True)
class RetrievalRow:
    """One selection at one budget of :func:`retrieval_accuracy`, averaged over the seeds.

    Attributes:
        selection: one of :data:`SELECTIONS`.
        budget: ``k`` for the top-k selections, ``top_blocks`` for MoBA, ``N`` for dense.
        keys_read: keys each scored query reads, on average (MoBA: its own block's keys up to itself, plus
            ``top_blocks · B``).
        needle_kept: fraction of scored queries whose needle is among the keys read.
        accuracy: fraction of scored queries whose attention output decodes to the needle's value.
    """

    selection: str
    budget: int
    keys_read: float
    needle_kept: float
    accuracy: float


def _task(n: int, head_dim: int, noise: float, indexer_dim: int, generator: torch.Generator):
    """One seed's keys, values, queries and needles, the exact and the indexer's scores of the last ``n/2``
    queries."""
    keys = torch.randn(n, head_dim, generator=generator)                                   # [N, d]
    values = torch.nn.functional.normalize(torch.randn(n, head_dim, generator=generator), dim=-1)  # [N, d]
    positions = torch.arange(n)
    needles = (torch.rand(n, generator=generator) * positions).long()                     # [N]: j < i (0 for i=0)
    queries = keys[needles] + noise * torch.randn(n, head_dim, generator=generator)      # [N, d]
    projection = torch.randn(head_dim, indexer_dim, generator=generator) / math.sqrt(indexer_dim)   # P [d, d_I]
    scored = slice(n // 2, n)                                                             # the last N/2 queries
    exact = queries[scored] @ keys.T / math.sqrt(head_dim)                                 # [N/2, N]
    cheap = torch.relu((queries[scored] @ projection) @ (keys @ projection).T)           # [N/2, N]
    return keys, values, queries, needles[scored], exact, cheap


def _score(exact: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, needles: torch.Tensor):
    """``(keys read, needle kept, accuracy)`` of softmax attention over ``mask`` ``[M, N]``."""
    weights = torch.softmax(exact.masked_fill(~mask, float("-inf")), dim=-1)              # [M, N]
    decoded = ((weights @ values) @ values.T).argmax(dim=-1)                              # [M]: the nearest value
    kept = mask.gather(-1, needles[:, None]).float().mean()
    return mask.sum(-1).float().mean().item(), kept.item(), (decoded == needles).float().mean().item()


def _budgets(where: str, name: str, value: object, minimum: int) -> list[int]:
    return _validate.integer_sequence(where, name, value, minimum=minimum)


def retrieval_accuracy(*, n: int = 1024, head_dim: int = 64, noise: float = 1.0, indexer_dim: int = 16,
                       ks: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256), block_size: int = 64,
                       top_blocks: Sequence[int] = (1, 2, 3, 4, 6, 8), seeds: Sequence[int] = (0, 1, 2)
                       ) -> list[RetrievalRow]:
    """Retrieval accuracy of dense attention, exact and indexer top-k, and MoBA's blocks (module docstring).

    Args:
        n: ``N``, keys per sequence; even and a multiple of ``block_size``.
        head_dim: ``d`` of keys, queries and values.
        noise: ``σ``, the query's noise around its needle's key, ``>= 0``.
        indexer_dim: ``d_I``, the width of the indexer's random projection.
        ks: the budgets ``k`` of the two top-k selections, each ``>= 1``.
        block_size: ``B`` of MoBA's blocks.
        top_blocks: MoBA's budgets, earlier blocks read beside the query's own, each ``>= 0``.
        seeds: one task each, from ``torch.Generator().manual_seed(seed)`` (the global RNG is untouched).

    Returns:
        ``[dense] + [exact top-k, indexer top-k] per k + [MoBA blocks] per top_blocks`` rows, accuracies
        averaged over the seeds.

    Raises:
        TypeError: a size, budget or seed that is not an int, ``noise`` not a number, budgets or seeds not a
            sequence.
        ValueError: a size below 1, an odd ``n`` or one that ``block_size`` does not divide, a negative
            ``noise``, budget or seed, no seeds.

    Example:
        >>> rows = retrieval_accuracy(n=128, head_dim=16, ks=(1, 128), block_size=16, top_blocks=(7,), seeds=(0,))
        >>> [(row.selection, row.budget) for row in rows]
        [('dense', 128), ('exact top-k', 1), ('indexer top-k', 1), ('exact top-k', 128), ('indexer top-k', 128),
         ('MoBA blocks', 7)]
        >>> rows[0].accuracy == rows[3].accuracy == rows[5].accuracy     # k = N, all blocks: dense attention
        True
    """
    where = "retrieval_accuracy"
    n, head_dim, indexer_dim, block_size = _validate.integers(where, minimum=1, n=n, head_dim=head_dim,
                                                              indexer_dim=indexer_dim, block_size=block_size)
    if n % 2 or n % block_size:
        raise ValueError(f"{where}: n must be even and a multiple of block_size={block_size}, got {n}")
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real):
        raise TypeError(f"{where}: noise must be a number >= 0, got {type(noise).__name__}")
    if not 0 <= noise < math.inf:
        raise ValueError(f"{where}: noise must be a finite number >= 0, got {noise}")
    ks = _budgets(where, "ks", ks, 1)
    top_blocks = _budgets(where, "top_blocks", top_blocks, 0)
    seeds = _validate.integer_sequence(where, "seeds", seeds, minimum=0, nonempty=True)

    runs: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    with torch.no_grad():
        for seed in seeds:
            generator = torch.Generator().manual_seed(seed)
            keys, values, queries, needles, exact, cheap = _task(n, head_dim, float(noise), indexer_dim, generator)
            causal = causal_mask(n // 2, n)                                               # [N/2, N]: the last N/2
            runs.setdefault(("dense", n), []).append(_score(exact, causal, values, needles))
            for k in ks:
                for selection, scores in (("exact top-k", exact), ("indexer top-k", cheap)):
                    mask = top_k_keys(scores[None], k)[0]                                 # [N/2, N]
                    runs.setdefault((selection, k), []).append(_score(exact, mask, values, needles))
            for count in top_blocks:
                chosen = moba_blocks(queries[None, None], keys[None, None], block_size=block_size, top_k=count)
                mask = dense_block_mask(chosen[..., n // 2:, :], block_size)[0, 0]        # [N/2, N]
                runs.setdefault(("MoBA blocks", count), []).append(_score(exact, mask, values, needles))
    return [RetrievalRow(selection, budget, *(sum(column) / len(column) for column in zip(*results)))
            for (selection, budget), results in runs.items()]
