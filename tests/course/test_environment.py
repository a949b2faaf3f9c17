"""environment.yml (conda) and pyproject.toml (pip) must describe the same environment, and the
.venv that make builds leaves out what only slows every process down."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest
import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10, the course's floor: the same parser from PyPI (the test extra installs it)
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
# conda-forge names that differ from PyPI's.
CONDA_TO_PYPI = {"pytorch": "torch"}
NOT_DEPENDENCIES = {"python", "pip"}
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*([<>=!~][^;]*)?\s*(;.*)?$")


def _parse(requirement: str) -> tuple[str, str, str]:
    match = REQUIREMENT.match(requirement)
    assert match, f"cannot parse requirement {requirement!r}"
    name, version, marker = match.groups()
    name = name.lower().replace("_", "-")
    return CONDA_TO_PYPI.get(name, name), (version or "").replace(" ", ""), (marker or "").strip()


def _pyproject_requirements() -> dict[str, tuple[str, str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    parsed = [_parse(r) for r in requirements]
    return {name: (version, marker.replace('"', "'")) for name, version, marker in parsed}


def _environment_requirements() -> dict[str, tuple[str, str]]:
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert environment["channels"] == ["conda-forge"]
    requirements = []
    for entry in environment["dependencies"]:
        if isinstance(entry, dict):
            requirements += [r for r in entry["pip"] if not r.startswith("-e")]
        else:
            requirements.append(entry)
    parsed = [_parse(r) for r in requirements]
    return {
        name: (version, marker.replace('"', "'"))
        for name, version, marker in parsed
        if name not in NOT_DEPENDENCIES
    }


def test_environment_yml_and_pyproject_name_the_same_dependencies():
    pip_side, conda_side = _pyproject_requirements(), _environment_requirements()
    assert sorted(pip_side) == sorted(conda_side)


def test_environment_yml_and_pyproject_agree_on_versions_and_markers():
    pip_side, conda_side = _pyproject_requirements(), _environment_requirements()
    differing = {
        name: (pip_side[name], conda_side[name])
        for name in pip_side
        if name in conda_side and pip_side[name] != conda_side[name]
    }
    assert differing == {}


def test_environment_yml_installs_the_package_itself_editable():
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_entries = [e for e in environment["dependencies"] if isinstance(e, dict)][0]["pip"]
    assert "-e ." in pip_entries


def test_python_floor_is_the_same_in_both():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_python = [e for e in environment["dependencies"] if isinstance(e, str) and e.startswith("python")]
    assert conda_python == ["python" + project["requires-python"]]


def test_the_venv_imports_nbformat_without_building_iri_parsers():
    # The Makefile's SLOW_TO_IMPORT: with rfc3987-syntax installed, every import of nbformat (each
    # tool, each grading process, each JupyterLab server) builds its Lark parsers, 1.4 s here.
    if pathlib.Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip(f"not make's .venv: {sys.prefix}")
    code = "import sys, nbformat, jupyterlab.labapp; print(sorted(m for m in sys.modules if m.startswith('rfc3987')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded
