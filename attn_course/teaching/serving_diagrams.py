"""Chapter 14's picture of the paged KV cache over time: which request holds which block at every step of the
engine (:class:`~attn_course.serving.engine.StepRecord`). Colours are Okabe-Ito's, one per request; a block that
two requests share (a cached prefix) is hatched.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from attn_course import _validate
from attn_course.serving.engine import StepRecord
from attn_course.teaching.plots import OKABE_ITO

__all__ = ["block_tables_over_time"]


def block_tables_over_time(records: Sequence[StepRecord], num_blocks: int) -> Figure:
    """Draw the pool's blocks (down) at every step (across), each coloured by the request holding it and marked
    with its place in that request's block table; a column's label says what the step ran (``P``: a prompt
    chunk, ``D``: a decode) and a preemption is marked with a red line before the step.

    Args:
        records: the engine's ``step_records`` (``Engine(..., record_steps=True)``).
        num_blocks: the pool's size.

    Returns:
        A ``Figure`` with one ``Axes``.

    Raises:
        TypeError, ValueError: ``records`` not a non-empty sequence of :class:`StepRecord`, ``num_blocks`` not
            an int ``>= 1`` or smaller than a block id recorded.

    Example:
        >>> record = StepRecord(1, {0: 5}, [], {0: [2, 0]}, [1], 0)
        >>> figure = block_tables_over_time([record], 4)
        >>> [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
        ['request 0']
        >>> plt.close(figure)
    """
    where = "block_tables_over_time"
    records = _validate.sequence(where, "records", records, of="StepRecords")
    if not records:
        raise ValueError(f"{where}: records must not be empty (run the engine with record_steps=True)")
    for record in records:
        _validate.instance(where, "records[...]", record, StepRecord)
    num_blocks = _validate.integer(where, "num_blocks", num_blocks, minimum=1)
    highest = max((block for record in records for table in record.block_tables.values() for block in table),
                  default=-1)
    if highest >= num_blocks:
        raise ValueError(f"{where}: a record holds block {highest}, but num_blocks is {num_blocks}")
    requests = sorted({request for record in records for request in record.block_tables})
    colour = {request: OKABE_ITO[index % len(OKABE_ITO)] for index, request in enumerate(requests)}
    figure, axis = plt.subplots(figsize=(1.5 + 0.42 * len(records), 1.0 + 0.3 * num_blocks), layout="constrained")
    for column, record in enumerate(records):
        holders: dict[int, list[tuple[int, int]]] = {}
        for request, table in record.block_tables.items():
            for place, block in enumerate(table):
                holders.setdefault(block, []).append((request, place))
        for block, held in holders.items():
            request, place = held[0]
            axis.add_patch(Rectangle((column, block), 1, 1, facecolor=colour[request], edgecolor="white",
                                     hatch="///" if len(held) > 1 else None))
            axis.text(column + 0.5, block + 0.5, str(place), ha="center", va="center", fontsize=7, color="white")
        if column and record.preemptions > records[column - 1].preemptions:
            axis.axvline(column, color="#D55E00", linewidth=2.5)
    labels = [("P" if record.prefills else "") + ("D" if record.decodes else "") for record in records]
    axis.set(xlim=(0, len(records)), ylim=(num_blocks, 0), xlabel="step (P: prompt chunks, D: decodes)",
             ylabel="block of the pool", xticks=[column + 0.5 for column in range(len(records))],
             yticks=[block + 0.5 for block in range(num_blocks)])
    axis.set_xticklabels([f"{record.step}\n{label}" for record, label in zip(records, labels)], fontsize=7)
    axis.set_yticklabels(range(num_blocks), fontsize=7)
    axis.legend(handles=[Patch(color=colour[request], label=f"request {request}") for request in requests],
                loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return figure
