"""Build the course as a static website (``make site``) from the committed, executed chapters.

    .venv/bin/python tools/site.py                  # -> build/site/ (open build/site/index.html)
    .venv/bin/python tools/site.py --out /tmp/site  # anywhere else
    python -m http.server -d build/site             # preview at http://127.0.0.1:8000

Nothing is executed: the pages show the outputs saved in ``notebooks/``, each chapter as a student
sees it (``tools/student_chapter.py``), copied into a source folder (``build/site-work/src``) with a
front page made from README.md (its title, intro and "## Chapters" map) and a page of highlighted
code for each package module a chapter links to or shows with ``show_source``. A relative link that
would not resolve on the site stops the build, naming the chapter and the link. Sphinx (myst-nb,
``site/conf.py``) renders the folder; the HTML replaces the site built in ``--out`` before.
"""

from __future__ import annotations

import argparse
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
if str(ROOT) not in sys.path:                  # run as a script: tools/ is found from the checkout
    sys.path.insert(0, str(ROOT))

from tools.student_chapter import student_notebook  # noqa: E402

CHAPTERS = ROOT / "notebooks"
PACKAGE = "attn_course"
CONF_DIR = ROOT / "site"
DEFAULT_OUT = ROOT / "build" / "site"

# A Markdown link or image target: [text](target) or [text](target "title").
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
HTML_LINK = re.compile(r"""((?:href|src)=["'])([^"']+)(["'])""")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


class SiteError(Exception):
    """The site cannot be built as asked; the message says why (``main`` prints it, exit 1)."""


@dataclass
class Pages:
    """What the site's pages link to: ``modules`` maps each package file that gets a page
    (``attn_course/core/attention.py``) to the chapters that link to it or show its code; ``files``
    are other files (an image beside a chapter) copied as they are."""

    chapters: set[str]
    modules: dict[str, set[str]] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)

    def module_page(self, module: str, shown_in: str) -> str:
        """Record that ``shown_in`` needs the page of ``module``; return that page's path."""
        self.modules.setdefault(module, set()).add(shown_in)
        return module + ".md"


def site_target(target: str, document: str, pages: Pages) -> str:
    """Where a relative link of ``document`` (a path from the repository root) points on the site:
    a chapter's as it is (myst-nb resolves it), a package file's to its source page, a file beside
    the chapters copied.

    Raises:
        SiteError: for a link to a file the site has no page for (it would 404), or outside the checkout.
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
    """Package files whose code the chapter shows with ``show_source`` (whose Markdown output starts
    with the object's dotted name in backticks)."""
    files = set()
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            shown = re.match(r"`([\w.]+)`\n", output.get("data", {}).get("text/markdown", ""))
            if shown and (found := module_file(shown.group(1))):
                files.add(found)
    return files


def readme_sections(readme: str) -> tuple[str, str, str]:
    """README.md's title, its intro (everything before the first ``##``) and its "## Chapters"
    section (the chapter map), each as Markdown; SiteError when either heading is missing."""
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
    missing = sorted(chapter for chapter in chapters
                     if f"({chapter})" not in chapter_map and f"({chapter}#" not in chapter_map)
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
    """The page of one package file (``attn_course/core/attention.py``): its path as title, the
    chapters that use it (``shown_in``, ``{chapter: its title}``), its code."""
    chapters = ", ".join(f"[{title}](/{chapter})" for chapter, title in sorted(shown_in.items()))
    # full-width: into the right margin (a code page has no contents list), for 120-character lines.
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
        try:
            notebook = student_notebook(nbformat.read(chapter, as_version=4), chapter.name)
        except ValueError as error:            # otter's blocks do not nest, or a solution would show
            raise SiteError(str(error)) from None
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


def check_out(out: pathlib.Path) -> None:
    """Refuse (SiteError) an output folder whose replacement would lose anything but an earlier site:
    a file, the checkout or its sources, a folder with files but no ``.buildinfo``."""
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
    """Build the site into ``out`` (replacing an earlier site there), working in ``work``, which
    keeps the sources and Sphinx's cache so that a second build re-renders only what changed.
    Sphinx's warnings are errors (a link that does not resolve, a missing image, a broken toctree).

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


def main(argv: list[str] | None = None) -> int:
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
