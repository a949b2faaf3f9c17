"""A submission running in its sandbox, which the grader sends calls and reads replies from.

:class:`Submission` starts :mod:`~attn_course_grading.in_sandbox` (in the sandbox, or, trusted,
without one), has it run the notebook, and keeps it running while the checks call its answers
(:mod:`~attn_course_grading.proxies`). Nothing a reply says is trusted: a malformed
(:mod:`~attn_course_grading.replies`), oversized or late reply stops the submission, and so does a
request it does not read in time (writes have the same deadlines as reads, so a submission that
stops reading cannot block the grader), or processes that together pass their memory or fill their
process limit. Every later call raises :class:`SubmissionStopped`, as if the notebook had crashed.
"""

from __future__ import annotations

import builtins
import collections
import os
import select
import signal
import subprocess
import sys
import threading
import time

from attn_course_grading import cgroups, in_sandbox, proc, replies, sandbox, syscalls, wire

#: The student's exceptions that come back as themselves; any other as a :class:`SubmissionError` of its name.
BUILTIN_ERRORS = {name: getattr(builtins, name) for name in (
    "ArithmeticError", "AssertionError", "AttributeError", "IndexError", "KeyError", "LookupError", "MemoryError",
    "NameError", "NotImplementedError", "OverflowError", "RecursionError", "RuntimeError", "TypeError",
    "UnboundLocalError", "ValueError", "ZeroDivisionError",
)}


#: The share of one core under which a sandbox the grader waits for counts as idle (``Limits.idle_seconds``).
IDLE_SHARE = 0.01


class SubmissionError(Exception):
    """An exception raised by the student's code, of a type that is not a Python built-in."""


class SubmissionStopped(RuntimeError):
    """The submission's process is gone (killed at a limit, crashed, or stopped for a bad reply)."""


class Submission:
    """One notebook, run in a sandbox, whose answers the grader can call until :meth:`close`.

    Args:
        cells, answers: the notebook's code cells, in order, and the names of its exercise answers.
        limits: :class:`~attn_course_grading.sandbox.Limits`.
        sandboxed: False (trusted code only) runs it without a sandbox, under the same limits.

    Attributes:
        events: the cells that failed and why (:func:`~attn_course_grading.replies.setup_reply`).
        kinds: ``{answer: "function" | "kernel" | "value" | "missing"}``; empty if stopped before.
        stopped: why the process stopped early, or None.
        output: the start of what the notebook printed.

    Raises:
        TypeError: an argument of the wrong type. Nothing a submission does makes the constructor
            raise (a bad setup reply sets ``stopped``); if it raises, its process is killed first.
    """

    def __init__(self, cells: list[str], answers: list[str], limits: sandbox.Limits, *, sandboxed: bool = True):
        if not isinstance(cells, (list, tuple)) or not all(type(cell) is str for cell in cells):
            raise TypeError("Submission: cells must be a list of strings")
        if isinstance(answers, str) or not all(type(name) is str and name.isidentifier() for name in answers):
            raise TypeError("Submission: answers must be a list of names (identifiers)")
        if not isinstance(limits, sandbox.Limits):
            raise TypeError(f"Submission: limits must be a sandbox.Limits, got {type(limits).__name__}")
        if not isinstance(sandboxed, bool):
            raise TypeError(f"Submission: sandboxed must be a bool, got {type(sandboxed).__name__}")
        self.limits, self.answers, self.events, self.kinds = limits, list(answers), [], {}
        # The source as submitted: the grader reads what each answer calls from it (proxies.py).
        self.cells = list(cells)
        self.stopped: str | None = None
        self.output_size = 0
        self._output = bytearray()
        self.peak_memory_bytes, self.peak_tasks = 0, 0
        self._idle_since: float | None = None      # since when the grader waits for the sandbox (or None)
        self._kill_lock = threading.Lock()
        command = [sys.executable, "-m", "attn_course_grading.in_sandbox", "--processes", str(limits.processes),
                   "--cell-seconds", str(limits.cell_seconds)]
        self._user = sandbox.SandboxUser() if sandboxed and os.geteuid() == 0 else None
        syscall_filter = syscalls.filter_descriptor() if sandboxed else None
        # Every byte the notebook holds, shared memory included, and its cores, in cgroups (where this system
        # has them). The kernel's memory limit a quarter above the grader's watch: the backstop for what grows
        # faster than the watch's tenth of a second.
        self._cgroup = cgroups.SandboxGroup.create(limits.memory_bytes * 5 // 4, limits.threads) \
            if sandboxed else None

        def start_sandbox() -> None:              # in the new process, before bubblewrap runs
            limits.set_in_this_process()
            if self._cgroup is not None:
                self._cgroup.join()

        try:
            if sandboxed:
                if self._user:
                    command += ["--user", f"{self._user.uid}:{sandbox.SANDBOX_GID}"]
                command = sandbox.sandbox_command(command, limits, syscall_filter=syscall_filter)
            self.started = time.monotonic()
            self._process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=sandbox.environment(limits), cwd="/", preexec_fn=start_sandbox,
                start_new_session=True,       # a process group of its own, killed whole (trusted runs too)
                pass_fds=() if syscall_filter is None else (syscall_filter,),
            )
        except BaseException:
            self._release_user()
            if self._cgroup is not None:
                self._cgroup.remove()
            raise
        finally:
            if syscall_filter is not None:
                os.close(syscall_filter)      # bubblewrap has its own copy
        # From here on a process is running: whatever goes wrong, it is killed before the exception
        # leaves (the caller's `with` has not started yet).
        try:
            self._requests = self._process.stdin.fileno()
            os.set_blocking(self._requests, False)
            self._drain = threading.Thread(target=self._keep_output, daemon=True)
            self._drain.start()
            threading.Thread(target=self._watch_limits, daemon=True).start()
            deadline = self.started + limits.seconds
            late = f"stopped after {limits.seconds:g} s, the time limit of the whole notebook"
            if self._send(wire.encode({"cells": list(cells), "answers": self.answers}), deadline, late):
                reply = self._receive(deadline=deadline, late=late)
                if reply is not None:
                    try:
                        self.events, self.kinds = replies.setup_reply(reply, self.answers, len(cells))
                    except replies.MalformedReply as error:
                        self._stop(f"it sent a malformed reply ({error})")
            # The checks' calls of the answers get, in all, as long as the notebook had.
            self._calls_deadline = time.monotonic() + limits.seconds
        except BaseException:
            self.close()
            raise

    @property
    def output(self) -> str:
        return self._output.decode("utf-8", "replace")

    def request(self, message: dict) -> dict:
        """Send one call (``{"call": name, "args": [...], ...}``) or read (``{"get": name}``).

        Returns:
            The checked reply (:func:`~attn_course_grading.replies.call_reply`).

        Raises:
            TypeError: ``message`` is not a call or a read, or holds what cannot be sent.
            SubmissionStopped: the process had stopped, or stops now (late, gone, malformed reply).
            the student's exception: of its type (:data:`BUILTIN_ERRORS`, else a
                :class:`SubmissionError` of its name), with its message.
        """
        if not isinstance(message, dict) or not (type(message.get("call")) is str or type(message.get("get")) is str):
            raise TypeError("Submission.request: message must be a dict with a 'call' or 'get' name")
        if self.stopped:
            raise SubmissionStopped(f"your notebook's process had stopped: {self.stopped}")
        try:
            blob = wire.encode(message, objects=True)
        except wire.NotData as error:
            raise TypeError(f"the grader cannot send {error}") from None
        seconds, name = self.limits.call_seconds, message.get("call", message.get("get"))
        what = f"a call of {name}" if "call" in message else f"reading {name}"
        if time.monotonic() + seconds <= self._calls_deadline:
            deadline, late = time.monotonic() + seconds, f"{what} ran past {seconds:g} s"
        else:
            deadline = self._calls_deadline
            late = f"the checks' calls of its answers ran past {self.limits.seconds:g} s in all"
        # One deadline for the request and its reply: writing it counts against the call's time.
        reply = self._receive(deadline=deadline, late=late) if self._send(blob, deadline, late) else None
        if reply is None:
            raise SubmissionStopped(f"your notebook's process had stopped: {self.stopped}")
        rules = [pair[0] for pair in message.get("forbid") or []]
        try:
            reply = replies.call_reply(reply, arguments=len(message.get("args") or []), rules=rules)
        except replies.MalformedReply as error:
            self._stop(f"it sent a malformed reply to {what} ({error})")
            raise SubmissionStopped(f"your notebook's process had stopped: {self.stopped}") from None
        if "error" in reply:
            error_name, text = reply["error"]["type"], reply["error"]["message"]
            kind = BUILTIN_ERRORS.get(error_name) or type(error_name, (SubmissionError,), {})
            raise kind(text)
        return reply

    def close(self) -> None:
        """Kill the sandbox (and everything it started) and wait for it."""
        self._kill()
        with self._kill_lock:
            self._process.wait()
        self._release_user()
        if self._cgroup is not None:
            self._cgroup.remove()
        if hasattr(self, "_drain"):
            self._drain.join(timeout=5)
        for stream in (self._process.stdin, self._process.stdout, self._process.stderr):
            try:
                stream.close()
            except OSError:
                pass

    def _release_user(self) -> None:
        if self._user:
            self._user.release()
            self._user = None

    def __enter__(self) -> Submission:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _send(self, blob: bytes, deadline: float, late: str) -> bool:
        """Write one request by ``deadline`` on the non-blocking pipe; False after stopping the
        process (gone, or not reading: ``late`` says why)."""
        if self.stopped:
            return False
        pending = [memoryview(len(blob).to_bytes(8, "little")), memoryview(blob)]
        poll = select.poll()
        poll.register(self._requests, select.POLLOUT)      # poll, not select: no limit on the fd's number
        while pending:
            try:
                written = os.write(self._requests, pending[0][:1 << 16])
            except BlockingIOError:
                # The pipe is full: wait until it drains, up to the deadline. (Write first, poll only
                # then: a pipe reports itself writable only with a slot free, though a write may fit.)
                left = deadline - time.monotonic()
                if left <= 0 or not poll.poll(max(1, int(left * 1000))):
                    if time.monotonic() >= deadline:
                        self._stop(f"it stopped reading the grader's requests: {late}")
                        return False
                continue
            except OSError:                                # EPIPE: its end is closed, it is gone
                self._stop(self._exit_reason())
                return False
            pending[0] = pending[0][written:]
            if not len(pending[0]):
                pending.pop(0)
        return True

    def _receive(self, deadline: float, late: str) -> object:
        """The next reply, decoded, or None after stopping the process (late, gone, malformed)."""
        if self.stopped:
            return None
        self._idle_since = time.monotonic()
        try:
            header = self._read(8, deadline)
            if header is None:
                return self._stop(late)
            length = int.from_bytes(header, "little")
            if length > wire.MAX_MESSAGE_BYTES:
                return self._stop(f"it sent a reply of {length} bytes, more than {wire.MAX_MESSAGE_BYTES}")
            blob = self._read(length, deadline)
            if blob is None:
                return self._stop(late)
            return wire.decode(blob)
        except EOFError:
            return self._stop(self._exit_reason())
        except Exception as error:  # noqa: BLE001 - whatever a reply does to the reader, it stops that notebook
            return self._stop(f"it sent a malformed reply (not data: {type(error).__name__}: {error})")
        finally:
            self._idle_since = None

    def _read(self, size: int, deadline: float) -> bytes | None:
        fd, data = self._process.stdout.fileno(), bytearray()
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        while len(data) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not poll.poll(max(1, int(left * 1000))):
                return None
            chunk = os.read(fd, min(size - len(data), 1 << 20))
            if not chunk:
                raise EOFError
            data += chunk
        return bytes(data)

    def _stop(self, reason: str) -> None:
        if self.stopped is None:
            # The reason may quote the reply: kept safe and short for the results file.
            self.stopped = replies.safe_text(str(reason), replies.MAX_TEXT_CHARS)
        self._kill()
        return None

    def _kill(self) -> None:
        """SIGKILL to the whole process group (in the sandbox, bubblewrap's death ends its process
        namespace). Only while the process is not yet collected: its number may then be reused."""
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
        if self._cgroup is not None and self._cgroup.killed_for_memory():
            return (f"its processes together used more than {self.limits.memory_bytes / 2**30:g} GiB of memory, "
                    "the limit (shared memory and tmpfs files included)")
        if code == in_sandbox.PROCESS_LIMIT_EXIT:
            return f"it reached its limit of {self.limits.processes} processes and threads"
        if code < 0:
            names = {9: "SIGKILL", 24: "SIGXCPU (the CPU time limit)", 11: "SIGSEGV"}
            return f"its process was killed by signal {names.get(-code, -code)}"
        return f"its process exited with code {code}"

    def _watch_limits(self) -> None:
        """Kill the sandbox when its processes together hold more than ``memory_bytes`` (RLIMIT_AS
        holds each one; without cgroups this is the limit on their sum, passed for a moment at most)
        or fill its process limit (a fork bomb takes the CPU from every notebook graded beside it).
        Checked 10 times a second: one check reads /proc in 2-4 ms. And stop it when, while the grader waits
        for it, its processes use less than :data:`IDLE_SHARE` of a core for ``idle_seconds`` (the timers of its
        cells are its own, and a notebook that sleeps holds a grading slot from the class)."""
        samples: collections.deque = collections.deque()          # (when, CPU ticks) while the grader waits
        idle_ticks = IDLE_SHARE * self.limits.idle_seconds * os.sysconf("SC_CLK_TCK")
        while self._process.poll() is None:
            pids = proc.process_tree(self._process.pid)
            now = time.monotonic()
            if self._idle_since is None:
                samples.clear()
            else:
                ticks = proc.cpu_ticks(pids)
                samples.append((now, ticks))
                while len(samples) > 1 and samples[1][0] <= now - self.limits.idle_seconds:
                    samples.popleft()                      # one sample kept at the window's start
                first_when, first_ticks = samples[0]
                if now - first_when >= self.limits.idle_seconds and ticks - first_ticks < idle_ticks:
                    self._stop(f"it used next to no CPU for {self.limits.idle_seconds:g} s while the grader "
                               "waited for it (a notebook that sleeps holds a grading slot from the class)")
                    return
            tasks = proc.task_count(pids)
            self.peak_tasks = max(self.peak_tasks, tasks)
            # A bomb's processes come and go as each fails to fork: stopped at 90% of the limit.
            if tasks >= 0.9 * self.limits.processes:
                self._stop(f"it reached its limit of {self.limits.processes} processes and threads")
                return
            resident = proc.resident_bytes(pids)
            if resident > self.limits.memory_bytes:
                # RSS counts pages that forked processes share once each; PSS (slower) once in all.
                resident = proc.proportional_bytes(pids)
            if self._cgroup is not None:          # and what no process maps: shared memory, tmpfs files
                resident = max(resident, self._cgroup.held_bytes())
            self.peak_memory_bytes = max(self.peak_memory_bytes, resident)
            if resident > self.limits.memory_bytes:
                self._stop(f"its processes together used more than {self.limits.memory_bytes / 2**30:g} GiB "
                           "of memory, the limit")
                return
            time.sleep(0.1)

    def _keep_output(self) -> None:
        """Read everything the notebook prints; keep the first ``output_bytes``."""
        stream = self._process.stderr
        while chunk := stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16):
            self.output_size += len(chunk)
            room = self.limits.output_bytes - len(self._output)
            if room > 0:
                self._output += chunk[:room]
