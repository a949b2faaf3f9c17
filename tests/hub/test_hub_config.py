"""The hub's configuration files, read as JupyterHub and Helm read them, and the hub test's skip.

deploy/jupyterhub/jupyterhub_config.py is loaded with traitlets' own loader (what ``jupyterhub -f``
does); deploy/jupyterhub/config.yaml (Zero to JupyterHub) is only parsed: no Kubernetes here.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import yaml
from traitlets.config.loader import PyFileConfigLoader

from tools import lab

from support import hub as hub_support

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "jupyterhub"


def load(path: pathlib.Path, monkeypatch, tmp_path, **environment):
    monkeypatch.setenv("ATTN_COURSE_HUB_STATE", str(tmp_path / "state"))
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return PyFileConfigLoader(path.name, str(path.parent)).load_config()


def test_each_users_server_is_the_courses_environment_offline(monkeypatch, tmp_path):
    config = load(DEPLOY / "jupyterhub_config.py", monkeypatch, tmp_path,
                  ATTN_COURSE_STUDENTS="ada, grace", ATTN_COURSE_INSTRUCTORS="turing")
    assert config.Spawner.cmd == [str(ROOT / ".venv" / "bin" / "jupyterhub-singleuser")]
    assert config.Spawner.default_url == "/lab"
    assert config.Spawner.args == lab.OFFLINE_FLAGS
    assert config.Spawner.environment["JUPYTER_PATH"] == str(ROOT / ".venv" / "share" / "jupyter")
    assert config.Spawner.environment["HF_HUB_OFFLINE"] == "1"
    assert config.Authenticator.allowed_users == {"ada", "grace"}
    assert config.Authenticator.admin_users == {"turing"}
    assert config.ConfigurableHTTPProxy.command == [str(DEPLOY / "node_modules" / ".bin" / "configurable-http-proxy")]
    # Its state goes where it is told, not into the checkout.
    assert config.JupyterHub.db_url == f"sqlite:///{tmp_path / 'state' / 'jupyterhub.sqlite'}"
    assert (tmp_path / "state").is_dir()


def test_the_idle_culler_runs_as_a_service_with_the_scopes_it_needs(monkeypatch, tmp_path):
    config = load(DEPLOY / "jupyterhub_config.py", monkeypatch, tmp_path, ATTN_COURSE_HUB_IDLE_SECONDS="1800")
    (service,) = config.JupyterHub.services
    assert service["command"][:3] == [sys.executable, "-m", "jupyterhub_idle_culler"]
    assert "--timeout=1800" in service["command"]
    (role,) = config.JupyterHub.load_roles
    assert role["services"] == [service["name"]]
    # jupyterhub-idle-culler's README: the scopes it needs to find idle servers and stop them.
    assert set(role["scopes"]) == {"list:users", "read:users:activity", "read:servers", "delete:servers"}
    completed = subprocess.run([sys.executable, "-m", "jupyterhub_idle_culler", "--help"],
                               capture_output=True, text=True)
    assert completed.returncode == 0 and "--timeout" in completed.stdout


def test_the_test_hub_is_the_deployed_one_with_a_test_login_and_homes(monkeypatch, tmp_path):
    config = load(ROOT / "tests" / "hub" / "jupyterhub_test_config.py", monkeypatch, tmp_path,
                  ATTN_COURSE_TEST_PASSWORD="p" * 16, ATTN_COURSE_TEST_HOMES=str(tmp_path / "homes"),
                  ATTN_COURSE_TEST_PORT="1", ATTN_COURSE_TEST_HUB_PORT="2", ATTN_COURSE_TEST_PROXY_API_PORT="3")
    assert config.JupyterHub.spawner_class == "simple"
    assert config.SimpleLocalProcessSpawner.home_dir_template == f"{tmp_path / 'homes'}/{{username}}"
    assert config.Spawner.cmd == [str(ROOT / ".venv" / "bin" / "jupyterhub-singleuser")]
    assert config.Spawner.args[:len(lab.OFFLINE_FLAGS)] == lab.OFFLINE_FLAGS
    for url in (config.JupyterHub.bind_url, config.JupyterHub.hub_bind_url, config.ConfigurableHTTPProxy.api_url):
        assert url.startswith("http://127.0.0.1:"), url         # loopback only


def test_zero_to_jupyterhub_values_say_the_same_as_one_machine():
    values = yaml.safe_load((DEPLOY / "config.yaml").read_text())
    assert values["hub"]["config"]["KubeSpawner"]["args"] == lab.OFFLINE_FLAGS
    assert values["singleuser"]["defaultUrl"] == "/lab"
    assert values["singleuser"]["extraEnv"]["NBGITPULLER_APP"] == "lab"
    assert values["cull"]["enabled"] is True
    # The image comes from binder/, whose postBuild installs nbgitpuller (the hub extra).
    assert '".[hub]"' in (ROOT / "binder" / "postBuild").read_text()


def test_the_proxy_is_pinned_and_installed_into_the_repository():
    package = json.loads((DEPLOY / "package.json").read_text())
    lock = json.loads((DEPLOY / "package-lock.json").read_text())
    wanted = package["dependencies"]["configurable-http-proxy"]
    assert lock["packages"]["node_modules/configurable-http-proxy"]["version"] == wanted
    assert "deploy/jupyterhub/node_modules/" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.parametrize("ci", [None, "false"])
def test_without_the_proxy_the_hub_test_skips_saying_how_to_enable_it(monkeypatch, tmp_path, ci):
    monkeypatch.setattr(hub_support, "PROXY", tmp_path / "node_modules" / ".bin" / "configurable-http-proxy")
    monkeypatch.setattr(hub_support, "ROOT", tmp_path)
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception) as skipped:
        hub_support.require_hub()
    assert str(skipped.value).startswith("hub tests skipped: no configurable-http-proxy at node_modules/.bin/")
    assert "make hub" in str(skipped.value) and "npm" in str(skipped.value)


def test_without_the_proxy_the_hub_test_fails_in_ci(monkeypatch, tmp_path):
    monkeypatch.setattr(hub_support, "PROXY", tmp_path / "configurable-http-proxy")
    monkeypatch.setattr(hub_support, "ROOT", tmp_path)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="hub tests cannot run in CI: no configurable-http-proxy"):
        hub_support.require_hub()
