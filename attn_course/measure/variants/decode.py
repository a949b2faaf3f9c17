"""Decoding one token after ``N - 1``: a full KV cache, a rolling window, linear attention's state."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attn_course.core.kv_cache import KVCache
from attn_course.measure.memory import peak_memory
from attn_course.measure.timing import best_time
from attn_course.measure.variants.names import VariantRow
from attn_course.variants.linear_attention import elu_feature_map, linear_attention_parallel
from attn_course.variants.sliding_window import RollingKVCache

__all__ = ["decode_rows", "linear_step"]


def linear_step(state: torch.Tensor, normaliser: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """One decoding step of causal linear attention, updating ``(S, z)`` in place.

    ``state`` ``[B, H, d, d_v]``, ``normaliser`` ``[B, H, d]``; ``q``, ``k``, ``v`` ``[B, H, 1, d]``.
    """
    k_feature, q_feature = elu_feature_map(k[..., 0, :]), elu_feature_map(q[..., 0, :])   # [B, H, d]
    state.add_(k_feature[..., :, None] * v[..., 0, None, :])                              # S += φ(k) vᵀ
    normaliser.add_(k_feature)                                                            # z += φ(k)
    numerator = (q_feature[..., None, :] @ state)                                         # [B, H, 1, d_v]
    return numerator / ((q_feature * normaliser).sum(-1)[..., None, None] + eps)


def decode_rows(variants: list[str], q, k, v, n: int, window: int, repeats: int,
                 budget_s: float = 0.0) -> list[VariantRow]:
    """Rows for decoding token ``n - 1`` after ``n - 1`` cached ones; the caches are filled untimed.

    ``q``, ``k``, ``v`` ``[B, H, N, d]``: the whole sequence; each row's output is compared with
    the reference computed from it (``max_difference``), the caller decides what is too far.
    """
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
                return linear_step(*caches, new_q, new_k, new_v)

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
