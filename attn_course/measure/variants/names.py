"""The variants chapter 09 measures, by name, and the row each (variant, N) measurement gives."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from attn_course import _validate

__all__ = ["DECODE_VARIANTS", "DEFAULT_LENGTHS", "PREFILL_VARIANTS", "QUICK_LENGTHS", "VariantRow", "check_lengths",
           "check_name", "check_names"]

DEFAULT_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
QUICK_LENGTHS = (32, 64)
PREFILL_VARIANTS = ("softmax sdpa", "softmax self_attention", "sliding window mask", "flex eager",
                    "linear chunked", "linear recurrent")
DECODE_VARIANTS = ("decode kv-cache", "decode rolling-cache", "decode linear state")


@dataclasses.dataclass(frozen=True)
class VariantRow:
    """One (variant, N) measurement of :func:`measure_variants`.

    Attributes:
        variant: one of :data:`PREFILL_VARIANTS` or :data:`DECODE_VARIANTS`.
        mode: ``"prefill"`` (all ``N`` queries at once) or ``"decode"`` (one new token after ``N - 1``).
        n: sequence length N (for ``decode``, the keys the new token may see, itself included).
        seconds: best wall-clock time of one call (one step for ``decode``).
        peak_bytes: bytes allocated during the call (inputs excluded), exact
            (:func:`~attn_course.measure.memory.peak_memory`); None for ``flex eager`` (not measurable).
        state_bytes: bytes the variant keeps to generate the next token after these N: the keys and
            values (``2·B·H·N·d·4``), the rolling window (``2·B·H·(W-1)·d·4``) or linear
            attention's state ``(S, z)`` (``B·H·(d·d + d)·4``).
        max_difference: largest absolute difference of the output from the reference.
    """

    variant: str
    mode: str
    n: int
    seconds: float
    peak_bytes: int | None
    state_bytes: int
    max_difference: float



def check_lengths(where: str, lengths: object) -> list[int]:
    """``lengths`` as a non-empty list of ints >= 1, or the error naming ``where``."""
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1)
    if not lengths:
        raise ValueError(f"{where}: lengths must not be empty")
    return lengths


def check_name(where: str, name: str, value: object, allowed: Sequence[str]) -> str:
    """``value``, one of ``allowed``, or the error naming ``where`` and ``name``."""
    if not isinstance(value, str):
        raise TypeError(f"{where}: {name} must be a str, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{where}: {name} must be one of {list(allowed)}, got {value!r}")
    return value


def check_names(where: str, name: str, value: object, allowed: Sequence[str]) -> list[str]:
    """``value`` as a list of names from ``allowed``, or the error naming the first that is not."""
    value = _validate.sequence(where, name, value, of="variant names")
    for index, item in enumerate(value):
        if item not in allowed:
            raise ValueError(f"{where}: {name}[{index}] must be one of {list(allowed)}, got {item!r}")
    return value
