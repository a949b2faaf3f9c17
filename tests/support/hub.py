"""A JupyterHub for tests/hub/test_hub.py, on loopback, and what a student does in it with Chromium.

The hub is ``jupyterhub -f tests/hub/jupyterhub_test_config.py``: the course's own configuration
(deploy/jupyterhub/jupyterhub_config.py) with a shared-password login and SimpleLocalProcessSpawner
homes under a temporary folder, its proxy the configurable-http-proxy that ``make hub`` or ``make test`` installed
from npm into deploy/jupyterhub/node_modules. Nothing here downloads anything.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import secrets
import socket
import subprocess
import sys
import time
from typing import NamedTuple

import psutil
import pytest

from helpers import in_ci
from support.browser import stop_server, wait_until_serving

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEST_CONFIG = ROOT / "tests" / "hub" / "jupyterhub_test_config.py"
PROXY = ROOT / "deploy" / "jupyterhub" / "node_modules" / ".bin" / "configurable-http-proxy"
HUB_SKIP = "hub tests skipped: "


def missing_hub() -> str | None:
    """Why the hub test cannot run here (no configurable-http-proxy, or no jupyterhub), with how to
    fix it; ``None`` when it can."""
    if not (PROXY.is_file() and os.access(PROXY, os.X_OK)):
        return (f"no configurable-http-proxy at {PROXY.relative_to(ROOT)}; enable them with `make hub` "
                "(it runs npm ci there; needs npm: `apt-get install npm`)")
    if not (pathlib.Path(sys.executable).parent / "jupyterhub").exists():
        return "jupyterhub is not installed; enable them with `make hub` (the hub extra)"
    return None


def require_hub() -> None:
    """Skip the hub test where it cannot run (fail in CI, where .ci/run installs npm and make the rest)."""
    reason = missing_hub()
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"hub tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(HUB_SKIP + reason)


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free at this moment."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


class Hub(NamedTuple):
    url: str                    # http://127.0.0.1:PORT, the proxy's public side
    password: str               # every student's (SharedPasswordAuthenticator)
    homes: pathlib.Path         # SimpleLocalProcessSpawner's home_dir_template's parent
    log: pathlib.Path
    started: float              # time.monotonic() when jupyterhub was started


@contextlib.contextmanager
def running_hub(folder: pathlib.Path, students: list[str]):
    """JupyterHub started on loopback for ``students``, its state, homes and log under ``folder``;
    stopped (and its servers and proxy with it) on leaving."""
    port, hub_port, proxy_api_port = free_ports(3)
    password = secrets.token_hex(16)
    homes, state, log = folder / "homes", folder / "hub-state", folder / "jupyterhub.log"
    homes.mkdir()
    environment = {**os.environ, "ATTN_COURSE_HUB_STATE": str(state), "ATTN_COURSE_STUDENTS": ",".join(students),
                   "ATTN_COURSE_TEST_PASSWORD": password, "ATTN_COURSE_TEST_HOMES": str(homes),
                   "ATTN_COURSE_TEST_PORT": str(port), "ATTN_COURSE_TEST_HUB_PORT": str(hub_port),
                   "ATTN_COURSE_TEST_PROXY_API_PORT": str(proxy_api_port)}
    environment.pop("JUPYTERHUB_API_TOKEN", None)
    command = [str(pathlib.Path(sys.executable).parent / "jupyterhub"), "-f", str(TEST_CONFIG)]
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as output:
        started = time.monotonic()
        hub = subprocess.Popen(command, cwd=folder, env=environment, stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_serving(f"{url}/hub/health", hub, seconds=60, poll=0.25,
                               problem=lambda: f"JupyterHub did not start:\n{log.read_text()[-3000:]}")
            yield Hub(url, password, homes, log, started)
        finally:
            stop_hub(hub)


def stop_hub(hub: subprocess.Popen) -> None:
    """Stop the hub and everything it started.

    JupyterHub stops its servers, proxy and services itself on SIGTERM, but it starts each of them
    in a session of its own, and a hub that does not finish its clean-up in time (seen here: it
    stopped at "Cleaning up 1 services...") leaves them running, ports and kernels included, after
    the test and after pytest. So its descendants are listed first, then stopped too.
    """
    try:
        started = psutil.Process(hub.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        started = []
    stop_server(hub)
    for process in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(started, timeout=10)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=10)


# --- a student in Chromium ----------------------------------------------------------------------


def log_in(page, hub: Hub, student: str) -> None:
    """On the hub's login page (where a link leads a student not yet logged in), log in."""
    page.wait_for_selector("#username_input")
    page.fill("#username_input", student)
    page.fill("#password_input", hub.password)
    page.click("#login_submit")


def code_cell(page, containing: str):
    """The code cell whose source contains ``containing`` (the first one)."""
    editor = page.locator(".jp-InputArea-editor", has_text=containing)
    return page.locator(".jp-Notebook .jp-CodeCell", has=editor).first


def start_cell(page, cell) -> None:
    """Run ``cell`` (select it, Shift+Enter) without waiting: JupyterLab queues it behind those
    already running, as when a student clicks ahead."""
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")


def wait_until_ran(page, cell) -> None:
    """Wait until ``cell``, never run before, has run: its prompt holds an execution count."""
    page.wait_for_function(
        "node => /\\[\\d+\\]/.test(node.querySelector('.jp-InputPrompt').textContent)",
        arg=cell.element_handle())


def replace_source(page, cell, source: str) -> None:
    """Replace ``cell``'s source by ``source``, as a student typing it would (no auto-indent)."""
    cell.scroll_into_view_if_needed()
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(source)
    page.keyboard.press("Escape")                                # back to command mode


def output_text(cell) -> str:
    return " ".join(cell.locator(".jp-OutputArea-output").all_text_contents())


def save(page) -> None:
    """Save the notebook open in ``page`` and wait until JupyterLab says it is saved."""
    page.keyboard.press("Control+s")
    page.wait_for_function("() => document.querySelector('.jp-mod-dirty') === null")


def notebook_opened(page, name: str) -> None:
    """Wait until JupyterLab shows the tab of notebook ``name``."""
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=re.compile(re.escape(name))).first.wait_for()
