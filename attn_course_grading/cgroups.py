"""A memory cgroup per sandbox: every byte a notebook holds, counted and bounded by the kernel.

``RLIMIT_AS`` bounds each process's address space and the grader's watch adds up their resident memory, but
pages of shared memory that no process maps (a ``memfd`` written and unmapped, a file on a ``tmpfs``) are in
no process's RSS and no address space: a notebook held 3 GiB that way under a 2 GiB limit. A memory cgroup
charges those pages to the group whose process made them. Each sandbox gets one, with the notebook's memory
limit; the grader reads what the group holds (anonymous and shared pages: the page cache of the libraries
it reads is the kernel's to reclaim) and, when the kernel's own limit was hit, reports the kill as memory.

cgroup v2 where the system has it (a group under ``/sys/fs/cgroup/attn-course``), else the v1 memory
controller (``/sys/fs/cgroup/memory/attn-course``); both need root. :func:`memory_accounting` says which,
or why neither, for the grader's report.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import time

__all__ = ["MemoryGroup", "available", "memory_accounting"]

_ROOT = pathlib.Path("/sys/fs/cgroup")
_NAMES = itertools.count()


def _hierarchy() -> tuple[str, pathlib.Path] | None:
    """("v2" or "v1", the course's parent group), where this process may make groups under it."""
    if os.geteuid() != 0:
        return None
    controllers = _ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return "v2", _ROOT / "attn-course"
    if (_ROOT / "memory" / "memory.limit_in_bytes").exists() and os.access(_ROOT / "memory", os.W_OK):
        return "v1", _ROOT / "memory" / "attn-course"
    return None


def available() -> bool:
    """Whether this process can give each sandbox a memory cgroup."""
    return _hierarchy() is not None


def memory_accounting() -> str:
    """One line for the grader's report: how a notebook's memory is counted here."""
    found = _hierarchy()
    if found is None:
        why = "not run as root" if os.geteuid() != 0 else "no writable cgroup memory controller"
        return (f"memory: each process's address space and their resident memory only ({why}): pages of "
                "shared memory or tmpfs that no process maps are not counted")
    version, parent = found
    return f"memory: a cgroup {version} per notebook (under {parent}), shared memory and tmpfs pages included"


class MemoryGroup:
    """One sandbox's memory cgroup, limited to ``limit_bytes``; None from :meth:`create` where there is none.

    The grader creates it, the sandbox's first process joins it before anything else runs (:meth:`join`,
    in ``preexec_fn``; every process it starts inherits it), the grader reads :meth:`held_bytes` and
    :meth:`killed_for_memory`, and :meth:`remove` deletes it once its processes are gone.
    """

    def __init__(self, version: str, path: pathlib.Path):
        self.version, self.path = version, path

    @classmethod
    def create(cls, limit_bytes: int) -> MemoryGroup | None:
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes <= 0:
            raise ValueError(f"MemoryGroup: limit_bytes must be a positive int, got {limit_bytes!r}")
        found = _hierarchy()
        if found is None:
            return None
        version, parent = found
        try:
            parent.mkdir(exist_ok=True)
            if version == "v2":
                for folder in (_ROOT, parent):          # the memory controller enabled for the groups below
                    (folder / "cgroup.subtree_control").write_text("+memory")
            path = parent / f"sandbox-{os.getpid()}-{next(_NAMES)}"
            path.mkdir()
            group = cls(version, path)
            if version == "v2":
                (path / "memory.max").write_text(str(limit_bytes))
                if (path / "memory.swap.max").exists():
                    (path / "memory.swap.max").write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                if (path / "memory.memsw.limit_in_bytes").exists():           # no swapping past the limit
                    (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        except OSError:
            return None                                  # a system that refuses: counted as having none
        return group

    def join(self) -> None:
        """Move the calling process into the group (the sandbox's first process, before it runs anything)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def _stat(self) -> dict[str, int]:
        try:
            lines = (self.path / "memory.stat").read_text().splitlines()
        except OSError:
            return {}
        return {name: int(value) for name, value in (line.split() for line in lines)}

    def held_bytes(self) -> int:
        """The anonymous and shared-memory pages the group holds now (not the page cache)."""
        stat = self._stat()
        if self.version == "v2":
            return stat.get("anon", 0) + stat.get("shmem", 0)
        return stat.get("total_rss", 0) + stat.get("total_shmem", 0)

    def killed_for_memory(self) -> bool:
        """Whether the kernel killed one of the group's processes at the group's limit."""
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        try:
            lines = (self.path / name).read_text().splitlines()
        except OSError:
            return False
        counts = {key: int(value) for key, value in (line.split() for line in lines)}
        return counts.get("oom_kill", 0) > 0

    def remove(self) -> None:
        """Delete the group (its processes have ended: a few tries while the kernel lets them go)."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)
