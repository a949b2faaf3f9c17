"""tests/hub: the hub test and its pieces."""

# A JupyterHub configuration file, run by `jupyterhub -f`, not a module to import (--doctest-modules would).
collect_ignore = ["jupyterhub_test_config.py"]
