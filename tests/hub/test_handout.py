"""Hand-out: tools/handout.py's commits and link, and what nbgitpuller does when a student clicks it again.

The pulls are nbgitpuller's own (``nbgitpuller.pull.GitPuller``, what its ``/git-pull`` handler
runs in the student's server), from a hand-out repository that tools/handout.py published, over a
``file://`` URL as the hub test uses: the first click clones, each later click merges the
instructor's new commit into the student's copy.
"""

from __future__ import annotations

import pathlib
import subprocess
import urllib.parse

import nbformat
import pytest
from nbgitpuller.pull import GitPuller

from tools import handout

ANSWER = "def stable_softmax(scores):\n    return scores.softmax(-1)"


def chapter(title: str, stub: str = "def stable_softmax(scores):\n    ...") -> nbformat.NotebookNode:
    """A small student notebook: a title, an exercise statement, the exercise's cell, its check."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell(f"# {title}"),
                      nbformat.v4.new_markdown_cell("**Exercise 1.** Write `stable_softmax(scores)`; teh softmax."),
                      nbformat.v4.new_code_cell(stub),
                      nbformat.v4.new_code_cell('grader.check("q1")')]
    for number, cell in enumerate(notebook.cells):
        cell.id = f"cell-{number}"
    return notebook


def write(notebook, path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)


def pull(repo: pathlib.Path, home: pathlib.Path) -> None:
    """What the link does in the student's server: clone, or merge into the clone."""
    for _ in GitPuller(handout.repository_url(str(repo)), str(home / handout.TARGET), branch=handout.BRANCH).pull():
        pass


def sources(path: pathlib.Path) -> list[str]:
    return [cell.source for cell in nbformat.read(path, as_version=4).cells]


@pytest.fixture
def course(tmp_path):
    """dist/student with one chapter, published once; a student who clicked the link once."""
    student = tmp_path / "dist" / "student"
    write(chapter("Chapter 02"), student / "02_formula.ipynb")
    repo, home = tmp_path / "handout", tmp_path / "home"
    assert handout.publish(student, repo) is not None
    pull(repo, home)
    return student, repo, home


def test_the_first_click_gives_the_student_the_student_notebooks(course):
    student, _, home = course
    assert (home / "attn-course" / "02_formula.ipynb").read_bytes() == (student / "02_formula.ipynb").read_bytes()


def answered(home: pathlib.Path) -> pathlib.Path:
    """The student's copy of chapter 02, with their answer saved in it."""
    mine = home / "attn-course" / "02_formula.ipynb"
    notebook = nbformat.read(mine, as_version=4)
    notebook.cells[2].source = ANSWER
    nbformat.write(notebook, mine)
    return mine


def test_a_typo_fixed_later_arrives_and_the_students_answer_stays(course):
    student, repo, home = course
    mine = answered(home)
    fixed = chapter("Chapter 02")
    fixed.cells[1].source = fixed.cells[1].source.replace("teh", "the")  # the instructor's typo fix
    write(fixed, student / "02_formula.ipynb")
    assert handout.publish(student, repo, message="typo") is not None
    pull(repo, home)
    assert sources(mine)[1:3] == ["**Exercise 1.** Write `stable_softmax(scores)`; the softmax.", ANSWER]


def test_where_both_changed_the_same_cell_the_students_version_wins(course):
    student, repo, home = course
    mine = answered(home)
    changed_stub = chapter("Chapter 02", stub="def stable_softmax(scores: torch.Tensor):\n    ...")
    write(changed_stub, student / "02_formula.ipynb")
    handout.publish(student, repo)
    pull(repo, home)
    assert sources(mine)[2] == ANSWER


def test_a_deleted_notebook_comes_back_and_a_new_chapter_does_not_overwrite_a_students_file(course):
    student, repo, home = course
    (home / "attn-course" / "02_formula.ipynb").unlink()
    own = home / "attn-course" / "03_multi_head.ipynb"
    own.write_text("the student's own notes", encoding="utf-8")
    write(chapter("Chapter 03"), student / "03_multi_head.ipynb")
    handout.publish(student, repo)
    pull(repo, home)
    assert (home / "attn-course" / "02_formula.ipynb").exists()
    assert sources(home / "attn-course" / "03_multi_head.ipynb")[0] == "# Chapter 03"
    renamed = [path for path in (home / "attn-course").glob("03_multi_head__*.ipynb")]
    assert [path.read_text(encoding="utf-8") for path in renamed] == ["the student's own notes"]


def test_publish_commits_only_changes_and_mirrors_the_student_folder(course):
    student, repo, _ = course
    assert handout.publish(student, repo) is None                      # nothing changed
    write(chapter("Chapter 03"), student / "03_multi_head.ipynb")
    (student / "02_formula.ipynb").unlink()
    commit = handout.publish(student, repo)
    listed = subprocess.run(["git", "-C", str(repo), "ls-tree", "--name-only", commit],
                            capture_output=True, text=True, check=True).stdout.split()
    assert listed == ["03_multi_head.ipynb"]


def test_publish_refuses_what_is_not_a_hand_out(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="student must be a folder of student notebooks"):
        handout.publish(empty, tmp_path / "repo")
    write(chapter("x"), tmp_path / "student" / "01.ipynb")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="repo must be a git work tree or a new folder"):
        handout.publish(tmp_path / "student", tmp_path / "plain")
    handout.publish(tmp_path / "student", tmp_path / "repo", branch="spring")
    with pytest.raises(ValueError, match="is on branch 'spring', expected 'main'"):
        handout.publish(tmp_path / "student", tmp_path / "repo")
    with pytest.raises(TypeError, match="publish: student must be a path, got int"):
        handout.publish(3, tmp_path / "repo")
    with pytest.raises(ValueError, match="publish: branch must be a non-empty string"):
        handout.publish(tmp_path / "student", tmp_path / "repo", branch=" ")


def test_the_link_asks_nbgitpuller_to_pull_the_hand_out_and_open_the_chapter(tmp_path):
    link = handout.link("https://hub.example.org/", str(tmp_path / "handout"), chapter="02_formula.ipynb")
    parts = urllib.parse.urlsplit(link)
    assert (parts.scheme, parts.netloc, parts.path) == ("https", "hub.example.org", "/hub/user-redirect/git-pull")
    assert urllib.parse.parse_qs(parts.query) == {
        "repo": [f"file://{tmp_path}/handout"], "branch": ["main"], "targetpath": ["attn-course"],
        "urlpath": ["lab/tree/attn-course/02_formula.ipynb"]}


def test_a_local_path_becomes_an_absolute_normalised_file_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert handout.repository_url("course/../handout") == f"file://{tmp_path}/handout"
    assert handout.repository_url("/srv/a/../handout") == "file:///srv/handout"
    assert handout.repository_url("git@github.com:you/course.git") == "git@github.com:you/course.git"


def test_the_link_keeps_a_hubs_path_prefix_and_a_git_url():
    link = handout.link("https://uni.example/jupyter", "https://github.com/you/course-student", branch="spring")
    parts = urllib.parse.urlsplit(link)
    assert parts.path == "/jupyter/hub/user-redirect/git-pull"
    query = urllib.parse.parse_qs(parts.query)
    assert query["repo"] == ["https://github.com/you/course-student"] and query["branch"] == ["spring"]
    assert query["urlpath"] == ["lab/tree/attn-course/"]


@pytest.mark.parametrize("arguments, message", [
    (dict(hub="hub.example.org"), "hub must be the hub's http"),
    (dict(hub="ftp://hub.example.org"), "hub must be the hub's http"),
    (dict(hub="https://hub.example.org/?next=x"), "hub must be the hub's http"),
    (dict(chapter="02_formula"), "chapter must be a notebook's file name"),
    (dict(chapter="../02_formula.ipynb"), "chapter must be a notebook's file name"),
    (dict(target="a/b"), "target must be a plain name"),
    (dict(target=".hidden"), "target must be a plain name"),
    (dict(repo=""), "repo must be a git URL or a path"),
])
def test_the_link_refuses_what_would_not_work(arguments, message):
    call = dict(hub="https://hub.example.org", repo="https://github.com/you/course-student") | arguments
    with pytest.raises(ValueError, match=message):
        handout.link(**call)
