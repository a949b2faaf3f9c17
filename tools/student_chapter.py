"""A chapter as a student may read it (``tools/site.py``): what ``otter assign`` hands out, with its outputs.

otter's raw cells and the test cells (public and hidden) go; solution code becomes what ``otter
assign`` gives the student (otter's own ``replace_solutions``), its outputs cleared, and a written
answer in a solution block goes; the saved ipywidgets state goes (the site has no widget manager, and
myst-nb would load one from a CDN), each widget output reduced to what a static page can show.
"""

from __future__ import annotations

import copy
import html
import re

import nbformat

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# Outputs a page can show without a widget manager; site/conf.py ranks them above the widget view.
STATIC_MIME_TYPES = ("text/html", "image/png", "image/svg+xml", "image/jpeg", "image/gif",
                     "text/markdown", "text/latex")
# tqdm's notebook bar: its text/plain is the bar as it was when first displayed ("  0%|  | 0/600").
PROGRESS_BAR = re.compile(r"\d+%\|.*\|\s*\d+/\d+")


def otter_block(cell: nbformat.NotebookNode) -> tuple[str, str] | None:
    """``("begin"|"end", "question"|"solution"|"tests"|"prompt")`` for one of otter's block
    boundary cells, ``("config", "")`` for its assignment config; ``None`` for any other cell, as
    ``otter assign`` itself decides (``otter.assign.blocks``)."""
    from otter.assign.blocks import BlockType, is_assignment_config_cell, is_block_boundary_cell

    if cell.cell_type == "code" or not cell.source.strip():
        return None                                 # otter reads a boundary from a first line
    if is_assignment_config_cell(cell):
        return ("config", "")
    for block in BlockType:
        for end in (False, True):
            if is_block_boundary_cell(cell, block, end=end):
                return ("end" if end else "begin", block.value)
    return None


def student_source(source: str) -> str:
    """Solution code as ``otter assign`` hands it to the student: each ``# BEGIN SOLUTION`` ...
    ``# END SOLUTION`` block becomes ``...`` and each ``x = ...  # SOLUTION`` line ``x = ...``."""
    from otter.assign.solutions import replace_solutions

    return "\n".join(replace_solutions(source.split("\n"), "python"))


def has_solution_marker(source: str) -> bool:
    """Whether code carries one of otter's solution markers."""
    return any(re.search(r"#\s*(BEGIN SOLUTION|END SOLUTION|SOLUTION)( NO PROMPT)?\s*$", line.rstrip())
               for line in source.splitlines())


def widget_note(output: nbformat.NotebookNode) -> nbformat.NotebookNode | None:
    """A widget output as a static page can show it: kept if it has a static fallback (site/conf.py
    ranks it first); else a note saying where the widget works, or ``None`` for a progress bar."""
    data = output.get("data", {})
    if WIDGET_VIEW not in data or any(mime in data for mime in STATIC_MIME_TYPES):
        return output
    text = data.get("text/plain", "")
    if PROGRESS_BAR.search(text):
        return None
    name = re.match(r"\s*([A-Za-z_]\w*)\(", text)
    what = f"the interactive {html.escape(name.group(1))}" if name else "an interactive widget"
    note = (f'<p class="site-widget-note">Here the chapter shows {what}. It needs a running '
            "notebook: open this chapter in JupyterLab (<code>make lab</code>) to use it.</p>")
    return nbformat.from_dict({"output_type": "display_data", "metadata": {}, "data": {"text/html": note}})


def student_notebook(notebook: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """A copy of a chapter (executed, with otter's cells) as a student may read it (the module's docstring).

    Args:
        notebook: the executed chapter, with otter's assignment cells.
        name: the chapter's name, for error messages.

    Raises:
        ValueError: when otter's blocks do not nest (a ``# BEGIN TESTS`` never ended, an end
            without a begin), or a solution marker sits outside a solution block, where
            ``otter assign`` would leave it, and the solution, in the student's notebook.
    """
    notebook = copy.deepcopy(notebook)
    notebook.metadata.pop("widgets", None)
    open_blocks: list[str] = []
    cells = []
    for index, cell in enumerate(notebook.cells):
        where = f"{name}, cell {index}"
        boundary = otter_block(cell)
        if boundary is not None:
            kind, block = boundary
            if kind == "begin":
                open_blocks.append(block)
            elif kind == "end":
                if not open_blocks:
                    raise ValueError(f"{where}: '# END {block.upper()}' without its '# BEGIN {block.upper()}'")
                if open_blocks[-1] != block:
                    raise ValueError(f"{where}: '# END {block.upper()}' while '# BEGIN {open_blocks[-1].upper()}' "
                                    "is still open")
                open_blocks.pop()
            continue
        if "tests" in open_blocks:
            continue
        if "solution" in open_blocks and "prompt" not in open_blocks:
            if cell.cell_type == "markdown" and "otter_include" not in cell.metadata.get("tags", []):
                continue                            # a written answer: otter removes it too
            if cell.cell_type == "code":
                cell.source = student_source(cell.source)
                cell.outputs = []
                cell.execution_count = None
        if cell.cell_type == "code":
            if has_solution_marker(cell.source):
                raise ValueError(f"{where}: a solution marker outside a solution block; otter would "
                                "show it, and the solution, to students")
            cell.outputs = [kept for kept in map(widget_note, cell.outputs) if kept is not None]
        cells.append(cell)
    if open_blocks:
        raise ValueError(f"{name}: '# BEGIN {open_blocks[-1].upper()}' never ended")
    notebook.cells = cells
    return notebook
