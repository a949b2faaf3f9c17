"""JupyterHub for this course on one machine: every student's server runs the course's .venv.

    make venv                                   # the course's .venv (make hub adds the hub extra and the proxy)
    make hub                                    # = .venv/bin/jupyterhub -f deploy/jupyterhub/jupyterhub_config.py

What it sets (INSTRUCTORS.md section 6 says how to run a class with it):

- each user's server is ``.venv/bin/jupyterhub-singleuser`` of this checkout, so the kernel
  "python3" is the course's own (registered inside .venv by ``make venv``, with the display name
  the chapters carry), JupyterLab is the interface (``/lab``), and JupyterLab's settings are the
  course's (tools/jupyterlab-overrides.json, copied into .venv by ``make venv``: no news feed),
  with tools/lab.py's offline flags (no update check, no news, no extension catalogue);
- nbgitpuller (installed in .venv, the ``hub`` extra) opens what it pulls in JupyterLab;
- the idle culler (jupyterhub-idle-culler) stops a server idle for
  ``ATTN_COURSE_HUB_IDLE_SECONDS`` (default 3600); the files stay in the home;
- configurable-http-proxy is the one ``make venv`` installed in deploy/jupyterhub/node_modules;
- the hub's database, cookie secret and the proxy's pid file go in ``ATTN_COURSE_HUB_STATE``
  (default: .hub-state/ in the checkout, git-ignored).

Users: by default system users, logged in with their own password (PAM) and each server run as
that user (LocalProcessSpawner), so a student's kernel cannot read another's home. The students
and instructors allowed in are named in ``ATTN_COURSE_STUDENTS`` and ``ATTN_COURSE_INSTRUCTORS``
(comma-separated; instructors are the hub's admins). The hub listens on
``ATTN_COURSE_HUB_BIND_URL`` (default ``http://127.0.0.1:8000``: put TLS in front of it, or
give it a certificate with ``c.JupyterHub.ssl_cert``/``ssl_key``, before opening it to a class).

tests/hub/test_hub.py starts exactly this file (tests/hub/jupyterhub_test_config.py loads it, then
puts a test authenticator and SimpleLocalProcessSpawner in place of PAM and system users).
"""

import importlib.util
import os
import pathlib
import sys

c = get_config()  # noqa: F821 - JupyterHub's config loader defines get_config

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VENV = ROOT / ".venv"
STATE = pathlib.Path(os.environ.get("ATTN_COURSE_HUB_STATE") or ROOT / ".hub-state")
STATE.mkdir(parents=True, exist_ok=True)


def _names(variable):
    return {name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()}


def _offline_flags():
    """tools/lab.py's OFFLINE_FLAGS: the one list of JupyterLab's offline flags, `make lab`'s too."""
    spec = importlib.util.spec_from_file_location("attn_course_lab", ROOT / "tools" / "lab.py")
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)
    return list(lab.OFFLINE_FLAGS)


# --- the hub and its proxy ------------------------------------------------------------------------
c.JupyterHub.bind_url = os.environ.get("ATTN_COURSE_HUB_BIND_URL", "http://127.0.0.1:8000")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")
c.ConfigurableHTTPProxy.command = [str(HERE / "node_modules" / ".bin" / "configurable-http-proxy")]

# --- users ----------------------------------------------------------------------------------------
c.JupyterHub.authenticator_class = "pam"
c.JupyterHub.spawner_class = "localprocess"
c.Authenticator.allowed_users = _names("ATTN_COURSE_STUDENTS")
c.Authenticator.admin_users = _names("ATTN_COURSE_INSTRUCTORS")

# --- each user's server: the course's environment, JupyterLab, offline ---------------------------
c.Spawner.cmd = [str(VENV / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.args = _offline_flags()
c.Spawner.environment = {
    # The .venv's kernel "python3" and JupyterLab settings first (as tools/lab.py does for `make lab`).
    "JUPYTER_PATH": str(VENV / "share" / "jupyter"),
    "HF_HUB_OFFLINE": "1",
    "PYTHONHASHSEED": "0",
    "OMP_WAIT_POLICY": "PASSIVE",
    # nbgitpuller's status page sends the student to JupyterLab, not the classic notebook.
    "NBGITPULLER_APP": "lab",
}
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 60

# --- the idle culler: a server idle this long is stopped (its files stay) ----------------------------
IDLE_SECONDS = int(os.environ.get("ATTN_COURSE_HUB_IDLE_SECONDS", "3600"))
c.JupyterHub.load_roles = [{
    "name": "attn-course-idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}]
c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={IDLE_SECONDS}",
                f"--cull-every={max(60, min(600, IDLE_SECONDS // 4))}"],
}]
