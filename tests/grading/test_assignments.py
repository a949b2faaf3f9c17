"""Instructor tooling: otter assign builds clean student notebooks; make grade grades them.

These tests build every chapter's assignment once (tools/assign.py) and grade a small class
(tools/grade.py, each notebook in its sandbox): the solutions (whole notebooks of two chapters,
WHOLE_NOTEBOOK_CHAPTERS, and the answers of two more, ANSWERS_ONLY_CHAPTERS), and submissions with
the mistakes that attn_course.checks diagnoses, as a whole notebook of chapter 01 (WHOLE_PLANTED_CHAPTERS,
whose other questions are left untouched) and as notebooks of answers of three chapters
(ANSWERS_PLANTED_CHAPTERS, the student with the most mistakes in each, whose other answers are the
solutions). One planted notebook is also graded by `otter run`, which must give the same scores and
feedback. For every chapter, every planted mistake and every untouched answer is also run against its
question's public tests without otter.
"""

from __future__ import annotations

import ast
import csv
import importlib
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import zipfile

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from attn_course_grading.assignment import import_statements

from helpers import run_tool, sandbox_installed
from support.exercises import chapter_namespace, exception_test_source, failures, otter_run, public_tests
from support.without_triton import environment_without_triton

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
HAS_OTTER = (pathlib.Path(sys.executable).parent / "otter").exists()


def grading(test):
    """A test that builds assignments or grades with otter: slow (`make unit` leaves it out),
    and skipped where otter-grader is not installed."""
    return pytest.mark.slow(pytest.mark.skipif(not HAS_OTTER, reason="otter-grader is not installed")(test))


def master_blocks(master: pathlib.Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Lines found only in solutions, and (question, body) of each hidden test, in a master
    notebook. A hidden test's body is its cell without the ``# HIDDEN`` line."""
    solution_lines, other_lines, hidden_tests, question = [], set(), [], None
    for cell in nbformat.read(master, as_version=4).cells:
        if cell.cell_type == "raw" and cell.source.startswith("# BEGIN QUESTION"):
            question = re.search(r"name:\s*(\S+)", cell.source).group(1)
        if cell.cell_type != "code":
            continue
        inside = False
        for line in cell.source.splitlines():
            if line.strip() == "# BEGIN SOLUTION":
                inside = True
            elif line.strip() == "# END SOLUTION":
                inside = False
            elif line.strip():
                (solution_lines.append if inside else other_lines.add)(line.strip())
        if cell.source.startswith("# HIDDEN"):
            hidden_tests.append((question, cell.source.split("\n", 1)[1]))
    # A line that the chapter's teaching code also shows is no secret.
    return [line for line in solution_lines if line not in other_lines], hidden_tests


def statements(source: str) -> list[str]:
    """The top-level statements of ``source`` as syntax trees (``ast.dump``): what a test *does*,
    whatever its comments and spelling. otter rewrites tests (drops comments, writes 1e-5
    as 1e-05, adds parentheses), so text comparisons miss them; trees do not."""
    return [ast.dump(node) for node in ast.parse(TransformerManager().transform_cell(source)).body]


def cases_of_test_file(source: str) -> tuple[str, list[dict]]:
    """(question, its cases) of one otter exception-based test file: each ``@test_case(...)``
    function, as ``{"hidden": bool, "code": its body}``."""
    module = ast.parse(source)
    (question,) = [node.value.value for node in module.body if isinstance(node, ast.Assign)
                   and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["name"]]
    cases = []
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.decorator_list:
            options = {k.arg: ast.literal_eval(k.value) for k in node.decorator_list[0].keywords}
            cases.append({"hidden": bool(options.get("hidden")), "code": "\n".join(map(ast.unparse, node.body))})
    return question, cases


def zip_cases(zip_path: pathlib.Path) -> dict[str, list[dict]]:
    """{question: its test cases} from an autograder zip's ``tests/*.py``."""
    with zipfile.ZipFile(zip_path) as archive:
        return dict(cases_of_test_file(archive.read(name).decode()) for name in archive.namelist()
                    if name.startswith("tests/") and name.endswith(".py"))


def student_code(student: nbformat.NotebookNode) -> list[list[str]]:
    """Everything a student notebook could run or show as code: each code cell, and each test
    case that otter stores in its metadata (the public ones), as a list of statements."""
    units = [statements(cell.source) for cell in student.cells if cell.cell_type == "code"]
    for source in student.metadata.get("otter", {}).get("tests", {}).values():
        units += [statements(case["code"]) for case in cases_of_test_file(source)[1]]
    return units


def as_graded(body: str) -> list[str]:
    """A chapter test cell's statements as otter runs them (tools/assign.py's exception_test)."""
    (function, _) = ast.parse(exception_test_source(body)).body
    return [ast.dump(node) for node in function.body]


def contains(unit: list[str], body: list[str]) -> bool:
    return any(unit[i:i + len(body)] == body for i in range(len(unit) - len(body) + 1))


def questions(master: pathlib.Path) -> list[tuple[str, str]]:
    """(question name, its prompt) for each exercise of a master notebook."""
    found, current = [], None
    for cell in nbformat.read(master, as_version=4).cells:
        if cell.cell_type == "raw" and cell.source.startswith("# BEGIN QUESTION"):
            current = re.search(r"name:\s*(\S+)", cell.source).group(1)
        elif current and cell.cell_type == "markdown":
            found.append((current, cell.source))
            current = None
    return found


@pytest.mark.parametrize("master", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_has_three_kinds_of_exercise(master):
    prompts = [prompt for _, prompt in questions(master)]
    assert len(prompts) >= 3
    for kind in ("(implement)", "(predict, then check)", "(find the bug)"):
        assert any(kind in prompt for prompt in prompts), f"{master.name} has no {kind} exercise"


@pytest.mark.parametrize("master", CHAPTERS, ids=lambda p: p.stem)
def test_assignment_config_sits_just_before_the_first_question(master):
    """Out of the students' way (the chapter opens with its title), and still ahead of every
    question: otter assign reads the config cell where it finds it, in cell order."""
    cells = nbformat.read(master, as_version=4).cells
    raw = [(i, cell.source) for i, cell in enumerate(cells) if cell.cell_type == "raw"]
    configs = [i for i, source in raw if source.startswith("# ASSIGNMENT CONFIG")]
    first_question = next(i for i, source in raw if source.startswith("# BEGIN QUESTION"))
    assert configs == [first_question - 1]
    assert re.search(r"^name: (\S+)$", cells[configs[0]].source, re.M).group(1) == master.stem


@grading
@pytest.mark.parametrize("master", CHAPTERS, ids=lambda p: p.stem)
def test_student_notebook_has_no_solution_code_and_no_hidden_test(dist, master):
    solution_lines, hidden_tests = master_blocks(master)
    assert solution_lines and hidden_tests, "the master notebook should have both"
    student = nbformat.read(dist / "student" / master.name, as_version=4)
    student_text = "\n".join(cell.source for cell in student.cells if cell.cell_type == "code")
    leaked = [line for line in solution_lines if line in student_text]
    assert leaked == []
    units = student_code(student)
    for question, body in hidden_tests:
        tree = statements(body)
        assert not any(contains(unit, tree) for unit in units), f"{question}: a hidden test is in the student notebook"
        # Nor the expression that decides it, anywhere, as code or as text.
        assert not any(tree[-1] in unit for unit in units), f"{question}: a hidden test's check is visible"
        assert body.splitlines()[-1].strip() not in student_text
    # The same search finds the public tests, which the student notebook does carry.
    for question, cases in zip_cases(dist / "autograder" / f"{master.stem}.zip").items():
        for case in cases:
            if not case["hidden"]:
                public = statements(case["code"])
                assert any(contains(unit, public) for unit in units), f"{question}: a public test is missing"
    raw = (dist / "student" / master.name).read_text()
    assert "# BEGIN SOLUTION" not in raw and "# HIDDEN" not in raw and "# ASSIGNMENT CONFIG" not in raw


@grading
@pytest.mark.parametrize("master", CHAPTERS, ids=lambda p: p.stem)
def test_autograder_holds_the_hidden_tests(dist, master):
    _, hidden_tests = master_blocks(master)
    cases = zip_cases(dist / "autograder" / f"{master.stem}.zip")
    for question, body in hidden_tests:
        hidden = [statements(case["code"]) for case in cases[question] if case["hidden"]]
        assert as_graded(body) in hidden, f"{question}: this hidden test is not in the autograder:\n{body}"
    for question in cases:
        in_master = [body for name, body in hidden_tests if name == question]
        assert len(in_master) == sum(case["hidden"] for case in cases[question]), question


@grading
def test_assignments_are_reproducible(dist, tmp_path):
    # Two chapters rebuilt, the first and the last: what makes a build reproducible (the cell ids
    # assign.py derives) is the same code for every chapter, and each rebuild costs seconds.
    rebuilt = [CHAPTERS[0], CHAPTERS[-1]]
    run_tool("tools/assign.py", "--no-run-tests", "--out", str(tmp_path), *map(str, rebuilt))
    for master in rebuilt:
        first = (dist / "student" / master.name).read_bytes()
        second = (tmp_path / "student" / master.name).read_bytes()
        assert first == second, f"{master.name} differs between two builds"


def test_a_chapter_of_triton_kernels_is_not_graded_where_triton_is_missing(dist, monkeypatch, tmp_path):
    # Without Triton its checks skip, and a skipped check would pass: the grader refuses instead.
    from attn_course_grading import grader
    from attn_course_grading.assignment import Assignment

    kernels, formula = (Assignment(dist / "autograder" / f"{name}.zip") for name in ("07_flash_triton", "02_formula"))
    assert kernels.needs_triton and not formula.needs_triton
    monkeypatch.setattr(grader, "triton_installed", lambda: False)
    with pytest.raises(RuntimeError, match="07_flash_triton's exercises are Triton kernels, and Triton is not"):
        grader.grade(kernels, tmp_path / "any.ipynb")
    # make grade, where `import triton` fails: the chapter is named, not graded, and noted for each student.
    write_notebook(nbformat.read(dist / "autograder" / "07_flash_triton.ipynb", as_version=4),
                   tmp_path / "submissions" / "ada" / "07_flash_triton.ipynb")
    result = subprocess.run([sys.executable, "tools/grade.py", str(tmp_path / "submissions"), "--autograders",
                             str(dist / "autograder"), "--out", str(tmp_path / "grades"), "--trusted"],
                            env=environment_without_triton(tmp_path), cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "not grading 07_flash_triton: its exercises are Triton kernels" in result.stdout
    grades = (tmp_path / "grades" / "grades.csv").read_text()
    assert "07_flash_triton: not graded: its exercises are Triton kernels" in grades


# --- grading a small class -----------------------------------------------------------

def load_planted() -> dict[str, dict[str, dict[str, tuple[str, str, str]]]]:
    """student -> chapter -> function -> (planted code, question, hint), from tests/support/planted/planted_NN.py."""
    planted: dict[str, dict[str, dict]] = {}
    for path in sorted((ROOT / "tests" / "support" / "planted").glob("planted_[0-9][0-9].py")):
        module = importlib.import_module(f"support.planted.{path.stem}")
        for student, functions in module.PLANTED.items():
            planted.setdefault(student, {})[module.CHAPTER] = functions
    return planted


# One file of planted mistakes per chapter (tests/support/planted/planted_NN.py), so that each chapter's
# exercises and their mistakes change together.
PLANTED = load_planted()


# The chapters graded as whole notebooks: one with widgets, one that starts processes of its own
# (each graded notebook runs its whole chapter, twice: the solutions and a planted student). For
# every chapter, the rest is checked without grading: nbval runs every master notebook, whose
# public and hidden test cells must print True for the solutions;
# test_planted_mistake_fails_its_public_check_with_the_hint runs every planted mistake and
# test_untouched_answers_fail_their_public_checks every untouched answer against the public
# tests exactly as otter runs them.
WHOLE_NOTEBOOK_CHAPTERS = ("01_intuition", "10_distributed")
# The chapters whose answers are called with more than tensors, graded as notebooks of the
# chapter's imports and answers (seconds, not a chapter's minute): 04 (a TinyLanguageModel and its
# KVCaches, appended to by the call) and 07 (Triton kernels, launched as kernel[grid](...)).
ANSWERS_ONLY_CHAPTERS = ("04_causal", "07_flash_triton")


def most_planted(planted: dict, chapters: tuple[str, ...], *, leaving_one_untouched: bool = False
                 ) -> dict[str, dict[str, dict]]:
    """The planted students graded: per chapter, the one who planted the most mistakes (the first
    by name if several; with ``leaving_one_untouched``, among those who leave a question untouched, for
    test_untouched_questions_score_zero_without_crashing). Every planted mistake is matched with its hint by
    test_planted_mistake_fails_its_public_check_with_the_hint below; this class shows that the
    hints reach the feedback through make grade."""
    chosen: dict[str, dict[str, dict]] = {}
    for chapter in chapters:
        everything = {name for name, _ in questions(ROOT / "notebooks" / f"{chapter}.ipynb")}
        candidates = sorted(s for s in planted if chapter in planted[s] and not (
            leaving_one_untouched and {q for _, q, _ in planted[s][chapter].values()} >= everything))
        student = max(candidates, key=lambda s: len(planted[s][chapter]))
        chosen.setdefault(student, {})[chapter] = planted[student][chapter]
    return chosen


def merged(*classes: dict) -> dict[str, dict[str, dict]]:
    together: dict[str, dict[str, dict]] = {}
    for students in classes:
        for student, chapters in students.items():
            together.setdefault(student, {}).update(chapters)
    return together


# The planted students graded: as whole notebooks, two of chapter 01's (a few seconds each), the one with the most
# mistakes and the one with the most that leaves a question untouched; as answers, the one with the most mistakes in
# each of 04, 07 and 10, whose answers the checks call through the grader's proxies (a model and its caches, Triton
# kernels, processes). Every other planted mistake meets its hint in this process, in
# test_planted_mistake_fails_its_public_check_with_the_hint: an answers-only notebook of 04 took 12 to 28 s in the
# sandbox during a full test run, and all nine planted students of 04 and 07 were most of this class's time.
# Chapter 10's solutions are graded whole (a chapter that starts processes of its own).
WHOLE_PLANTED_CHAPTERS = ("01_intuition",)
ANSWERS_PLANTED_CHAPTERS = (*ANSWERS_ONLY_CHAPTERS, "10_distributed")
GRADED_PLANTED = merged(most_planted(PLANTED, WHOLE_PLANTED_CHAPTERS),
                        most_planted(PLANTED, WHOLE_PLANTED_CHAPTERS, leaving_one_untouched=True),
                        most_planted(PLANTED, ANSWERS_PLANTED_CHAPTERS))
GRADED_MASTERS = [m for m in CHAPTERS if m.stem in WHOLE_NOTEBOOK_CHAPTERS + ANSWERS_ONLY_CHAPTERS]


def answers_only(solution: pathlib.Path, replaced: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """A notebook of a solution notebook's imports and answer cells (``replaced``: a planted
    student's versions of some answers): what a student who skipped the reading hands in."""
    imports, answers = [], []
    for cell in nbformat.read(solution, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        if "# BEGIN SOLUTION" in cell.source:
            name = next((n for n in (replaced or {}) if cell.source.startswith(f"def {n}(")), None)
            answers.append(replaced[name] if name else cell.source)
            continue
        try:
            body = ast.parse(cell.source).body
        except SyntaxError:
            continue
        imports += [node for node in import_statements(ast.Module(body=body, type_ignores=[]))
                    if "otter" not in ast.unparse(node)]
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(ast.unparse(ast.Module(body=imports, type_ignores=[])))]
    notebook.cells += [nbformat.v4.new_code_cell(source) for source in answers]
    return notebook


def write_notebook(notebook: nbformat.NotebookNode, path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return path


def plant(student_notebook: pathlib.Path, functions: dict, destination: pathlib.Path) -> None:
    notebook = nbformat.read(student_notebook, as_version=4)
    for name, (code, _, _) in functions.items():
        (cell,) = [c for c in notebook.cells if c.cell_type == "code" and c.source.startswith(f"def {name}(")]
        cell.source = code
    destination.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, destination)


@pytest.fixture(scope="session")
def graded(dist, tmp_path_factory) -> pathlib.Path:
    submissions = tmp_path_factory.mktemp("submissions")
    for chapter in WHOLE_NOTEBOOK_CHAPTERS:
        write_notebook(nbformat.read(dist / "autograder" / f"{chapter}.ipynb", as_version=4),
                       submissions / "solutions" / f"{chapter}.ipynb")
    for chapter in ANSWERS_ONLY_CHAPTERS:
        write_notebook(answers_only(dist / "autograder" / f"{chapter}.ipynb"),
                       submissions / "solutions" / f"{chapter}.ipynb")
    # Untouched notebooks are not graded separately: each whole-notebook planted student leaves every
    # question it plants nothing in untouched (test_untouched_questions_score_zero_without_crashing),
    # and test_untouched_answers_fail_their_public_checks runs every untouched answer without otter.
    for student, chapters in GRADED_PLANTED.items():
        for chapter, functions in chapters.items():
            destination = submissions / student / f"{chapter}.ipynb"
            if chapter in WHOLE_PLANTED_CHAPTERS:
                plant(dist / "student" / f"{chapter}.ipynb", functions, destination)
            else:
                replaced = {name: code for name, (code, _, _) in functions.items()}
                write_notebook(answers_only(dist / "autograder" / f"{chapter}.ipynb", replaced), destination)
    out = tmp_path_factory.mktemp("grades")
    # Each notebook in its sandbox; where bubblewrap is not installed (never in CI), the same grading
    # without one, so that the scores and hints are still checked (tests/grading/test_sandbox_grading.py
    # skips with one line).
    trusted = [] if sandbox_installed() else ["--trusted"]
    run_tool("tools/grade.py", str(submissions), "--autograders", str(dist / "autograder"), "--out", str(out),
             *trusted)
    return out


def grade_rows(graded: pathlib.Path) -> dict[str, dict[str, str]]:
    with open(graded / "grades.csv") as handle:
        return {row["student"]: row for row in csv.DictReader(handle)}


def planted_in(chapters: tuple[str, ...]):
    """(student, chapter, the questions it planted mistakes in) for each graded planted notebook of ``chapters``."""
    for student, by_chapter in GRADED_PLANTED.items():
        for chapter, functions in by_chapter.items():
            if chapter in chapters:
                yield student, chapter, {question for _, question, _ in functions.values()}


@grading
def test_csv_has_a_row_per_student_and_a_column_per_question(graded):
    rows = grade_rows(graded)
    assert set(rows) == {"solutions", *GRADED_PLANTED}
    expected_columns = {f"{m.stem}:{name}" for m in GRADED_MASTERS for name, _ in questions(m)}
    assert expected_columns <= set(next(iter(rows.values())))


@grading
def test_solutions_score_full_marks(graded):
    row = grade_rows(graded)["solutions"]
    assert float(row["total"]) == float(row["possible"]) > 0


@grading
def test_every_cell_of_the_solutions_runs_where_they_are_graded(graded):
    # The sandbox has what a chapter needs (chapter 10 starts processes, which need /dev/shm).
    for master in GRADED_MASTERS:
        run = json.loads((graded / "solutions" / f"{master.stem}.json").read_text())["run"]
        assert run["cell_errors"] == [] and run["stopped"] is None, (master.stem, run)


@grading
def test_untouched_questions_score_zero_without_crashing(graded):
    # In each planted student's notebook, the questions without a planted mistake are untouched
    # (the student notebook's "..."): otter must run the whole notebook and give them 0.
    rows = grade_rows(graded)
    untouched = []
    for student, chapter, planted_questions in planted_in(WHOLE_PLANTED_CHAPTERS):
        master = ROOT / "notebooks" / f"{chapter}.ipynb"
        untouched += [float(rows[student][f"{chapter}:{name}"]) for name, _ in questions(master)
                      if name not in planted_questions]
    # (Planted students leave few questions untouched; every untouched answer of every chapter is
    # checked without otter by test_untouched_answers_fail_their_public_checks.)
    assert untouched and all(score == 0 for score in untouched), untouched


@grading
@pytest.mark.parametrize(
    "student, chapter, name",
    [(s, c, n) for s, chapters in GRADED_PLANTED.items() for c, functions in chapters.items() for n in functions],
)
def test_planted_mistake_loses_the_points_and_gets_the_matching_hint(graded, student, chapter, name):
    _, question, hint = GRADED_PLANTED[student][chapter][name]
    feedback = {q["name"]: q for q in json.loads((graded / student / f"{chapter}.json").read_text())["questions"]}
    # Tests a mistake does not touch still earn their share (otter gives partial credit).
    assert float(grade_rows(graded)[student][f"{chapter}:{question}"]) < feedback[question]["max_score"]
    assert hint in feedback[question]["output"]


@grading
def test_scores_and_feedback_equal_what_otter_run_gives(dist, graded, tmp_path):
    # otter run, the reference: the notebook and the tests in one kernel, unsandboxed. make grade
    # runs otter's own test files outside the sandbox, so both must agree question by question.
    chapter = WHOLE_NOTEBOOK_CHAPTERS[0]
    student = next(s for s, chapters in sorted(GRADED_PLANTED.items()) if chapter in chapters)
    notebook = tmp_path / student / f"{chapter}.ipynb"
    plant(dist / "student" / f"{chapter}.ipynb", GRADED_PLANTED[student][chapter], notebook)
    out = tmp_path / "otter"
    out.mkdir()
    by_otter = otter_run(dist / "autograder" / f"{chapter}.zip", notebook, out)
    ours = {q["name"]: q for q in json.loads((graded / student / f"{chapter}.json").read_text())["questions"]}
    assert set(ours) == set(by_otter)
    for name, question in ours.items():
        assert (question["score"], question["max_score"]) == (by_otter[name]["score"], by_otter[name]["max_score"])
        assert question["output"] == by_otter[name]["output"], name


@grading
def test_a_planted_mistake_costs_only_its_own_question(graded):
    # In the answers-only notebooks every other answer is the solution: full marks for those.
    rows = grade_rows(graded)
    kept = []
    for student, chapter, planted_questions in planted_in(ANSWERS_PLANTED_CHAPTERS):
        feedback = json.loads((graded / student / f"{chapter}.json").read_text())["questions"]
        kept += [(float(rows[student][f"{chapter}:{q['name']}"]), q["max_score"]) for q in feedback
                 if q["name"] not in planted_questions]
    assert kept and all(score == possible for score, possible in kept), kept


# --- every planted mistake against its public check, without otter ---------------------------
# Grading a class with otter runs each submission's whole chapter (training included), so the
# otter class above holds one planted student of three chapters; this test is where *every* planted mistake is
# matched with its hint quickly: each one runs, as the student's cell, in a namespace holding the
# chapter's imports, followed by the question's public tests exactly as otter runs them.

@pytest.mark.slow
@pytest.mark.parametrize(
    "student, chapter, name",
    [(s, c, n) for s, chapters in PLANTED.items() for c, functions in chapters.items() for n in functions],
)
def test_planted_mistake_fails_its_public_check_with_the_hint(student, chapter, name):
    code, question, hint = PLANTED[student][chapter][name]
    namespace = chapter_namespace(ROOT / "notebooks" / f"{chapter}.ipynb")
    exec(compile(code, f"<{student}'s {name}>", "exec"), namespace)
    tests = public_tests(ROOT / "notebooks" / f"{chapter}.ipynb")[question]
    messages = failures(tests, namespace, question)
    assert messages, f"{student}'s planted {name} passes the public tests of {question}"
    assert any(hint in message for message in messages), messages


def untouched_answers(student_notebook: pathlib.Path) -> dict[str, str]:
    """{question: the student notebook's answer cells, as handed out}: the code cells just before
    each ``grader.check("question")`` cell, back to the previous markdown or check cell."""
    answers: dict[str, str] = {}
    pending: list[str] = []
    for cell in nbformat.read(student_notebook, as_version=4).cells:
        check = re.fullmatch(r'grader\.check\("([^"]+)"\)', cell.source.strip()) if cell.cell_type == "code" else None
        if check:
            answers[check.group(1)] = "\n\n".join(pending)
            pending = []
        elif cell.cell_type == "code":
            pending.append(cell.source)
        else:
            pending = []
    return answers


@pytest.mark.slow
@pytest.mark.parametrize("master", CHAPTERS, ids=[m.stem for m in CHAPTERS])
def test_untouched_answers_fail_their_public_checks(dist, master):
    # Every question's answer as handed out ("..." in place of the solution) must fail its public
    # tests, as otter runs them: an exercise that a blank answer passes gives free points.
    answers = untouched_answers(dist / "student" / master.name)
    assert set(answers) == {name for name, _ in questions(master)}
    for question, tests in public_tests(master).items():
        namespace = chapter_namespace(master)
        exec(compile(answers[question], f"<untouched {question}>", "exec"), namespace)
        failures = 0
        for source in tests:
            try:
                exec(compile(exception_test_source(source), f"<{question} public test>", "exec"), namespace)
            except Exception:   # noqa: BLE001 - otter counts any exception as a failed test
                failures += 1
        assert failures, f"{master.stem}: the untouched answer to {question} passes its public tests"

