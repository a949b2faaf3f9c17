"""The chapters where Triton is not installed (macOS, Windows): chapter 07 runs top to bottom and says
what that changes, and no other chapter imports anything that reaches Triton.

Chapter 07 runs in a Jupyter kernel whose ``import triton`` fails (:mod:`support.without_triton`),
without its hidden tests (the grader's, which need Triton: the grader refuses to grade the chapter
where Triton is missing). The other chapters are not run twice (``make test`` runs each once, with
Triton): their imports are, all together, in a process without Triton, where nothing but torch's own
probe may even ask for it.
"""

from __future__ import annotations

import ast
import json

import nbformat
from nbclient import NotebookClient

from helpers import ROOT
from support.exercises import chapter_imports
from support.without_triton import environment_without_triton, run_without_triton

CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
KERNEL_CHAPTER = ROOT / "notebooks" / "07_flash_triton.ipynb"


def text_of(cell: nbformat.NotebookNode) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", "") or output.get("data", {}).get("text/plain", "") or output.get("evalue", ""))
    return "".join(parts)


def test_chapter_07_runs_top_to_bottom_without_triton_and_says_what_that_changes(tmp_path):
    committed = nbformat.read(KERNEL_CHAPTER, as_version=4)
    notebook = nbformat.read(KERNEL_CHAPTER, as_version=4)
    notebook.cells = [cell for cell in notebook.cells if not cell.source.startswith("# HIDDEN")]
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    client.execute(env=environment_without_triton(tmp_path))      # raises CellExecutionError on any error
    cells = {cell.source: text_of(cell) for cell in notebook.cells if cell.cell_type == "code"}
    everything = "\n".join(cells.values())
    # One sentence at the top says what changes; the first kernel call says what runs instead.
    assert "Triton is not installed here (it ships for Linux only), so this chapter reads its kernels" in everything
    assert "so the kernels' algorithm runs in PyTorch instead: chapter 06's tiled_attention" in everything
    # The kernels' listings are read from their files: the same text as with Triton.
    listings = [cell for cell in committed.cells if cell.cell_type == "code" and "show_source(" in cell.source]
    assert len(listings) == 6
    for cell in listings:
        assert cells[cell.source] == text_of(cell)
    # The Triton exercises' checks skip with their sentence, and the classmate's kernel is not run.
    for check in ("check_rescale_kernel", "check_window_kernel"):
        assert f"{check}: this exercise is a Triton kernel, and Triton is not installed here" in everything
    assert "so the classmate's kernel cannot run" in everything


def test_no_other_chapter_imports_anything_that_reaches_triton(tmp_path):
    imports = sorted({statement for chapter in CHAPTERS if chapter != KERNEL_CHAPTER
                      for statement in map(ast.unparse, chapter_imports(chapter))})
    assert len(imports) > 50
    out = run_without_triton(f"""
        import sys
        import sitecustomize

        for statement in {json.dumps(imports)}:
            exec(statement, {{}})
        # torch asks whether Triton is there (torch.utils._triton), and takes no for an answer.
        asked = [who for _, who in sitecustomize.REFUSED if who != "torch.utils._triton"]
        assert asked == [] and "triton" not in sys.modules, asked
        print("imported", len({json.dumps(imports)}))
    """, tmp_path)
    assert f"imported {len(imports)}" in out
