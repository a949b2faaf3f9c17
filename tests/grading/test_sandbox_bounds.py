"""Issue 45: what bounds a sandboxed notebook beyond its own processes.

Inside the sandbox a notebook can make no user namespace of its own (where it would hold every capability and
mount a tmpfs no limit counts) and use no kernel keyring (keys outlive processes and sandboxes reuse user ids):
attn_course_grading.syscalls' seccomp program, read by an interpreter written here from the BPF specification,
and run by bubblewrap. Its processes together get their share of the cores (attn_course_grading.cgroups); the
memory it holds in pages no process maps, and a notebook that sleeps, are stopped in a hostile class graded
by tests/grading/test_grading_across_machines.py."""

from __future__ import annotations

import errno
import os
import platform
import struct
import subprocess
import sys
import textwrap

import pytest

from attn_course_grading import cgroups, sandbox, syscalls
from attn_course_grading.remote import Submission

from helpers import require_sandbox

ALLOW, EPERM, ENOSYS = "allow", "EPERM", "ENOSYS"
CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17
#: (AUDIT_ARCH, {call: number}) from the kernel's syscall tables (arch/x86/entry/syscalls/syscall_64.tbl,
#: include/uapi/asm-generic/unistd.h), written again here rather than read from the module under test.
MACHINES = {"x86_64": (0xC000003E, {"clone": 56, "unshare": 272, "clone3": 435, "add_key": 248,
                                    "request_key": 249, "keyctl": 250, "read": 0, "fork": 57}),
            "aarch64": (0xC00000B7, {"clone": 220, "unshare": 97, "clone3": 435, "add_key": 217,
                                     "request_key": 218, "keyctl": 219, "read": 63})}


def run_filter(program: bytes, nr: int, arch: int, first_argument: int = 0) -> str:
    """What classic BPF ``program`` returns for one call (linux/filter.h's semantics, the opcodes it uses)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, first_argument, 0, 0, 0, 0, 0)
    instructions = [struct.unpack("<HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    accumulator, at = 0, 0
    while True:
        code, jump_true, jump_false, k = instructions[at]
        if code == 0x20:                                           # load a word of seccomp_data
            accumulator = struct.unpack_from("<I", data, k)[0]
        elif code in (0x15, 0x45):                                 # jump if equal / if any bit set
            taken = accumulator == k if code == 0x15 else bool(accumulator & k)
            at += jump_true if taken else jump_false
        elif code == 0x06:                                         # return
            action, value = k & 0xFFFF0000, k & 0xFFFF
            if action == 0x7FFF0000:
                return ALLOW
            assert action == 0x00050000, hex(k)
            return errno.errorcode[value]
        else:
            raise AssertionError(f"an opcode this interpreter does not know: {code:#x}")
        at += 1


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_the_program_refuses_exactly_user_namespaces_and_keyrings(machine):
    arch, numbers = MACHINES[machine]
    program = syscalls.filter_program(machine)
    for call in ("add_key", "request_key", "keyctl"):
        assert run_filter(program, numbers[call], arch) == EPERM, call
    for call in ("unshare", "clone"):
        assert run_filter(program, numbers[call], arch, CLONE_NEWUSER) == EPERM, call
        assert run_filter(program, numbers[call], arch, CLONE_NEWUSER | CLONE_NEWNS | SIGCHLD) == EPERM, call
        assert run_filter(program, numbers[call], arch, SIGCHLD) == ALLOW, call          # fork and threads
    assert run_filter(program, numbers["clone3"], arch) == ENOSYS       # the C library falls back to clone
    assert run_filter(program, numbers["read"], arch) == ALLOW
    assert run_filter(program, numbers["read"], 0x40000003) == EPERM    # the same number in the 32-bit ABI
    if machine == "x86_64":
        assert run_filter(program, 0x40000000 | numbers["keyctl"], arch) == EPERM        # x32 numbering
    assert syscalls.filter_program("riscv64") is None                   # unknown numbers: no program


PROBE = textwrap.dedent("""
    import ctypes, errno, subprocess, threading
    libc = ctypes.CDLL(None, use_errno=True)
    def outcome(result):
        return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
    print("unshare", outcome(libc.unshare(0x10000000)))
    print("add_key", outcome(libc.syscall({add_key}, b"user", b"left", b"behind", 6, ctypes.c_int(-4))))
    print("keyctl", outcome(libc.syscall({keyctl}, 0, ctypes.c_int(-4), 0)))    # KEYCTL_GET_KEYRING_ID
    thread = threading.Thread(target=print, args=("a thread", "ok"))
    thread.start(); thread.join()
    print("a process", "ok" if subprocess.run(["true"]).returncode == 0 else "failed")
""")


def probe(*, filtered: bool) -> dict[str, str]:
    """What :data:`PROBE` reports, run in a sandbox as the grader starts one (with the filter or not)."""
    numbers = MACHINES[platform.machine()][1]
    code = PROBE.format(add_key=numbers["add_key"], keyctl=numbers["keyctl"])
    limits = sandbox.Limits()
    descriptor = syscalls.filter_descriptor() if filtered else None
    try:
        command = sandbox.sandbox_command([sys.executable, "-c", code], limits, syscall_filter=descriptor)
        completed = subprocess.run(command, capture_output=True, text=True, timeout=60, env=sandbox.environment(limits),
                                   preexec_fn=limits.set_in_this_process,
                                   pass_fds=() if descriptor is None else (descriptor,))
    finally:
        if descriptor is not None:
            os.close(descriptor)
    assert completed.returncode == 0, completed.stderr
    return dict(line.split(" ", 1) if not line.startswith("a ") else line.rsplit(" ", 1)
                for line in completed.stdout.splitlines())


@pytest.mark.slow
def test_inside_the_sandbox_there_is_no_user_namespace_and_no_keyring():
    require_sandbox()
    if platform.machine() not in MACHINES:
        pytest.skip("no seccomp program for this machine: the sandbox runs without the filter")
    seen = probe(filtered=True)
    assert seen == {"unshare": "EPERM", "add_key": "EPERM", "keyctl": "EPERM", "a thread": "ok",
                    "a process": "ok"}, seen
    # Without the program the same calls succeed here (where the kernel lets unprivileged users make
    # namespaces and keys): the refusals above are the filter's.
    unfiltered = probe(filtered=False)
    if unfiltered["unshare"] == "ok":
        assert unfiltered["add_key"] == "ok"


@pytest.mark.slow
def test_a_notebook_that_computes_all_along_is_not_taken_for_idle():
    # The idle limit is the grader's, read from /proc outside the sandbox (a notebook that sleeps is stopped:
    # tests/grading/test_grading_across_machines.py); one that computes for longer than it is never stopped.
    require_sandbox()
    limits = sandbox.Limits(seconds=60, cell_seconds=60, idle_seconds=2)
    busy = "import time\nend = time.monotonic() + 4\nwhile time.monotonic() < end:\n    pass"
    with Submission([busy], [], limits) as submission:
        assert submission.stopped is None, submission.stopped


#: Four processes that compute for 3 s of wall time; then their CPU time, which the parent prints.
BUSY_PROCESSES = textwrap.dedent("""
    import os, time
    children = []
    for _ in range(4):
        child = os.fork()
        if child == 0:
            end = time.monotonic() + 3
            while time.monotonic() < end:
                pass
            os._exit(0)
        children.append(child)
    for child in children:
        os.waitpid(child, 0)
    print("cpu seconds", round(os.times().children_user + os.times().children_system, 2))
""")


@pytest.mark.slow
def test_a_notebook_gets_its_share_of_the_cores_not_the_machine():
    require_sandbox()
    if not cgroups.available() or "CPU capped" not in cgroups.accounting():
        pytest.skip(cgroups.accounting())
    limits = sandbox.Limits(seconds=60, cell_seconds=30, threads=1)
    with Submission([BUSY_PROCESSES], [], limits) as submission:
        stopped = submission.stopped
    # Read once it is closed: what the notebook prints is drained by a thread of its own, joined by close().
    output = submission.output
    assert stopped is None, stopped
    assert "cpu seconds" in output, (output, submission.events)
    cpu_seconds = float(output.rsplit("cpu seconds", 1)[1].split()[0])
    assert cpu_seconds < 1.3 * 3, output      # one core for 3 s, where four processes would take more
