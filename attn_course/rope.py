"""Rotary position embeddings (RoPE): positions as rotations of queries and keys.

Split a head's ``d`` features into ``d / 2`` pairs and treat each pair as a point in the
plane (or a complex number). At position ``m``, pair ``i`` is rotated by the angle
``m · θ_i`` with ``θ_i = base^(-2i / d)``: fast rotations for the first pairs, slow ones
for the last. Because rotating ``q`` by ``m θ`` and ``k`` by ``n θ`` changes their dot
product only through ``(m - n) θ``, attention scores depend on the *relative* position
of query and key, while each token still carries its absolute position.

Two ways of pairing the features are in use, and a checkpoint only works with the one it
was trained with:

* ``interleaved=False`` (half split): feature ``i`` pairs with ``i + d/2``. GPT-NeoX,
  LLaMA and most Hugging Face checkpoints (``rotate_half``).
* ``interleaved=True``: features ``2i`` and ``2i + 1`` pair up, as the RoFormer paper
  writes it (and GPT-J, and the complex-number view ``x_{2i} + i·x_{2i+1}``).
"""

from __future__ import annotations

import torch
from torch import nn

from attn_course import _validate

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(nn.Module):
    """Rotate ``[..., N, head_dim]`` vectors by their positions.

    Args:
        head_dim: ``d``, the size of each query/key vector; must be even.
        base: ``θ_i = base^(-2i/d)``; larger bases rotate more slowly (longer contexts).
        interleaved: pair adjacent features (RoFormer) instead of the two halves (LLaMA).

    Raises:
        TypeError: ``head_dim`` not an int or ``base`` not a number.
        ValueError: odd or non-positive ``head_dim``, or ``base`` not positive and finite.

    Example:
        >>> rope = RotaryEmbedding(head_dim=8)
        >>> q = torch.randn(2, 5, 8)                    # [B, N, d]
        >>> rope(q).shape
        torch.Size([2, 5, 8])
        >>> torch.allclose(rope(q).norm(dim=-1), q.norm(dim=-1))   # rotations keep lengths
        True
    """

    def __init__(self, head_dim: int, *, base: float = 10000.0, interleaved: bool = False) -> None:
        super().__init__()
        where = "RotaryEmbedding"
        head_dim = _validate.integer(where, "head_dim", head_dim, minimum=2)
        if head_dim % 2:
            raise ValueError(f"{where}: head_dim must be even (features rotate in pairs), got {head_dim}")
        base = _validate.positive_finite(where, "base", base)
        interleaved = _validate.boolean(where, "interleaved", interleaved)
        self.head_dim, self.base, self.interleaved = head_dim, base, interleaved

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base:g}, interleaved={self.interleaved}"

    def frequencies(self, device: torch.device | str | None = None) -> torch.Tensor:
        """``[d/2]`` angular frequencies ``θ_i = base^(-2i/d)``, in float64."""
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device) / self.head_dim
        return self.base ** -exponents

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """``[N, d/2]`` rotation angles ``m · θ_i`` (float64) for integer positions ``[N]``.

        Computed in float64 on every call: cheap, and exact enough that position 100 000
        rotates as accurately as position 1 (float32 angles lose about 0.01 rad there).

        Raises:
            TypeError, ValueError: positions that are not a 1-D integer tensor.
        """
        positions = _validate.integer_tensor("RotaryEmbedding.angles", "positions", positions)
        if positions.dim() != 1:
            raise ValueError(f"RotaryEmbedding.angles: positions must be 1-D [N], "
                             f"got shape {_validate.shape_str(positions)}")
        theta = self.frequencies(positions.device)
        return positions.to(torch.float64)[:, None] * theta[None, :]

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate each vector of ``x`` by the angle of its position.

        Args:
            x: ``[..., N, head_dim]`` queries or keys (floating point).
            positions: ``[N]`` integer positions; default ``0 .. N-1``. Pass
                ``torch.arange(offset, offset + N)`` for tokens that follow ``offset``
                cached ones.

        Returns:
            The rotated tensor, same shape and dtype as ``x``.

        Raises:
            TypeError: ``x`` not floating, or positions not an integer tensor.
            ValueError: ``x``'s last dimension is not ``head_dim``, or positions are not 1-D
                of length ``N``.
        """
        where = "RotaryEmbedding.forward"
        x = _validate.floating_tensor(where, "x", x, min_dim=2)
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{where}: x must end in head_dim={self.head_dim}, got shape {_validate.shape_str(x)}"
            )
        n = x.shape[-2]
        if positions is None:
            positions = torch.arange(n, device=x.device)
        else:
            positions = _validate.integer_tensor(where, "positions", positions)
            if positions.dim() != 1 or positions.shape[0] != n:
                raise ValueError(
                    f"{where}: positions must be 1-D with one entry per token (N={n}), "
                    f"got shape {_validate.shape_str(positions)}"
                )
        # Half precision rotates in float32; float32 and float64 keep their own precision.
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        angles = self.angles(positions.to(x.device))                   # [N, d/2]
        cos, sin = angles.cos().to(compute_dtype), angles.sin().to(compute_dtype)
        xc = x.to(compute_dtype)
        if self.interleaved:
            even, odd = xc[..., 0::2], xc[..., 1::2]                  # [..., N, d/2] each
            rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
            return rotated.flatten(-2).to(x.dtype)                     # [..., N, d]
        first, second = xc.chunk(2, dim=-1)                            # [..., N, d/2] each
        rotated = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
        return rotated.to(x.dtype)                                     # [..., N, d]
