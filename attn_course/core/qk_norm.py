"""QK-norm: each head's query and key RMS-normalised before the scores (Qwen3; Gemma 3 with Gemma's norm).

    q_h = RMSNorm_Q(x W_Q^h),   k_h = RMSNorm_K(x W_K^h)     # over the d features of one head, weight [d]

The scores ``q_h · k_h`` can then grow only through the norms' weights, not through the projections:
Dehghani et al. (2023, ViT-22B) added it because attention logits that kept growing made training
diverge. One weight of ``d`` features serves every head of the projection (Hugging Face's ``q_norm``
and ``k_norm``); the norm comes before RoPE, and a KV cache stores keys already normalised.

:class:`HeadNormLinear` is the projection followed by that norm, so that
:class:`~attn_course.core.multihead.MultiHeadAttention` built with ``qk_norm=True`` projects, splits into
heads and rotates exactly as without it: its ``q_proj`` and ``k_proj`` are these.
"""

from __future__ import annotations

import torch
from torch import nn

from attn_course import _validate
from attn_course.core.norms import RMSNorm

__all__ = ["HeadNormLinear"]


class HeadNormLinear(nn.Linear):
    """A linear projection into ``H`` heads of ``d`` features, each head's output RMS-normalised.

    ``forward(x)`` is ``x Wᵀ + b`` (``[..., H·d]``, heads side by side as
    :func:`~attn_course.core.multihead.split_heads` reads them) with each head's ``d`` features divided
    by their root mean square and scaled by ``norm.weight`` (:class:`~attn_course.core.norms.RMSNorm`,
    float32 inside, as Hugging Face's ``Qwen3RMSNorm``).

    Args:
        in_features: ``E``, the input width.
        num_heads: ``H``, the heads the output holds.
        head_dim: ``d``, the features of one head (the norm's size).
        bias: a bias on the projection (before the norm).
        eps: the norm's ``eps`` (``rms_norm_eps``).
        norm: the norm's class, :class:`~attn_course.core.norms.RMSNorm` (Qwen3) or a subclass such as
            :class:`~attn_course.core.norms.GemmaRMSNorm` (Gemma 3, Qwen3-Next: a weight of ``1 + w``).

    Attributes:
        norm: the :class:`~attn_course.core.norms.RMSNorm` over ``d`` (Hugging Face's ``q_norm`` or ``k_norm``).

    Raises:
        TypeError, ValueError: sizes that are not positive ints, ``eps`` not a positive finite number,
            ``norm`` not an RMSNorm class.

    Example:
        >>> projection = HeadNormLinear(16, num_heads=2, head_dim=4)
        >>> heads = projection(torch.randn(3, 5, 16)).unflatten(-1, (2, 4))          # [B, N, H, d]
        >>> torch.allclose(heads.pow(2).mean(dim=-1), torch.ones(3, 5, 2), atol=1e-4)  # RMS 1 per head
        True
    """

    def __init__(self, in_features: int, num_heads: int, head_dim: int, *, bias: bool = False,
                 eps: float = 1e-6, norm: type[RMSNorm] = RMSNorm) -> None:
        where = "HeadNormLinear"
        if not (isinstance(norm, type) and issubclass(norm, RMSNorm)):
            raise TypeError(f"{where}: norm must be RMSNorm or a subclass of it, got {norm!r}")
        in_features, num_heads, head_dim = _validate.integers(where, minimum=1, in_features=in_features,
                                                              num_heads=num_heads, head_dim=head_dim)
        super().__init__(in_features, num_heads * head_dim, bias=_validate.boolean(where, "bias", bias))
        self.num_heads, self.head_dim = num_heads, head_dim
        self.norm = norm(head_dim, eps=eps)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_heads={self.num_heads}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Project ``x``, then normalise each head's features.

        Args:
            x: ``[..., E]``.

        Returns:
            ``[..., H·d]``.

        Raises:
            TypeError, ValueError: as ``torch.nn.Linear`` and :class:`~attn_course.core.norms.RMSNorm`.
        """
        projected = super().forward(x)                                         # [..., H·d]
        heads = projected.unflatten(-1, (self.num_heads, self.head_dim))       # [..., H, d]
        return self.norm(heads).flatten(-2)                                    # [..., H·d]
