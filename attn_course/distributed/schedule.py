"""Ring attention's schedule, and what ring attention and Ulysses cost, predicted from their steps without
running them: the block each rank holds at each step (:func:`ring_schedule`), the rank that computes each
(query chunk, key chunk) pair under a causal mask (:func:`causal_pair_grid`; their counts per rank are
:func:`~attn_course.distributed.ring_work.ring_work`), the bytes one rank sends (:func:`formula_bytes`) and the
causal ring's critical path (:func:`critical_path_formula`). :mod:`attn_course.measure.distributed` counts the
same from outside and compares; chapter 10 draws the first two (:mod:`attn_course.teaching.distributed_diagrams`).
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.distributed.layout import check_divisible, check_layout, chunk_count
from attn_course.distributed.ulysses import ulysses_bytes

__all__ = ["LAYOUT", "METHODS", "causal_pair_grid", "critical_path_formula", "formula_bytes", "ring_schedule"]

# The methods compared, and each one's layout: Ulysses needs the contiguous layout; ring runs with all three.
METHODS = ("ulysses", "ring", "ring zigzag", "ring striped")
LAYOUT = {"ulysses": "contiguous", "ring": "contiguous", "ring zigzag": "zigzag", "ring striped": "striped"}


def ring_schedule(world_size: int) -> torch.Tensor:
    """``[P steps, P ranks]``: the K/V block rank ``r`` holds at step ``s``, ``(r - s) mod P``.

    At step 0 every rank holds its own block; after each step it has passed its block to rank ``r + 1`` and
    received rank ``r - 1``'s, so after ``P`` steps every query block has met every key block.

    Example:
        >>> ring_schedule(3).tolist()
        [[0, 1, 2], [2, 0, 1], [1, 2, 0]]
    """
    world_size = _validate.integer("ring_schedule", "world_size", world_size, minimum=1)
    steps, ranks = torch.meshgrid(torch.arange(world_size), torch.arange(world_size), indexing="ij")
    return (ranks - steps) % world_size


def causal_pair_grid(world_size: int, layout: str) -> torch.Tensor:
    """``[C, C]`` over (query chunk, key chunk), ``C = chunk_count(P, layout)``: the rank that computes each pair
    under a causal mask, or -1 where the mask hides the whole pair (key chunk after the query chunk).

    Rank ``r`` holds the query chunks of its layout (``r``; ``r`` and ``2P - 1 - r`` zig-zag; striped, chunk
    ``r`` is the stripe of tokens ``r, r + P, ...``) and computes every visible pair in their rows; its cells
    count its work in chunk pairs (a half-masked diagonal pair counts as one). Stripes interleave, so no pair is
    hidden whole: every cell is a half-masked diagonal pair (for ``N / P >= 2`` tokens per rank).

    Example:
        >>> causal_pair_grid(2, "contiguous").tolist()
        [[0, -1], [1, 1]]
        >>> causal_pair_grid(2, "striped").tolist()
        [[0, 0], [1, 1]]
    """
    where = "causal_pair_grid"
    world_size = _validate.integer(where, "world_size", world_size, minimum=1)
    chunks = chunk_count(world_size, check_layout(where, layout))
    index = torch.arange(chunks)
    owner = torch.minimum(index, 2 * world_size - 1 - index) if layout == "zigzag" else index   # [C]: its rank
    grid = owner[:, None].expand(chunks, chunks).clone()                         # row = query chunk
    if layout != "striped":                                  # stripes interleave: none lies wholly after another
        grid[torch.triu(torch.ones(chunks, chunks, dtype=torch.bool), diagonal=1)] = -1
    return grid


def formula_bytes(method: str, batch: int, heads: int, n: int, head_dim: int, world_size: int, *,
                  element_size: int = 4, backward: bool = False, kv_heads: int | None = None) -> int:
    """Bytes one rank sends for one attention layer, from the algorithm.

    A query shard has ``S_q = B·H·(N/P)·d`` elements, a K (or V) shard ``S = B·H_kv·(N/P)·d``
    (``H_kv = H`` without grouped-query attention).

    - Ulysses: ``(P - 1)/P · (2 S_q + 2 S)`` forward (q and out at ``H`` heads, k and v at ``H_kv``), twice
      that forward + backward (:func:`~attn_course.distributed.ulysses.ulysses_bytes`);
    - ring (any layout): ``2 (P - 1) · S`` forward (K and V passed ``P - 1`` times); the backward passes K and
      V ``P - 1`` times again and dK, dV ``P`` times (home at the end): ``(4P - 2) · S`` more, ``(6P - 4) · S``
      in all. The dK/dV sums travel in float32 when the inputs are half precision
      (:func:`~attn_course.distributed.ring.accumulation_dtype`): their ``2P · S`` elements count
      ``max(element_size, 4)`` bytes each. Nothing at ``P = 1``.

    Args:
        method: one of :data:`METHODS`.
        batch, heads, n, head_dim: ``B``, ``H``, the full ``N``, ``d`` (``d_v = d``).
        world_size: ``P``; ``N`` divisible by it (by ``2P`` for the zig-zag layout).
        element_size: bytes per element.
        backward: forward + backward instead of forward only.
        kv_heads: ``H_kv``, the K/V heads (a divisor of ``H``); None for ``H``.

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
    batch, heads, n, head_dim, world_size, element_size = _validate.integers(
        where, minimum=1, batch=batch, heads=heads, n=n, head_dim=head_dim, world_size=world_size,
        element_size=element_size)
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


def critical_path_formula(n: int, world_size: int, layout: str) -> int:
    """The critical path of a causal ring-attention forward, in score elements per (batch, head).

    A synchronous ring moves at the pace of each step's slowest rank: the path is the sum over the ``P`` steps
    of the most scores any rank computes, a diagonal tile counted whole (it is computed whole, then masked).
    Contiguous, ``N²/P`` (at step ``s`` the ranks ``r >= s`` compute a full block); zig-zag, ``(2P + 1) ·
    (N/2P)²`` (three tiles at step 0, two after): ``4P / (2P + 1)`` times shorter, 16/9 ≈ 1.78 at ``P = 4``, not
    the 4 of the slowest rank's pairs over the fastest's; striped, ``N²/P`` as contiguous (each step one masked
    tile, computed whole).

    Args:
        n, world_size, layout: ``N`` (divisible by ``P``, by ``2P`` for zig-zag), ``P`` and the layout.

    Returns:
        The critical path's score elements.

    Raises:
        TypeError, ValueError: sizes that are not ints ``>= 1`` or do not divide, an unknown layout.

    Example:
        >>> [critical_path_formula(48, 4, layout) for layout in ("contiguous", "zigzag", "striped")]
        [576, 324, 576]
    """
    where = "critical_path_formula"
    n, world_size = _validate.integers(where, minimum=1, n=n, world_size=world_size)
    check_divisible(where, n, world_size, check_layout(where, layout))
    if layout == "zigzag":
        return (2 * world_size + 1) * (n // (2 * world_size)) ** 2         # 3 tiles at step 0, then 2 a step
    return world_size * (n // world_size) ** 2                               # one (N/P)² tile a step
