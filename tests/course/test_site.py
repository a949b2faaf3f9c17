"""The course as a website (``make site``, tools/site.py): what it shows, and that it works offline.

The fast tests check the student version of the chapters that the site is built from: otter's
cells and the test cells gone, solutions replaced by ``...`` as ``otter assign`` does it, no
solution line left, widget outputs reduced to what a static page can show, links pointed at
pages that exist. What a solution line is, is found here from the chapters' own markers,
independently of tools/site.py.

The slow tests build the site once, as ``make site`` does, into a temporary folder, serve it on
loopback and open the front page and every chapter in Chromium (Debian's, as
tests/course/test_browser.py does; skipped without it, failing in CI): no request leaves the site and
none fails, every plot has decoded, every formula is typeset by the site's own MathJax, every
link between pages resolves. Screenshots go to ``test-artifacts/site/``.
"""

from __future__ import annotations

import functools
import html.parser
import pathlib
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import nbformat
import pytest

from tools import site as website
from tools import student_chapter

from helpers import ROOT

# otter imports ipylab, whose traits warn as they are defined (traitlets' own deprecation); not ours.
pytestmark = pytest.mark.filterwarnings("ignore:Traits should be given as instances:DeprecationWarning")

CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ARTIFACTS = ROOT / "test-artifacts" / "site"
# Each of otter's block boundaries and its config cell, as otter recognises them (a raw cell's
# first line); solution lines inside a code cell are marked the same way, or end in "# SOLUTION".
OTTER_CELL = re.compile(r"#\s+(?:(begin|end)\s+(question|solution|tests|prompt)|assignment\s+config)\b", re.I)
TEXT_MIME_TYPES = ("text/plain", "text/markdown", "text/html", "text/latex")


def squeeze(text: str) -> str:
    """``text`` with every run of white space as one space: code reads the same in a page's text."""
    return re.sub(r"\s+", " ", text).strip()


# --- what is a solution, and what a student may see, read from the chapters themselves -------


def blocks(notebook) -> list[tuple[nbformat.NotebookNode, set[str]]]:
    """Each cell that is not one of otter's boundary cells, with the blocks it sits in."""
    inside: set[str] = set()
    cells = []
    for cell in notebook.cells:
        marker = OTTER_CELL.match(cell.source) if cell.cell_type == "raw" else None
        if marker:
            begin_or_end, block = (marker.group(1) or "").lower(), (marker.group(2) or "").lower()
            (inside.add if begin_or_end == "begin" else inside.discard)(block)
            continue
        cells.append((cell, set(inside)))
    return cells


def split_solution(source: str) -> tuple[list[str], list[str]]:
    """A solution cell's lines: (what stays visible, the solution's own lines)."""
    visible, solution, in_solution = [], [], False
    for line in source.splitlines():
        if re.search(r"#\s*BEGIN SOLUTION", line):
            in_solution = True
        elif re.search(r"#\s*END SOLUTION", line):
            in_solution = False
        elif in_solution or re.search(r"#\s*SOLUTION\s*$", line):
            solution.append(line.split("#", 1)[0] if not in_solution else line)
        else:
            visible.append(line)
    return visible, solution


def output_text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts += [str(output.get("data", {}).get(mime, "")) for mime in TEXT_MIME_TYPES]
    return "\n".join(parts)


@functools.lru_cache(maxsize=1)
def solutions() -> dict[str, set[str]]:
    """Each chapter's distinctive solution lines: a line of a solution (white space squeezed,
    at least 8 characters) that a student sees nowhere else, neither in any chapter outside its
    solutions and tests nor in the package code the site shows. Those must never reach the site.
    """
    visible, lines = [], {}
    for chapter in CHAPTERS:
        lines[chapter.stem] = set()
        for cell, inside in blocks(nbformat.read(chapter, as_version=4)):
            if "tests" in inside or cell.cell_type == "raw":
                continue
            if "solution" in inside and cell.cell_type == "code":
                shown, solution = split_solution(cell.source)
                visible += shown
                lines[chapter.stem] |= {squeeze(line) for line in solution if len(squeeze(line)) >= 8}
            elif "solution" not in inside:
                visible += [cell.source, output_text(cell)]
    # The package files a chapter links to or shows get a page of their own.
    pages = website.Pages(chapters={f"notebooks/{c.name}" for c in CHAPTERS})
    for chapter in CHAPTERS:
        notebook = nbformat.read(chapter, as_version=4)
        for cell in notebook.cells:
            if cell.cell_type == "markdown":
                website.rewrite_links(cell.source, f"notebooks/{chapter.name}", pages)
        for module in website.shown_modules(notebook):
            visible.append((ROOT / module).read_text(encoding="utf-8"))
    visible += [(ROOT / module).read_text(encoding="utf-8") for module in pages.modules]
    corpus = squeeze("\n".join(visible))
    return {name: {line for line in found if line not in corpus} for name, found in lines.items()}


def notebook_text(notebook) -> str:
    return squeeze("\n".join(cell.source + "\n" + output_text(cell) for cell in notebook.cells))


# --- the student version, without a build ---------------------------------------------------


@pytest.fixture(scope="module")
def student_chapters():
    return {c.stem: student_chapter.student_notebook(nbformat.read(c, as_version=4), c.name) for c in CHAPTERS}


def test_every_chapter_has_solution_lines_to_look_for():
    # Otherwise the tests below would pass for want of anything to find.
    assert all(solutions()[chapter.stem] for chapter in CHAPTERS), solutions()


def test_no_solution_line_and_no_otter_cell_in_the_student_chapters(student_chapters):
    for name, notebook in student_chapters.items():
        text = notebook_text(notebook)
        assert [line for line in solutions()[name] if line in text] == [], name
        assert not re.search(r"BEGIN SOLUTION|END SOLUTION|BEGIN TESTS|ASSIGNMENT CONFIG|BEGIN QUESTION", text), name
        assert [c for c in notebook.cells if c.cell_type == "raw" and OTTER_CELL.match(c.source)] == [], name


def test_each_solution_becomes_the_placeholder_with_no_output(student_chapters):
    for chapter in CHAPTERS:
        masters = [cell for cell, inside in blocks(nbformat.read(chapter, as_version=4))
                   if "solution" in inside and cell.cell_type == "code"]
        answers = [cell for cell in student_chapters[chapter.stem].cells
                   if cell.cell_type == "code" and "..." in [line.strip() for line in cell.source.splitlines()]]
        assert len(answers) == len(masters) > 0, chapter.name
        for master, answer in zip(masters, answers):
            shown, _ = split_solution(master.source)
            # What stays of the cell (the def line, comments before the block) stays in order.
            assert [line for line in answer.source.splitlines() if line.strip() != "..."] == shown
            assert answer.outputs == [] and answer.execution_count is None


def test_test_cells_are_gone_and_other_cells_kept(student_chapters):
    for chapter in CHAPTERS:
        cells = blocks(nbformat.read(chapter, as_version=4))
        tests = [cell.source for cell, inside in cells if "tests" in inside]
        kept = [cell.source for cell, inside in cells if not inside & {"tests", "solution"}]
        student = [cell.source for cell in student_chapters[chapter.stem].cells]
        assert tests and not set(tests) & set(student), chapter.name
        assert [source for source in student if source in kept] == kept, chapter.name


def test_saved_widget_state_is_dropped(student_chapters):
    assert any("widgets" in nbformat.read(c, as_version=4).metadata for c in CHAPTERS)
    assert all("widgets" not in notebook.metadata for notebook in student_chapters.values())


def small_notebook() -> nbformat.NotebookNode:
    """An otter master in miniature: one question, its solution, a public and a hidden test."""
    new = nbformat.v4
    solution = new.new_code_cell("def double(x):\n    # BEGIN SOLUTION\n    return x * 2\n    # END SOLUTION",
                                 outputs=[new.new_output("stream", name="stdout", text="leaked\n")],
                                 execution_count=3)
    return new.new_notebook(cells=[
        new.new_markdown_cell("# Chapter 00 — A question"),
        new.new_raw_cell("# ASSIGNMENT CONFIG\nname: 00_small"),
        new.new_raw_cell("# BEGIN QUESTION\nname: q1\npoints: 1"),
        new.new_markdown_cell("Write `double`."),
        new.new_raw_cell("# BEGIN SOLUTION"), solution, new.new_markdown_cell("Because twice is two times."),
        new.new_raw_cell("# END SOLUTION"),
        new.new_raw_cell("# BEGIN TESTS"), new.new_code_cell("assert double(2) == 4"),
        new.new_code_cell("# HIDDEN\nassert double(3) == 6"), new.new_raw_cell("# END TESTS"),
        new.new_raw_cell("# END QUESTION"),
        new.new_code_cell("threshold = 0.5  # SOLUTION"),
    ], metadata={"widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}}}})


def test_student_notebook_of_a_small_master():
    notebook = small_notebook()
    notebook.cells[-1].source = "print('no solution out here')"
    student = student_chapter.student_notebook(notebook, "00_small.ipynb")
    assert [(c.cell_type, c.source) for c in student.cells] == [
        ("markdown", "# Chapter 00 — A question"),
        ("markdown", "Write `double`."),
        ("code", "def double(x):\n    ..."),
        ("code", "print('no solution out here')"),
    ]
    assert student.cells[2].outputs == [] and student.cells[2].execution_count is None
    assert "widgets" not in student.metadata
    assert "widgets" in notebook.metadata and "return x * 2" in notebook.cells[5].source   # a copy


def test_student_notebook_refuses_a_solution_outside_its_block():
    with pytest.raises(ValueError, match=r"00_small.ipynb, cell 13: a solution marker outside"):
        student_chapter.student_notebook(small_notebook(), "00_small.ipynb")


def test_student_notebook_refuses_an_unended_block():
    notebook = small_notebook()
    del notebook.cells[11]                                         # "# END TESTS"
    with pytest.raises(ValueError, match="cell 11: '# END QUESTION' while '# BEGIN TESTS' is still open"):
        student_chapter.student_notebook(notebook, "00_small.ipynb")


def widget_output(**data) -> nbformat.NotebookNode:
    data = {"application/vnd.jupyter.widget-view+json": {"model_id": "0"}, **data}
    return nbformat.from_dict({"output_type": "display_data", "metadata": {}, "data": data})


def test_widget_outputs_keep_their_fallback_or_become_a_note():
    note = student_chapter.widget_note
    with_fallback = widget_output(**{"text/html": "<div>view</div><script>draw()</script>", "text/plain": "View()"})
    assert note(with_fallback) is with_fallback
    only_repr = note(widget_output(**{"text/plain": "QueryExplorer(query='bank', title='toy model')"}))
    assert list(only_repr.data) == ["text/html"] and "QueryExplorer" in only_repr.data["text/html"]
    assert "query='bank'" not in only_repr.data["text/html"]
    assert note(widget_output(**{"text/plain": "training:   0%|          | 0/600 [00:00<?, ?step/s]"})) is None
    plain = nbformat.from_dict({"output_type": "execute_result", "metadata": {}, "execution_count": 1,
                                "data": {"text/plain": "tensor([1.])"}})
    assert note(plain) is plain


def test_no_chapter_output_shows_a_widget_repr(student_chapters):
    for name, notebook in student_chapters.items():
        for cell in notebook.cells:
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                if "application/vnd.jupyter.widget-view+json" in data:
                    assert set(data) & {"text/html", "image/png", "image/svg+xml"}, (name, data.get("text/plain"))


def test_links_point_at_pages_of_the_site():
    pages = website.Pages(chapters={"notebooks/01_intuition.ipynb", "notebooks/02_formula.ipynb"})
    text = ("See [chapter 02](02_formula.ipynb#masks), [the code](../attn_course/core/attention.py), "
            "[a paper](https://arxiv.org/abs/1706.03762), [below](#summary) and, as an example, "
            "`[x](../nowhere.py)`.")
    assert website.rewrite_links(text, "notebooks/01_intuition.ipynb", pages) == text.replace(
        "attention.py)", "attention.py.md)")
    assert pages.modules == {"attn_course/core/attention.py": {"notebooks/01_intuition.ipynb"}}
    for target in ("../INSTRUCTORS.md", "../attn_course/nowhere.py", "../../outside.py"):
        with pytest.raises(website.SiteError, match=re.escape(target)):
            website.rewrite_links(f"[x]({target})", "notebooks/01_intuition.ipynb", pages)


def test_show_source_outputs_name_their_module_file():
    assert website.module_file("attn_course.positions.rope.RotaryEmbedding.forward") == "attn_course/positions/rope.py"
    assert website.module_file("attn_course.flash.tiled.tiled_attention") == "attn_course/flash/tiled.py"
    assert website.module_file("torch.nn.functional.softmax") is None


def test_front_page_is_the_readme_chapter_map():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    names = [f"notebooks/{c.name}" for c in CHAPTERS]
    page = website.front_page(readme, names, website.Pages(chapters=set(names)))
    _, _, chapter_map = website.readme_sections(readme)
    assert chapter_map in page and page.startswith("# attn-course")
    assert all(f"]({name})" in page for name in names)
    with pytest.raises(website.SiteError, match="chapter map does not link notebooks/10_more.ipynb"):
        website.front_page(readme, names + ["notebooks/10_more.ipynb"], website.Pages(chapters=set(names)))
    with pytest.raises(website.SiteError, match="'## Chapters' section"):
        website.readme_sections("# A title\n\nNo map.\n")


def test_out_folder_that_is_not_a_site_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert website.main(["--out", str(tmp_path)]) == 1
    assert "is a folder with files in it but no site built by this tool" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert website.main(["--out", str(ROOT / "notebooks" / "site")]) == 1
    assert "would overwrite" in capsys.readouterr().err
    assert website.main(["--out", str(ROOT.parent)]) == 1
    assert "would overwrite the checkout" in capsys.readouterr().err


@pytest.mark.slow
def test_site_chapters_match_otters_student_notebooks(dist):
    """The site shows each chapter's cells as `make assignments` hands them out: the same cells,
    in the same order, less otter's own (its set-up cell and a grader.check per question)."""
    for chapter in CHAPTERS:
        site = student_chapter.student_notebook(nbformat.read(chapter, as_version=4), chapter.name)
        student = nbformat.read(dist / "student" / chapter.name, as_version=4)
        otters_own = re.compile(r"(#[^\n]*\n)*import otter\n|grader\.check(_all)?\(|grader\.export\(")
        expected = [(c.cell_type, c.source) for c in student.cells if not otters_own.match(c.source)]
        assert [(c.cell_type, c.source) for c in site.cells] == expected, chapter.name


# --- the built site ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> pathlib.Path:
    """The site, built once as `make site` builds it (tools/site.py), into a temporary folder."""
    out = tmp_path_factory.mktemp("site") / "site"
    started = time.monotonic()
    completed = subprocess.run([sys.executable, str(ROOT / "tools" / "site.py"), "--out", str(out)],
                               cwd=ROOT, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    print(f"site built in {time.monotonic() - started:.0f} s")
    return out


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def served(built):
    """The built site on a free loopback port; its base URL (``http://127.0.0.1:PORT/``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(built)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class PageText(html.parser.HTMLParser):
    """A page's text and the ids of its elements (link anchors)."""

    def __init__(self):
        super().__init__()
        self.parts, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        self.ids.update(value for name, value in attrs if name == "id" and value)

    def handle_data(self, data):
        self.parts.append(data)


def parse_page(path: pathlib.Path) -> PageText:
    parser = PageText()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@pytest.mark.slow
def test_no_solution_on_any_page(built):
    pages = sorted(built.rglob("*.html"))
    assert len(pages) > len(CHAPTERS)
    every_line = set().union(*solutions().values())
    for page in pages:
        text = squeeze("".join(parse_page(page).parts))
        assert [line for line in every_line if line in text] == [], page.relative_to(built)
        assert not re.search(r"BEGIN SOLUTION|END SOLUTION|BEGIN TESTS|ASSIGNMENT CONFIG", text), page


@pytest.mark.slow
def test_every_page_is_built_and_no_page_asks_another_machine(built):
    assert (built / "index.html").is_file()
    assert all((built / "notebooks" / f"{c.stem}.html").is_file() for c in CHAPTERS)
    remote = re.compile(r"""<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.I)
    for page in built.rglob("*.html"):
        assert not remote.search(page.read_text(encoding="utf-8")), page.relative_to(built)


def expected_images(chapter: pathlib.Path) -> int:
    """Plots the chapter's page must show: outputs whose best representation is an image."""
    notebook = student_chapter.student_notebook(nbformat.read(chapter, as_version=4), chapter.name)
    return sum(1 for cell in notebook.cells for output in cell.get("outputs", [])
               if "image/png" in output.get("data", {}) and "text/html" not in output["data"])


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, ""


@pytest.mark.slow
def test_pages_in_chromium(browser, built, served):
    """The front page and every chapter: requests, plots, formulas, links, scripts."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pages = [("index", "index.html", 0)] + [(c.stem, f"notebooks/{c.stem}.html", expected_images(c))
                                             for c in CHAPTERS]
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    requests, problems, links = [], [], set()
    context.on("request", lambda request: requests.append(request.url))
    context.on("requestfailed", lambda request: problems.append(f"failed: {request.url} {request.failure}"))
    context.on("response", lambda response: response.status >= 400 and problems.append(
        f"HTTP {response.status}: {response.url}"))
    for name, path, images in pages:
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error, errors=errors: errors.append(str(error)))
        page.goto(served + path, wait_until="load")
        # Sphinx adds MathJax, deferred, to pages with math: wait until it has typeset the page.
        if page.locator(".math").count():
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
            page.evaluate("() => MathJax.startup.promise")
        math = page.evaluate("""() => {
            const spans = [...document.querySelectorAll('.math')];
            return {total: spans.length, typeset: spans.filter(s => s.querySelector('mjx-container')).length,
                    errors: document.querySelectorAll('mjx-merror').length};
        }""")
        undecoded = page.evaluate("() => [...document.images].filter(i => !(i.complete && i.naturalWidth > 0))"
                                  ".map(i => i.src)")
        plots = page.locator(".cell_output img[src*='_images/']").count()
        # An HTML output (the head view draws itself with its inline script) shows something.
        empty_html = page.evaluate("() => [...document.querySelectorAll('.cell_output .text_html')]"
                                   ".filter(e => e.offsetHeight === 0).length")
        # Without an icon of its own a page makes the browser ask for /favicon.ico, a 404 on most hosts.
        icon = page.locator("link[rel='icon']").count()
        links |= set(page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)"))
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
        head_views = page.locator(".attn-head-view").count()
        placeholders = page.locator(".attn-head-view-placeholder").count()
        if name == "08_transformer_bert":
            # Interactive from the page's own script: "bank" -> "loan" in layer 0, head 4, as printed.
            control = page.locator(".attn-head-view").nth(1)
            bank = control.locator('.hv-queries .hv-token[data-index="2"]')
            bank.hover()
            loan_weight = float(control.locator('.hv-keys .hv-token[data-index="5"] .hv-weight').text_content())
            # Pinned by a click, with the pointer away: the screenshot's scrolling cannot point elsewhere.
            bank.click()
            page.mouse.move(0, 0)
            control.screenshot(path=str(ARTIFACTS / "07_head_view.png"))
        page.close()
        assert placeholders == 0, f"{name}: a head view whose script did not run"
        assert head_views == {"01_intuition": 1, "03_multi_head": 1, "08_transformer_bert": 2,
                              "11_induction_heads": 1}.get(name, 0), name
        if name == "08_transformer_bert":
            assert loan_weight == pytest.approx(0.294, abs=6e-4)      # the chapter prints 0.29
        assert errors == [], (name, errors)
        assert undecoded == [], (name, undecoded)
        assert plots == images, f"{name}: {plots} plots shown, the chapter has {images}"
        assert empty_html == 0 and icon == 1, (name, empty_html, icon)
        assert math["errors"] == 0 and math["typeset"] == math["total"], (name, math)
        if name != "index":
            assert math["total"] > 0, name
    context.close()
    assert problems == []
    local = (served, "data:", "blob:")
    assert requests and [url for url in requests if not url.startswith(local)] == []

    # Every link within the site resolves: the page is there, and so is the anchor it names.
    internal = sorted(url for url in links if url.startswith(served))
    assert any("/notebooks/02_formula.html" in url for url in internal)
    assert any(url.endswith(".py.html") for url in internal)
    seen: dict[str, tuple[int, set[str]]] = {}
    for url in internal:
        address, _, anchor = url.partition("#")
        if address not in seen:
            status, body = fetch(address)
            parser = PageText()
            parser.feed(body)
            seen[address] = status, parser.ids
        status, ids = seen[address]
        assert status == 200, url
        assert not anchor or urllib.parse.unquote(anchor) in ids, url
