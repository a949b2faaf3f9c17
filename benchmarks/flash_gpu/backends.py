"""Which attention runs: SDPA restricted to one backend, and our decode kernel (or flash_attention)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.flash_gpu.sizes import SDPA_BACKENDS

__all__ = ["ours_decode", "sdpa_context", "sdpa_has_enable_gqa"]


def sdpa_context(method: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[method]))


@functools.cache
def sdpa_has_enable_gqa() -> bool:
    """Whether this torch's ``scaled_dot_product_attention`` takes ``enable_gqa`` (added in torch 2.5).

    Returns:
        True when SDPA accepts grouped-query K/V with ``enable_gqa=True``; backends may still
        refuse it (then :func:`decode_rows` expands K/V for them).
    """
    q, k = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 2, 8)
    try:
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    except TypeError:
        return False
    return True


@functools.cache
def ours_decode() -> tuple[str, Callable, str]:
    """(method name, function, note): ``decode_attention`` if the package has it, else ``flash_attention``."""
    from attn_course.flash import triton_attention

    try:
        from attn_course.flash import decode_attention
    except ImportError as error:
        decode_attention = getattr(triton_attention, "decode_attention", None)
        if decode_attention is None:
            return ("ours (flash_attention)", triton_attention.flash_attention,
                    f"no decode_attention ({error}); flash_attention timed")
    return "ours (decode_attention)", decode_attention, ""
