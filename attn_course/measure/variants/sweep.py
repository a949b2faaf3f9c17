"""``measure_variants``: every variant at every N, each output checked against a reference before it is timed."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course._threads import threads as threads_of_torch
from attn_course.measure.memory import available_memory_bytes, peak_memory
from attn_course.measure.timing import best_time
from attn_course.measure.variants.decode import decode_rows
from attn_course.measure.variants.names import (
    DECODE_VARIANTS,
    DEFAULT_LENGTHS,
    PREFILL_VARIANTS,
    VariantRow,
    check_lengths,
    check_names,
)
from attn_course.measure.variants.prefill import MATERIALISING, prefill_functions
from attn_course.variants.linear_attention import linear_attention_parallel
from attn_course.variants.masks import sliding_window_mask

__all__ = ["measure_variants"]


def measure_variants(
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    *,
    batch: int = 1,
    heads: int = 4,
    head_dim: int = 64,
    window: int = 128,
    chunk_size: int = 128,
    variants: Sequence[str] = PREFILL_VARIANTS + DECODE_VARIANTS,
    repeats: int = 2,
    budget_s: float = 0.25,
    threads: int | None = 1,
    seed: int = 0,
) -> list[VariantRow]:
    """Time and peak memory of causal attention variants against N, each output checked first.

    For each N, random ``q``, ``k``, ``v`` ``[B, H, N, d]`` float32 (from a generator seeded with
    ``seed``; the global RNG is not touched) go through every variant under ``torch.no_grad()``:
    one call under :func:`~attn_course.measure.memory.peak_memory` (its output compared with the
    reference), then the best of at least ``repeats`` timed calls, more while they took under
    ``budget_s`` in all (:func:`~attn_course.measure.timing.best_time`): fast variants get many
    samples, whose minimum resists a busy machine's noise. The variants that materialise
    ``N × N`` buffers (``softmax self_attention``, ``sliding window mask``, ``flex eager``) are
    skipped at an N whose three ``B·H·N²`` float32 buffers would not fit comfortably in the
    memory free now.

    One CPU thread by default: on a shared 2-core machine, two threads made the many small
    operations of the chunked and recurrent forms up to 10× slower at random (a thread waiting
    for a busy core), which moved the crossover by 4× from run to run; on one thread the ratios
    were smooth and repeatable. Pass ``threads=None`` to keep torch's setting.

    Args:
        lengths: sequence lengths N, one group of rows each.
        batch, heads, head_dim: ``B``, ``H``, ``d``.
        window: ``W`` of the sliding window and of the rolling cache (keys each query sees).
        chunk_size: ``C`` of the chunked linear attention.
        variants: names from :data:`PREFILL_VARIANTS` and :data:`DECODE_VARIANTS` (default: all).
        repeats: best time of at least this many calls.
        budget_s: seconds per (variant, N) within which more calls are timed; 0 for ``repeats`` exactly.
        threads: CPU threads for torch during the measurement (restored after), or None.
        seed: for the random inputs; ``>= 0``.

    Returns:
        One :class:`VariantRow` per (N, variant), N in the order given, variants in the order given.

    Raises:
        TypeError: ``lengths`` or ``variants`` not a sequence, or a size that is not an int.
        ValueError: no lengths, a size below 1, an unknown variant name, a negative seed or
            ``budget_s``.
        RuntimeError: a variant's output differs from its reference by more than 1e-4.

    Example:
        >>> rows = measure_variants((32, 64), heads=2, head_dim=8, window=8, chunk_size=16, repeats=1, budget_s=0)
        >>> len(rows), max(row.max_difference for row in rows) < 1e-4
        (18, True)
        >>> peak = {(r.variant, r.n): r.peak_bytes for r in rows}     # exact bytes, not timings
        >>> peak["softmax self_attention", 64] / peak["softmax self_attention", 32] > 3.5   # ~N²
        True
    """
    where = "measure_variants"
    lengths = check_lengths(where, lengths)
    batch = _validate.integer(where, "batch", batch, minimum=1)
    heads = _validate.integer(where, "heads", heads, minimum=1)
    head_dim = _validate.integer(where, "head_dim", head_dim, minimum=1)
    window = _validate.integer(where, "window", window, minimum=1)
    chunk_size = _validate.integer(where, "chunk_size", chunk_size, minimum=1)
    variants = check_names(where, "variants", variants, PREFILL_VARIANTS + DECODE_VARIANTS)
    if not variants:
        raise ValueError(f"{where}: variants must not be empty")
    repeats = _validate.integer(where, "repeats", repeats, minimum=1)
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)):
        raise TypeError(f"{where}: budget_s must be a number of seconds, got {type(budget_s).__name__}")
    if not 0 <= budget_s < math.inf:
        raise ValueError(f"{where}: budget_s must be >= 0 and finite, got {budget_s}")
    threads = None if threads is None else _validate.integer(where, "threads", threads, minimum=1)
    seed = _validate.integer(where, "seed", seed, minimum=0)
    generator = torch.Generator().manual_seed(seed)
    element = 4                                                                           # float32 bytes
    rows = []
    with torch.no_grad(), threads_of_torch(threads):
        for n in lengths:
            q, k, v = (torch.randn(batch, heads, n, head_dim, generator=generator) for _ in range(3))
            functions = prefill_functions(n, window, chunk_size)
            references = {}
            for variant in (name for name in variants if name in PREFILL_VARIANTS):
                if variant in MATERIALISING and 3 * element * batch * heads * n * n > available_memory_bytes() // 2:
                    continue   # swapping would measure the disk, not attention
                if variant.startswith("linear"):
                    kind, state = "linear", batch * heads * (head_dim * head_dim + head_dim) * element
                else:
                    kind, state = variant, 2 * batch * heads * n * head_dim * element
                    if variant == "sliding window mask":
                        kind, state = variant, 2 * batch * heads * min(n, window - 1) * head_dim * element
                if kind not in references:
                    if kind == "linear":
                        references[kind] = linear_attention_parallel(q, k, v, causal=True)
                    else:
                        mask = sliding_window_mask(n, window=window) if kind == "sliding window mask" else None
                        references[kind] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                          is_causal=mask is None)
                fn = functions[variant]
                if variant == "flex eager":
                    out, peak = fn(q, k, v), None     # peak_memory's dispatch mode cannot enter FlexAttention
                else:
                    out, peak = peak_memory(fn, q, k, v)
                difference = (out - references[kind]).abs().max().item()
                if not difference <= 1e-4:
                    raise RuntimeError(f"{where}: {variant} differs from its reference by {difference:.3g} at N={n}")
                seconds = best_time(functools.partial(fn, q, k, v), repeats, budget_s=budget_s)
                rows.append(VariantRow(variant=variant, mode="prefill", n=n, seconds=seconds, peak_bytes=peak,
                                       state_bytes=state, max_difference=difference))
            decode = [name for name in variants if name in DECODE_VARIANTS]
            for row in decode_rows(decode, q, k, v, n, window, repeats, budget_s):
                if not row.max_difference <= 1e-4:
                    raise RuntimeError(f"{where}: {row.variant} differs from its reference by "
                                       f"{row.max_difference:.3g} at N={n}")
                rows.append(row)
    return rows
