"""The attention ours is measured against: SDPA restricted to one backend, and FlexAttention."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.flash_gpu.plan import SDPA_BACKENDS

__all__ = ["flex_function", "sdpa_context", "sdpa_has_enable_gqa"]


def sdpa_context(method: str):
    """``scaled_dot_product_attention`` restricted to ``method``'s backend (a key of ``SDPA_BACKENDS``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[method]))


@functools.cache
def sdpa_has_enable_gqa() -> bool:
    """Whether this torch's ``scaled_dot_product_attention`` takes ``enable_gqa`` (torch 2.5 and later; a
    backend may still refuse it)."""
    q, k = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 2, 8)
    try:
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    except TypeError:
        return False
    return True


def flex_function(causal: bool, n: int, device: torch.device,
                  grouped: bool) -> tuple[Callable, str, str, str]:
    """(fn, path, config, note): FlexAttention for one shape, its causal block mask made once, here.

    On a GPU ``fn`` is ``torch.compile(flex_attention, dynamic=False)``: one static compilation per shape,
    as a model of fixed shape gets (its first call compiles: ``first_call_s``, not the timing). Compiled
    caches are dropped first (``torch.compiler.reset()``): past Dynamo's recompile limit it would run
    eagerly without saying so. On the CPU dry run it runs eagerly (Inductor's Triton kernels need a GPU).

    Raises:
        ImportError, RuntimeError: this torch has no FlexAttention, or the mask cannot be built
            (the caller records the row as skipped with the reason).
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def causal_mod(b, h, q_index, kv_index):
        return q_index >= kv_index

    # B=None, H=None: one mask broadcast over sequences and heads (the causal mask is the same in each).
    block_mask = create_block_mask(causal_mod, None, None, n, n, device=device) if causal else None
    if device.type == "cuda":
        torch.compiler.reset()
        attend, path, note = torch.compile(flex_attention, dynamic=False), "flex-compiled", ""
    else:
        attend, path = flex_attention, "flex-eager"
        note = "CPU dry run: flex_attention eagerly (torch.compile's Triton kernels need a GPU)"
    blocks = "none (no mask)" if block_mask is None else f"block_mask BLOCK_SIZE={tuple(block_mask.BLOCK_SIZE)}"
    config = f"{blocks}; kernel options: Inductor's defaults for this d and dtype (not read back)"

    def fn(q, k, v):
        if device.type != "cuda":   # eager FlexAttention refuses CPU inputs that require grad
            q, k, v = q.detach(), k.detach(), v.detach()
        return attend(q, k, v, block_mask=block_mask, enable_gqa=grouped)

    return fn, path, config, note
