"""What a sandboxed notebook may not ask the kernel for: a seccomp program that bubblewrap loads (``--seccomp``).

Two kinds of system call reach past the sandbox's walls, and no notebook needs either:

- **a user namespace of its own** (``unshare`` or ``clone`` with ``CLONE_NEWUSER``): inside one the notebook
  holds every capability and can mount a tmpfs as large as the machine's memory, which no limit of ours
  counts, and container escapes start there;
- **the kernel's keyrings** (``add_key``, ``keyctl``, ``request_key``): keys belong to a user id and outlive
  processes, and sandboxes reuse user ids, so a key left by one student was read by the next sandbox.

Each answers ``EPERM``. ``clone3`` answers ``ENOSYS``: its flags sit in memory, out of a filter's sight, and
the C library then falls back to ``clone``, whose flags the filter reads. A call made through another ABI
than the machine's own (32-bit or x32 numbering) answers ``EPERM`` too, since its numbers mean other calls.
The program is classic BPF, written out here (about twenty instructions) rather than generated: each
instruction is the rule it enforces.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

__all__ = ["FILTERED", "filter_descriptor", "filter_program"]

# Classic BPF opcodes (linux/filter.h) and seccomp's return values (linux/seccomp.h).
_LOAD_WORD = 0x20            # BPF_LD | BPF_W | BPF_ABS: A = the 32-bit word at offset k of seccomp_data
_JUMP_IF_EQUAL = 0x15        # BPF_JMP | BPF_JEQ | BPF_K
_JUMP_IF_ANY_BIT = 0x45      # BPF_JMP | BPF_JSET | BPF_K
_RETURN = 0x06               # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian here).
_NR, _ARCH, _FIRST_ARGUMENT_LOW = 0, 4, 16
_CLONE_NEWUSER = 0x10000000
_X32_BIT = 0x40000000

#: {machine: (its AUDIT_ARCH value, {call: its number})}.
_MACHINES = {
    "x86_64": (0xC000003E, {"clone": 56, "unshare": 272, "clone3": 435,
                            "add_key": 248, "request_key": 249, "keyctl": 250}),
    "aarch64": (0xC00000B7, {"clone": 220, "unshare": 97, "clone3": 435,
                             "add_key": 217, "request_key": 218, "keyctl": 219}),
}
#: The calls the program refuses (``clone`` and ``unshare`` only with ``CLONE_NEWUSER``).
FILTERED = ("unshare(CLONE_NEWUSER)", "clone(CLONE_NEWUSER)", "clone3", "add_key", "keyctl", "request_key")


def filter_program(machine: str | None = None) -> bytes | None:
    """The seccomp program for ``machine`` (default: this one), as bubblewrap reads it; None where the
    course knows no system-call numbers for it (then the sandbox runs without the filter)."""
    machine = platform.machine() if machine is None else machine
    if machine not in _MACHINES:
        return None
    arch, numbers = _MACHINES[machine]
    program: list[tuple] = []          # (opcode, jump if true, jump if false, k); jumps to labels below
    refuse, not_found, reads_flags = "refuse", "allow", "flags"
    program += [(_LOAD_WORD, 0, 0, _ARCH), (_JUMP_IF_EQUAL, None, refuse, arch),
                (_LOAD_WORD, 0, 0, _NR)]
    if machine == "x86_64":
        program.append((_JUMP_IF_ANY_BIT, refuse, None, _X32_BIT))
    program.append((_JUMP_IF_EQUAL, "no clone3", None, numbers["clone3"]))
    for call in ("add_key", "request_key", "keyctl"):
        program.append((_JUMP_IF_EQUAL, refuse, None, numbers[call]))
    for call in ("clone", "unshare"):
        program.append((_JUMP_IF_EQUAL, reads_flags, None, numbers[call]))
    labels = {not_found: len(program)}
    program.append((_RETURN, 0, 0, _ALLOW))
    labels[reads_flags] = len(program)
    program += [(_LOAD_WORD, 0, 0, _FIRST_ARGUMENT_LOW), (_JUMP_IF_ANY_BIT, refuse, None, _CLONE_NEWUSER),
                (_RETURN, 0, 0, _ALLOW)]
    labels["no clone3"] = len(program)
    program.append((_RETURN, 0, 0, _ERRNO | errno.ENOSYS))
    labels[refuse] = len(program)
    program.append((_RETURN, 0, 0, _ERRNO | errno.EPERM))

    def offset(target, at: int) -> int:   # a jump counts the instructions it skips; None: the next one
        return 0 if target is None or isinstance(target, int) else labels[target] - at - 1

    return b"".join(struct.pack("<HBBI", code, offset(yes, at), offset(no, at), k)
                    for at, (code, yes, no, k) in enumerate(program))


def filter_descriptor() -> int | None:
    """A new descriptor, at its start, of an in-memory file holding :func:`filter_program` (bubblewrap reads
    it to the end: one per sandbox; the caller passes it with ``pass_fds`` and closes it), or None where
    there is no program for this machine."""
    program = filter_program()
    if program is None:
        return None
    descriptor = os.memfd_create("attn-course-seccomp", 0)     # not close-on-exec: bubblewrap inherits it
    os.write(descriptor, program)
    os.lseek(descriptor, 0, os.SEEK_SET)
    return descriptor
