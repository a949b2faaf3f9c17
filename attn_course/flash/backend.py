"""The Triton FlashAttention kernel as an attention backend of :class:`~attn_course.core.multihead.MultiHeadAttention`.

Importing this module (``import attn_course.flash`` does) registers ``"flash"`` in
:mod:`attn_course.core.backends`, the way Hugging Face adds a kernel to ``ALL_ATTENTION_FUNCTIONS``:
``MultiHeadAttention(attention_backend="flash")`` then runs :func:`~attn_course.flash.flash_attention`,
and ``"auto"`` (the default) takes it on a CUDA GPU in float16/bfloat16 whenever nothing in the
call blocks it (:func:`flash_blockers`). The kernel reads grouped-query key/value heads in place
and, for up to 16 new tokens against a cache, decodes by splitting the keys.
"""

from __future__ import annotations

import torch

from attn_course.core.backends import register_attention_backend
from attn_course.flash.configs import GPU_DTYPES, INTERPRETER_DTYPES, SUPPORTED_HEAD_DIMS
from attn_course.flash.triton_attention import flash_attention

__all__ = ["triton_flash_attention", "flash_blockers"]


def triton_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                           is_causal: bool = False, dropout: float = 0.0,
                           need_weights: bool = False) -> tuple[torch.Tensor, None]:
    """:func:`~attn_course.flash.flash_attention` with a backend's arguments (:mod:`attn_course.core.backends`).

    Args:
        q: ``[B, H, N_q, d]``; k, v: ``[B, H_kv, N_k, d]``.
        mask, dropout, need_weights: must be None, 0 and False (:func:`flash_blockers` says so first).
        is_causal: the kernel's own bottom-right causal mask (the new queries are the last positions).

    Returns:
        ``(output [B, H, N_q, d], None)``: the kernel never forms the weights.

    Raises:
        ValueError: a mask, dropout or ``need_weights``; otherwise as ``flash_attention``.
    """
    blockers = flash_blockers(q, k, mask=mask, need_weights=need_weights, dropout=dropout)
    if blockers:
        raise ValueError("triton_flash_attention: this call has " + "; ".join(blockers))
    return flash_attention(q, k, v, causal=is_causal), None                    # [B, H, N_q, d]


def flash_blockers(q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None, need_weights: bool,
                   dropout: float) -> list[str]:
    """What in a call the kernel cannot do, in words (empty: it can run).

    Example:
        >>> flash_blockers(torch.zeros(1, 1, 2, 12), torch.zeros(1, 1, 2, 12), mask=None, need_weights=False,
        ...                dropout=0.0)
        ['head size E / H = 12, not one of (16, 32, 64, 128)']
    """
    dtypes = GPU_DTYPES if q.is_cuda else INTERPRETER_DTYPES
    return [reason for reason, blocked in (
        ("need_weights=True (the kernel never forms the weights)", need_weights),
        ("a mask (only is_causal is supported)", mask is not None),
        ("dropout while training", dropout > 0),
        (f"head size E / H = {q.shape[-1]}, not one of {SUPPORTED_HEAD_DIMS}", q.shape[-1] not in SUPPORTED_HEAD_DIMS),
        (f"dtype {q.dtype}, not one of {[str(d) for d in dtypes]}", q.dtype not in dtypes),
    ) if blocked]


def _on_a_gpu(q: torch.Tensor) -> bool:
    """``"auto"`` takes the kernel only on a CUDA GPU: on a CPU it would run in Triton's (slow) interpreter."""
    return q.is_cuda


register_attention_backend("flash", triton_flash_attention, blockers=flash_blockers, automatic=_on_a_gpu)
