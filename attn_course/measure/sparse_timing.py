"""Learned sparse attention against dense attention on a CPU, time against N (``python -m benchmarks sparse``),
for ``q``, ``k``, ``v`` ``[B, H, N, d]`` float32, causal:

* ``dense sdpa``: PyTorch's SDPA, a fused kernel over all ``N (N + 1) / 2`` pairs;
* ``top-k gather``: each query's ``k`` keys, chosen beforehand (untimed) by DeepSeek-V3.2's
  :class:`~attn_course.variants.sparse_attention.LightningIndexer`, gathered and attended: ``O(N k d)``;
* ``top-k + indexer``: the same with the selection timed: the indexer's scores over all ``N²/2`` pairs (its
  ``H_I`` heads of ``d_I``, materialised ``[B, H_I, N, N]`` as the package writes it), ``top_k_keys``' top-k,
  then the gathered attention;
* ``blocks gather``: the keys of MoBA's blocks (:func:`~attn_course.variants.block_selection.moba_blocks`,
  chosen beforehand): each query's own block and ``top_blocks`` earlier ones, ``(top_blocks + 1) · B`` keys;
* ``blocks + selection``: the same with MoBA's gate (``q`` against each block's mean key) timed;
* ``blocks flex eager``: the chosen blocks as a FlexAttention ``mask_mod``
  (:func:`~attn_course.variants.block_selection.block_mask_mod`) through
  :func:`~attn_course.variants.flex_attention.flex_attend`, not compiled: the unfused fallback computes every
  score and masks, so it shows what a mask costs without a kernel that skips the empty tiles.

Gathering copies ``2 · k · d`` floats per query that a fused sparse kernel would read in place, so the sparse
rows overstate what such a kernel would take here: a crossover they show is a late one. Every output is compared
with SDPA under the selection's mask before it is timed.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course._threads import threads as threads_of_torch
from attn_course.core.masks import causal_mask
from attn_course.measure.crossover import first_below_one
from attn_course.measure.rows import check_rows, pyplot_for
from attn_course.measure.timing import best_time
from attn_course.measure.variants import check_name
from attn_course.variants.block_selection import block_mask_mod, dense_block_mask, moba_blocks
from attn_course.variants.flex_attention import flex_attend
from attn_course.variants.sparse_attention import IndexerConfig, LightningIndexer, top_k_keys

__all__ = ["DEFAULT_LENGTHS", "QUICK_LENGTHS", "SPARSE_VARIANTS", "SparseCrossover", "SparseRow", "measure_sparse",
           "plot_sparse", "sparse_crossover"]

DEFAULT_LENGTHS = (512, 1024, 2048, 4096, 8192)
QUICK_LENGTHS = (64, 128)
SPARSE_VARIANTS = ("dense sdpa", "top-k gather", "top-k + indexer", "blocks gather", "blocks + selection",
                   "blocks flex eager")


@dataclasses.dataclass(frozen=True)
class SparseRow:
    """One (variant, N) measurement of :func:`measure_sparse`.

    Attributes:
        variant: one of :data:`SPARSE_VARIANTS`.
        n: sequence length N.
        keys_per_query: the most keys a query reads: ``N`` (dense), ``k``, ``(top_blocks + 1) · B``.
        seconds: best wall-clock time of one call.
        max_difference: largest absolute difference of the output from SDPA under the selection's mask.
    """

    variant: str
    n: int
    keys_per_query: int
    seconds: float
    max_difference: float


def _gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor, valid: torch.Tensor,
                      chunk: int = 128) -> torch.Tensor:
    """Each query attends its keys ``index`` ``[B, H, N, K]`` (where ``valid``), gathered, ``chunk`` queries at a
    time so that the copies stay small."""
    batch, heads, tokens, width = q.shape
    flat_k, flat_v = k.reshape(-1, width), v.reshape(-1, v.shape[-1])                      # [B·H·N, d]
    base = (torch.arange(batch * heads) * k.shape[2]).view(batch, heads, 1, 1)           # each head's first row
    out = q.new_empty(batch, heads, tokens, v.shape[-1])
    for start in range(0, tokens, chunk):
        part = slice(start, start + chunk)
        rows = (index[:, :, part] + base).reshape(-1)                                     # [B·H·C·K]
        shape = (*index[:, :, part].shape, -1)                                            # [B, H, C, K, ·]
        keys, values = flat_k.index_select(0, rows).view(shape), flat_v.index_select(0, rows).view(shape)
        scores = torch.einsum("bhckd,bhcd->bhck", keys, q[:, :, part]) / math.sqrt(width)  # [B, H, C, K]
        weights = torch.softmax(scores.masked_fill(~valid[:, :, part], float("-inf")), dim=-1)
        out[:, :, part] = torch.einsum("bhck,bhckd->bhcd", weights, values)              # [B, H, C, d_v]
    return out


def _top_k_index(scores: torch.Tensor, k: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index, valid)`` ``[B, H, N, k]`` of the indexer's ``scores`` ``[B, N, N]``, shared by every head."""
    causal = causal_mask(scores.shape[-1], device=scores.device)
    index = scores.masked_fill(~causal, float("-inf")).topk(min(k, scores.shape[-1]), dim=-1).indices   # [B, N, k]
    valid = index <= torch.arange(scores.shape[-1])[:, None]                             # no future key
    return index[:, None].expand(-1, heads, -1, -1), valid[:, None].expand(-1, heads, -1, -1)


def _block_index(chosen: torch.Tensor, block_size: int, top_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index, valid)`` ``[B, H, N, (top_blocks + 1) · B]``: the keys of the blocks ``chosen`` ``[B, H, N, n]``."""
    count = min(top_blocks + 1, chosen.shape[-1])
    blocks = chosen.float().topk(count, dim=-1).indices                                  # [B, H, N, count]
    kept = chosen.gather(-1, blocks)                                                     # a chosen block or a filler
    index = (blocks[..., None] * block_size + torch.arange(block_size)).flatten(-2)      # [B, H, N, count·B]
    positions = torch.arange(chosen.shape[2])[:, None]
    return index, kept.repeat_interleave(block_size, dim=-1) & (index <= positions)


def _functions(q, k, v, x, query_input, indexer: LightningIndexer, top_k: int, block_size: int, top_blocks: int
               ) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, torch.Tensor], dict[str, int]]:
    """``({name: attend()}, {name: its mask [B, H | 1, N, N]}, {name: keys per query})`` for one N."""
    heads, tokens = q.shape[1], q.shape[2]

    def top_k_selected():
        return _top_k_index(indexer(x, query_input), top_k, heads)

    def blocks_selected():
        chosen = moba_blocks(q, k, block_size=block_size, top_k=top_blocks)
        return _block_index(chosen, block_size, top_blocks)

    chosen = moba_blocks(q, k, block_size=block_size, top_k=top_blocks)                  # [B, H, N, n]
    top_k_index, block_index = top_k_selected(), _block_index(chosen, block_size, top_blocks)
    mask_mod = block_mask_mod(chosen, block_size)

    def flex():
        with warnings.catch_warnings():   # eager FlexAttention says it materialises the scores: that is the row
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile",
                                    category=UserWarning)
            return flex_attend(q, k, v, mask_mod=mask_mod)

    functions = {
        "dense sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "top-k gather": lambda: _gather_attention(q, k, v, *top_k_index),
        "top-k + indexer": lambda: _gather_attention(q, k, v, *top_k_selected()),
        "blocks gather": lambda: _gather_attention(q, k, v, *block_index),
        "blocks + selection": lambda: _gather_attention(q, k, v, *blocks_selected()),
        "blocks flex eager": flex,
    }
    top_k_mask = top_k_keys(indexer(x, query_input), top_k)[:, None]                   # [B, 1, N, N]
    block_mask = dense_block_mask(chosen, block_size)                                   # [B, H, N, N]
    masks = {"dense sdpa": causal_mask(tokens), "top-k gather": top_k_mask, "top-k + indexer": top_k_mask}
    masks.update(dict.fromkeys(("blocks gather", "blocks + selection", "blocks flex eager"), block_mask))
    keys = {"dense sdpa": tokens, "top-k gather": top_k, "top-k + indexer": top_k}
    keys.update(dict.fromkeys(("blocks gather", "blocks + selection", "blocks flex eager"),
                              (top_blocks + 1) * block_size))
    return functions, masks, keys


def measure_sparse(lengths: Sequence[int] = DEFAULT_LENGTHS, *, batch: int = 1, heads: int = 2, head_dim: int = 64,
                   top_k: int = 256, block_size: int = 64, top_blocks: int = 3, indexer_heads: int = 2,
                   indexer_dim: int = 16, variants: Sequence[str] = SPARSE_VARIANTS, repeats: int = 2,
                   budget_s: float = 0.5, threads: int | None = 1, seed: int = 0) -> list[SparseRow]:
    """Time dense causal attention against top-k and MoBA block attention (module docstring), outputs checked.

    For each N, random ``q``, ``k``, ``v`` and the indexer's input (from a generator seeded with ``seed``; the
    indexer's weights from ``torch.manual_seed(seed)``, the global RNG restored after) go through every variant
    under ``torch.no_grad()``: one call compared with SDPA under the variant's mask, then the best of at least
    ``repeats`` timed calls, more within ``budget_s`` (:func:`~attn_course.measure.timing.best_time`).

    Args:
        lengths: sequence lengths N, each a multiple of ``block_size``.
        batch, heads, head_dim: ``B``, ``H``, ``d``.
        top_k: keys each query keeps (top-k rows).
        block_size, top_blocks: MoBA's ``B`` and the earlier blocks each query keeps beside its own.
        indexer_heads, indexer_dim: the lightning indexer's ``H_I`` and ``d_I`` (its input is ``H·d`` wide).
        variants: names from :data:`SPARSE_VARIANTS` (default: all).
        repeats, budget_s: as :func:`~attn_course.measure.timing.best_time`'s.
        threads: CPU threads for torch during the measurement (restored after), or None to leave it.
        seed: for the random inputs and weights; ``>= 0``.

    Returns:
        One :class:`SparseRow` per (N, variant), N and variants in the order given.

    Raises:
        TypeError: ``lengths`` or ``variants`` not a sequence, a size that is not an int.
        ValueError: no lengths or variants, a size below 1 (``top_blocks`` below 0, ``indexer_dim`` below 2), an
            N that ``block_size`` does not divide, an unknown variant name, a negative seed or ``budget_s``.
        RuntimeError: a variant's output differs from its reference by more than 1e-4.

    Example:
        >>> rows = measure_sparse((64, 128), top_k=16, block_size=16, top_blocks=1, repeats=1, budget_s=0,
        ...                       variants=("dense sdpa", "top-k gather", "blocks gather"))
        >>> [(row.variant, row.n, row.keys_per_query) for row in rows][:3]
        [('dense sdpa', 64, 64), ('top-k gather', 64, 16), ('blocks gather', 64, 32)]
    """
    where = "measure_sparse"
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1, nonempty=True)
    batch, heads, head_dim, top_k, block_size, indexer_heads, indexer_dim = _validate.integers(
        where, minimum=1, batch=batch, heads=heads, head_dim=head_dim, top_k=top_k, block_size=block_size,
        indexer_heads=indexer_heads, indexer_dim=indexer_dim)
    top_blocks = _validate.integer(where, "top_blocks", top_blocks, minimum=0)
    if indexer_dim < 2:
        raise ValueError(f"{where}: indexer_dim must be >= 2 (RoPE turns pairs of features), got {indexer_dim}")
    for index, n in enumerate(lengths):
        if n % block_size:
            raise ValueError(f"{where}: lengths[{index}] must be a multiple of block_size={block_size}, got {n}")
    variants = _validate.sequence(where, "variants", variants, of="variant names")
    if not variants:
        raise ValueError(f"{where}: variants must not be empty")
    for index, name in enumerate(variants):
        check_name(where, f"variants[{index}]", name, SPARSE_VARIANTS)
    repeats = _validate.integer(where, "repeats", repeats, minimum=1)
    budget_s = _validate.seconds(where, "budget_s", budget_s)
    threads = None if threads is None else _validate.integer(where, "threads", threads, minimum=1)
    seed = _validate.integer(where, "seed", seed, minimum=0)
    generator = torch.Generator().manual_seed(seed)
    width, query_input = heads * head_dim, 2 * indexer_dim
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        indexer = LightningIndexer(IndexerConfig(width, query_input, num_heads=indexer_heads, head_dim=indexer_dim,
                                                 rope_dim=2 * max(1, indexer_dim // 4), top_k=top_k))
    rows = []
    with torch.no_grad(), threads_of_torch(threads):
        for n in lengths:
            q, k, v = (torch.randn(batch, heads, n, head_dim, generator=generator) for _ in range(3))
            x = torch.randn(batch, n, width, generator=generator)                          # [B, N, H·d]
            query_input = torch.randn(batch, n, 2 * indexer_dim, generator=generator)      # [B, N, q_in]
            functions, masks, keys = _functions(q, k, v, x, query_input, indexer, top_k, block_size, top_blocks)
            references: dict[int, torch.Tensor] = {}                                       # by mask
            for variant in variants:
                mask = masks[variant]
                if id(mask) not in references:
                    references[id(mask)] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                reference = references[id(mask)]
                difference = (functions[variant]() - reference).abs().max().item()
                if not difference <= 1e-4:
                    raise RuntimeError(f"{where}: {variant} differs from its reference by {difference:.3g} at N={n}")
                seconds = best_time(functions[variant], repeats, budget_s=budget_s)
                rows.append(SparseRow(variant, n, min(keys[variant], n), seconds, difference))
    return rows


@dataclasses.dataclass(frozen=True)
class SparseCrossover:
    """Where a sparse variant becomes faster than dense attention (:func:`sparse_crossover`).

    Attributes:
        dense, sparse: the two variants compared; lengths: the N where both were measured, ascending.
        time_n: the smallest grid N from which the sparse variant is faster at every larger grid N; None if it
            is slower at the largest.
        time_n_interpolated: where ``log(t_sparse / t_dense)`` crosses 0, linear in ``log N`` between ``time_n``
            and the grid N before it; None when ``time_n`` is None or the grid's first N.
        seconds_ratio: ``t_sparse / t_dense`` at each N.
    """

    dense: str
    sparse: str
    lengths: tuple[int, ...]
    time_n: int | None
    time_n_interpolated: float | None
    seconds_ratio: tuple[float, ...]

    def describe(self) -> str:
        """One sentence, e.g. ``"top-k gather is faster than dense sdpa from N = 2048 (curves cross near ...)"``."""
        if self.time_n is None:
            return (f"{self.sparse} is not faster than {self.dense} for N <= {self.lengths[-1]} "
                    f"(time ratio at the largest N: {self.seconds_ratio[-1]:.2f})")
        if self.time_n_interpolated is None:
            return (f"{self.sparse} is faster than {self.dense} already at the smallest N measured, "
                    f"{self.time_n} (ratio {self.seconds_ratio[0]:.2f})")
        return (f"{self.sparse} is faster than {self.dense} from N = {self.time_n} (curves cross near "
                f"N ≈ {self.time_n_interpolated:.0f}; ratio at the largest N {self.seconds_ratio[-1]:.2f})")


def sparse_crossover(rows: Sequence[SparseRow], sparse: str, *, dense: str = "dense sdpa") -> SparseCrossover:
    """The :class:`SparseCrossover` of ``sparse`` against ``dense`` in rows already measured.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`SparseRow`, a name not a str.
        ValueError: an unknown variant name, or fewer than two N with both variants.

    Example:
        >>> rows = [SparseRow(name, n, 0, seconds, 0.0) for name, n, seconds in (
        ...     ("dense sdpa", 100, 1.0), ("top-k gather", 100, 2.0), ("dense sdpa", 400, 4.0),
        ...     ("top-k gather", 400, 2.0))]
        >>> crossover = sparse_crossover(rows, "top-k gather")
        >>> crossover.time_n, round(crossover.time_n_interpolated)
        (400, 200)
    """
    where = "sparse_crossover"
    rows = check_rows(where, rows, (SparseRow,))
    sparse = check_name(where, "sparse", sparse, SPARSE_VARIANTS)
    dense = check_name(where, "dense", dense, SPARSE_VARIANTS)
    found = {(row.variant, row.n): row.seconds for row in rows}
    lengths = sorted(n for (name, n) in found if name == dense and (sparse, n) in found)
    if len(lengths) < 2:
        raise ValueError(f"{where}: rows must hold {dense!r} and {sparse!r} at two or more common N, got {lengths}")
    ratios = [found[sparse, n] / found[dense, n] for n in lengths]
    time_n, between = first_below_one(lengths, ratios)
    return SparseCrossover(dense, sparse, tuple(lengths), time_n, between, tuple(ratios))



def plot_sparse(rows: Sequence[SparseRow], path: object, *, title: str) -> None:
    """Save a PNG of :func:`measure_sparse`'s rows, seconds against N, log-log, a line per variant.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`SparseRow`, ``path`` not a path, ``title`` not a str.
        ValueError: no rows.
        ImportError: matplotlib is not installed.
    """
    where = "plot_sparse"
    rows = check_rows(where, rows, (SparseRow,))
    path, plt = pyplot_for(where, path, title)
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for index, variant in enumerate(dict.fromkeys(row.variant for row in rows)):
        mine = [row for row in rows if row.variant == variant]
        axis.plot([row.n for row in mine], [row.seconds for row in mine], marker="o", color=f"C{index}",
                  label=variant)
    lengths = sorted({row.n for row in rows})
    axis.set_xscale("log", base=2)
    axis.set_xticks(lengths, [str(n) for n in lengths])
    axis.minorticks_off()
    axis.set(yscale="log", xlabel="N", ylabel="seconds (best)", title="causal attention, time")
    axis.legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
