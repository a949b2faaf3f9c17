"""``python -m benchmarks variants``: causal attention variants, time and memory against N.

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

from attn_course.measure.variants.cache_bytes import CacheBytesRow, cache_bytes_rows, print_cache_bytes
from attn_course.measure.variants.crossover import Crossover, crossover_from_rows, linear_crossover
from attn_course.measure.variants.names import (
    DECODE_VARIANTS,
    DEFAULT_LENGTHS,
    PREFILL_VARIANTS,
    QUICK_LENGTHS,
    VariantRow,
)
from attn_course.measure.variants.report import plot_variants, print_variants
from attn_course.measure.variants.sweep import measure_variants

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
