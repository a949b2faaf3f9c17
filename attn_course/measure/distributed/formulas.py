"""The methods compared, their shapes' rules, and the bytes one rank sends, from the algorithms."""

from __future__ import annotations

from attn_course import _validate
from attn_course.distributed.layout import check_divisible
from attn_course.distributed.ulysses import ulysses_bytes

__all__ = ["LAYOUT", "METHODS", "check_methods", "check_shape", "formula_bytes", "positive_ints"]

# (name, layout): Ulysses needs the contiguous layout; ring runs with all three.
METHODS = ("ulysses", "ring", "ring zigzag", "ring striped")
LAYOUT = {"ulysses": "contiguous", "ring": "contiguous", "ring zigzag": "zigzag", "ring striped": "striped"}


def formula_bytes(method: str, batch: int, heads: int, n: int, head_dim: int, world_size: int, *,
                  element_size: int = 4, backward: bool = False, kv_heads: int | None = None) -> int:
    """Bytes one rank sends for one attention layer, from the algorithm.

    A query shard has ``S_q = B·H·(N/P)·d`` elements, a K (or V) shard ``S = B·H_kv·(N/P)·d``
    (``H_kv = H`` without grouped-query attention).

    - Ulysses: ``(P - 1)/P · (2 S_q + 2 S)`` forward (q and out at ``H`` heads, k and v at
      ``H_kv``), twice that forward + backward (:func:`~attn_course.distributed.ulysses.ulysses_bytes`);
    - ring (any layout): ``2 (P - 1) · S`` forward (K and V passed ``P - 1`` times); the
      backward passes K and V ``P - 1`` times again and dK, dV ``P`` times (home at the end):
      ``(4P - 2) · S`` more, so ``(6P - 4) · S`` in all. The dK/dV sums travel in float32 when
      the inputs are half precision (:func:`~attn_course.distributed.ring.accumulation_dtype`):
      their ``2P · S`` elements count ``max(element_size, 4)`` bytes each. Nothing at ``P = 1``.

    Args:
        method: one of :data:`METHODS`.
        batch, heads, n, head_dim: ``B``, ``H``, the full ``N``, ``d`` (``d_v = d``).
        kv_heads: ``H_kv``, the K/V heads (a divisor of ``H``); None for ``H``.
        world_size: ``P``; ``N`` divisible by it (by ``2P`` for the zig-zag layout).
        element_size: bytes per element.
        backward: forward + backward instead of forward only.

    Returns:
        Bytes sent per rank (every rank sends the same).

    Raises:
        TypeError, ValueError: an unknown method, sizes that are not positive ints or do not divide.

    Example:
        >>> formula_bytes("ring", 1, 4, 64, 16, 4), formula_bytes("ulysses", 1, 4, 64, 16, 4)
        (24576, 12288)
        >>> formula_bytes("ring", 1, 32, 64, 16, 4, kv_heads=8), formula_bytes("ulysses", 1, 32, 64, 16, 4, kv_heads=8)
        (49152, 61440)
    """
    where = "formula_bytes"
    if method not in METHODS:
        raise ValueError(f"{where}: method must be one of {list(METHODS)}, got {method!r}")
    if method == "ulysses":
        return ulysses_bytes(batch, heads, n, head_dim, world_size, element_size=element_size, backward=backward,
                             kv_heads=kv_heads)
    batch, heads, n, head_dim, world_size, element_size = (
        _validate.integer(where, name, value, minimum=1) for name, value in (
            ("batch", batch), ("heads", heads), ("n", n), ("head_dim", head_dim), ("world_size", world_size),
            ("element_size", element_size)))
    _validate.boolean(where, "backward", backward)
    if kv_heads is not None:
        kv_heads = _validate.integer(where, "kv_heads", kv_heads, minimum=1)
        if heads % kv_heads:
            raise ValueError(f"{where}: heads={heads} must be divisible by kv_heads={kv_heads}")
        heads = kv_heads                                                      # the ring sends K/V heads only
    check_divisible(where, n, world_size, LAYOUT[method])
    shard = batch * heads * (n // world_size) * head_dim                     # elements of one K (or V) shard
    kv_hops = 2 * (world_size - 1) * shard * element_size                     # K and V, P - 1 hops
    if not backward:
        return kv_hops
    grad_hops = 2 * world_size * shard * max(element_size, 4) if world_size > 1 else 0   # dK and dV sums, P hops
    return 2 * kv_hops + grad_hops


def check_methods(where: str, methods: object) -> list[str]:
    """``methods`` as a non-empty list of names from :data:`METHODS`."""
    methods = _validate.labels(where, "methods", methods)
    if not methods:
        raise ValueError(f"{where}: methods must not be empty")
    for index, method in enumerate(methods):
        if method not in METHODS:
            raise ValueError(f"{where}: methods[{index}] must be one of {list(METHODS)}, got {method!r}")
    return methods


def positive_ints(where: str, name: str, values: object) -> list[int]:
    """``values`` as a non-empty list of ints >= 1."""
    values = _validate.integer_sequence(where, name, values, minimum=1)
    if not values:
        raise ValueError(f"{where}: {name} must not be empty")
    return values


def check_shape(where: str, methods: list[str], world_size: int, n: int, heads: int,
                kv_heads: int | None = None) -> None:
    """Refuse, by name, a (P, N, H, H_kv) a method cannot run: N not divisible by P (2P zig-zag), H_kv
    not a divisor of H, H_kv (H without grouped-query attention) not divisible by P (Ulysses)."""
    if kv_heads is not None and heads % kv_heads:
        raise ValueError(f"{where}: H={heads} must be divisible by H_kv={kv_heads} (grouped-query attention)")
    for method in methods:
        check_divisible(where, n, world_size, LAYOUT[method])
        if method == "ulysses" and (heads if kv_heads is None else kv_heads) % world_size:
            what = f"H={heads}" if kv_heads is None else f"H_kv={kv_heads}"
            raise ValueError(f"{where}: {what} must be divisible by P={world_size} for ulysses (whole heads per "
                             f"rank)")
