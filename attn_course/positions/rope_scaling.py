"""RoPE context extension: the frequencies of each method, as small config objects.

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attn_course import _validate

__all__ = ["LinearScaling", "NTKScaling", "YaRNScaling", "Llama3Scaling", "SCALINGS", "base_frequencies"]


def base_frequencies(base: float, rotary_dim: int, device=None) -> torch.Tensor:
    """``[rotary_dim/2]`` ``θ_i = base^(-2i/rotary_dim)`` in float64, plain RoPE's inverse frequencies.

    Example:
        >>> base_frequencies(100.0, 4)
        tensor([1.0000, 0.1000], dtype=torch.float64)
    """
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


def _check_extension(config: object, low: str, high: str) -> None:
    """Check and store a frozen config's ``factor``, ``original_context``, and its bounds ``low < high``."""
    where = type(config).__name__
    checked = {"factor": _factor(where, config.factor),
               "original_context": _validate.integer(where, "original_context", config.original_context, minimum=1)}
    for name in (low, high):
        checked[name] = _validate.positive_finite(where, name, getattr(config, name))
    if checked[high] <= checked[low]:
        raise ValueError(f"{where}: {high} must exceed {low}, got {checked[high]:g} and {checked[low]:g}")
    for name, value in checked.items():
        object.__setattr__(config, name, value)


@dataclass(frozen=True)
class LinearScaling:
    """Position Interpolation (Chen et al., 2023): squeeze ``factor`` times more positions into
    the trained range by dividing every frequency by ``factor`` (Hugging Face ``"linear"``).

    Args:
        factor: how many times longer the new context is than the trained one (``>= 1``).

    Raises:
        TypeError, ValueError: a factor that is not a number ``>= 1``.

    Example:
        >>> from attn_course.positions.rope import RotaryEmbedding
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
        return base_frequencies(base, rotary_dim, device) / self.factor


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
        >>> from attn_course.positions.rope import RotaryEmbedding
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
        return base_frequencies(base * stretch ** (rotary_dim / (rotary_dim - 2)), rotary_dim, device)


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
        >>> from attn_course.positions.rope import RotaryEmbedding
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
        _check_extension(self, "beta_slow", "beta_fast")
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
        theta = base_frequencies(base, rotary_dim, device)         # [P/2]
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
        >>> from attn_course.positions.rope import RotaryEmbedding
        >>> theta = RotaryEmbedding(128, base=500000.0, scaling=Llama3Scaling()).frequencies()
        >>> round((RotaryEmbedding(128, base=500000.0).frequencies()[-1] / theta[-1]).item(), 6)
        8.0
    """

    factor: float = 8.0
    original_context: int = 8192
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self) -> None:
        _check_extension(self, "low_freq_factor", "high_freq_factor")

    def inverse_frequencies(self, base: float, rotary_dim: int, *, seq_len: int | None = None,
                            device=None) -> torch.Tensor:
        """``[rotary_dim/2]`` LLaMA 3.1 ``θ_i`` (float64); ``seq_len`` is unused."""
        base, rotary_dim = _check_frequency_call("Llama3Scaling.inverse_frequencies", base, rotary_dim, seq_len)
        theta = base_frequencies(base, rotary_dim, device)           # [P/2]
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
