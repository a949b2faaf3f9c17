"""The pictures of chapter 10, computed: which K/V block each rank holds at each step of the ring, and
which (query chunk, key chunk) pairs a causal mask leaves to compute in each layout.

Only arithmetic and matplotlib: nothing here starts a process.
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.distributed.layout import check_layout, chunk_count

__all__ = ["ring_schedule", "causal_pair_grid", "plot_ring_schedule", "plot_causal_pairs"]


def ring_schedule(world_size: int) -> torch.Tensor:
    """``[P steps, P ranks]``: the K/V block rank ``r`` holds at step ``s``, ``(r - s) mod P``.

    At step 0 every rank holds its own block; after each step it has passed its block to rank
    ``r + 1`` and received rank ``r - 1``'s, so after ``P`` steps every query block has met every key block.

    Example:
        >>> ring_schedule(3).tolist()
        [[0, 1, 2], [2, 0, 1], [1, 2, 0]]
    """
    world_size = _validate.integer("ring_schedule", "world_size", world_size, minimum=1)
    steps, ranks = torch.meshgrid(torch.arange(world_size), torch.arange(world_size), indexing="ij")
    return (ranks - steps) % world_size


def causal_pair_grid(world_size: int, layout: str) -> torch.Tensor:
    """``[C, C]`` integer grid over (query chunk, key chunk), ``C`` chunks as
    :func:`~attn_course.distributed.layout.chunk_count` says: the rank that computes each pair, or -1
    where the causal mask hides the whole pair (key chunk after the query chunk), so nobody computes it.

    Rank ``r`` holds the query chunks of its layout (``r``; or ``r`` and ``2P - 1 - r`` for ``"zigzag"``;
    for ``"striped"`` chunk ``r`` is the stripe of tokens ``r, r + P, ...``) and computes every visible
    pair in their rows. Counting a rank's cells gives its work in chunk pairs (diagonal pairs are half
    masked and count as one). Striped chunks interleave, so no pair is hidden whole: every cell is a
    half-masked diagonal pair (for ``N / P >= 2`` tokens per rank).

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


def plot_ring_schedule(world_size: int, ax=None):
    """Draw :func:`ring_schedule` as a table: one row per step, one column per rank, the block held written in.

    Returns:
        The matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    schedule = ring_schedule(world_size)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.1 * world_size + 1, 0.8 * world_size + 0.8))
    ax.imshow(schedule, cmap="tab10", vmin=0, vmax=9, alpha=0.45)
    for step in range(world_size):
        for rank in range(world_size):
            ax.text(rank, step, f"K,V {int(schedule[step, rank])}", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(world_size), [f"rank {r}" for r in range(world_size)])
    ax.set_yticks(range(world_size), [f"step {s}" for s in range(world_size)])
    ax.set_title("Which key/value block each rank holds")
    return ax


def plot_causal_pairs(world_size: int, layout: str, ax=None):
    """Draw :func:`causal_pair_grid`: each visible (query chunk, key chunk) pair coloured by the rank computing it.

    Returns:
        The matplotlib Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    grid = causal_pair_grid(world_size, layout)
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    colours = ["white"] + [plt.get_cmap("tab10")(r) for r in range(world_size)]
    ax.imshow(grid + 1, cmap=ListedColormap(colours), vmin=0, vmax=world_size)
    work = [int((grid == r).sum()) for r in range(world_size)]
    ax.set_title(f"{layout}: chunk pairs per rank {work}", fontsize=10)
    ax.set_xlabel("key chunk")
    ax.set_ylabel("query chunk")
    return ax
