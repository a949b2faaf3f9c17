"""Chapter 10's pictures: which K/V block each rank holds at each step of the ring, and which (query chunk, key
chunk) pairs a causal mask leaves each rank to compute, from :mod:`attn_course.distributed.schedule`."""

from __future__ import annotations

from attn_course.distributed.schedule import causal_pair_grid, ring_schedule

__all__ = ["plot_causal_pairs", "causal_pairs_legend", "plot_ring_schedule"]


def plot_ring_schedule(world_size: int, ax=None):
    """Draw :func:`~attn_course.distributed.schedule.ring_schedule` as a table: a row per step, a column per rank,
    the block held written in; return the matplotlib Axes."""
    import matplotlib.pyplot as plt

    schedule = ring_schedule(world_size)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.1 * world_size + 1, 0.8 * world_size + 0.8))
    ax.imshow(schedule.numpy(), cmap="tab10", vmin=0, vmax=9, alpha=0.45)
    for step in range(world_size):
        for rank in range(world_size):
            ax.text(rank, step, f"K,V {int(schedule[step, rank])}", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(world_size), [f"rank {r}" for r in range(world_size)])
    ax.set_yticks(range(world_size), [f"step {s}" for s in range(world_size)])
    ax.set_title("Which key/value block each rank holds")
    return ax


def plot_causal_pairs(world_size: int, layout: str, ax=None):
    """Draw :func:`~attn_course.distributed.schedule.causal_pair_grid`, each visible (query chunk, key chunk) pair
    coloured by the rank computing it, the half of a pair that causality masks (keys after the query) hatched;
    return the matplotlib Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Polygon

    grid = causal_pair_grid(world_size, layout)
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    colours = ["white"] + [plt.get_cmap("tab10")(r) for r in range(world_size)]
    ax.imshow((grid + 1).numpy(), cmap=ListedColormap(colours), vmin=0, vmax=world_size)
    chunks = grid.shape[0]
    # Contiguous and zigzag chunks hold consecutive tokens: only a diagonal pair is half masked. Striped chunks
    # interleave tokens, so every pair is.
    every = [(r, c) for r in range(chunks) for c in range(chunks)]
    cut = every if layout == "striped" else [(c, c) for c in range(chunks)]
    for row, col in cut:
        ax.add_patch(Polygon([(col - 0.5, row - 0.5), (col + 0.5, row - 0.5), (col + 0.5, row + 0.5)],
                             facecolor="white", edgecolor="0.45", hatch="///", lw=0))
    work = [int((grid == r).sum()) for r in range(world_size)]
    ax.set_title(f"{layout}: chunk pairs per rank {work}", fontsize=10)
    ax.set(xlabel="key chunk", ylabel="query chunk", xticks=range(chunks), yticks=range(chunks))
    return ax


def causal_pairs_legend(world_size: int) -> list:
    """The legend handles of :func:`plot_causal_pairs`: a colour per rank, the hatched half, the empty pair."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = [Patch(color=plt.get_cmap("tab10")(r), label=f"rank {r}") for r in range(world_size)]
    return ranks + [Patch(facecolor="white", edgecolor="0.45", hatch="///", label="half a pair,\nmasked by causality"),
                    Patch(facecolor="white", edgecolor="0.45", label="whole pair masked:\nnot computed")]
