"""A submission running in its sandbox, and its exercise answers as proxies the grader calls.

:class:`Submission` starts :mod:`attn_course_grading.in_sandbox` (in the sandbox of
:mod:`attn_course_grading.sandbox`, or, trusted, without one), has it run the notebook, and keeps
it running while the checks call the answers. A check calls :class:`RemoteFunction` like the
student's own function: the arguments go to the submission as data, the answer comes back as
data (:mod:`attn_course_grading.wire`), and an exception in the student's code comes back as an
exception of the same name and message, so a check's diagnosis reads as it does in the notebook.

Nothing a reply says is trusted: a malformed, oversized or late reply stops the submission, and
every later call raises :class:`SubmissionStopped` (the question's tests fail, as they would if
the notebook had crashed).
"""

from __future__ import annotations

import builtins
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time

import torch

from attn_course_grading import in_sandbox, sandbox, wire

#: Exceptions from the student's code that come back as themselves; any other comes back as a
#: :class:`SubmissionError` subclass of the same name.
BUILTIN_ERRORS = {name: getattr(builtins, name) for name in (
    "ArithmeticError", "AssertionError", "AttributeError", "IndexError", "KeyError", "LookupError", "MemoryError",
    "NameError", "NotImplementedError", "OverflowError", "RecursionError", "RuntimeError", "TypeError",
    "UnboundLocalError", "ValueError", "ZeroDivisionError",
)}


class SubmissionError(Exception):
    """An exception raised by the student's code, of a type that is not a Python built-in."""


class SubmissionStopped(RuntimeError):
    """The submission's process is gone (killed at a limit, crashed, or stopped for a bad reply)."""


class Submission:
    """One notebook, run in a sandbox, whose answers the grader can call until :meth:`close`.

    Args:
        cells: the notebook's code cells, in order.
        answers: the names of its exercise answers (functions, or a Triton kernel).
        limits: :class:`~attn_course_grading.sandbox.Limits`.
        sandboxed: False runs the notebook without a sandbox (trusted code only): same protocol,
            same limits on time, memory and output, but with the network and the files the
            grader's user can reach.

    Attributes:
        events: what went wrong where while the notebook ran, as its process reported it.
        stopped: why the process stopped early, or None.
        output: the start of what the notebook printed.
    """

    def __init__(self, cells: list[str], answers: list[str], limits: sandbox.Limits, *, sandboxed: bool = True):
        if not all(isinstance(cell, str) for cell in cells):
            raise TypeError("Submission: cells must be a list of strings")
        self.limits, self.answers, self.events, self.kinds = limits, list(answers), [], {}
        self.stopped: str | None = None
        self.output_size = 0
        self._output = bytearray()
        command = [sys.executable, "-m", "attn_course_grading.in_sandbox", "--processes", str(limits.processes),
                   "--cell-seconds", str(limits.cell_seconds)]
        self._user = sandbox.SandboxUser() if sandboxed and os.geteuid() == 0 else None
        if sandboxed:
            if self._user:
                command += ["--user", f"{self._user.uid}:{sandbox.SANDBOX_GID}"]
            command = sandbox.sandbox_command(command, limits)
        self.started = time.monotonic()
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=sandbox.environment(limits), cwd="/", preexec_fn=limits.set_in_this_process,
            start_new_session=True,       # a process group of its own, killed whole (trusted runs too)
        )
        self._drain = threading.Thread(target=self._keep_output, daemon=True)
        self._drain.start()
        self.peak_memory_bytes, self.peak_tasks = 0, 0
        self._kill_lock = threading.Lock()
        self._watch = threading.Thread(target=self._watch_limits, daemon=True)
        self._watch.start()
        self._send({"cells": list(cells), "answers": self.answers})
        reply = self._receive(deadline=self.started + limits.seconds,
                              late=f"stopped after {limits.seconds:g} s, the time limit of the whole notebook")
        # The checks' calls of the answers get, in all, as long as the notebook had.
        self._calls_deadline = time.monotonic() + limits.seconds
        if isinstance(reply, dict):
            self.events = [event for event in reply.get("events", []) if isinstance(event, dict)][:100]
            kinds = reply.get("kinds", {})
            self.kinds = {name: kinds.get(name) if kinds.get(name) in ("function", "kernel", "value") else "missing"
                          for name in self.answers}

    @property
    def output(self) -> str:
        return self._output.decode("utf-8", "replace")

    def answer_values(self) -> dict[str, object]:
        """``{name: proxy or value}`` for each answer the notebook defines (a missing one is left out)."""
        found: dict[str, object] = {}
        for name, kind in self.kinds.items():
            if kind == "function":
                found[name] = RemoteFunction(self, name)
            elif kind == "kernel":
                found[name] = RemoteKernel(self, name)
            elif kind == "value":
                try:
                    found[name] = self.request({"get": name}).get("value")
                except Exception:  # noqa: BLE001 - a value that cannot cross is left out, as if undefined
                    pass
        return found

    def request(self, message: dict) -> object:
        """Send one call; return its value, or raise the student's exception."""
        if self.stopped:
            raise SubmissionStopped(f"your notebook's process had stopped: {self.stopped}")
        try:
            self._send(message)
        except wire.NotData as error:
            raise TypeError(f"the grader cannot send {error}") from None
        seconds, name = self.limits.call_seconds, message.get("call", message.get("get"))
        if time.monotonic() + seconds <= self._calls_deadline:
            deadline, late = time.monotonic() + seconds, f"a call of {name} ran past {seconds:g} s"
        else:
            deadline = self._calls_deadline
            late = f"the checks' calls of its answers ran past {self.limits.seconds:g} s in all"
        reply = self._receive(deadline=deadline, late=late)
        if reply is None:
            raise SubmissionStopped(f"your notebook's process had stopped: {self.stopped}")
        if not isinstance(reply, dict):
            self._stop("it sent a reply that is not a reply")
            raise SubmissionStopped(f"your notebook's process had stopped: {self.stopped}")
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            name, text = str(error.get("type", "Error")), str(error.get("message", ""))[:2000]
            kind = BUILTIN_ERRORS.get(name) or type(name if name.isidentifier() else "Error", (SubmissionError,), {})
            raise kind(text)
        return reply

    def close(self) -> None:
        """Kill the sandbox (and everything it started) and wait for it."""
        self._kill()
        with self._kill_lock:
            self._process.wait()
        if self._user:
            self._user.release()
            self._user = None
        self._drain.join(timeout=5)
        for stream in (self._process.stdin, self._process.stdout, self._process.stderr):
            try:
                stream.close()
            except OSError:
                pass

    def __enter__(self) -> Submission:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # --- the wire ---------------------------------------------------------------------------

    def _send(self, message: dict) -> None:
        blob = wire.encode(message, objects=True)
        try:
            self._process.stdin.write(struct.pack("<Q", len(blob)) + blob)
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            self._stop(self._exit_reason())

    def _receive(self, deadline: float, late: str) -> object:
        """The next reply, or None after stopping the process (late, gone, malformed)."""
        if self.stopped:
            return None
        try:
            header = self._read(8, deadline)
            if header is None:
                return self._stop(late)
            (length,) = struct.unpack("<Q", header)
            if length > wire.MAX_MESSAGE_BYTES:
                return self._stop(f"it sent a reply of {length} bytes, more than {wire.MAX_MESSAGE_BYTES}")
            blob = self._read(length, deadline)
            if blob is None:
                return self._stop(late)
            return wire.decode(blob)
        except EOFError:
            return self._stop(self._exit_reason())
        except ValueError as error:
            return self._stop(f"it sent a reply that is not data ({error})")

    def _read(self, size: int, deadline: float) -> bytes | None:
        fd, data = self._process.stdout.fileno(), bytearray()
        while len(data) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, min(size - len(data), 1 << 20))
            if not chunk:
                raise EOFError
            data += chunk
        return bytes(data)

    def _stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
        self._kill()
        return None

    def _kill(self) -> None:
        """SIGKILL to the whole process group. In the sandbox, bubblewrap's death ends its process
        namespace, and every process in it; trusted, this ends what the notebook started too."""
        # Under the lock, and only while the process is not yet collected: once collected, its
        # number may be given to another process, whose group must never be killed.
        with self._kill_lock:
            if self._process.poll() is None:
                try:
                    os.killpg(self._process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def _exit_reason(self) -> str:
        try:
            code = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "its process stopped answering"
        if code == in_sandbox.PROCESS_LIMIT_EXIT:
            return f"it reached its limit of {self.limits.processes} processes and threads"
        if code < 0:
            names = {9: "SIGKILL", 24: "SIGXCPU (the CPU time limit)", 11: "SIGSEGV"}
            return f"its process was killed by signal {names.get(-code, -code)}"
        return f"its process exited with code {code}"

    def _watch_limits(self, every: float = 0.1) -> None:
        """Kill the sandbox when all its processes together hold more than ``memory_bytes``, or
        when it reaches its limit of processes (checked 10 times a second: one check reads /proc,
        about 2–4 ms).

        Each process is held to that address space by RLIMIT_AS, but a notebook that forks many
        could still add up to more than the machine has; without cgroups, this watch is the limit
        on the sum, and it may be passed for a moment. A notebook at its process limit is a fork
        bomb: its processes, each busy forking, would take the CPU from every other notebook graded
        at the same time, so it is stopped at once (the chapters use a few dozen at most).
        """
        while self._process.poll() is None:
            pids = process_tree(self._process.pid)
            tasks = task_count(pids)
            self.peak_tasks = max(self.peak_tasks, tasks)
            # A bomb's processes come and go as each fails to fork and exits: stopped when they fill
            # most of the limit (90%), which no chapter comes near, not only at the limit itself.
            if tasks >= 0.9 * self.limits.processes:
                self._stop(f"it reached its limit of {self.limits.processes} processes and threads")
                return
            resident = resident_bytes(pids)
            if resident > self.limits.memory_bytes:
                # Resident memory counts the pages forked processes share once per process; the
                # proportional share (PSS) counts each page once: slower to read, so read only now.
                resident = proportional_bytes(pids)
            self.peak_memory_bytes = max(self.peak_memory_bytes, resident)
            if resident > self.limits.memory_bytes:
                self._stop(f"its processes together used more than {self.limits.memory_bytes / 2**30:g} GiB "
                           "of memory, the limit")
                return
            time.sleep(every)

    def _keep_output(self) -> None:
        """Read everything the notebook prints; keep the first ``output_bytes``."""
        stream = self._process.stderr
        while chunk := stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16):
            self.output_size += len(chunk)
            room = self.limits.output_bytes - len(self._output)
            if room > 0:
                self._output += chunk[:room]


def process_tree(root: int) -> list[int]:
    """Process ``root`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue                      # gone meanwhile, or not readable
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def task_count(pids: list[int]) -> int:
    """Processes and threads of ``pids`` (what RLIMIT_NPROC counts)."""
    count = 0
    for pid in pids:
        try:
            count += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    return count


def resident_bytes(pids: list[int]) -> int:
    """Resident memory of ``pids`` added up (a page shared by several counts for each)."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as handle:
                total += int(handle.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total


def proportional_bytes(pids: list[int]) -> int:
    """Proportional set size of ``pids`` added up: each shared page divided among its sharers."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                for line in handle:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, IndexError, ValueError):
            pass
    return total


class RemoteFunction:
    """The student's function ``name``, called in their sandbox: data in, data out.

    Arguments the call changes in place (tensors, caches) are changed here too, and grad mode
    is the caller's, so a check sees what it would see calling the function in the notebook.
    """

    def __init__(self, submission: Submission, name: str, index: object = None):
        self._submission, self.__name__, self._index = submission, name, index

    def __call__(self, *args, **kwargs):
        reply = self._submission.request({"call": self.__name__, "index": self._index, "args": list(args),
                                          "kwargs": kwargs, "grad": torch.is_grad_enabled()})
        for original, after in zip(args, reply.get("after") or []):
            if after is not None:
                wire.update_in_place(original, after)
        return reply.get("value")

    def call_watching(self, rules: list, *args):
        """Call it under the exercise's rules of what it may not call, watched in the sandbox
        (:func:`attn_course.checks.forbidden.watch_calls`, where the answer runs).

        Returns:
            ``(value, seen)``: what it returned, and ``(what was called, the rule)`` for each
            forbidden call, as :func:`~attn_course.checks.forbidden.watch_calls` records them.
        """
        reply = self._submission.request({"call": self.__name__, "index": self._index, "args": list(args),
                                          "kwargs": {}, "grad": torch.is_grad_enabled(),
                                          "forbid": [[rule.name, rule.why] for rule in rules]})
        for original, after in zip(args, reply.get("after") or []):
            if after is not None:
                wire.update_in_place(original, after)
        by_name = {rule.name: rule for rule in rules}
        seen = [(str(called), by_name[name]) for called, name in reply.get("forbidden") or []
                if isinstance(called, str) and name in by_name]
        return reply.get("value"), seen

    def __repr__(self) -> str:
        return f"<the submission's {self.__name__}>"


class RemoteKernel:
    """The student's ``@triton.jit`` kernel: ``kernel[grid](...)`` launches it in their sandbox
    (in Triton's interpreter) and copies the tensors it wrote back into the caller's."""

    def __init__(self, submission: Submission, name: str):
        self._submission, self.__name__ = submission, name
        self.fn = None        # JITFunction's attribute that launchers look for

    def __getitem__(self, grid) -> RemoteFunction:
        return RemoteFunction(self._submission, self.__name__, index=grid)

    def __repr__(self) -> str:
        return f"<the submission's kernel {self.__name__}>"
