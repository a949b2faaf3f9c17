"""``python -m attn_course.measure variants``: causal attention variants, time and memory against N.

What each variant costs on a CPU, for ``q``, ``k``, ``v`` ``[B, H, N, d]`` float32, causal:

* ``softmax sdpa``: PyTorch's ``scaled_dot_product_attention(is_causal=True)``. On a CPU it runs a
  fused FlashAttention-style kernel: ``O(N² d)`` time, but only the output (``O(N d)``) allocated.
* ``softmax self_attention``: the course's :func:`~attn_course.core.attention.self_attention` with a
  :func:`~attn_course.core.masks.causal_mask`: the ``N × N`` weights materialised, ``O(N²)`` memory.
* ``sliding window mask``: ``self_attention`` with a
  :func:`~attn_course.variants.masks.sliding_window_mask`, as the course implements the window. A mask
  hides pairs but saves no compute: every one of the ``N²`` scores is still computed (and then
  thrown away), so time and memory are those of full causal attention. The window pays off when
  decoding, where a :class:`~attn_course.variants.sliding_window.RollingKVCache` keeps memory fixed at
  ``W`` (the ``decode`` rows below).
* ``flex eager``: :func:`~attn_course.variants.flex_attention.flex_attend` with a causal ``mask_mod``,
  without ``torch.compile``: PyTorch's unfused fallback, which materialises the scores. Its peak
  memory is not measured (``None``): :func:`~attn_course.measure.memory.peak_memory` counts storages
  with a dispatch mode, and FlexAttention's higher-order operator refuses to run under one.
* ``linear chunked``: :func:`~attn_course.variants.linear_attention.linear_attention` (causal, chunks of
  ``C``): ``O(N (C d + d²))`` time, memory linear in ``N``.
* ``linear recurrent``: :func:`~attn_course.variants.linear_attention.linear_attention_recurrent`, one token
  per Python step: the same ``O(N d²)`` arithmetic, but ``N`` small steps, so on a CPU it is far
  slower than the chunked form (one measurement: 0.17 s against 0.014 s at N = 2048, B=1, H=4, d=64,
  one thread).

Decoding one token after ``N - 1`` (mode ``decode``): a full :class:`~attn_course.core.kv_cache.KVCache`
(its step reads all ``N`` keys, its memory grows with ``N``), a ``RollingKVCache`` of window ``W``
(reads at most ``W`` keys, memory fixed), and linear attention's recurrent step (a ``d × d`` state
per head, fixed). Each row's ``state_bytes`` is what the variant must keep to generate the next
token; :func:`cache_bytes_rows` gives it per token for MHA, GQA, MQA, MLA, the window and linear
attention for one stated configuration.

Every timed output is compared with a reference before it is timed (``max_difference``: masked SDPA
for the softmax variants, :func:`~attn_course.variants.linear_attention.linear_attention_parallel` for
linear attention), so the benchmark never times a wrong computation. :func:`linear_crossover`
finds the N from which linear attention is faster (and smaller) than softmax attention.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import causal_mask
from attn_course.measure.memory import peak_memory
from attn_course.measure.timing import check_rows
from attn_course.variants.flex_attention import causal, flex_attend
from attn_course.variants.kv_cache_size import (
    gqa_cache_elements,
    mha_cache_elements,
    mla_cache_elements,
    mqa_cache_elements,
)
from attn_course.variants.linear_attention import (
    elu_feature_map,
    linear_attention,
    linear_attention_parallel,
    linear_attention_recurrent,
)
from attn_course.variants.masks import sliding_window_mask
from attn_course.variants.sliding_window import RollingKVCache

__all__ = [
    "DEFAULT_LENGTHS",
    "QUICK_LENGTHS",
    "PREFILL_VARIANTS",
    "DECODE_VARIANTS",
    "VariantRow",
    "Crossover",
    "CacheBytesRow",
    "measure_variants",
    "linear_crossover",
    "crossover_from_rows",
    "cache_bytes_rows",
    "print_variants",
    "print_cache_bytes",
    "plot_variants",
]

DEFAULT_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
QUICK_LENGTHS = (32, 64)
PREFILL_VARIANTS = ("softmax sdpa", "softmax self_attention", "sliding window mask", "flex eager",
                    "linear chunked", "linear recurrent")
DECODE_VARIANTS = ("decode kv-cache", "decode rolling-cache", "decode linear state")
_MATERIALISING = ("softmax self_attention", "sliding window mask", "flex eager")   # N × N buffers
_FLEX_WARNING = "flex_attention called without torch.compile"


@dataclasses.dataclass(frozen=True)
class VariantRow:
    """One (variant, N) measurement of :func:`measure_variants`.

    Attributes:
        variant: one of :data:`PREFILL_VARIANTS` or :data:`DECODE_VARIANTS`.
        mode: ``"prefill"`` (all ``N`` queries at once) or ``"decode"`` (one new token after ``N - 1``).
        n: sequence length N (for ``decode``, the keys the new token may see, itself included).
        seconds: best wall-clock time of one call (one step for ``decode``).
        peak_bytes: bytes allocated during the call (inputs excluded), exact
            (:func:`~attn_course.measure.memory.peak_memory`); None for ``flex eager`` (not measurable).
        state_bytes: bytes the variant keeps to generate the next token after these N: the keys and
            values (``2·B·H·N·d·4``), the rolling window (``2·B·H·(W-1)·d·4``) or linear
            attention's state ``(S, z)`` (``B·H·(d·d + d)·4``).
        max_difference: largest absolute difference of the output from the reference.
    """

    variant: str
    mode: str
    n: int
    seconds: float
    peak_bytes: int | None
    state_bytes: int
    max_difference: float


@dataclasses.dataclass(frozen=True)
class Crossover:
    """Where causal linear attention overtakes causal softmax attention, from :func:`linear_crossover`.

    Attributes:
        softmax, linear: the two variants compared (names from :data:`PREFILL_VARIANTS`).
        lengths: the grid of N measured, ascending.
        time_n: the smallest grid N from which linear attention is faster at every larger grid N;
            None if it is slower at the largest.
        time_n_interpolated: where the two time curves cross, interpolating ``log(t_linear /
            t_softmax)`` linearly in ``log N`` between ``time_n`` and the grid N before it; None when
            ``time_n`` is None or the grid's first N (the crossing is at or below the grid).
        memory_n, memory_n_interpolated: the same for peak memory (exact bytes, so not noisy).
        seconds_ratio: ``t_linear / t_softmax`` at each grid N (below 1: linear is faster).
        memory_ratio: ``peak_linear / peak_softmax`` at each grid N.
    """

    softmax: str
    linear: str
    lengths: tuple[int, ...]
    time_n: int | None
    time_n_interpolated: float | None
    memory_n: int | None
    memory_n_interpolated: float | None
    seconds_ratio: tuple[float, ...]
    memory_ratio: tuple[float, ...]

    def describe(self) -> str:
        """One sentence per quantity, e.g. ``"time: linear chunked faster than softmax sdpa from N = 1024 ..."``."""
        lines = []
        for what, first, between, ratios in (("time", self.time_n, self.time_n_interpolated, self.seconds_ratio),
                                             ("memory", self.memory_n, self.memory_n_interpolated,
                                              self.memory_ratio)):
            verb = "faster" if what == "time" else "smaller"
            if first is None:
                lines.append(f"{what}: {self.linear} is not {verb} than {self.softmax} for N <= "
                             f"{self.lengths[-1]} (ratio at the largest N: {ratios[-1]:.2f})")
            elif between is None:
                lines.append(f"{what}: {self.linear} is {verb} than {self.softmax} already at the "
                             f"smallest N measured, {first} (ratio {ratios[0]:.2f})")
            else:
                lines.append(f"{what}: {self.linear} is {verb} than {self.softmax} from N = {first} "
                             f"(curves cross near N ≈ {between:.0f})")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class CacheBytesRow:
    """What one variant keeps per sequence to decode, from :func:`cache_bytes_rows` (one layer).

    Attributes:
        variant: ``"MHA"``, ``"GQA"``, ``"MQA"``, ``"MLA"``, ``"sliding window (MHA)"`` or ``"linear"``.
        elements_per_token: elements added per token (for the window, until it is full; 0 for linear).
        bytes_per_token: ``elements_per_token · bytes_per_element``.
        n: the sequence length of ``bytes_at_n``.
        bytes_at_n: bytes held for one sequence of ``n`` tokens.
        fixed: True when ``bytes_at_n`` stops growing with ``n`` (the window, linear attention).
        formula: how ``bytes_at_n`` is counted.
    """

    variant: str
    elements_per_token: int
    bytes_per_token: int
    n: int
    bytes_at_n: int
    fixed: bool
    formula: str


def _lengths(where: str, lengths: object) -> list[int]:
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1)
    if not lengths:
        raise ValueError(f"{where}: lengths must not be empty")
    return lengths


def _name(where: str, name: str, value: object, allowed: Sequence[str]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where}: {name} must be a str, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{where}: {name} must be one of {list(allowed)}, got {value!r}")
    return value


def _names(where: str, name: str, value: object, allowed: Sequence[str]) -> list[str]:
    value = _validate.sequence(where, name, value, of="variant names")
    for index, item in enumerate(value):
        if item not in allowed:
            raise ValueError(f"{where}: {name}[{index}] must be one of {list(allowed)}, got {item!r}")
    return value


def _available_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):   # pragma: no cover - not Linux
        return 8 << 30


def _best_time(fn: Callable[..., object], repeats: int, *, setup: Callable[[], object] | None = None,
              budget_s: float = 0.25, most: int = 30) -> float:
    """Best wall-clock time of ``fn()`` (or ``fn(setup())``, ``setup`` untimed) in seconds.

    At least ``repeats`` calls, and more (up to ``most``) while the calls so far took less than
    ``budget_s`` in all: fast variants get many samples, whose minimum resists the noise of a
    busy machine, at little cost; slow ones get ``repeats``.
    """
    best, spent, calls = math.inf, 0.0, 0
    while calls < repeats or (spent < budget_s and calls < most):
        argument = () if setup is None else (setup(),)
        start = time.perf_counter()
        fn(*argument)
        elapsed = time.perf_counter() - start
        best, spent, calls = min(best, elapsed), spent + elapsed, calls + 1
    return best


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """Run torch on ``count`` CPU threads inside the block (None: leave the setting), then restore it."""
    previous = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _flex_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # Eager FlexAttention warns (once per process) that it materialises the scores instead of
    # compiling a fused kernel. That is exactly what this row measures, so the warning says nothing
    # new here; it is silenced for this call only, by its text, so that any other warning shows.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_FLEX_WARNING, category=UserWarning)
        return flex_attend(q, k, v, mask_mod=causal())


def _prefill_functions(n: int, window: int, chunk_size: int) -> dict[str, Callable]:
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
    """Rows for decoding token ``n - 1`` after ``n - 1`` cached ones; the caches are filled untimed."""
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
        seconds = _best_time(step, repeats, setup=fresh, budget_s=budget_s)
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

    For each N, random ``q``, ``k``, ``v`` ``[B, H, N, d]`` float32 (from a generator seeded with
    ``seed``; the global RNG is not touched) go through every variant under ``torch.no_grad()``:
    one call under :func:`~attn_course.measure.memory.peak_memory` (its output compared with the
    reference), then the best of at least ``repeats`` timed calls, more (up to 30) while they
    took under ``budget_s`` in all: fast variants get many samples, whose minimum resists a busy
    machine's noise. The variants that materialise ``N × N`` buffers (``softmax self_attention``,
    ``sliding window mask``, ``flex eager``) are skipped at an N whose three ``B·H·N²`` float32
    buffers would not fit comfortably in the memory free now.

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
    lengths = _lengths(where, lengths)
    batch = _validate.integer(where, "batch", batch, minimum=1)
    heads = _validate.integer(where, "heads", heads, minimum=1)
    head_dim = _validate.integer(where, "head_dim", head_dim, minimum=1)
    window = _validate.integer(where, "window", window, minimum=1)
    chunk_size = _validate.integer(where, "chunk_size", chunk_size, minimum=1)
    variants = _names(where, "variants", variants, PREFILL_VARIANTS + DECODE_VARIANTS)
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
    with torch.no_grad(), _threads(threads):
        for n in lengths:
            q, k, v = (torch.randn(batch, heads, n, head_dim, generator=generator) for _ in range(3))
            functions = _prefill_functions(n, window, chunk_size)
            references = {}
            for variant in (name for name in variants if name in PREFILL_VARIANTS):
                if variant in _MATERIALISING and 3 * element * batch * heads * n * n > _available_memory_bytes() // 2:
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
                seconds = _best_time(functools.partial(fn, q, k, v), repeats, budget_s=budget_s)
                rows.append(VariantRow(variant=variant, mode="prefill", n=n, seconds=seconds, peak_bytes=peak,
                                       state_bytes=state, max_difference=difference))
            decode = [name for name in variants if name in DECODE_VARIANTS]
            for row in _decode_rows(decode, q, k, v, n, window, repeats, budget_s):
                if not row.max_difference <= 1e-4:
                    raise RuntimeError(f"{where}: {row.variant} differs from its reference by "
                                       f"{row.max_difference:.3g} at N={n}")
                rows.append(row)
    return rows


def _first_from(lengths: list[int], values: list[float]) -> tuple[int | None, float | None]:
    """Smallest grid N from which every ratio is below 1, and the log-log interpolated crossing."""
    index = len(values)
    while index > 0 and values[index - 1] < 1:
        index -= 1
    if index == len(values):
        return None, None
    if index == 0:
        return lengths[0], None
    (n0, r0), (n1, r1) = (lengths[index - 1], values[index - 1]), (lengths[index], values[index])
    x0, x1, y0, y1 = math.log(n0), math.log(n1), math.log(r0), math.log(r1)
    return lengths[index], math.exp(x0 + (x1 - x0) * y0 / (y0 - y1))


def crossover_from_rows(rows: Sequence[VariantRow], *, softmax: str = "softmax sdpa",
                        linear: str = "linear chunked") -> Crossover:
    """The :class:`Crossover` of ``linear`` against ``softmax`` in rows already measured.

    Args:
        rows: from :func:`measure_variants`, holding both variants at two or more common N.
        softmax: the softmax variant, ``"softmax sdpa"`` or ``"softmax self_attention"``.
        linear: ``"linear chunked"`` or ``"linear recurrent"``.

    Returns:
        a :class:`Crossover` over the N where both were measured, ascending.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`VariantRow`.
        ValueError: an unknown variant name, or fewer than two N with both variants.

    Example:
        >>> rows = [VariantRow(name, "prefill", n, seconds, peak, 0, 0.0) for name, n, seconds, peak in (
        ...     ("softmax sdpa", 100, 1.0, 10), ("linear chunked", 100, 2.0, 40),
        ...     ("softmax sdpa", 400, 4.0, 40), ("linear chunked", 400, 2.0, 160))]
        >>> crossover = crossover_from_rows(rows)
        >>> crossover.time_n, round(crossover.time_n_interpolated), crossover.memory_n
        (400, 200, None)
    """
    where = "crossover_from_rows"
    rows = check_rows(where, rows, (VariantRow,))
    softmax = _name(where, "softmax", softmax, ("softmax sdpa", "softmax self_attention"))
    linear = _name(where, "linear", linear, ("linear chunked", "linear recurrent"))
    found = {(r.variant, r.n): r for r in rows if r.mode == "prefill"}
    lengths = sorted(n for (name, n) in found if name == softmax and (linear, n) in found)
    if len(lengths) < 2:
        raise ValueError(f"{where}: rows must hold {softmax!r} and {linear!r} at two or more common N, "
                         f"got {lengths}")
    seconds = [found[linear, n].seconds / found[softmax, n].seconds for n in lengths]
    memory = [found[linear, n].peak_bytes / found[softmax, n].peak_bytes for n in lengths]
    time_n, time_between = _first_from(lengths, seconds)
    memory_n, memory_between = _first_from(lengths, memory)
    return Crossover(softmax=softmax, linear=linear, lengths=tuple(lengths), time_n=time_n,
                     time_n_interpolated=time_between, memory_n=memory_n, memory_n_interpolated=memory_between,
                     seconds_ratio=tuple(seconds), memory_ratio=tuple(memory))


def linear_crossover(
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    *,
    batch: int = 1,
    heads: int = 4,
    head_dim: int = 64,
    chunk_size: int = 128,
    softmax: str = "softmax sdpa",
    linear: str = "linear chunked",
    repeats: int = 3,
    budget_s: float = 0.25,
    threads: int | None = 1,
    seed: int = 0,
) -> Crossover:
    """Measure the N from which causal linear attention is faster, and smaller, than softmax attention.

    Runs :func:`measure_variants` for the two variants only, on the grid ``lengths`` (sorted),
    then :func:`crossover_from_rows`. Times are this machine's and noisy (the grid N is the first
    from which linear attention stays faster); the memory crossover is exact.

    Args:
        lengths: the grid of N, at least two distinct values.
        batch, heads, head_dim: ``B``, ``H``, ``d``.
        chunk_size: ``C`` of the chunked linear attention.
        softmax: ``"softmax sdpa"`` (PyTorch's fused kernel) or ``"softmax self_attention"``
            (the course's, the ``N × N`` weights materialised).
        linear: ``"linear chunked"`` or ``"linear recurrent"``.
        repeats, budget_s, threads: as in :func:`measure_variants` (one thread by default).
        seed: for the random inputs; ``>= 0``.

    Returns:
        a :class:`Crossover`.

    Raises:
        TypeError, ValueError: as :func:`measure_variants`, or fewer than two distinct lengths.

    Example:
        >>> crossover = linear_crossover((64, 256), head_dim=16, softmax="softmax self_attention", budget_s=0)
        >>> crossover.lengths, crossover.memory_n        # memory: exact bytes, not a timing
        ((64, 256), 64)
        >>> print(crossover.describe())                  # doctest: +SKIP
        time: linear chunked is faster than softmax self_attention from N = 256 (curves cross near N ≈ 150)
        memory: linear chunked is smaller than softmax self_attention already at the smallest N measured, 64 ...
    """
    where = "linear_crossover"
    grid = sorted(set(_lengths(where, lengths)))
    if len(grid) < 2:
        raise ValueError(f"{where}: lengths must hold at least two distinct N, got {list(lengths)}")
    softmax = _name(where, "softmax", softmax, ("softmax sdpa", "softmax self_attention"))
    linear = _name(where, "linear", linear, ("linear chunked", "linear recurrent"))
    rows = measure_variants(grid, batch=batch, heads=heads, head_dim=head_dim, chunk_size=chunk_size,
                            variants=(softmax, linear), repeats=repeats, budget_s=budget_s, threads=threads,
                            seed=seed)
    return crossover_from_rows(rows, softmax=softmax, linear=linear)


def cache_bytes_rows(
    n: int = 32768,
    *,
    heads: int = 8,
    head_dim: int = 64,
    kv_heads: int = 2,
    kv_lora_rank: int = 256,
    qk_rope_head_dim: int = 32,
    window: int = 4096,
    bytes_per_element: int = 2,
) -> list[CacheBytesRow]:
    """Bytes one layer keeps per sequence to decode, for each variant, in one small configuration.

    MHA, GQA, MQA and MLA per token from :mod:`attn_course.variants.kv_cache_size`; the sliding window
    keeps the last ``W - 1`` tokens of MHA keys and values (a
    :class:`~attn_course.variants.sliding_window.RollingKVCache`), and linear attention a state ``S [d, d]``
    and ``z [d]`` per head, whatever ``n``.

    Args:
        n: tokens in the sequence.
        heads, head_dim: ``n_h`` and ``d_h``.
        kv_heads: ``n_kv`` for GQA (between 1 and ``heads``).
        kv_lora_rank, qk_rope_head_dim: MLA's ``d_c`` and ``d_h^R``.
        window: ``W`` of the sliding window.
        bytes_per_element: 2 for float16/bfloat16, 4 for float32.

    Returns:
        One :class:`CacheBytesRow` per variant: MHA, GQA, MQA, MLA, sliding window (MHA), linear.

    Raises:
        TypeError: a size that is not an int.
        ValueError: a size below 1, or ``kv_heads`` above ``heads``.

    Example:
        >>> rows = cache_bytes_rows(1000, heads=4, head_dim=8, kv_heads=2, kv_lora_rank=16,
        ...                         qk_rope_head_dim=4, window=10, bytes_per_element=2)
        >>> [(row.variant, row.bytes_at_n) for row in rows]
        [('MHA', 128000), ('GQA', 64000), ('MQA', 32000), ('MLA', 40000),
         ('sliding window (MHA)', 1152), ('linear', 576)]
    """
    where = "cache_bytes_rows"
    n = _validate.integer(where, "n", n, minimum=1)
    heads = _validate.integer(where, "heads", heads, minimum=1)
    head_dim = _validate.integer(where, "head_dim", head_dim, minimum=1)
    kv_heads = _validate.integer(where, "kv_heads", kv_heads, minimum=1)
    if kv_heads > heads:
        raise ValueError(f"{where}: kv_heads must be at most heads, got kv_heads={kv_heads}, heads={heads}")
    window = _validate.integer(where, "window", window, minimum=1)
    size = _validate.integer(where, "bytes_per_element", bytes_per_element, minimum=1)
    mha = mha_cache_elements(heads, head_dim)
    held = min(n, window - 1)
    linear_state = heads * (head_dim * head_dim + head_dim)
    growing = [("MHA", mha, "2·n_h·d_h·n"), ("GQA", gqa_cache_elements(kv_heads, head_dim), "2·n_kv·d_h·n"),
               ("MQA", mqa_cache_elements(head_dim), "2·d_h·n"),
               ("MLA", mla_cache_elements(kv_lora_rank, qk_rope_head_dim), "(d_c + d_h^R)·n")]
    rows = [CacheBytesRow(variant=name, elements_per_token=elements, bytes_per_token=elements * size, n=n,
                          bytes_at_n=elements * size * n, fixed=False, formula=f"{formula} · bytes")
            for name, elements, formula in growing]
    rows.append(CacheBytesRow(variant="sliding window (MHA)", elements_per_token=mha, bytes_per_token=mha * size,
                              n=n, bytes_at_n=mha * size * held, fixed=n >= window - 1,
                              formula="2·n_h·d_h·min(n, W-1) · bytes"))
    rows.append(CacheBytesRow(variant="linear", elements_per_token=0, bytes_per_token=0, n=n,
                              bytes_at_n=linear_state * size, fixed=True, formula="n_h·(d_h·d_h + d_h) · bytes"))
    return rows


def print_variants(rows: Sequence[VariantRow]) -> None:
    """Print the rows of :func:`measure_variants` as a table: milliseconds and MiB.

    Args:
        rows: a non-empty sequence of :class:`VariantRow`.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`VariantRow`.
        ValueError: no rows.
    """
    rows = check_rows("print_variants", rows, (VariantRow,))
    print(f"{'variant':>22} {'mode':>7} {'N':>6} {'ms':>9} {'peak MiB':>9} {'state KiB':>10} {'max diff':>9}")
    for r in rows:
        peak = "n/a" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.2f}"
        print(f"{r.variant:>22} {r.mode:>7} {r.n:>6} {r.seconds * 1e3:>9.3f} {peak:>9} "
              f"{r.state_bytes / 2**10:>10.1f} {r.max_difference:>9.1e}")


def print_cache_bytes(rows: Sequence[CacheBytesRow]) -> None:
    """Print the rows of :func:`cache_bytes_rows` as a table.

    Args:
        rows: a non-empty sequence of :class:`CacheBytesRow`.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`CacheBytesRow`.
        ValueError: no rows.
    """
    rows = check_rows("print_cache_bytes", rows, (CacheBytesRow,))
    print(f"{'variant':>22} {'bytes/token':>12} {'N':>7} {'MiB at N':>9} {'fixed':>6}   formula")
    for r in rows:
        print(f"{r.variant:>22} {r.bytes_per_token:>12} {r.n:>7} {r.bytes_at_n / 2**20:>9.3f} "
              f"{'yes' if r.fixed else 'no':>6}   {r.formula}")


def plot_variants(rows: Sequence[VariantRow], path: str | os.PathLike, *, title: str) -> None:
    """Save a PNG of :func:`measure_variants`'s prefill rows: time and peak memory against N, log-log.

    Args:
        rows: a non-empty sequence of :class:`VariantRow` (decode rows are left out of the plot).
        path: the PNG file to write.
        title: the figure's title, e.g. :func:`~attn_course.measure.timing.machine_description`.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`VariantRow`, ``path`` not a path, ``title`` not a str.
        ValueError: no rows.
        ImportError: matplotlib is not installed.
    """
    where = "plot_variants"
    rows = check_rows(where, rows, (VariantRow,))
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where}: path must be a str or path, got {type(path).__name__}")
    if not isinstance(title, str):
        raise TypeError(f"{where}: title must be a str, got {type(title).__name__}")
    import matplotlib  # here, not at the top: the CSV suffices where matplotlib is missing

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    prefill = [r for r in rows if r.mode == "prefill"]
    lengths = sorted({r.n for r in prefill})
    for index, variant in enumerate(dict.fromkeys(r.variant for r in prefill)):
        style = dict(marker="o", label=variant, color=f"C{index}")     # one colour per variant in both panels
        chosen = [r for r in prefill if r.variant == variant]
        axes[0].plot([r.n for r in chosen], [r.seconds for r in chosen], **style)
        measured = [r for r in chosen if r.peak_bytes]
        if measured:
            axes[1].plot([r.n for r in measured], [r.peak_bytes / 2**20 for r in measured], **style)
    for axis in axes:
        axis.set_xscale("log", base=2)
        axis.set_xticks(lengths, [str(n) for n in lengths])
        axis.minorticks_off()
    axes[0].set(yscale="log", xlabel="N", ylabel="seconds (best)", title="time (causal)")
    axes[1].set(yscale="log", xlabel="N", ylabel="peak MiB", title="peak memory (flex eager: not measurable)")
    axes[0].legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
