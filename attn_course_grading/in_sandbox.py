"""The program a submission runs in: execute the notebook, then answer the grader's calls.

    python -m attn_course_grading.in_sandbox [--user UID:GID] [--processes N] [--cell-seconds S]

Started by :class:`~attn_course_grading.remote.Submission`. It reads and writes
:mod:`~attn_course_grading.wire` messages (an 8-byte length, then the blob) on its standard input and
output: it reads ``{"cells": [...], "answers": [...]}``, runs the cells in one IPython namespace as a
kernel would (a cell that fails or runs past ``--cell-seconds`` is stopped, the next one runs), sends
the setup reply, then answers each call or read until its input ends (the replies' shapes:
:mod:`~attn_course_grading.replies`).

All of this runs in the student's process, so none of it is trusted: the grader checks every reply,
keeps a deadline on every request and reply, and scores in its own process. This program guarantees
only the sandbox's own limits, set before the first cell runs; it leaves the student's code no easy
handle on itself (the cell timer's handler, the request loop's names), but nothing relies on that.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import resource
import signal
import sys

import torch

from attn_course.checks.forbidden import Forbidden, watch_calls
from attn_course_grading import replies, wire

#: Cells that belong to otter's self-checks, not to the student's work: the grader does the checking.
OTTER_CELL = re.compile(r"(#[^\n]*\n)*import otter\ngrader = otter\.Notebook\([^\n]*\)"
                        r"|grader\.(check|check_all|export)\([^\n]*\)")
#: The exit status that says a cell reached the process limit (``os.fork`` failed with EAGAIN): the
#: grader's watch, ten looks a second, may miss a fork bomb that collapses between two looks.
PROCESS_LIMIT_EXIT = 75


def read_message(stream) -> object:
    """The next message on ``stream`` (EOFError when the grader closed it)."""
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError
    # int.from_bytes, not struct.unpack: a cell cannot replace a built-in type's method as it can
    # the struct module's attribute (and stall here, with the grader's request half written).
    return wire.decode(stream.read(int.from_bytes(header, "little")), objects=True)


def write_message(fd: int, value: object) -> None:
    """Send ``value`` on ``fd`` (a value that is not data as the TypeError the grader reports)."""
    try:
        blob = wire.encode(value)
    except wire.NotData as error:
        blob = wire.encode({"error": {"type": "TypeError", "message": f"it returned {error}"}})
    data = len(blob).to_bytes(8, "little") + blob
    while data:
        data = data[os.write(fd, data):]


MAIN_PROCESS = os.getpid()


def leave_if_forked() -> None:
    """A process the student forked that came back here exits (one process speaks to the grader);
    the main one collects its ended children, which count against the process limit until then."""
    if os.getpid() != MAIN_PROCESS:
        os._exit(0)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def kind_of(value: object) -> str:
    """How the grader reaches an answer: ``"kernel"`` (``kernel[grid](...)``), ``"function"`` or ``"value"``."""
    try:
        if hasattr(value, "__getitem__") and hasattr(value, "fn") and hasattr(value, "run"):
            return "kernel"                   # a @triton.jit function: launched as kernel[grid](...)
        return "function" if callable(value) else "value"
    except Exception:  # noqa: BLE001 - an object whose attributes raise is reached as a value, if at all
        return "value"


def run_cells(cells: list[str], cell_seconds: float) -> tuple[dict, list[dict]]:
    """Run each cell in one IPython namespace: ``(namespace, events)``, the events
    ``{"cell": index, "error": text}`` bounded as :func:`~attn_course_grading.replies.setup_reply` requires.

    A cell past ``cell_seconds`` is interrupted by SIGALRM, whose handler is the built-in
    :func:`signal.default_int_handler`: a built-in has no ``__globals__``, so a cell that asks
    ``signal.getsignal`` for it gets no way into this module. A KeyboardInterrupt once the timer has
    run out is the timeout.
    """
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance(colors="NoColor")
    events: list[dict] = []
    timed_out = f"CellTimedOut: stopped after {cell_seconds:g} s, the time limit of one cell"

    for index, source in enumerate(cells):
        if OTTER_CELL.fullmatch(source.strip()):
            continue
        leave_if_forked()
        signal.signal(signal.SIGALRM, signal.default_int_handler)
        signal.setitimer(signal.ITIMER_REAL, cell_seconds)
        try:
            try:
                result = shell.run_cell(source, store_history=False)
            finally:
                remaining = signal.setitimer(signal.ITIMER_REAL, 0)[0]
            error = result.error_in_exec or result.error_before_exec
        except KeyboardInterrupt as interrupt:   # raised outside IPython's own handler (or in the finally)
            remaining, error = 0.0, interrupt
        leave_if_forked()
        if isinstance(error, BlockingIOError) and error.errno == errno.EAGAIN:
            os._exit(PROCESS_LIMIT_EXIT)       # a fork refused at the limit: a fork bomb
        if error is not None:
            if isinstance(error, KeyboardInterrupt) and remaining == 0.0:
                text = timed_out
            else:
                text = f"{replies.safe_name(type(error).__name__)}: {_message(error, 300)}"
            if len(events) < replies.MAX_EVENTS - 1:
                events.append({"cell": index, "error": replies.safe_text(text, replies.MAX_TEXT_CHARS)})
            elif len(events) == replies.MAX_EVENTS - 1:
                events.append({"cell": index, "error": "this cell and every later one that failed (not listed)"})
        sys.stdout.flush()
    return shell.user_ns, events


def _message(error: BaseException, limit: int) -> str:
    """``str(error)``, safe and at most ``limit`` characters (a student's ``__str__`` may fail)."""
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - an exception whose text cannot be had is reported without it
        return "(its message could not be read)"
    return replies.safe_text(text if type(text) is str else "", limit)


def answer(namespace: dict, request: dict) -> dict:
    """One call of the grader: run it, and send back the value and any argument it changed."""
    name = request.get("call", request.get("get"))
    if name not in namespace:
        return {"error": {"type": "NameError", "message": f"name {name!r} is not defined"}}
    target = namespace[name]
    if "get" in request:
        return {"value": target, "after": [], "forbidden": []}
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
            return {"value": None, "after": [], "forbidden": _forbidden(seen)}
        if isinstance(error, wire.NotData):
            return {"error": {"type": "TypeError", "message": f"it returned {error}"}}
        return {"error": {"type": replies.safe_name(type(error).__name__),
                          "message": _message(error, replies.MAX_TEXT_CHARS)}}
    if request.get("index") is not None:
        # A kernel writes through pointers, which no version counter sees: every tensor goes back.
        after = [arg if isinstance(arg, torch.Tensor) else None for arg in args]
    else:
        # Only caches: the grader copies back nothing else of an ordinary call.
        after = [_changed(arg, version) for arg, version in zip(args, before)]
    return {"value": value, "after": after, "forbidden": _forbidden(seen)}


def _forbidden(seen: list) -> list[list[str]]:
    """The forbidden calls seen, as the grader accepts them: at most MAX_FORBIDDEN, names bounded."""
    return [[replies.safe_text(str(called), replies.MAX_CALLED_CHARS), rule.name]
            for called, rule in seen[:replies.MAX_FORBIDDEN]]


def _version(value: object) -> object:
    """What tells whether a call changed an argument that the grader copies back: a cache's length."""
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
    return wire.cache_state(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--user", help="UID:GID to become first (when started as root)")
    parser.add_argument("--processes", type=int, default=64, help="most processes and threads at once")
    parser.add_argument("--cell-seconds", type=float, default=300.0, help="time limit of one cell")
    args = parser.parse_args()
    if args.user:                      # started as root: become a user the kernel limits in processes
        uid, gid = (int(part) for part in args.user.split(":"))
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    # Counted per user namespace (one per sandbox, Linux >= 5.14): a fork bomb stops here.
    resource.setrlimit(resource.RLIMIT_NPROC, (args.processes, args.processes))

    # The messages keep standard input and output; the student's prints go to standard error.
    requests = os.fdopen(os.dup(0), "rb")
    reply_fd = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)

    # Bound before any cell runs: a cell that replaces this module's globals changes nothing here.
    read, write, respond, leave, kind = read_message, write_message, answer, leave_if_forked, kind_of
    setup = read(requests)
    namespace, events = run_cells(setup["cells"], args.cell_seconds)
    kinds = {name: kind(namespace[name]) if name in namespace else "missing" for name in setup["answers"]}
    write(reply_fd, {"events": events, "kinds": kinds})
    while True:
        try:
            request = read(requests)
        except EOFError:
            return 0
        reply = respond(namespace, request)
        leave()
        write(reply_fd, reply)


if __name__ == "__main__":
    sys.exit(main())
