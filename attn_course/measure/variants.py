"""Causal attention variants on a CPU, time and memory against N (``python -m benchmarks variants``), for ``q``,
``k``, ``v`` ``[B, H, N, d]`` float32:

* ``softmax sdpa``: PyTorch's SDPA, on a CPU a fused FlashAttention-style kernel: ``O(N² d)`` time, only the
  output allocated;
* ``softmax self_attention``: the course's, with a causal mask: the ``N × N`` weights materialised;
* ``sliding window mask``: the same with a sliding-window mask, which hides pairs but saves no compute (all
  ``N²`` scores are computed, then thrown away); the window pays off when decoding, where a ``RollingKVCache``
  keeps memory fixed at ``W``;
* ``flex eager``: FlexAttention with a causal ``mask_mod``, not compiled (the unfused fallback, which
  materialises the scores); its peak memory is None: ``peak_memory``'s dispatch mode cannot enter
  FlexAttention's higher-order operator;
* ``linear chunked`` (chunks of ``C``: ``O(N (C d + d²))`` time, memory linear in ``N``) and ``linear
  recurrent`` (the same ``O(N d²)`` arithmetic in ``N`` small Python steps: 0.17 s against 0.014 s at
  N = 2048, B=1, H=4, d=64, one thread).

Decoding one token after ``N - 1`` (mode ``decode``): a full ``KVCache`` (reads all ``N`` keys, grows with
``N``), a ``RollingKVCache`` of window ``W`` and linear attention's recurrent step (a ``d × d`` state per
head), with the bytes each keeps to generate the next token. Every output is compared with a reference
before it is timed, so the benchmark never times a wrong computation.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course._threads import threads as threads_of_torch
from attn_course.core.attention import self_attention
from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import causal_mask
from attn_course.measure.memory import available_memory_bytes, peak_memory
from attn_course.measure.rows import check_rows, save_time_and_memory
from attn_course.measure.timing import best_time
from attn_course.variants.flex_attention import causal, flex_attend
from attn_course.variants.linear_attention import (
    elu_feature_map,
    linear_attention,
    linear_attention_parallel,
    linear_attention_recurrent,
)
from attn_course.variants.masks import sliding_window_mask
from attn_course.variants.sliding_window import RollingKVCache

__all__ = ["DECODE_VARIANTS", "DEFAULT_LENGTHS", "PREFILL_VARIANTS", "QUICK_LENGTHS", "VariantRow", "check_name",
           "measure_variants", "plot_variants", "prefill_functions"]

DEFAULT_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
QUICK_LENGTHS = (32, 64)
PREFILL_VARIANTS = ("softmax sdpa", "softmax self_attention", "sliding window mask", "flex eager",
                    "linear chunked", "linear recurrent")
DECODE_VARIANTS = ("decode kv-cache", "decode rolling-cache", "decode linear state")


@dataclasses.dataclass(frozen=True)
class VariantRow:
    """One (variant, N) measurement of :func:`measure_variants`.

    Attributes:
        variant, mode: one of :data:`PREFILL_VARIANTS` (``"prefill"``: all ``N`` queries at once) or of
            :data:`DECODE_VARIANTS` (``"decode"``: one new token after ``N - 1``).
        n: sequence length N (for ``decode``, the keys the new token may see, itself included).
        seconds: best wall-clock time of one call (one step for ``decode``).
        peak_bytes: bytes allocated during the call (inputs excluded), exact; None for ``flex eager``.
        state_bytes: bytes kept to generate the next token after these N: the keys and values
            (``2·B·H·N·d·4``), the rolling window (``2·B·H·(W-1)·d·4``) or linear attention's state ``(S, z)``
            (``B·H·(d·d + d)·4``).
        max_difference: largest absolute difference of the output from the reference.
    """

    variant: str
    mode: str
    n: int
    seconds: float
    peak_bytes: int | None
    state_bytes: int
    max_difference: float



def check_name(where: str, name: str, value: object, allowed: Sequence[str]) -> str:
    """``value``, one of ``allowed``, or the error naming ``where`` and ``name``."""
    if not isinstance(value, str):
        raise TypeError(f"{where}: {name} must be a str, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{where}: {name} must be one of {list(allowed)}, got {value!r}")
    return value


MATERIALISING = ("softmax self_attention", "sliding window mask", "flex eager")   # N × N buffers


def _flex_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # Eager FlexAttention warns (once per process) that it materialises the scores instead of
    # compiling a fused kernel. That is exactly what this row measures, so the warning says nothing
    # new here; it is silenced for this call only, by its text, so that any other warning shows.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile", category=UserWarning)
        return flex_attend(q, k, v, mask_mod=causal())


def prefill_functions(n: int, window: int, chunk_size: int) -> dict[str, Callable]:
    """``{name: attend(q, k, v)}`` for every name of ``PREFILL_VARIANTS``, at length ``n``."""
    full, local = causal_mask(n), sliding_window_mask(n, window=window)                    # [N, N]
    return {
        "softmax sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "softmax self_attention": lambda q, k, v: self_attention(q, k, v, full)[0],
        "sliding window mask": lambda q, k, v: self_attention(q, k, v, local)[0],
        "flex eager": _flex_causal,
        "linear chunked": lambda q, k, v: linear_attention(q, k, v, causal=True, chunk_size=chunk_size),
        "linear recurrent": linear_attention_recurrent,
    }


def _linear_step(state: torch.Tensor, normaliser: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """One decoding step of causal linear attention, updating ``(S, z)`` in place.

    ``state`` ``[B, H, d, d_v]``, ``normaliser`` ``[B, H, d]``; ``q``, ``k``, ``v`` ``[B, H, 1, d]``.
    """
    k_feature, q_feature = elu_feature_map(k[..., 0, :]), elu_feature_map(q[..., 0, :])   # [B, H, d]
    state.add_(k_feature[..., :, None] * v[..., 0, None, :])                              # S += φ(k) vᵀ
    normaliser.add_(k_feature)                                                            # z += φ(k)
    numerator = (q_feature[..., None, :] @ state)                                         # [B, H, 1, d_v]
    return numerator / ((q_feature * normaliser).sum(-1)[..., None, None] + eps)


def _decode_rows(variants: list[str], q, k, v, n: int, window: int, repeats: int,
                 budget_s: float = 0.0) -> list[VariantRow]:
    """Rows for decoding token ``n - 1`` after ``n - 1`` cached ones (``q``, ``k``, ``v`` ``[B, H, N, d]``: the
    whole sequence), the caches filled untimed; the caller decides what ``max_difference`` is too far."""
    rows = []
    last = slice(n - 1, n)
    new_q, new_k, new_v = q[:, :, last], k[:, :, last], v[:, :, last]                     # [B, H, 1, d]
    for variant in variants:
        if variant == "decode linear state":
            reference = linear_attention_parallel(q, k, v, causal=True)[:, :, last]
            features = elu_feature_map(k[:, :, : n - 1])                                  # [B, H, N-1, d]

            def fresh(features=features):
                return features.transpose(-2, -1) @ v[:, :, : n - 1], features.sum(-2)    # S, z after N-1

            def step(caches):
                return _linear_step(*caches, new_q, new_k, new_v)

            def held(caches):
                return sum(t.numel() * t.element_size() for t in caches)
        else:
            # Softmax attention of the newest query over the keys the cache returns: one query,
            # so no mask is needed (a rolling cache returns exactly the window).
            visible = slice(max(0, n - window), n) if variant == "decode rolling-cache" else slice(0, n)
            reference = F.scaled_dot_product_attention(new_q, k[:, :, visible], v[:, :, visible])

            def fresh(variant=variant):
                cache = RollingKVCache(window) if variant == "decode rolling-cache" else KVCache(max_length=n)
                if n > 1:
                    cache.append(k[:, :, : n - 1], v[:, :, : n - 1])
                return cache

            def step(cache):
                keys, values = cache.append(new_k, new_v)                                 # [B, H, N_k, d]
                return F.scaled_dot_product_attention(new_q, keys, values)

            def held(cache):
                return cache.memory_bytes
        caches = fresh()
        out, peak = peak_memory(step, caches)
        # A fresh cache per timed call (untimed): a step changes the cache it runs on.
        seconds = best_time(step, repeats, setup=fresh, budget_s=budget_s)
        rows.append(VariantRow(variant=variant, mode="decode", n=n, seconds=seconds, peak_bytes=peak,
                               state_bytes=held(caches), max_difference=(out - reference).abs().max().item()))
    return rows


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

    For each N, random ``q``, ``k``, ``v`` (from a generator seeded with ``seed``; the global RNG is not
    touched) go through every variant under ``torch.no_grad()``: one call under ``peak_memory`` (its output
    compared with the reference), then the best of at least ``repeats`` timed calls, more while they took
    under ``budget_s`` (:func:`~attn_course.measure.timing.best_time`): fast variants get many samples, whose
    minimum resists a busy machine's noise. Variants that materialise ``N × N`` buffers are skipped where three
    ``B·H·N²`` float32 buffers would not fit comfortably in the memory free now.

    One CPU thread by default: on a shared 2-core machine two threads made the many small operations of the
    chunked and recurrent forms up to 10× slower at random, which moved the crossover by 4× from run to run;
    on one thread the ratios were smooth and repeatable.

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
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1, nonempty=True)
    batch, heads, head_dim, window, chunk_size = _validate.integers(
        where, minimum=1, batch=batch, heads=heads, head_dim=head_dim, window=window, chunk_size=chunk_size)
    variants = _validate.sequence(where, "variants", variants, of="variant names")
    for index, name in enumerate(variants):
        check_name(where, f"variants[{index}]", name, PREFILL_VARIANTS + DECODE_VARIANTS)
    if not variants:
        raise ValueError(f"{where}: variants must not be empty")
    repeats = _validate.integer(where, "repeats", repeats, minimum=1)
    budget_s = _validate.seconds(where, "budget_s", budget_s)
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
            for row in _decode_rows(decode, q, k, v, n, window, repeats, budget_s):
                if not row.max_difference <= 1e-4:
                    raise RuntimeError(f"{where}: {row.variant} differs from its reference by "
                                       f"{row.max_difference:.3g} at N={n}")
                rows.append(row)
    return rows


def plot_variants(rows: Sequence[VariantRow], path: str | os.PathLike, *, title: str) -> None:
    """Save a PNG of :func:`measure_variants`'s prefill rows, time and peak memory against N, log-log (errors as
    :func:`~attn_course.measure.flash.plot_rows`'s, for :class:`VariantRow`)."""
    rows = check_rows("plot_variants", rows, (VariantRow,))
    prefill = [r for r in rows if r.mode == "prefill"]
    series = {variant: [(r.n, r.seconds, r.peak_bytes and r.peak_bytes / 2**20)
                        for r in prefill if r.variant == variant]
              for variant in dict.fromkeys(r.variant for r in prefill)}
    save_time_and_memory("plot_variants", series, path, title=title,
                         panels=("time (causal)", "peak memory (flex eager: not measurable)"))
