"""The prefill variants as functions of ``(q, k, v)``: all ``N`` queries at once, causal."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.variants.flex_attention import causal, flex_attend
from attn_course.variants.linear_attention import linear_attention, linear_attention_recurrent
from attn_course.variants.masks import sliding_window_mask

__all__ = ["FLEX_WARNING", "MATERIALISING", "flex_causal", "prefill_functions"]

MATERIALISING = ("softmax self_attention", "sliding window mask", "flex eager")   # N × N buffers
FLEX_WARNING = "flex_attention called without torch.compile"


def flex_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # Eager FlexAttention warns (once per process) that it materialises the scores instead of
    # compiling a fused kernel. That is exactly what this row measures, so the warning says nothing
    # new here; it is silenced for this call only, by its text, so that any other warning shows.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=FLEX_WARNING, category=UserWarning)
        return flex_attend(q, k, v, mask_mod=causal())


def prefill_functions(n: int, window: int, chunk_size: int) -> dict[str, Callable]:
    """``{name: attend(q, k, v)}`` for every name of ``PREFILL_VARIANTS``, at length ``n``."""
    full, local = causal_mask(n), sliding_window_mask(n, window=window)                    # [N, N]
    return {
        "softmax sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "softmax self_attention": lambda q, k, v: self_attention(q, k, v, full)[0],
        "sliding window mask": lambda q, k, v: self_attention(q, k, v, local)[0],
        "flex eager": flex_causal,
        "linear chunked": lambda q, k, v: linear_attention(q, k, v, causal=True, chunk_size=chunk_size),
        "linear recurrent": linear_attention_recurrent,
    }

