"""Build the course as a static website (``make site``) from the committed, executed chapters.

    .venv/bin/python tools/site.py                  # -> build/site/ (open build/site/index.html)
    .venv/bin/python tools/site.py --out /tmp/site  # anywhere else
    python -m http.server -d build/site             # preview at http://127.0.0.1:8000

Nothing is executed: the pages show the outputs saved in ``notebooks/``. The site is what a
student may read, so the chapters are not published as they are. Each is first copied, as a
student sees it, into a source folder (``build/site-work/src`` by default):

- otter's raw cells (``# ASSIGNMENT CONFIG``, ``# BEGIN QUESTION`` ... ``# END QUESTION``) go,
  and so do the test cells between ``# BEGIN TESTS`` and ``# END TESTS``, public and hidden;
- solution code becomes what ``otter assign`` gives the student (otter's own
  ``replace_solutions``, so the site and ``make assignments`` agree), its outputs cleared;
  Markdown inside a solution block (a written answer) goes, as otter removes it;
- the notebook's saved ipywidgets state goes: the site has no widget manager, and myst-nb
  would otherwise load one from a CDN. A widget output keeps its static fallback
  (``text/html``, an image), which ``site/conf.py`` ranks above the widget view; one with no
  fallback but its ``text/plain`` repr becomes a short note (a progress bar is dropped).

Beside the chapters the source folder gets a front page, made from README.md's title, intro
and chapter map ("## Chapters"), and one page per package module that a chapter links to
(``../attn_course/core/attention.py``) or shows with ``show_source``, the file's code highlighted.
Every relative link is checked on the way: one that would not resolve on the site stops the
build with the chapter and the link named. Sphinx (myst-nb, ``site/conf.py``) then renders the
folder; the HTML is copied to ``--out``, replacing a site built there before.
"""

from __future__ import annotations

import argparse
import copy
import html
import os
import pathlib
import posixpath
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "notebooks"
PACKAGE = "attn_course"
CONF_DIR = ROOT / "site"
DEFAULT_OUT = ROOT / "build" / "site"

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# Outputs a page can show without a widget manager; site/conf.py ranks them above the widget view.
STATIC_MIME_TYPES = ("text/html", "image/png", "image/svg+xml", "image/jpeg", "image/gif",
                     "text/markdown", "text/latex")
# tqdm's notebook bar: its text/plain is the bar as it was when first displayed ("  0%|  | 0/600").
PROGRESS_BAR = re.compile(r"\d+%\|.*\|\s*\d+/\d+")
# A Markdown link or image target: [text](target) or [text](target "title").
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
HTML_LINK = re.compile(r"""((?:href|src)=["'])([^"']+)(["'])""")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


class SiteError(Exception):
    """The site cannot be built as asked; the message says why (``main`` prints it, exit 1)."""


# --- the student's view of a chapter --------------------------------------------------------


def otter_block(cell: nbformat.NotebookNode) -> tuple[str, str] | None:
    """``("begin"|"end", "question"|"solution"|"tests"|"prompt")`` for one of otter's block
    boundary cells, ``("config", "")`` for its assignment config; ``None`` for any other cell.

    Otter's own functions decide (``otter.assign.blocks``): the same raw cells, fenced ```otter
    Markdown cells included, that ``otter assign`` acts on.
    """
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
    """A widget output as a static page can show it.

    An output with a static fallback (``text/html``, an image, ...) is kept as it is: site/conf.py
    ranks the fallback first. One with only the widget view and its ``text/plain`` repr
    (``QueryExplorer(query='bank', ...)``) becomes a note saying where the widget works; a
    progress bar, whose repr is the bar at 0%, is dropped (``None``).
    """
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
    """A copy of a chapter as the site shows it to a student (see the module docstring).

    Args:
        notebook: the executed chapter, with otter's assignment cells.
        name: the chapter's name, for error messages.

    Returns:
        A new notebook: no otter cells, no test cells, solutions replaced by ``...`` (their
        outputs cleared), no saved widget state, widget outputs reduced to what a page can show.

    Raises:
        SiteError: when otter's blocks do not nest (a ``# BEGIN TESTS`` never ended, an end
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
                    raise SiteError(f"{where}: '# END {block.upper()}' without its '# BEGIN {block.upper()}'")
                if open_blocks[-1] != block:
                    raise SiteError(f"{where}: '# END {block.upper()}' while '# BEGIN {open_blocks[-1].upper()}' "
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
                raise SiteError(f"{where}: a solution marker outside a solution block; otter would "
                                "show it, and the solution, to students")
            cell.outputs = [kept for kept in map(widget_note, cell.outputs) if kept is not None]
        cells.append(cell)
    if open_blocks:
        raise SiteError(f"{name}: '# BEGIN {open_blocks[-1].upper()}' never ended")
    notebook.cells = cells
    return notebook


# --- links, and the pages they need ---------------------------------------------------------


@dataclass
class Pages:
    """What the site's pages link to, gathered while the chapters are copied.

    ``modules`` maps each package file that gets a page (``attn_course/core/attention.py``) to the
    chapters (``notebooks/02_formula.ipynb``) that link to it or show its code.
    ``files`` are other files (an image beside a chapter) copied into the site as they are.
    """

    chapters: set[str]
    modules: dict[str, set[str]] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)

    def module_page(self, module: str, shown_in: str) -> str:
        """Record that ``shown_in`` needs the page of ``module``; return that page's path."""
        self.modules.setdefault(module, set()).add(shown_in)
        return module + ".md"


def site_target(target: str, document: str, pages: Pages) -> str:
    """Where a relative link of ``document`` (a path from the repository root) points on the site.

    Links to a chapter stay as they are (myst-nb resolves them to its page), links to a package
    file are turned to its source page (``attention.py`` -> ``attention.py.md``), a file beside
    the chapters is copied. Anything else in the checkout has no page: that is an error, so that
    the site never holds a link that 404s.

    Raises:
        SiteError: for a link to a file the site has no page for, or to a path outside the checkout.
    """
    if not target or target.startswith("#") or SCHEME.match(target) or target.startswith("//"):
        return target                               # an anchor on the same page, or another site
    path, hash_, anchor = target.partition("#")
    here = posixpath.dirname(document)
    resolved = posixpath.normpath(posixpath.join(here, path))
    on_disk = ROOT / resolved
    if resolved.startswith("..") or not on_disk.exists():
        raise SiteError(f"{document} links to {target!r}, which is not a file of this checkout")
    if resolved in pages.chapters:
        return target
    if resolved.startswith(PACKAGE + "/") and resolved.endswith(".py") and on_disk.is_file():
        page = pages.module_page(resolved, document)
        return posixpath.relpath(page, here or ".") + (hash_ + anchor if anchor else "")
    if resolved.startswith(CHAPTERS.name + "/") and on_disk.is_file() and not resolved.endswith(".ipynb"):
        pages.files.add(resolved)
        return target
    raise SiteError(f"{document} links to {target!r} ({resolved}), which has no page on the site: link a "
                    f"chapter, a file of {PACKAGE}/ or a file beside the chapters, or a web address")


def rewrite_links(text: str, document: str, pages: Pages) -> str:
    """``text`` (Markdown, HTML inside it included) with every relative link pointed at the site
    (:func:`site_target`). Code spans and fenced code are left alone: a link there is an example."""
    def rewrite(chunk: str) -> str:
        chunk = LINK.sub(lambda m: m.group(1) + site_target(m.group(2), document, pages) + m.group(3), chunk)
        return HTML_LINK.sub(lambda m: m.group(1) + site_target(m.group(2), document, pages) + m.group(3), chunk)

    # Odd pieces are code: fenced blocks first, then inline code spans.
    pieces = re.split(r"(^```.*?^```|`[^`\n]*`)", text, flags=re.MULTILINE | re.DOTALL)
    return "".join(piece if i % 2 else rewrite(piece) for i, piece in enumerate(pieces))


def module_file(dotted: str) -> str | None:
    """The package file that defines ``dotted`` (``attn_course.positions.rope.RotaryEmbedding.forward`` ->
    ``attn_course/positions/rope.py``), the longest module prefix that is a file; ``None`` outside the package."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return None
    for end in range(len(parts), 0, -1):
        base = "/".join(parts[:end])
        for candidate in (base + ".py", base + "/__init__.py"):
            if (ROOT / candidate).is_file():
                return candidate
    return None


def shown_modules(notebook: nbformat.NotebookNode) -> set[str]:
    """Package files whose code the chapter shows with ``show_source`` (its Markdown output starts
    with the object's dotted name in backticks, see attn_course/teaching/source.py)."""
    files = set()
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            shown = re.match(r"`([\w.]+)`\n", output.get("data", {}).get("text/markdown", ""))
            if shown and (found := module_file(shown.group(1))):
                files.add(found)
    return files


# --- the pages beside the chapters ----------------------------------------------------------


def readme_sections(readme: str) -> tuple[str, str, str]:
    """README.md's title, its intro (everything before the first ``##``) and its "## Chapters"
    section (the chapter map), each as Markdown.

    Raises:
        SiteError: when README.md has no ``# `` title or no "## Chapters" section.
    """
    title = re.search(r"^# (.+)$", readme, flags=re.MULTILINE)
    chapters = re.search(r"^## Chapters\n(.*?)(?=^## |\Z)", readme, flags=re.MULTILINE | re.DOTALL)
    if title is None or chapters is None:
        raise SiteError("README.md needs a '# ' title and a '## Chapters' section: the front page is made of them")
    intro = readme[title.end():].split("\n## ", 1)[0]
    return title.group(1).strip(), intro.strip(), chapters.group(1).strip()


def chapter_title(notebook: nbformat.NotebookNode) -> str:
    """The chapter's first Markdown heading, its title on the site."""
    for cell in notebook.cells:
        if cell.cell_type == "markdown" and (heading := re.search(r"^#\s+(.+)$", cell.source, re.MULTILINE)):
            return heading.group(1).strip()
    raise SiteError("a chapter without a Markdown '# ' heading has no title on the site")


def toctree(caption: str, entries: Iterable[str]) -> str:
    """A hidden toctree: the sidebar's navigation, in this order."""
    lines = "\n".join(entries)
    return f"```{{toctree}}\n:hidden:\n:caption: {caption}\n\n{lines}\n```\n"


def front_page(readme: str, chapters: list[str], pages: Pages) -> str:
    """The site's index: README's title and intro, a line on what the site is, the chapter map
    (its links checked and pointed at the chapter pages), the source pages, the navigation."""
    title, intro, chapter_map = readme_sections(readme)
    lines = [f"# {title}", "", rewrite_links(intro, "README.md", pages), "",
             "This site shows every chapter as it was last run, with its outputs. The exercises appear "
             "without their solutions; to do them, run the course in JupyterLab (`make lab`).", "",
             "## Chapters", "", rewrite_links(chapter_map, "README.md", pages), ""]
    linked = [chapter for chapter in chapters if f"({chapter})" in chapter_map or f"({chapter}#" in chapter_map]
    missing = sorted(set(chapters) - set(linked))
    if missing:
        raise SiteError(f"README.md's chapter map does not link {', '.join(missing)}: the front page would miss it")
    if pages.modules:
        lines += ["## The package's code in the chapters", "",
                  "The modules the chapters link to or show, in full:", ""]
        lines += [f"- [`{module}`]({module}.md)" for module in sorted(pages.modules)]
        lines.append("")
    lines.append(toctree("Chapters", [chapter.removesuffix(".ipynb") for chapter in chapters]))
    if pages.modules:
        lines.append(toctree("The package's code", sorted(pages.modules)))
    return "\n".join(lines)


def source_page(module: str, shown_in: dict[str, str]) -> str:
    """The page of one package file: its path as title, the chapters that use it, its code.

    Args:
        module: the file, from the repository root (``attn_course/core/attention.py``).
        shown_in: each chapter that links to or shows it (``notebooks/02_formula.ipynb``) and that
            chapter's title.
    """
    chapters = ", ".join(f"[{title}](/{chapter})" for chapter, title in sorted(shown_in.items()))
    # full-width: the book theme lets it run into the right margin, where a code page has no contents
    # list, so that the package's 120-character lines need less scrolling.
    return (f"# {module}\n\nLinked or shown in: {chapters}.\n\n"
            f"```{{literalinclude}} {posixpath.basename(module)}\n:language: python\n:linenos:\n"
            ":class: full-width\n```\n")


def write_if_changed(path: pathlib.Path, text: str) -> None:
    """Write ``text`` unless the file holds it already: Sphinx re-reads only what is newer."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_sources(src: pathlib.Path) -> list[str]:
    """Fill ``src`` with the student chapters, the front page and the source pages; return the
    chapters' paths (``notebooks/NN_name.ipynb``)."""
    chapters = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    if not chapters:
        raise SiteError(f"no chapters (NN_name.ipynb) in {CHAPTERS}")
    names = [f"{CHAPTERS.name}/{chapter.name}" for chapter in chapters]
    pages = Pages(chapters=set(names))
    titles = {}
    for chapter, name in zip(chapters, names):
        notebook = student_notebook(nbformat.read(chapter, as_version=4), chapter.name)
        titles[name] = chapter_title(notebook)
        for cell in notebook.cells:
            if cell.cell_type == "markdown":
                cell.source = rewrite_links(cell.source, name, pages)
        for module in shown_modules(notebook):
            pages.module_page(module, name)
        write_if_changed(src / name, nbformat.writes(notebook) + "\n")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    write_if_changed(src / "index.md", front_page(readme, names, pages))
    for module, shown_in in pages.modules.items():
        write_if_changed(src / (module + ".md"), source_page(module, {c: titles[c] for c in shown_in}))
        write_if_changed(src / module, (ROOT / module).read_text(encoding="utf-8"))
    for name in pages.files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, src / name)
    # A page left from an earlier build (a module no chapter shows any more) would still be built.
    wanted = {src / "index.md", *(src / n for n in names), *(src / n for n in pages.files),
              *(src / m for m in pages.modules), *(src / (m + ".md") for m in pages.modules)}
    for stale in [p for p in src.rglob("*") if p.is_file() and p not in wanted]:
        stale.unlink()
    return names


# --- building ---------------------------------------------------------------------------------


def check_out(out: pathlib.Path) -> None:
    """Refuse an output folder whose replacement would lose anything but an earlier site.

    Raises:
        SiteError: when ``out`` is a file, holds (or is) the checkout's own sources, or is a
            folder with files in it that is not a site this tool built (no ``.buildinfo``).
    """
    if out.exists() and not out.is_dir():
        raise SiteError(f"--out {out} is a file, not a folder")
    if ROOT.is_relative_to(out):
        raise SiteError(f"--out {out} would overwrite the checkout; choose a folder of its own, such as build/site")
    for precious in (CHAPTERS, ROOT / PACKAGE, CONF_DIR, ROOT / ".git"):
        if out.is_relative_to(precious):
            raise SiteError(f"--out {out} would overwrite {precious}; choose a folder of its own, such as build/site")
    if out.is_dir() and any(out.iterdir()) and not (out / ".buildinfo").is_file():
        raise SiteError(f"--out {out} is a folder with files in it but no site built by this tool "
                        "(no .buildinfo); it is left alone: empty it or choose another")


def build(out: pathlib.Path, work: pathlib.Path, *, quiet: bool = True) -> None:
    """Build the site into ``out`` (replacing an earlier site there), working in ``work``.

    ``work`` keeps the student chapters (``src``), Sphinx's doctrees and its HTML between runs,
    so a second build re-renders only what changed. Sphinx runs with warnings as errors: a link
    that does not resolve, a missing image or a broken toctree stops the build.

    Raises:
        SiteError: for an unusable ``out``, a chapter the site cannot show, or a failed Sphinx run.
    """
    out, work = out.resolve(), work.resolve()
    check_out(out)
    if work == out or work.is_relative_to(out) or out.is_relative_to(work):
        raise SiteError(f"--work {work} and --out {out} must be separate folders")
    write_sources(work / "src")
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(CONF_DIR), "-d", str(work / "doctrees"),
               "-W", "--keep-going", str(work / "src"), str(work / "html")]
    if quiet:
        command.append("-q")
    completed = subprocess.run(command, cwd=ROOT)
    if completed.returncode != 0:
        raise SiteError(f"Sphinx failed (exit {completed.returncode}); its messages are above")
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(work / "html", out)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                        help="folder for the HTML, replaced if it holds an earlier site (default: build/site)")
    parser.add_argument("--work", type=pathlib.Path, default=None,
                        help="folder for the student chapters and Sphinx's cache (default: OUT's name + '-work' "
                             "beside it, e.g. build/site-work)")
    parser.add_argument("--verbose", action="store_true", help="show Sphinx's progress, not only its warnings")
    arguments = parser.parse_args(argv)
    if arguments.work is None:
        arguments.work = arguments.out.parent / (arguments.out.name + "-work")
    return arguments


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    started = time.monotonic()
    try:
        build(arguments.out, arguments.work, quiet=not arguments.verbose)
    except SiteError as error:
        print(f"tools/site.py: {error}", file=sys.stderr)
        return 1
    index = arguments.out / "index.html"
    print(f"site: {os.path.relpath(index)} ({time.monotonic() - started:.0f} s); "
          f"preview with: python -m http.server -d {os.path.relpath(arguments.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
