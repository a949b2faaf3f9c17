"""The course's hub configuration (deploy/jupyterhub/jupyterhub_config.py) as tests/hub/test_hub.py runs it.

Loaded as ``jupyterhub -f tests/hub/jupyterhub_test_config.py``; everything comes from the deployed
file but what a test machine cannot have, set from the environment the test gives it:

- system users and PAM: replaced by a shared password (SharedPasswordAuthenticator) for the
  students named in ATTN_COURSE_STUDENTS, and SimpleLocalProcessSpawner, which gives each user
  a home of their own under ATTN_COURSE_TEST_HOMES without creating system users (all servers
  run as the test's own Unix user: see INSTRUCTORS.md section 6 on what that does not isolate);
- the ports: the hub's, the proxy's API and the public one, free loopback ports chosen by the test.
"""

import os
import pathlib

c = get_config()  # noqa: F821 - JupyterHub's config loader defines get_config
ROOT = pathlib.Path(__file__).resolve().parents[2]
load_subconfig(str(ROOT / "deploy" / "jupyterhub" / "jupyterhub_config.py"))  # noqa: F821

c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = os.environ["ATTN_COURSE_TEST_PASSWORD"]
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = os.environ["ATTN_COURSE_TEST_HOMES"] + "/{username}"
if os.getuid() == 0:                          # CI runs as root: the servers then run as root too
    c.Spawner.args = [*c.Spawner.args, "--allow-root"]

c.JupyterHub.bind_url = f"http://127.0.0.1:{os.environ['ATTN_COURSE_TEST_PORT']}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{os.environ['ATTN_COURSE_TEST_HUB_PORT']}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ['ATTN_COURSE_TEST_PROXY_API_PORT']}"
c.Spawner.port = 0                            # each server on a random free port
c.JupyterHub.log_level = "INFO"
