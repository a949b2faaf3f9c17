"""Which tokens of a sequence each rank holds: the contiguous, zig-zag and striped layouts.

A sequence of ``N`` tokens is split over ``P`` ranks along its sequence dimension:

- ``"contiguous"``: rank ``r`` holds tokens ``r · N/P .. (r+1) · N/P - 1``. Simple, but under a
  causal mask the last rank's queries see every key and the first rank's see only their own
  block: rank ``P - 1`` does ``2P - 1`` times the work of rank 0.
- ``"zigzag"``: cut the sequence into ``2P`` chunks of ``N / 2P`` and give rank ``r`` chunks
  ``r`` and ``2P - 1 - r`` (an early chunk and a late one), so every rank's causal work is the
  same.
- ``"striped"`` (Brandon et al. 2023, "Striped Attention", arXiv 2311.09431): token ``i`` lives
  on rank ``i mod P``, so rank ``r`` holds tokens ``r, r + P, r + 2P, ...``. Every rank's
  tokens are spread over the whole sequence, so under a causal mask each (query block, key
  block) pair is about half visible, on every rank and at every step.

:func:`shard` cuts a full tensor into this rank's part, :func:`unshard` puts all ranks' parts back
in order, and :func:`token_positions` says which positions of the full sequence a rank's tokens
are, which is what a causal mask needs.
"""

from __future__ import annotations

import torch

from attn_course import _validate

__all__ = ["LAYOUTS", "shard", "unshard", "token_positions", "chunk_count", "check_divisible", "check_layout",
           "check_shards"]

LAYOUTS = ("contiguous", "zigzag", "striped")


def check_layout(where: str, layout: object, name: str = "layout") -> str:
    """``layout`` if it is one of :data:`LAYOUTS`, else the ValueError naming ``where`` and the argument."""
    if layout not in LAYOUTS:
        raise ValueError(f"{where}: {name} must be one of {LAYOUTS}, got {layout!r}")
    return layout


def check_shards(where: str, q: object, k: object, v: object) -> None:
    """Refuse, naming ``where``, shards that are not q ``[B, H, N_local, d]``, k ``[B, H_kv, N_local, d]`` and
    v ``[B, H_kv, N_local, d_v]``, floating, of one dtype and device, at least one token, ``H_kv`` dividing ``H``
    (grouped-query attention)."""
    _validate.four_d(where, layout="[B, H, N_local, d]", q=q, k=k, v=v)
    if (q.shape[0], q.shape[2], q.shape[3]) != (k.shape[0], k.shape[2], k.shape[3]) or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"{where}: q must be [B, H, N_local, d], k [B, H_kv, N_local, d] and v [B, H_kv, N_local, "
                         f"d_v], cut from the sequence the same way, got q {_validate.shape_str(q)}, "
                         f"k {_validate.shape_str(k)}, v {_validate.shape_str(v)}")
    if q.shape[2] == 0:
        raise ValueError(f"{where}: q, k and v need at least one token on every rank, got N_local=0")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{where}: grouped-query attention needs H divisible by H_kv, got q with H={q.shape[1]} "
                         f"heads and k, v with H_kv={k.shape[1]}")


def _check(where: str, world_size: object, layout: object, rank: object = None) -> tuple[int, str, int | None]:
    world_size = _validate.integer(where, "world_size", world_size, minimum=1)
    check_layout(where, layout)
    if rank is not None:
        rank = _validate.integer(where, "rank", rank, minimum=0)
        if rank >= world_size:
            raise ValueError(f"{where}: rank must be below world_size={world_size}, got {rank}")
    return world_size, layout, rank


def chunk_count(world_size: int, layout: str) -> int:
    """How many equal chunks the sequence is cut into, each held whole by one rank; ``N`` must be
    divisible by it: ``P`` (contiguous), ``2P`` (zig-zag) or ``P`` (striped, where rank ``r``'s
    chunk is the stripe of every ``P``-th token from ``r``, not a run of neighbours).

    Args:
        world_size: ``P >= 1``.
        layout: one of :data:`LAYOUTS`.

    Returns:
        The number of chunks; each rank holds ``chunk_count / P`` of them.

    Raises:
        TypeError, ValueError: ``world_size`` not an int ``>= 1``, an unknown layout.

    Example:
        >>> chunk_count(4, "contiguous"), chunk_count(4, "zigzag"), chunk_count(4, "striped")
        (4, 8, 4)
    """
    world_size, layout, _ = _check("chunk_count", world_size, layout)
    return 2 * world_size if layout == "zigzag" else world_size


def check_divisible(where: str, n: int, world_size: int, layout: str) -> int:
    """The tokens per chunk, ``N / chunk_count``, or the ValueError naming ``where`` when ``N`` does not divide."""
    chunks = chunk_count(world_size, layout)
    if n % chunks:
        parts = {"contiguous": "P equal chunks", "zigzag": "2P equal chunks", "striped": "P equal stripes"}[layout]
        raise ValueError(f"{where}: the sequence length N={n} must be divisible by {chunks} for the {layout} layout "
                         f"over {world_size} ranks ({parts}); pad the sequence or choose another P")
    return n // chunks


def _chunks_of(rank: int, world_size: int, layout: str) -> tuple[int, ...]:
    return (rank, 2 * world_size - 1 - rank) if layout == "zigzag" else (rank,)


def token_positions(rank: int, world_size: int, n: int, layout: str = "contiguous") -> torch.Tensor:
    """The positions in the full sequence of the ``N / P`` tokens rank ``rank`` holds, in its order.

    Args:
        rank, world_size: this rank and ``P``.
        n: ``N``, the full sequence length (divisible by ``P``, or ``2P`` for the zig-zag layout).
        layout: ``"contiguous"``, ``"zigzag"`` or ``"striped"``.

    Returns:
        ``[N / P]`` int64 positions, increasing.

    Raises:
        TypeError, ValueError: non-int sizes, a rank outside ``0 .. P - 1``, an unknown layout or an
            ``N`` that does not divide.

    Example:
        >>> token_positions(0, 2, 8, "zigzag").tolist(), token_positions(1, 2, 8, "zigzag").tolist()
        ([0, 1, 6, 7], [2, 3, 4, 5])
        >>> token_positions(1, 4, 8, "striped").tolist()
        [1, 5]
    """
    where = "token_positions"
    world_size, layout, rank = _check(where, world_size, layout, rank)
    n = _validate.integer(where, "n", n, minimum=1)
    length = check_divisible(where, n, world_size, layout)                    # refuses an N that does not divide
    if layout == "striped":
        return torch.arange(rank, n, world_size)                              # i with i mod P = rank
    return torch.cat([torch.arange(c * length, (c + 1) * length) for c in _chunks_of(rank, world_size, layout)])


def shard(x: torch.Tensor, rank: int, world_size: int, layout: str = "contiguous", *, dim: int = -2) -> torch.Tensor:
    """This rank's part of a full tensor, cut along the sequence dimension ``dim``.

    Args:
        x: the full tensor, e.g. ``[B, H, N, d]`` (``dim=-2``, the default).
        rank, world_size: this rank and ``P``.
        layout: ``"contiguous"``, ``"zigzag"`` or ``"striped"``.
        dim: the sequence dimension.

    Returns:
        ``[..., N / P, ...]``: the tokens :func:`token_positions` names, in that order (a copy).

    Raises:
        TypeError, ValueError: as :func:`token_positions`, or ``x`` not a tensor.

    Example:
        >>> shard(torch.arange(8), 1, 2, "zigzag", dim=0).tolist()
        [2, 3, 4, 5]
        >>> shard(torch.arange(8), 1, 2, "striped", dim=0).tolist()
        [1, 3, 5, 7]
    """
    where = "shard"
    x = _validate.tensor(where, "x", x)
    if x.dim() == 0:
        raise ValueError(f"{where}: x must have a sequence dimension, got a 0-d tensor")
    positions = token_positions(rank, world_size, x.shape[dim], layout)
    return x.index_select(dim, positions.to(x.device))


def unshard(shards: list[torch.Tensor], layout: str = "contiguous", *, dim: int = -2) -> torch.Tensor:
    """Put every rank's part back into the full tensor: the inverse of :func:`shard`.

    Args:
        shards: ``[part of rank 0, ..., part of rank P - 1]``, each ``[..., N / P, ...]``.
        layout: the layout they were cut with (one of :data:`LAYOUTS`).
        dim: the sequence dimension.

    Returns:
        ``[..., N, ...]`` with every token back at its position.

    Raises:
        TypeError, ValueError: not a non-empty list of tensors of one shape, an unknown layout.

    Example:
        >>> parts = [shard(torch.arange(8), r, 2, "zigzag", dim=0) for r in range(2)]
        >>> unshard(parts, "zigzag", dim=0).tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
    """
    where = "unshard"
    if not isinstance(shards, (list, tuple)) or not shards or not all(isinstance(s, torch.Tensor) for s in shards):
        raise TypeError(f"{where}: shards must be a non-empty list of tensors, one per rank, "
                        f"got {type(shards).__name__}")
    if len({tuple(s.shape) for s in shards}) != 1:
        raise ValueError(f"{where}: every shard must have one shape, got {[tuple(s.shape) for s in shards]}")
    world_size, layout, _ = _check(where, len(shards), layout)
    local = shards[0].shape[dim]
    n = local * world_size
    joined = torch.cat(list(shards), dim=dim)                                  # in rank order
    positions = torch.cat([token_positions(r, world_size, n, layout) for r in range(world_size)])
    order = torch.argsort(positions)                                           # where each position sits in `joined`
    return joined.index_select(dim, order.to(joined.device))
