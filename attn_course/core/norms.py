"""RMSNorm (Zhang and Sennrich, 2019): LayerNorm without the mean, as Llama uses it.

    RMSNorm(x) = x / sqrt(mean(x²) + eps) · weight

LayerNorm subtracts the mean and divides by the standard deviation; RMSNorm only divides by
the root mean square, which is cheaper and works as well in practice. There is no bias.
"""

from __future__ import annotations

import torch
from torch import nn

from attn_course import _validate

__all__ = ["RMSNorm", "GemmaRMSNorm"]


class RMSNorm(nn.Module):
    """Divide each ``E``-vector by its root mean square, then scale it by a learned weight.

    Precision, as Hugging Face's ``LlamaRMSNorm`` (transformers 5.24, ``modeling_llama.py``): the
    mean of squares and the division are computed in float32 whatever the input dtype (a
    bfloat16 sum of 4096 squares loses most of its digits); the normalised vector is cast back
    to the input's dtype *before* it is multiplied by the weight. (Gemma's RMSNorm differs: it
    multiplies by ``1 + weight`` in float32 and casts afterwards.)

    Args:
        dim: ``E``, the size of the last dimension.
        eps: added to the mean of squares (``rms_norm_eps``, ``1e-6`` in Llama 2, ``1e-5`` in Llama 3).

    Raises:
        TypeError, ValueError: ``dim`` not a positive int, ``eps`` not a positive finite number.

    Example:
        >>> norm = RMSNorm(4)
        >>> norm(torch.tensor([[1.0, -1.0, 1.0, -1.0]])).tolist()
        [[0.9999995231628418, -0.9999995231628418, 0.9999995231628418, -0.9999995231628418]]
    """

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        where = "RMSNorm"
        self.dim = _validate.integer(where, "dim", dim, minimum=1)
        self.eps = _validate.positive_finite(where, "eps", eps)
        self.weight = nn.Parameter(torch.ones(self.dim))                 # [E]

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps:g}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x``.

        Args:
            x: ``[..., E]`` floating point.

        Returns:
            ``[..., E]``, in the dtype of ``weight * x`` (``x``'s when both share a dtype).

        Raises:
            TypeError: ``x`` not a floating tensor.
            ValueError: ``x``'s last dimension is not ``E``.
        """
        return self.weight * self._normalised("RMSNorm.forward", x).to(x.dtype)     # [..., E]

    def _normalised(self, where: str, x: object) -> torch.Tensor:
        """``x / sqrt(mean(x²) + eps)`` in float32, after checking ``x``."""
        x = _validate.floating_tensor(where, "x", x, min_dim=1)
        if x.shape[-1] != self.dim:
            raise ValueError(f"{where}: x must be [..., E] with E = {self.dim}, got shape {_validate.shape_str(x)}")
        wide = x.to(torch.float32)                                        # [..., E]
        mean_square = wide.pow(2).mean(dim=-1, keepdim=True)               # [..., 1]
        return wide * torch.rsqrt(mean_square + self.eps)                  # [..., E]


class GemmaRMSNorm(RMSNorm):
    """RMSNorm whose weight is stored as an offset from one: ``x / sqrt(mean(x²) + eps) · (1 + weight)``.

    Gemma (and Qwen3-Next, whose norm is Gemma's) stores ``weight`` initialised at zero, so a freshly
    built norm is the identity scale. Precision, as Hugging Face's ``Gemma3RMSNorm`` (transformers 5.25):
    everything, the product with ``1 + weight`` included, in float32, and the result cast back to the
    input's dtype afterwards (:class:`RMSNorm` casts before multiplying; the two differ only in half
    precision).

    Args:
        dim: ``E``, the size of the last dimension.
        eps: added to the mean of squares (``rms_norm_eps``, ``1e-6`` in Gemma 3).

    Raises:
        TypeError, ValueError: ``dim`` not a positive int, ``eps`` not a positive finite number.

    Example:
        >>> norm = GemmaRMSNorm(4)                                        # weight 0: scale 1 + 0
        >>> norm(torch.tensor([[2.0, -2.0, 2.0, -2.0]])).tolist()
        [[0.9999998807907104, -0.9999998807907104, 0.9999998807907104, -0.9999998807907104]]
    """

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__(dim, eps=eps)
        nn.init.zeros_(self.weight)                                        # [E], the offset from 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x``.

        Args:
            x: ``[..., E]`` floating point.

        Returns:
            ``[..., E]``, in ``x``'s dtype.

        Raises:
            TypeError: ``x`` not a floating tensor.
            ValueError: ``x``'s last dimension is not ``E``.
        """
        normalised = self._normalised("GemmaRMSNorm.forward", x)          # [..., E], float32
        return (normalised * (1.0 + self.weight.float())).to(x.dtype)      # [..., E]
