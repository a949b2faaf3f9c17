"""What a sandbox's processes use, read from ``/proc``: its process tree, CPU time, threads and memory."""

from __future__ import annotations

import os


def process_tree(root: int) -> list[int]:
    """Process ``root`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                parent = int(_text(f"/proc/{entry.name}/stat").rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue                      # gone meanwhile, or not readable
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _summed(pids: list[int], value) -> int:
    """``value(pid)`` added up over ``pids``; a process gone meanwhile, or unreadable, counts 0."""
    total = 0
    for pid in pids:
        try:
            total += value(pid)
        except (OSError, IndexError, ValueError, StopIteration):
            pass
    return total


def _text(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def cpu_ticks(pids: list[int]) -> int:
    """CPU time of ``pids`` added up (user and system, in clock ticks): what they have computed so far."""
    return _summed(pids, lambda pid: sum(int(field) for field in
                                         _text(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[11:13]))


def task_count(pids: list[int]) -> int:
    """Processes and threads of ``pids`` (what RLIMIT_NPROC counts)."""
    return _summed(pids, lambda pid: len(os.listdir(f"/proc/{pid}/task")))


def resident_bytes(pids: list[int]) -> int:
    """Resident memory of ``pids`` added up (a page shared by several counts for each)."""
    page = os.sysconf("SC_PAGE_SIZE")
    return _summed(pids, lambda pid: int(_text(f"/proc/{pid}/statm").split()[1]) * page)


def proportional_bytes(pids: list[int]) -> int:
    """Proportional set size of ``pids`` added up: each shared page divided among its sharers."""
    return _summed(pids, lambda pid: next(int(line.split()[1]) * 1024 for line in
                                          _text(f"/proc/{pid}/smaps_rollup").splitlines() if line.startswith("Pss:")))


def address_space_bytes() -> int:
    """This process's address space (``VmSize`` of ``/proc/self/status``), what RLIMIT_AS counts."""
    for line in _text("/proc/self/status").splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise OSError("address_space_bytes: /proc/self/status has no VmSize")
