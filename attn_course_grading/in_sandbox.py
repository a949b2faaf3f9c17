"""The program a submission runs in: execute the notebook, then answer the grader's calls.

    python -m attn_course_grading.in_sandbox [--user UID:GID] [--processes N] [--cell-seconds S]

Started by :class:`attn_course_grading.remote.Submission` inside the sandbox (or, for trusted
submissions, without one). It speaks :mod:`attn_course_grading.wire` messages, each an 8-byte
length and a blob, on its standard input and output:

1. the grader sends ``{"cells": [...], "answers": [...]}``: the notebook's code cells and the
   names of its exercise answers;
2. this program runs the cells one after the other in one IPython namespace, as a kernel would
   (a cell that fails or runs past ``--cell-seconds`` is stopped and the next one runs), and sends
   ``{"events": [...], "kinds": {name: "function" | "kernel" | "value" | "missing"}}``;
3. then, until its input ends, it answers ``{"call": name, "args": [...], ...}`` with
   ``{"value": ...}`` or ``{"error": {"type": ..., "message": ...}}``, and ``{"get": name}``
   with the value of a name.

Everything here runs in the student's process, so nothing here is trusted: the student's code
can change any of it. The grader treats every reply as data from the student, and scores in
its own process. What this program can still guarantee is the sandbox's own limits, which it
sets before the first cell runs and which no later code can raise.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import resource
import signal
import struct
import sys

import torch

from attn_course.checks.forbidden import Forbidden, watch_calls
from attn_course_grading import wire

#: Cells that belong to otter's self-checks, not to the student's work: the grader does the checking.
OTTER_CELL = re.compile(r"(# Initialize Otter\n)?import otter\ngrader = otter\.Notebook\([^\n]*\)"
                        r"|grader\.(check|check_all|export)\([^\n]*\)")


#: The exit status that says a cell reached the process limit (``os.fork`` failed with EAGAIN).
#: The grader's watch of the process count samples ten times a second and may miss a fork bomb
#: that reaches the limit and collapses between two looks; this program stops at once instead.
PROCESS_LIMIT_EXIT = 75


class CellTimedOut(BaseException):
    """Raised in a cell that ran past its time; a BaseException so that ``except Exception`` keeps it."""


def read_message(stream) -> object:
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError
    (length,) = struct.unpack("<Q", header)
    return wire.decode(stream.read(length), objects=True)


def write_message(fd: int, value: object) -> None:
    try:
        blob = wire.encode(value)
    except wire.NotData as error:
        blob = wire.encode({"error": {"type": "TypeError", "message": f"it returned {error}"}})
    data = struct.pack("<Q", len(blob)) + blob
    while data:
        data = data[os.write(fd, data):]


MAIN_PROCESS = os.getpid()


def leave_if_forked() -> None:
    """A process the student forked that came back here exits: only one process speaks to the
    grader. The main process collects its children that have ended (each would count against the
    process limit until it is collected)."""
    if os.getpid() != MAIN_PROCESS:
        os._exit(0)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def drop_privileges(user: str) -> None:
    """Become ``UID:GID`` (when started as root): a user the kernel limits in processes."""
    uid, gid = (int(part) for part in user.split(":"))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def kind_of(value: object) -> str:
    if hasattr(value, "__getitem__") and hasattr(value, "fn") and hasattr(value, "run"):
        return "kernel"                       # a @triton.jit function: launched as kernel[grid](...)
    return "function" if callable(value) else "value"


def run_cells(cells: list[str], cell_seconds: float) -> tuple[dict, list[dict]]:
    """Run each cell in one IPython namespace; return the namespace and what went wrong where."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance(colors="NoColor")
    events: list[dict] = []

    def stop(signum, frame):
        raise CellTimedOut(f"stopped after {cell_seconds:g} s, the time limit of one cell")

    for index, source in enumerate(cells):
        if OTTER_CELL.fullmatch(source.strip()):
            continue
        leave_if_forked()
        signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, cell_seconds)
        try:
            result = shell.run_cell(source, store_history=False)
        except CellTimedOut as error:          # raised outside IPython's own handler
            result, events = None, events + [{"cell": index, "error": str(error)}]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        leave_if_forked()
        error = result and (result.error_in_exec or result.error_before_exec)
        if isinstance(error, BlockingIOError) and error.errno == errno.EAGAIN:
            os._exit(PROCESS_LIMIT_EXIT)       # a fork refused at the limit: a fork bomb
        if error is not None:
            events.append({"cell": index, "error": f"{type(error).__name__}: {str(error)[:300]}"})
        sys.stdout.flush()
    return shell.user_ns, events


def answer(namespace: dict, request: dict) -> dict:
    """One call of the grader: run it, and send back the value and any argument it changed."""
    name = request.get("call", request.get("get"))
    if name not in namespace:
        return {"error": {"type": "NameError", "message": f"name {name!r} is not defined"}}
    target = namespace[name]
    if "get" in request:
        return {"value": target}
    args, kwargs = request.get("args", []), request.get("kwargs", {})
    before = [_version(arg) for arg in args]
    rules = [Forbidden(str(name), str(why)) for name, why in request.get("forbid") or []]
    seen: list = []
    try:
        with torch.set_grad_enabled(bool(request.get("grad", True))), watch_calls(rules) as seen:
            if request.get("index") is not None:
                target = target[request["index"]]
            value = target(*args, **kwargs)
        wire.encode(value)                    # data, or the error below
    except BaseException as error:  # noqa: BLE001 - the student's exception, whatever it is, goes back as data
        if rules and seen:              # a forbidden call came first: that is what the check reports
            return {"value": None, "after": [], "forbidden": [[called, rule.name] for called, rule in seen]}
        if isinstance(error, wire.NotData):
            return {"error": {"type": "TypeError", "message": f"it returned {error}"}}
        return {"error": {"type": type(error).__name__, "message": str(error)[:2000]}}
    if request.get("index") is not None:
        # A kernel writes its outputs through pointers, which no version counter sees: send back
        # every tensor it was given.
        after = [arg if isinstance(arg, torch.Tensor) else None for arg in args]
    else:
        after = [_changed(arg, version) for arg, version in zip(args, before)]
    return {"value": value, "after": after, "forbidden": [[called, rule.name] for called, rule in seen]}


def _version(value: object) -> object:
    """What tells whether a call changed an argument: a tensor's version counter, a cache's length."""
    if isinstance(value, torch.Tensor):
        return value._version
    if isinstance(value, (list, tuple)):
        return [_version(item) for item in value]
    if hasattr(value, "append") and hasattr(value, "attended_length"):
        return len(value)
    return None


def _changed(value: object, version: object) -> object:
    if isinstance(value, (list, tuple)):
        changed = [_changed(item, v) for item, v in zip(value, version)]
        return changed if any(item is not None for item in changed) else None
    if version is None or _version(value) == version:
        return None
    return wire.cache_state(value) if not isinstance(value, torch.Tensor) else value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--user", help="UID:GID to become first (when started as root)")
    parser.add_argument("--processes", type=int, default=64, help="most processes and threads at once")
    parser.add_argument("--cell-seconds", type=float, default=300.0, help="time limit of one cell")
    args = parser.parse_args()
    if args.user:
        drop_privileges(args.user)
    # Counted per user namespace (one per sandbox, Linux >= 5.14): a fork bomb stops here.
    resource.setrlimit(resource.RLIMIT_NPROC, (args.processes, args.processes))

    # The messages keep standard input and output; the student's prints go to standard error,
    # which the grader reads and cuts short.
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)

    setup = read_message(requests)
    namespace, events = run_cells(setup["cells"], args.cell_seconds)
    kinds = {name: kind_of(namespace[name]) if name in namespace else "missing" for name in setup["answers"]}
    write_message(replies, {"events": events, "kinds": kinds})
    while True:
        try:
            request = read_message(requests)
        except EOFError:
            return 0
        reply = answer(namespace, request)
        leave_if_forked()
        write_message(replies, reply)


if __name__ == "__main__":
    sys.exit(main())
