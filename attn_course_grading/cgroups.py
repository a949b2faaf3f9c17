"""A cgroup per sandbox: every byte a notebook holds counted and bounded, and its CPU capped, by the kernel.

``RLIMIT_AS`` bounds each process's address space and the grader's watch adds up their resident memory, but
pages of shared memory that no process maps (a ``memfd`` written and unmapped, a file on a ``tmpfs``) are in
no process's RSS and no address space: a notebook held 3 GiB that way under a 2 GiB limit. A memory cgroup
charges those pages to the group whose process made them. Each sandbox gets one, with the notebook's memory
limit; the grader reads what the group holds (anonymous and shared pages: the page cache of the libraries
it reads is the kernel's to reclaim) and, when the kernel's own limit was hit, reports the kill as memory.

The CPU controller caps each sandbox at its share of the cores (``Limits.threads``), and puts all of them
in one group beside the grader's own work: a notebook that starts a hundred busy processes takes its own
cores, not the machine.

cgroup v2 where the system has it (groups under ``/sys/fs/cgroup/attn-course``), else the v1 controllers
(``/sys/fs/cgroup/memory/attn-course`` and ``/sys/fs/cgroup/cpu/attn-course``); both need root.
:func:`accounting` says which, or why neither, for the grader's report.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import time

__all__ = ["SandboxGroup", "accounting", "available"]

_ROOT = pathlib.Path("/sys/fs/cgroup")
_PERIOD_MICROSECONDS = 100_000
_NAMES = itertools.count()


def _parents() -> tuple[str, dict[str, pathlib.Path]] | None:
    """("v2" or "v1", {controller: the course's parent group}) where this process may make groups."""
    if os.geteuid() != 0:
        return None
    controllers = _ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        found = {"memory": _ROOT / "attn-course"}
        if "cpu" in controllers.read_text().split():
            found["cpu"] = _ROOT / "attn-course"
        return "v2", found
    found = {name: _ROOT / name / "attn-course" for name, control in (("memory", "memory.limit_in_bytes"),
                                                                     ("cpu", "cpu.cfs_quota_us"))
             if (_ROOT / name / control).exists() and os.access(_ROOT / name, os.W_OK)}
    return ("v1", found) if "memory" in found else None


def _remove_stale(parent: pathlib.Path) -> None:
    """Delete the empty groups of graders that have ended (a group whose processes were still leaving when
    its grader removed it)."""
    for stale in parent.glob("sandbox-*"):
        owner = stale.name.split("-")[1]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            try:
                stale.rmdir()
            except OSError:
                pass


def available() -> bool:
    """Whether this process can give each sandbox a memory cgroup."""
    return _parents() is not None


def accounting() -> str:
    """One line for the grader's report: how a notebook's memory and CPU are bounded here."""
    found = _parents()
    if found is None:
        why = "not run as root" if os.geteuid() != 0 else "no writable cgroup memory controller"
        return (f"memory: each process's address space and their resident memory only ({why}): pages of "
                "shared memory or tmpfs that no process maps are not counted, and CPU is not capped per notebook")
    version, parents = found
    cpu = "its CPU capped at its share of the cores" if "cpu" in parents else "CPU not capped (no cpu controller)"
    return (f"memory: a cgroup {version} per notebook (under {parents['memory']}), shared memory and tmpfs pages "
            f"included; {cpu}")


class SandboxGroup:
    """One sandbox's cgroups: memory limited to ``memory_bytes``, CPU to ``cpus`` cores (where the system has a
    cpu controller); None from :meth:`create` where there is no memory controller to use.

    The grader creates it, the sandbox's first process joins it before anything else runs (:meth:`join`,
    in ``preexec_fn``; every process it starts inherits it), the grader reads :meth:`held_bytes` and
    :meth:`killed_for_memory`, and :meth:`remove` deletes it once its processes are gone.
    """

    def __init__(self, version: str, paths: dict[str, pathlib.Path]):
        self.version, self.paths = version, paths

    @classmethod
    def create(cls, memory_bytes: int, cpus: int) -> SandboxGroup | None:
        for name, value in (("memory_bytes", memory_bytes), ("cpus", cpus)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"SandboxGroup: {name} must be a positive int, got {value!r}")
        found = _parents()
        if found is None:
            return None
        version, parents = found
        name = f"sandbox-{os.getpid()}-{next(_NAMES)}"
        group = cls(version, {})
        try:
            for controller, parent in parents.items():
                parent.mkdir(exist_ok=True)
                _remove_stale(parent)
                if version == "v2":              # the controllers enabled for the groups below
                    for folder in (_ROOT, parent):
                        (folder / "cgroup.subtree_control").write_text(f"+{controller}")
                path = parent / name
                path.mkdir(exist_ok=True)
                group.paths[controller] = path
            memory, cpu = group.paths["memory"], group.paths.get("cpu")
            if version == "v2":
                (memory / "memory.max").write_text(str(memory_bytes))
                if (memory / "memory.swap.max").exists():
                    (memory / "memory.swap.max").write_text("0")
                if cpu is not None:
                    (cpu / "cpu.max").write_text(f"{cpus * _PERIOD_MICROSECONDS} {_PERIOD_MICROSECONDS}")
            else:
                (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
                if (memory / "memory.memsw.limit_in_bytes").exists():           # no swapping past the limit
                    (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                if cpu is not None:
                    (cpu / "cpu.cfs_period_us").write_text(str(_PERIOD_MICROSECONDS))
                    (cpu / "cpu.cfs_quota_us").write_text(str(cpus * _PERIOD_MICROSECONDS))
        except OSError:
            group.remove()
            return None                                  # a system that refuses: counted as having none
        return group

    def join(self) -> None:
        """Move the calling process into the groups (the sandbox's first process, before it runs anything)."""
        for path in dict.fromkeys(self.paths.values()):
            (path / "cgroup.procs").write_text(str(os.getpid()))

    def _read(self, name: str) -> dict[str, int]:
        try:
            lines = (self.paths["memory"] / name).read_text().splitlines()
        except OSError:
            return {}
        return {key: int(value) for key, value in (line.split() for line in lines)}

    def held_bytes(self) -> int:
        """The anonymous and shared-memory pages the group holds now (not the page cache)."""
        stat = self._read("memory.stat")
        if self.version == "v2":
            return stat.get("anon", 0) + stat.get("shmem", 0)
        return stat.get("total_rss", 0) + stat.get("total_shmem", 0)

    def killed_for_memory(self) -> bool:
        """Whether the kernel killed one of the group's processes at the group's memory limit."""
        return self._read("memory.events" if self.version == "v2" else "memory.oom_control").get("oom_kill", 0) > 0

    def remove(self) -> None:
        """Delete the groups (their processes have ended: a few tries while the kernel lets them go)."""
        for path in dict.fromkeys(self.paths.values()):
            for _ in range(100):                   # up to 5 s: a killed sandbox's processes leave at their pace
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
