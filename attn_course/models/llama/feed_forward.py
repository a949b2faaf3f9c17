"""The SwiGLU feed-forward network of Llama (Shazeer, 2020, "GLU Variants Improve Transformer").

    SwiGLU(x) = down( silu(gate(x)) ⊙ up(x) ),    silu(z) = z · sigmoid(z)

Two projections to the hidden width ``F`` instead of one: ``gate`` decides, feature by feature,
how much of ``up`` passes. No biases. To keep the parameter count of a ``4·E`` GELU network,
Llama takes ``F ≈ 8/3 · E`` (11008 for E = 4096 in Llama 2 7B).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate

__all__ = ["SwiGLU"]


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``, applied to every token on its own.

    Args:
        embed_dim: ``E``.
        hidden_dim: ``F`` (``intermediate_size``).

    Raises:
        TypeError, ValueError: sizes that are not positive ints.

    Example:
        >>> ffn = SwiGLU(embed_dim=8, hidden_dim=16)
        >>> ffn(torch.randn(2, 5, 8)).shape
        torch.Size([2, 5, 8])
        >>> [name for name, _ in ffn.named_parameters()]
        ['gate.weight', 'up.weight', 'down.weight']
    """

    def __init__(self, embed_dim: int, hidden_dim: int) -> None:
        super().__init__()
        where = "SwiGLU"
        self.embed_dim = _validate.integer(where, "embed_dim", embed_dim, minimum=1)
        self.hidden_dim = _validate.integer(where, "hidden_dim", hidden_dim, minimum=1)
        self.gate = nn.Linear(self.embed_dim, self.hidden_dim, bias=False)
        self.up = nn.Linear(self.embed_dim, self.hidden_dim, bias=False)
        self.down = nn.Linear(self.hidden_dim, self.embed_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., E]`` to ``[..., E]``.

        Raises:
            TypeError: ``x`` not a floating tensor.
            ValueError: ``x``'s last dimension is not ``E``.
        """
        where = "SwiGLU.forward"
        x = _validate.floating_tensor(where, "x", x, min_dim=1)
        if x.shape[-1] != self.embed_dim:
            raise ValueError(f"{where}: x must be [..., E] with E = {self.embed_dim}, "
                             f"got shape {_validate.shape_str(x)}")
        hidden = F.silu(self.gate(x)) * self.up(x)                        # [..., F]
        return self.down(hidden)                                          # [..., E]
