"""Sphinx configuration of the course's website (``make site``, which runs ``tools/site.py``).

tools/site.py writes the pages (the student versions of the chapters, the front page, the
source pages) into a folder of their own and runs Sphinx on it with this folder as its
configuration (``-c site``). Two rules shape what follows: the chapters are shown as they were
executed, never run again; and a page makes no request to any other machine (no CDN, no web
fonts, no analytics), so MathJax and the theme's assets are served from the site itself.
"""

from __future__ import annotations

import pathlib
import re
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, installed as tomli
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

project = PROJECT["name"]
# The course's title is README.md's first heading, as on the front page (tools/site.py).
html_title = re.search(r"^# (.+)$", (ROOT / "README.md").read_text(encoding="utf-8"), re.MULTILINE).group(1).strip()
release = version = PROJECT["version"]

extensions = [
    "myst_nb",
    # MathJax 3 copied into _static/mathjax at the end of the build, and mathjax_path set to it.
    "sphinx-mathjax-offline",
]

# --- the chapters: executed once, in the repository ------------------------------------------

# The pages show the outputs committed with the chapters; nothing runs during the build.
nb_execution_mode = "off"
# myst-nb would add require.js and the ipywidgets HTML manager from a CDN to a page with saved
# widget state; tools/site.py drops that state too, and none of it could work offline.
nb_ipywidgets_js = {}
# Which of an output's representations a page shows, lowest number first. Our widgets carry a
# self-contained text/html (inline script, no widget manager) or an image beside their widget
# view, and those must win; the widget view itself needs a widget manager and is never shown.
nb_mime_priority_overrides = [
    ("html", "text/html", 10),
    ("html", "image/png", 20),
    ("html", "image/svg+xml", 30),
    ("html", "image/jpeg", 40),
    ("html", "image/gif", 50),
    ("html", "text/markdown", 60),      # show_source's highlighted code
    ("html", "text/latex", 70),
    ("html", "text/plain", 100),
    ("html", "application/javascript", None),
    ("html", "application/vnd.jupyter.widget-view+json", None),
]
# A cell's prints read as one block, as in JupyterLab.
nb_merge_streams = True

# The chapters write math as $...$ and $$...$$, and link sections as file.ipynb#heading-slug.
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_dmath_double_inline = True
myst_heading_anchors = 3

# --- the pages around them -----------------------------------------------------------------

html_theme = "sphinx_book_theme"
html_theme_options = {
    # A plain link to the repository; no launch buttons (Binder, Colab): they would open the
    # instructors' chapters, solutions included, where this site shows the students' version.
    "repository_url": PROJECT["urls"]["Repository"],
    "use_repository_button": True,
    "use_download_button": False,
    "home_page_in_toc": True,
    "show_toc_level": 2,
}
html_static_path = ["_static"]
html_css_files = ["site.css"]
# A page that names no icon makes the browser ask for /favicon.ico, a 404 on most hosts.
html_favicon = "_static/favicon.svg"
# The sources are the student notebooks with every output inside: a second copy of the site's
# images for a button we do not show.
html_copy_source = False
html_show_sourcelink = False

