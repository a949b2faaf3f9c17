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

Context extension (running a model on longer sequences than it was trained on) changes the
frequencies ``θ_i``; each method is a small config object passed as ``scaling=``:

* :class:`LinearScaling`: Position Interpolation (Chen et al., 2023), every ``θ_i / factor``.
* :class:`NTKScaling`: "NTK-aware" scaling, a larger base (static), or one that grows with the
  sequence length (``dynamic=True``).
* :class:`YaRNScaling`: YaRN (Peng et al., 2023): fast pairs kept, slow pairs interpolated, a
  linear ramp between, and a temperature on the scores.
* :class:`Llama3Scaling`: LLaMA 3.1's version: slow pairs divided by ``factor``, fast pairs kept,
  a smooth blend between.

Each gives the inverse frequencies (and YaRN's attention factor) that Hugging Face's
``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` give for the same configuration.
``rotary_fraction < 1`` rotates only the first features of each head (GPT-NeoX's
``rotary_pct``, Hugging Face's ``partial_rotary_factor``) and passes the others through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attn_course import _validate

__all__ = ["RotaryEmbedding", "LinearScaling", "NTKScaling", "YaRNScaling", "Llama3Scaling"]


def _base_frequencies(base: float, rotary_dim: int, device=None) -> torch.Tensor:
    """``[rotary_dim/2]`` ``θ_i = base^(-2i/rotary_dim)`` in float64."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim
    return base ** -exponents


def _check_frequency_call(where: str, base: object, rotary_dim: object, seq_len: object) -> tuple[float, int]:
    base = _validate.positive_finite(where, "base", base)
    rotary_dim = _validate.integer(where, "rotary_dim", rotary_dim, minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"{where}: rotary_dim must be even (features rotate in pairs), got {rotary_dim}")
    if seq_len is not None:
        _validate.integer(where, "seq_len", seq_len, minimum=1)
    return base, rotary_dim


def _factor(where: str, value: object) -> float:
    value = _validate.positive_finite(where, "factor", value)
    if value < 1:
        raise ValueError(f"{where}: factor must be >= 1 (how many times longer the new context is), got {value:g}")
    return value


@dataclass(frozen=True)
class LinearScaling:
    """Position Interpolation (Chen et al., 2023): squeeze ``factor`` times more positions into
    the trained range by dividing every frequency by ``factor`` (Hugging Face ``"linear"``).

    Args:
        factor: how many times longer the new context is than the trained one (``>= 1``).

    Raises:
        TypeError, ValueError: a factor that is not a number ``>= 1``.

    Example:
        >>> rope = RotaryEmbedding(8, scaling=LinearScaling(4.0))
        >>> (RotaryEmbedding(8).frequencies() / rope.frequencies()).tolist()
        [4.0, 4.0, 4.0, 4.0]
    """

    factor: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", _factor("LinearScaling", self.factor))

    def inverse_frequencies(self, base: float, rotary_dim: int, *, seq_len: int | None = None,
                            device=None) -> torch.Tensor:
        """``[rotary_dim/2]`` scaled ``θ_i`` (float64); ``seq_len`` is unused."""
        base, rotary_dim = _check_frequency_call("LinearScaling.inverse_frequencies", base, rotary_dim, seq_len)
        return _base_frequencies(base, rotary_dim, device) / self.factor


@dataclass(frozen=True)
class NTKScaling:
    """"NTK-aware" scaling (bloc97, 2023): keep the fast pairs, slow the slow ones, by raising the base.

    Static: ``base' = base · factor^(d/(d-2))``, so that the slowest pair turns ``factor`` times
    more slowly while pair 0 is unchanged. Dynamic (Hugging Face ``"dynamic"``): the base grows
    with the sequence length ``L`` of each call, ``base' = base · (factor·L/L₀ - (factor-1))^(d/(d-2))``
    for ``L > L₀ = original_context``, and is the trained base up to ``L₀``. ``L`` is the largest
    position of the call plus one, for the whole batch (as in Hugging Face); with a key/value cache,
    cached keys keep the rotation of the call that stored them, so a dynamic model decoded token by
    token does not give exactly the scores of one pass over the whole sequence.

    Args:
        factor: ``>= 1``.
        original_context: the trained context ``L₀``; required when ``dynamic``.
        dynamic: recompute the base from each call's sequence length.

    Raises:
        TypeError, ValueError: a bad factor, a missing or bad ``original_context`` for dynamic.

    Example:
        >>> theta = RotaryEmbedding(8, scaling=NTKScaling(4.0)).frequencies()
        >>> round(theta[0].item(), 6), round((RotaryEmbedding(8).frequencies()[-1] / theta[-1]).item(), 6)
        (1.0, 4.0)
    """

    factor: float
    original_context: int | None = None
    dynamic: bool = False

    def __post_init__(self) -> None:
        where = "NTKScaling"
        object.__setattr__(self, "factor", _factor(where, self.factor))
        object.__setattr__(self, "dynamic", _validate.boolean(where, "dynamic", self.dynamic))
        if self.original_context is not None:
            object.__setattr__(self, "original_context",
                               _validate.integer(where, "original_context", self.original_context, minimum=1))
        elif self.dynamic:
            raise ValueError(f"{where}: dynamic=True needs original_context (the trained context length)")

    def inverse_frequencies(self, base: float, rotary_dim: int, *, seq_len: int | None = None,
                            device=None) -> torch.Tensor:
        """``[rotary_dim/2]`` ``θ_i`` with the raised base (float64); ``seq_len`` only matters if dynamic.

        Raises:
            ValueError: ``rotary_dim`` of 2 (the exponent ``d/(d-2)`` is undefined).
        """
        where = "NTKScaling.inverse_frequencies"
        base, rotary_dim = _check_frequency_call(where, base, rotary_dim, seq_len)
        if rotary_dim == 2:
            raise ValueError(f"{where}: NTK scaling needs a rotary_dim above 2, got 2")
        if self.dynamic:
            length = max(seq_len or self.original_context, self.original_context)
            stretch = self.factor * length / self.original_context - (self.factor - 1)
        else:
            stretch = self.factor
        return _base_frequencies(base * stretch ** (rotary_dim / (rotary_dim - 2)), rotary_dim, device)


@dataclass(frozen=True)
class YaRNScaling:
    """YaRN (Peng, Quesnelle, Fan and Shippole, 2023), as Hugging Face's ``"yarn"`` computes it.

    Pairs that turn more than ``beta_fast`` times over the trained context keep their
    frequency; pairs that turn fewer than ``beta_slow`` times are interpolated (``θ_i / factor``);
    between them a linear ramp over the pair index. The rotated queries and keys are also
    multiplied by ``attention_factor`` (default ``0.1·ln(factor) + 1``), so the scores by its square.

    Args:
        factor: ``>= 1``.
        original_context: the trained context length ``L₀``.
        beta_fast, beta_slow: the turn counts that bound the ramp (``beta_fast > beta_slow > 0``).
        attention_factor: override the default temperature.
        truncate: round the ramp's ends to whole pairs (Hugging Face's default).

    Raises:
        TypeError, ValueError: arguments of the wrong kind or out of range.

    Example:
        >>> rope = RotaryEmbedding(64, scaling=YaRNScaling(4.0, original_context=2048))
        >>> round(rope.attention_scaling, 4)
        1.1386
    """

    factor: float
    original_context: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        where = "YaRNScaling"
        object.__setattr__(self, "factor", _factor(where, self.factor))
        object.__setattr__(self, "original_context",
                           _validate.integer(where, "original_context", self.original_context, minimum=1))
        fast = _validate.positive_finite(where, "beta_fast", self.beta_fast)
        slow = _validate.positive_finite(where, "beta_slow", self.beta_slow)
        if fast <= slow:
            raise ValueError(f"{where}: beta_fast must exceed beta_slow, got {fast:g} and {slow:g}")
        object.__setattr__(self, "beta_fast", fast)
        object.__setattr__(self, "beta_slow", slow)
        if self.attention_factor is not None:
            object.__setattr__(self, "attention_factor",
                               _validate.positive_finite(where, "attention_factor", self.attention_factor))
        object.__setattr__(self, "truncate", _validate.boolean(where, "truncate", self.truncate))

    @property
    def attention_scaling(self) -> float:
        """The factor on the rotated queries and keys: ``attention_factor`` or ``0.1·ln(factor) + 1``."""
        if self.attention_factor is not None:
            return self.attention_factor
        return 1.0 if self.factor <= 1 else 0.1 * math.log(self.factor) + 1.0

    def inverse_frequencies(self, base: float, rotary_dim: int, *, seq_len: int | None = None,
                            device=None) -> torch.Tensor:
        """``[rotary_dim/2]`` YaRN ``θ_i`` (float64); ``seq_len`` is unused."""
        base, rotary_dim = _check_frequency_call("YaRNScaling.inverse_frequencies", base, rotary_dim, seq_len)

        def pair_turning(turns: float) -> float:   # the (fractional) pair that turns `turns` times over L₀
            return rotary_dim * math.log(self.original_context / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = pair_turning(self.beta_fast), pair_turning(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rotary_dim - 1)
        if low == high:
            high += 0.001                                          # as Hugging Face: no zero-width ramp
        theta = _base_frequencies(base, rotary_dim, device)         # [P/2]
        pair = torch.arange(rotary_dim // 2, dtype=torch.float64, device=device)
        interpolated = ((pair - low) / (high - low)).clamp(0, 1)    # 0: keep θ_i, 1: θ_i / factor
        return theta * (1 - interpolated) + theta / self.factor * interpolated


@dataclass(frozen=True)
class Llama3Scaling:
    """LLaMA 3.1's frequency scaling, as Hugging Face's ``"llama3"`` computes it.

    Pairs whose wavelength exceeds ``original_context / low_freq_factor`` are divided by
    ``factor``; pairs shorter than ``original_context / high_freq_factor`` are kept; between
    them a blend that is linear in ``original_context / wavelength``.

    Args:
        factor: ``>= 1`` (8 in LLaMA 3.1).
        original_context: the trained context (8192 in LLaMA 3.1).
        low_freq_factor, high_freq_factor: bounds of the blend (1 and 4), ``high > low > 0``.

    Raises:
        TypeError, ValueError: arguments of the wrong kind or out of range.

    Example:
        >>> theta = RotaryEmbedding(128, base=500000.0, scaling=Llama3Scaling()).frequencies()
        >>> round((RotaryEmbedding(128, base=500000.0).frequencies()[-1] / theta[-1]).item(), 6)
        8.0
    """

    factor: float = 8.0
    original_context: int = 8192
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self) -> None:
        where = "Llama3Scaling"
        object.__setattr__(self, "factor", _factor(where, self.factor))
        object.__setattr__(self, "original_context",
                           _validate.integer(where, "original_context", self.original_context, minimum=1))
        low = _validate.positive_finite(where, "low_freq_factor", self.low_freq_factor)
        high = _validate.positive_finite(where, "high_freq_factor", self.high_freq_factor)
        if high <= low:
            raise ValueError(f"{where}: high_freq_factor must exceed low_freq_factor, got {high:g} and {low:g}")
        object.__setattr__(self, "low_freq_factor", low)
        object.__setattr__(self, "high_freq_factor", high)

    def inverse_frequencies(self, base: float, rotary_dim: int, *, seq_len: int | None = None,
                            device=None) -> torch.Tensor:
        """``[rotary_dim/2]`` LLaMA 3.1 ``θ_i`` (float64); ``seq_len`` is unused."""
        base, rotary_dim = _check_frequency_call("Llama3Scaling.inverse_frequencies", base, rotary_dim, seq_len)
        theta = _base_frequencies(base, rotary_dim, device)           # [P/2]
        wavelength = 2 * math.pi / theta
        long_wave = self.original_context / self.low_freq_factor       # longer: divided by factor
        short_wave = self.original_context / self.high_freq_factor     # shorter: kept
        blend = (self.original_context / wavelength - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor)              # 0 at long_wave, 1 at short_wave
        blended = (1 - blend) * theta / self.factor + blend * theta
        scaled = torch.where(wavelength > long_wave, theta / self.factor, theta)
        middle = (wavelength >= short_wave) & (wavelength <= long_wave)
        return torch.where(middle, blended, scaled)


SCALINGS = (LinearScaling, NTKScaling, YaRNScaling, Llama3Scaling)


class RotaryEmbedding(nn.Module):
    """Rotate ``[..., N, head_dim]`` vectors by their positions.

    Args:
        head_dim: ``d``, the size of each query/key vector; must be even.
        base: ``θ_i = base^(-2i/P)``; larger bases rotate more slowly (longer contexts).
        interleaved: pair adjacent features (RoFormer) instead of the two halves (LLaMA).
        scaling: a context-extension method (:class:`LinearScaling`, :class:`NTKScaling`,
            :class:`YaRNScaling`, :class:`Llama3Scaling`), or None for plain RoPE.
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
            return _base_frequencies(self.base, self.rotary_dim, device)
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
        positions = _validate.integer_tensor("RotaryEmbedding.angles", "positions", positions)
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
        positions = self._check_positions(where, x, positions)
        angles = self.angles(positions.to(x.device))                   # [N, P/2] or [B, N, P/2]
        if angles.dim() == 3:                                          # [B, 1, ..., 1, N, P/2] like x
            angles = angles.view(angles.shape[0], *([1] * (x.dim() - 3)), *angles.shape[1:])
        # Half precision rotates in float32; float32 and float64 keep their own precision.
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        scale = self.attention_scaling
        cos, sin = (angles.cos() * scale).to(compute_dtype), (angles.sin() * scale).to(compute_dtype)
        xc = x.to(compute_dtype)
        xr, passed = xc[..., : self.rotary_dim], xc[..., self.rotary_dim :]   # rotated, passed through
        if self.interleaved:
            even, odd = xr[..., 0::2], xr[..., 1::2]                  # [..., N, P/2] each
            rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
        else:
            first, second = xr.chunk(2, dim=-1)                        # [..., N, P/2] each
            rotated = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
        return torch.cat((rotated, passed), dim=-1).to(x.dtype)        # [..., N, d]

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
