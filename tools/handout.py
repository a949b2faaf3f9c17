"""Hand the student notebooks out on a JupyterHub with nbgitpuller.

    .venv/bin/python tools/handout.py publish --repo ../attn-course-student     # dist/student -> a git commit
    .venv/bin/python tools/handout.py link --hub https://hub.example.org \\
        --repo https://github.com/you/attn-course-student [--open 02_formula.ipynb]

Students get ``dist/student/``, never the master notebooks: ``publish`` commits the student
notebooks into a git repository of their own, which the instructor pushes where the hub can clone
from; ``link`` prints the nbgitpuller link that clones it into each student's ``~/attn-course/`` and
opens a chapter. Clicked again after a new publish, it merges by nbgitpuller's rules: the student's
changes win, nothing the student wrote is overwritten (INSTRUCTORS.md, section 6.2).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: The folder of each student's home that the link clones into, and that collection reads.
TARGET = "attn-course"
BRANCH = "main"
#: Who the hand-out commits are by, where the repository has no identity of its own.
_IDENTITY = ["-c", "user.name=attn-course hand-out", "-c", "user.email=handout@attn-course.invalid"]


def _git(repo: pathlib.Path, *arguments: str) -> str:
    completed = subprocess.run(["git", "-C", str(repo), *arguments], capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"git {' '.join(arguments)} failed in {repo}: {completed.stderr.strip()}")
    return completed.stdout.strip()


def publish(student: os.PathLike | str, repo: os.PathLike | str, branch: str = BRANCH,
            message: str = "Student notebooks") -> str | None:
    """Commit the student notebooks of ``student`` (``dist/student``) into the git repository
    ``repo``, on ``branch``: ``repo``'s ``*.ipynb`` become exactly those; anything else is left alone.

    Args:
        student: the student notebooks.
        repo: a git work tree on ``branch``, or a folder that does not exist yet (``git init``-ed).
        branch: the branch students pull.
        message: the commit message.

    Returns:
        The new commit's id, or None when the notebooks had not changed since the last commit.

    Raises:
        TypeError: an argument is not a path or a string.
        ValueError: ``student`` holds no notebook, ``repo`` is not a git work tree on ``branch``,
            or ``branch``/``message`` is empty.
    """
    for name, value in (("student", student), ("repo", repo)):
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"publish: {name} must be a path, got {type(value).__name__}")
    for name, value in (("branch", branch), ("message", message)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"publish: {name} must be a non-empty string, got {value!r}")
    student, repo = pathlib.Path(student), pathlib.Path(repo)
    notebooks = sorted(student.glob("*.ipynb")) if student.is_dir() else []
    if not notebooks:
        raise ValueError(f"publish: student must be a folder of student notebooks (make assignments), "
                         f"got {student}, which holds none")
    if not repo.exists():
        repo.mkdir(parents=True)
        _git(repo, "init", "--quiet", "--initial-branch", branch)
    elif not (repo / ".git").exists():
        raise ValueError(f"publish: repo must be a git work tree or a new folder, got {repo}, which is neither")
    current = _git(repo, "symbolic-ref", "--short", "HEAD")
    if current != branch:
        raise ValueError(f"publish: repo {repo} is on branch {current!r}, expected {branch!r}; "
                         f"`git -C {repo} switch {branch}` first")
    handed_out = {notebook.name for notebook in notebooks}
    for stale in repo.glob("*.ipynb"):
        if stale.name not in handed_out:
            stale.unlink()
    for notebook in notebooks:
        shutil.copyfile(notebook, repo / notebook.name)
    _git(repo, "add", "--all", "--", "*.ipynb")
    if not _git(repo, "status", "--porcelain", "--", "*.ipynb"):
        return None
    _git(repo, *_IDENTITY, "commit", "--quiet", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def repository_url(repo: str) -> str:
    """``repo`` as nbgitpuller's ``repo`` parameter: a URL as it is, a local path as ``file://``
    (so that git honours nbgitpuller's shallow clone, which it ignores for a plain path)."""
    if not isinstance(repo, str) or not repo.strip():
        raise ValueError(f"repository_url: repo must be a git URL or a path, got {repo!r}")
    if "://" in repo or repo.startswith("git@"):
        return repo
    # Absolute and normalised ("a/../b" is "b"), but no link resolved: the path is the hub machine's.
    return pathlib.Path(os.path.abspath(os.path.expanduser(repo))).as_uri()


def link(hub: str, repo: str, branch: str = BRANCH, chapter: str | None = None, target: str = TARGET) -> str:
    """The nbgitpuller link that clones (or, clicked again, merges) ``repo`` into ``~/target`` on
    the hub at ``hub`` and opens ``chapter`` (or the folder) in JupyterLab.

    Args:
        hub: the hub's public URL, ``https://hub.example.org`` (a path prefix is kept).
        repo: where the hub clones the hand-out from: a git URL, or a path on the hub's machine.
        branch, chapter, target: the branch :func:`publish` committed to, the notebook to open
            (``02_formula.ipynb``), the folder in each home.

    Raises:
        ValueError: ``hub`` is not an http(s) URL, ``chapter`` or ``target`` is not a plain name.
    """
    if not isinstance(hub, str):
        raise TypeError(f"link: hub must be a URL string, got {type(hub).__name__}")
    parsed = urllib.parse.urlsplit(hub)
    if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.query or parsed.fragment:
        raise ValueError(f"link: hub must be the hub's http(s) URL, like https://hub.example.org, got {hub!r}")
    for name, value in (("branch", branch), ("target", target)):
        if not isinstance(value, str) or not value or "/" in value or value.startswith(".") or value != value.strip():
            raise ValueError(f"link: {name} must be a plain name (no '/', not hidden), got {value!r}")
    if chapter is not None and (not isinstance(chapter, str) or not chapter.endswith(".ipynb") or "/" in chapter
                                or chapter.startswith(".")):
        raise ValueError(f"link: chapter must be a notebook's file name, like 02_formula.ipynb, got {chapter!r}")
    query = urllib.parse.urlencode({
        "repo": repository_url(repo),
        "branch": branch,
        "targetpath": target,
        "urlpath": f"lab/tree/{target}/{chapter or ''}",
    })
    return f"{hub.rstrip('/')}/hub/user-redirect/git-pull?{query}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    to_publish = commands.add_parser("publish", help="commit dist/student into the hand-out repository")
    to_publish.add_argument("--student", type=pathlib.Path, default=ROOT / "dist" / "student")
    to_publish.add_argument("--repo", type=pathlib.Path, required=True)
    to_publish.add_argument("--branch", default=BRANCH)
    to_publish.add_argument("--message", default="Student notebooks")
    to_link = commands.add_parser("link", help="print the nbgitpuller link")
    to_link.add_argument("--hub", required=True, help="the hub's URL, https://hub.example.org")
    to_link.add_argument("--repo", required=True, help="the hand-out repository's URL (or path on the hub)")
    to_link.add_argument("--branch", default=BRANCH)
    to_link.add_argument("--open", dest="chapter", help="the chapter to open, 02_formula.ipynb")
    to_link.add_argument("--target", default=TARGET, help=f"the folder in each home (default {TARGET})")
    args = parser.parse_args(argv)
    try:
        if args.command == "publish":
            commit = publish(args.student, args.repo, args.branch, args.message)
            print(f"{args.repo}: committed {commit[:12]} on {args.branch}; push it where the hub clones from"
                  if commit else f"{args.repo}: the student notebooks have not changed; nothing to commit")
        else:
            print(link(args.hub, args.repo, args.branch, args.chapter, args.target))
    except (ValueError, RuntimeError) as error:
        print(f"handout: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
