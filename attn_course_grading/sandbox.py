"""The sandbox one submission runs in: bubblewrap's command line, and the limits it runs under.

A submission sees, read-only, only what running a chapter needs (``/usr``, the Python installation,
the course's ``.venv`` and package), a private, size-limited ``/scratch`` (its working folder and
home), ``/tmp`` and ``/dev/shm``, no network, and its own process numbers. Every socket and FIFO in
the folders it sees is hidden (:func:`special_files`). The grader kills the sandbox, and every process
in it, when its grading ends.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import importlib.util
import os
import pathlib
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import threading

#: Whom a sandbox runs as when the grader runs as root: a user of its own (no account needed), so
#: that the kernel counts its processes apart from every other sandbox's.
SANDBOX_UIDS = range(61000, 61256)
SANDBOX_GID = 65534                # nogroup
#: The system's folders at the root besides /usr (links into it on a merged /usr).
_SYSTEM_TOPS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

INSTALL_HINT = ("Install bubblewrap (Debian/Ubuntu: sudo apt-get install bubblewrap; Fedora: sudo dnf install "
                "bubblewrap), or, only for submissions you trust, grade without a sandbox: make grade TRUSTED=1")


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one submission may use (INSTRUCTORS.md's table).

    Args:
        seconds: wall time of the whole notebook (then the sandbox is killed), and of all the
            checks' calls of its answers together.
        cell_seconds: wall time of one cell (then it is stopped and the next one runs).
        call_seconds: wall time of one call of an answer by a check.
        idle_seconds: how long the notebook's processes may use no CPU at all while the grader waits for
            them (running its cells, or a call): a notebook that sleeps holds a grading slot for nothing.
        memory_bytes: address space of each process (RLIMIT_AS), and memory of all the notebook's
            processes together (watched by the grader).
        processes: processes and threads at once (RLIMIT_NPROC); 90% of it is a fork bomb.
        scratch_bytes: size of ``/scratch``, ``/tmp`` and ``/dev/shm`` each.
        output_bytes: how much of what the notebook prints is kept.
        threads: threads PyTorch may use (OMP_NUM_THREADS).
    """

    seconds: float = 900.0
    cell_seconds: float = 300.0
    call_seconds: float = 60.0
    idle_seconds: float = 60.0
    memory_bytes: int = 4 * 2**30
    processes: int = 128
    scratch_bytes: int = 256 * 2**20
    output_bytes: int = 64 * 2**10
    threads: int = 1

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Limits: {field.name} must be a positive number, got {value!r}")

    def set_in_this_process(self) -> None:
        """The limits that ``setrlimit`` gives every process started from here on."""
        cpu = 2 * int(self.seconds) + 1       # the notebook, then the checks' calls of its answers
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # No file larger than the scratch space, wherever it is written (the tmpfs sizes bound each folder).
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.scratch_bytes, self.scratch_bytes))


def bubblewrap() -> str | None:
    """The ``bwrap`` program, or None."""
    return shutil.which("bwrap")


@functools.cache
def sandbox_problem() -> str | None:
    """Why submissions cannot be sandboxed here (None when they can): bwrap missing, or refusing."""
    program = bubblewrap()
    if program is None:
        return "bubblewrap (bwrap) is not installed. " + INSTALL_HINT
    probe = subprocess.run(sandbox_command([sys.executable, "-c", "pass"], Limits()), capture_output=True,
                           text=True, preexec_fn=Limits().set_in_this_process, timeout=60)
    if probe.returncode != 0:
        return (f"bubblewrap cannot start a sandbox here ({probe.stderr.strip()[:300]}); on Ubuntu 24.04 "
                "unprivileged user namespaces may need enabling (see INSTRUCTORS.md). " + INSTALL_HINT)
    return None


def _package_folder(name: str) -> pathlib.Path:
    """Where a package lies, found without importing it (the grader needs none of the course here)."""
    return pathlib.Path(importlib.util.find_spec(name).origin).resolve().parent


def _python_folders() -> set[pathlib.Path]:
    """The Python installation, this environment, and where a symlinked interpreter (pyenv, conda) lives."""
    return {pathlib.Path(sys.base_prefix).resolve(), pathlib.Path(sys.prefix).resolve(),
            pathlib.Path(os.path.realpath(sys.executable)).parent.parent}


def readable_roots() -> list[pathlib.Path]:
    """The folders a submission reads: the Python installation, this environment, the course's
    package and the grader's (whose ``in_sandbox`` runs the notebook), each folder alone."""
    roots = _python_folders() | {_package_folder("attn_course"), _package_folder("attn_course_grading")}
    # Drop any folder inside another: bubblewrap mounts each once.
    return sorted(root for root in roots if not any(other != root and other in root.parents for other in roots))


def special_files(root: os.PathLike | str) -> list[str]:
    """Every unix socket and FIFO under ``root``, not following links (an unreadable folder is passed over).

    ``connect()`` to a socket and ``open()`` of a FIFO work through a read-only bind mount, so a
    sandbox that saw the socket of an instructor's program (a Jupyter kernel's, an agent's) could
    talk to it. The walk takes 0.4 s for the ``.venv``, 2.5 s for ``/usr`` on a busy 2-core machine.
    """
    found, folders = [], [os.fspath(root)]
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            folders.append(entry.path)
                        elif not entry.is_file(follow_symlinks=False) and not entry.is_symlink():
                            mode = entry.stat(follow_symlinks=False).st_mode
                            if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
                                found.append(entry.path)
                    except OSError:
                        continue
        except OSError:
            continue
    return sorted(found)


def _installed() -> set[pathlib.Path]:
    """The folders walked once for sockets, not once per sandbox."""
    return {pathlib.Path("/") / top for top in ("usr", *_SYSTEM_TOPS)} | _python_folders()


#: :func:`installed_special_files`, once walked (or handed over by :func:`use_installed_special_files`).
_INSTALLED_SPECIAL_FILES: dict[pathlib.Path, tuple[str, ...]] = {}


def installed_special_files() -> dict[pathlib.Path, tuple[str, ...]]:
    """``{folder: its sockets and FIFOs}`` for the folders of installed software, walked once per process.

    Installed software changes only when something is installed. The walk takes 0.4 s of CPU: the
    grader walks once and hands the result to each grading process (:func:`use_installed_special_files`),
    which would otherwise walk again for its one notebook.
    """
    if not _INSTALLED_SPECIAL_FILES:
        _INSTALLED_SPECIAL_FILES.update({folder: tuple(special_files(folder)) for folder in _installed()
                                         if folder.is_dir() and not folder.is_symlink()})
    return dict(_INSTALLED_SPECIAL_FILES)


def use_installed_special_files(found: dict[pathlib.Path, tuple[str, ...]]) -> None:
    """Take ``found``, another process's :func:`installed_special_files`, as this process's.

    Raises:
        TypeError: ``found`` is not a dict of folders (``pathlib.Path``) to tuples of paths.
    """
    if not (isinstance(found, dict) and all(isinstance(folder, pathlib.Path) and isinstance(paths, tuple)
                                            for folder, paths in found.items())):
        raise TypeError(f"use_installed_special_files: found must be a dict of pathlib.Path to tuples of paths, "
                        f"got {type(found).__name__}")
    _INSTALLED_SPECIAL_FILES.clear()
    _INSTALLED_SPECIAL_FILES.update(found)


def sandbox_command(command: list[str], limits: Limits, *, syscall_filter: int | None = None) -> list[str]:
    """``bwrap`` and its options, then ``command``: run ``command`` in a fresh sandbox.

    ``syscall_filter``: a descriptor of :func:`~attn_course_grading.syscalls.filter_descriptor`'s program
    (no user namespaces, no keyrings), which the caller passes to ``bwrap`` (``pass_fds``)."""
    program = bubblewrap()
    if program is None:
        raise RuntimeError(INSTALL_HINT)
    options = [program, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
               "--die-with-parent", "--new-session", "--hostname", "sandbox",
               "--ro-bind", "/usr", "/usr", "--dev", "/dev", "--proc", "/proc"]
    if syscall_filter is not None:
        options += ["--seccomp", str(syscall_filter)]
    mounted = [pathlib.Path("/usr")]
    for top in _SYSTEM_TOPS:
        path = pathlib.Path("/") / top
        if path.is_symlink():
            options += ["--symlink", os.readlink(path), str(path)]   # merged /usr: /lib -> usr/lib
        elif path.is_dir():
            options += ["--ro-bind", str(path), str(path)]
            mounted.append(path)
    # /etc made by hand: a folder bubblewrap makes for a mount inside it is private (0700), and the
    # sandbox's own user (run by root) could then read none of these (fontconfig: "Cannot load
    # default config file", printed by every notebook that draws).
    options += ["--perms", "0755", "--dir", "/etc"]
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "fonts"):
        if (pathlib.Path("/etc") / name).exists():
            options += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
            mounted.append(pathlib.Path("/etc") / name)
    # Private, writable by the sandbox's user; /dev/shm holds chapter 10's semaphores and shared
    # tensors. Mounted before the folders below, which may lie inside /tmp and must stay on top.
    for private in ("/scratch", "/tmp", "/dev/shm"):
        options += ["--perms", "1777", "--size", str(limits.scratch_bytes), "--tmpfs", private]
    roots = readable_roots()
    # bubblewrap makes missing parent folders private (0700); the sandbox's user must pass through.
    parents = sorted({parent for root in roots for parent in root.parents if parent != pathlib.Path("/")})
    for parent in parents:
        if parent not in (pathlib.Path("/usr"), pathlib.Path("/tmp")) and pathlib.Path("/usr") not in parent.parents:
            # (a folder inside /tmp is made on the sandbox's own /tmp, never the host's)
            options += ["--perms", "0755", "--dir", str(parent)]
    for root in roots:
        options += ["--ro-bind", str(root), str(root)]
    mounted += roots
    # Sockets and FIFOs hidden: the course's own folders (where the instructor works) walked for
    # each sandbox, in milliseconds; installed software once.
    installed = installed_special_files()
    for folder in mounted:
        if folder.is_dir() and not folder.is_symlink():
            hidden = installed[folder] if folder in installed else special_files(folder)
            for path in hidden:
                options += ["--ro-bind", "/dev/null", path]
    options += ["--chdir", "/scratch"]
    if os.geteuid() == 0:
        # Run by root, bubblewrap starts the command as root without capabilities; it drops to a
        # user of its own (in_sandbox --user), for which the kernel enforces RLIMIT_NPROC.
        options += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return options + ["--"] + command


def environment(limits: Limits) -> dict[str, str]:
    """The whole environment of a submission: nothing of the instructor's (no tokens, no paths)."""
    threads = str(limits.threads)
    return {
        "PATH": f"{pathlib.Path(sys.executable).parent}:/usr/bin:/bin", "HOME": "/scratch", "USER": "student",
        "LANG": "C.UTF-8", "TMPDIR": "/tmp", "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/scratch/.matplotlib",
        "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0",
        "TRITON_CACHE_DIR": "/scratch/.triton", "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1",
        # No GPU is visible: Triton's interpreter, chosen before any cell imports Triton.
        "TRITON_INTERPRET": "1",
    }


def _claim_uid(uid: int) -> int | None:
    """A descriptor holding an exclusive lock that marks ``uid`` as this process's, or None where
    another process holds it."""
    folder = "/run/lock" if os.access("/run/lock", os.W_OK) else tempfile.gettempdir()
    # Read-only is enough for flock, and lets a later user open a file another user created.
    handle = os.open(pathlib.Path(folder) / f"attn-course-sandbox-uid-{uid}.lock",
                     os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(handle)
        return None
    return handle


class SandboxUser:
    """A user id from :data:`SANDBOX_UIDS` that no other running sandbox holds (root only): else a
    fork bomb in one sandbox would use up the processes of every sandbox of the same user.

    "No other" across processes too: each id is claimed with an exclusive ``flock`` on a file of its
    own (in ``/run/lock``, else the temporary folder), held until :meth:`release` or the process's end.
    Two graders running at once (two classes, or two test processes) took uid 61000 both, and a
    notebook of one then failed to fork for the other's processes (RLIMIT_NPROC counts per user).
    """

    _free = list(SANDBOX_UIDS)
    _lock = threading.Lock()

    def __init__(self) -> None:
        with self._lock:
            for uid in self._free:
                handle = _claim_uid(uid)
                if handle is not None:
                    self._free.remove(uid)
                    self.uid, self._handle = uid, handle
                    return
            raise RuntimeError(f"SandboxUser: all {len(SANDBOX_UIDS)} sandbox users are in use")

    def release(self) -> None:
        with self._lock:
            if self._handle is not None:
                os.close(self._handle)                     # the lock goes with the descriptor
                self._handle = None
            if self.uid not in self._free:
                self._free.append(self.uid)
