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

Context extension changes the frequencies ``θ_i``: :mod:`attn_course.positions.rope_scaling`
holds the methods (linear, NTK, YaRN, Llama 3), passed as ``scaling=``.
``rotary_fraction < 1`` rotates only the first features of each head (GPT-NeoX's
``rotary_pct``, Hugging Face's ``partial_rotary_factor``) and passes the others through.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attn_course import _validate
from attn_course.positions.rope_scaling import (
    SCALINGS,
    LinearScaling,
    Llama3Scaling,
    NTKScaling,
    YaRNScaling,
    base_frequencies,
)

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(nn.Module):
    """Rotate ``[..., N, head_dim]`` vectors by their positions.

    Args:
        head_dim: ``d``, the size of each query/key vector; must be even.
        base: ``θ_i = base^(-2i/P)``; larger bases rotate more slowly (longer contexts).
        interleaved: pair adjacent features (RoFormer) instead of the two halves (LLaMA).
        scaling: a context-extension method of :mod:`~attn_course.positions.rope_scaling` (``LinearScaling``,
            ``NTKScaling``, ``YaRNScaling``, ``Llama3Scaling``), or None for plain RoPE.
        rotary_fraction: rotate only the first ``P = int(d · rotary_fraction)`` features of each
            vector (GPT-NeoX's rotary fraction) and pass the rest through; ``P`` must be even.

    Raises:
        TypeError: ``head_dim`` not an int, ``base`` or ``rotary_fraction`` not a number, or a
            ``scaling`` of another kind.
        ValueError: odd or non-positive ``head_dim``, ``base`` not positive and finite,
            ``rotary_fraction`` outside ``(0, 1]`` or giving an odd or zero ``P``.

    Example:
        >>> rope = RotaryEmbedding(head_dim=8)
        >>> q = torch.randn(2, 5, 8)                    # [B, N, d]
        >>> rope(q).shape
        torch.Size([2, 5, 8])
        >>> torch.allclose(rope(q).norm(dim=-1), q.norm(dim=-1))   # rotations keep lengths
        True
    """

    def __init__(self, head_dim: int, *, base: float = 10000.0, interleaved: bool = False,
                 scaling: LinearScaling | NTKScaling | YaRNScaling | Llama3Scaling | None = None,
                 rotary_fraction: float = 1.0) -> None:
        super().__init__()
        where = "RotaryEmbedding"
        head_dim = _validate.integer(where, "head_dim", head_dim, minimum=2)
        if head_dim % 2:
            raise ValueError(f"{where}: head_dim must be even (features rotate in pairs), got {head_dim}")
        base = _validate.positive_finite(where, "base", base)
        interleaved = _validate.boolean(where, "interleaved", interleaved)
        if scaling is not None and not isinstance(scaling, SCALINGS):
            raise TypeError(f"{where}: scaling must be None or one of "
                            f"{', '.join(s.__name__ for s in SCALINGS)}, got {type(scaling).__name__}")
        rotary_fraction = _validate.positive_finite(where, "rotary_fraction", rotary_fraction)
        rotary_dim = int(head_dim * rotary_fraction)
        if rotary_fraction > 1 or rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"{where}: rotary_fraction must be in (0, 1] and rotate an even number of "
                             f"features, got {rotary_fraction:g} · {head_dim} = {rotary_dim}")
        if isinstance(scaling, NTKScaling) and rotary_dim == 2:
            raise ValueError(f"{where}: NTK scaling needs more than 2 rotated features, got {rotary_dim}")
        self.head_dim, self.base, self.interleaved = head_dim, base, interleaved
        self.scaling, self.rotary_fraction, self.rotary_dim = scaling, rotary_fraction, rotary_dim
        # The last positions rotated, with their cosines and sines (see _cos_sin).
        self._last: tuple[torch.Tensor, int, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def extra_repr(self) -> str:
        text = f"head_dim={self.head_dim}, base={self.base:g}, interleaved={self.interleaved}"
        if self.rotary_dim != self.head_dim:
            text += f", rotary_dim={self.rotary_dim}"
        return text + (f", scaling={self.scaling}" if self.scaling is not None else "")

    @property
    def attention_scaling(self) -> float:
        """The factor on the rotated features: YaRN's temperature, else 1."""
        return self.scaling.attention_scaling if isinstance(self.scaling, YaRNScaling) else 1.0

    def frequencies(self, device: torch.device | str | None = None, *, seq_len: int | None = None) -> torch.Tensor:
        """``[P/2]`` angular frequencies ``θ_i`` (``base^(-2i/P)`` before scaling), in float64.

        Args:
            device: where to put them.
            seq_len: the sequence length, for dynamic NTK scaling only (default: the trained length).

        Raises:
            TypeError, ValueError: a ``seq_len`` that is not a positive int.
        """
        if seq_len is not None:
            seq_len = _validate.integer("RotaryEmbedding.frequencies", "seq_len", seq_len, minimum=1)
        if self.scaling is None:
            return base_frequencies(self.base, self.rotary_dim, device)
        return self.scaling.inverse_frequencies(self.base, self.rotary_dim, seq_len=seq_len, device=device)

    def wavelengths(self, *, seq_len: int | None = None) -> torch.Tensor:
        """``[P/2]`` tokens per full turn of each pair, ``2π / θ_i`` (float64)."""
        return 2 * math.pi / self.frequencies(seq_len=seq_len)

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """``[..., P/2]`` rotation angles ``m · θ_i`` (float64) for integer positions of any shape.

        Computed in float64 on every call: cheap, and exact enough that position 100 000
        rotates as accurately as position 1 (float32 angles lose about 0.01 rad there). With
        dynamic NTK scaling the frequencies are those for ``max(positions) + 1`` tokens.

        Raises:
            TypeError: positions that are not an integer tensor.
        """
        return self._angles(_validate.integer_tensor("RotaryEmbedding.angles", "positions", positions))

    def _angles(self, positions: torch.Tensor) -> torch.Tensor:
        seq_len = None
        if isinstance(self.scaling, NTKScaling) and self.scaling.dynamic and positions.numel():
            seq_len = max(int(positions.max()) + 1, 1)
        theta = self.frequencies(positions.device, seq_len=seq_len)
        return positions.to(torch.float64)[..., None] * theta

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate each vector of ``x`` by the angle of its position.

        Args:
            x: ``[..., N, head_dim]`` queries or keys (floating point), e.g. ``[B, H, N, d]``.
            positions: integer positions, ``[N]`` shared by every sequence or ``[B, N]`` one row
                per sequence (``x`` then starts with ``B``: ``[B, N, d]`` or ``[B, H, N, d]``);
                default ``0 .. N-1``. Pass ``torch.arange(offset, offset + N)`` for tokens that
                follow ``offset`` cached ones; per-sequence rows for a left-padded batch.

        Returns:
            The rotated tensor, same shape and dtype as ``x``.

        Raises:
            TypeError: ``x`` not floating, or positions not an integer tensor.
            ValueError: ``x``'s last dimension is not ``head_dim``, or positions neither ``[N]``
                nor ``[B, N]`` for ``x``'s ``B`` and ``N``.
        """
        where = "RotaryEmbedding.forward"
        x = _validate.floating_tensor(where, "x", x, min_dim=2)
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{where}: x must end in head_dim={self.head_dim}, got shape {_validate.shape_str(x)}"
            )
        return self.rotate(x, self._check_positions(where, x, positions).to(x.device))

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The rotation itself, on inputs already checked: :meth:`forward` checks its inputs once and
        calls this, as does :class:`~attn_course.core.multihead.MultiHeadAttention`, which checks the
        positions it is given once per call.

        Args:
            x: ``[..., N, head_dim]`` floating.
            positions: integer ``[N]``, or ``[B, N]`` when ``x`` starts with ``B``, on ``x``'s device.

        Returns:
            The rotated tensor, same shape and dtype as ``x``.
        """
        # Half precision rotates in float32; float32 and float64 keep their own precision.
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        cos, sin = self._cos_sin(positions, compute_dtype)             # [N, P/2] or [B, N, P/2]
        if cos.dim() == 3:                                             # [B, 1, ..., 1, N, P/2] like x
            cos, sin = (t.view(t.shape[0], *([1] * (x.dim() - 3)), *t.shape[1:]) for t in (cos, sin))
        xc = x.to(compute_dtype)
        xr, passed = xc[..., : self.rotary_dim], xc[..., self.rotary_dim :]   # rotated, passed through
        if self.interleaved:
            even, odd = xr[..., 0::2], xr[..., 1::2]                  # [..., N, P/2] each
            rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
        else:
            first, second = xr.chunk(2, dim=-1)                        # [..., N, P/2] each
            rotated = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
        if not passed.shape[-1]:                                       # every feature rotated: no copy to join
            return rotated.to(x.dtype)
        return torch.cat((rotated, passed), dim=-1).to(x.dtype)        # [..., N, d]

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and ``sin`` of the angles (times YaRN's scale), in ``dtype``. A model's forward pass rotates
        every layer's queries and keys at the same positions tensor: they are computed once for it, and again
        only for another tensor, or for this one changed in place (its version counter)."""
        last = self._last
        if last is not None and last[0] is positions and last[1] == positions._version and last[2] == dtype:
            return last[3], last[4]
        angles = self._angles(positions)
        scale = self.attention_scaling
        cos, sin = (angles.cos() * scale).to(dtype), (angles.sin() * scale).to(dtype)
        self._last = (positions, positions._version, dtype, cos, sin)
        return cos, sin

    @staticmethod
    def _check_positions(where: str, x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        n = x.shape[-2]
        if positions is None:
            return torch.arange(n, device=x.device)
        positions = _validate.integer_tensor(where, "positions", positions)
        if positions.dim() == 1 and positions.shape[0] == n:
            return positions
        if positions.dim() == 2 and x.dim() >= 3 and positions.shape == (x.shape[0], n):
            return positions
        expected = f"[N] = [{n}]" + (f" or [B, N] = [{x.shape[0]}, {n}]" if x.dim() >= 3 else "")
        raise ValueError(
            f"{where}: positions must be {expected} for x of shape {_validate.shape_str(x)}, "
            f"got shape {_validate.shape_str(positions)}"
        )
