"""Notebooks that attack the machine and the class, not the score (issue 45), for a hostile class.

Each worked once under ``make grade`` as root in bubblewrap: memory in pages no process maps, held
past the memory limit unseen; a user namespace of the notebook's own (every capability, a tmpfs
the size of RAM); a kernel key that the next sandbox read; a notebook that cancels its cell timer
and sleeps, holding a grading slot. :func:`prepare` hands them in with the tiny chapter's right
answer after the attack, so only what the sandbox does to the attack decides the score.
"""

from __future__ import annotations

import pathlib
import textwrap

from helpers import TINY_ANSWER, notebook_json

#: Eight in-memory files of 200 MiB, each closed to every mapping: 1.6 GiB that no process's RSS holds.
UNMAPPED_MEMORY = textwrap.dedent("""
    import os
    held = []
    for _ in range(8):
        descriptor = os.memfd_create("held")
        for _ in range(200):
            os.write(descriptor, b"x" * 2**20)
        held.append(descriptor)
""")

#: A user namespace (then a tmpfs of its own would follow) and a key in the user's keyring, by the
#: system calls themselves: each prints what the kernel answered.
NAMESPACE_AND_KEYRING = textwrap.dedent("""
    import ctypes, errno
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:                                  # CLONE_NEWUSER
        print("unshare:", errno.errorcode[ctypes.get_errno()])
    else:
        print("unshare: a user namespace of its own")
    key = libc.syscall(248, b"user", b"left-for-the-next", b"secret", 6, -5)   # add_key, the user keyring
    print("add_key:", errno.errorcode[ctypes.get_errno()] if key < 0 else f"key {key} stored")
""")

#: The cell timer switched off, then a sleep just under the notebook's limit: no CPU used.
IDLE = textwrap.dedent("""
    import signal, time
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.alarm(0)
    time.sleep(50)
""")


def prepare(submissions: pathlib.Path, chapter: str) -> dict[str, dict]:
    """Hand in each attack as a student of ``chapter`` (the tiny chapter) under ``submissions``.

    Returns:
        ``{student: expectation}``: ``"score"`` (out of 2) and ``"stopped"``, the start of the
        grader's verdict (None: the notebook ran to its end), and ``"printed"``, what its output shows.
    """
    attacks = {
        "holds_unmapped_memory": (UNMAPPED_MEMORY, {"score": 0.0, "stopped": "its processes together used more "
                                                    "than 1 GiB of memory, the limit", "printed": ""}),
        "makes_namespace_and_key": (NAMESPACE_AND_KEYRING, {"score": 2.0, "stopped": None,
                                                            "printed": "unshare: EPERM\nadd_key: EPERM"}),
        "sleeps_without_timer": (IDLE, {"score": 0.0, "stopped": "it used next to no CPU for 5 s while the "
                                        "grader waited", "printed": ""}),
    }
    for student, (cell, _) in attacks.items():
        (submissions / student).mkdir(parents=True)
        (submissions / student / f"{chapter}.ipynb").write_text(notebook_json(cell, TINY_ANSWER))
    return {student: expectation for student, (_, expectation) in attacks.items()}
