"""Start ``P`` processes on this machine, join them in a process group, run one function on each, clean up.

    results = launch(fn, 4, q, k, v)        # fn(rank, world_size, q, k, v) in 4 fresh processes

This is what ``torchrun`` does for a terminal or a cluster, made to fit a notebook and a test:

- **fresh processes**: forked from a ``forkserver``, a clean single-threaded process started once
  per Python session that has imported torch and this module, so a launch costs a fraction of
  a second instead of seconds of imports, and nothing of the caller's state (threads, CUDA
  contexts, open files) is copied (``spawn`` where there is no forkserver, as on Windows). The
  server exits with the caller. ``fn`` is imported by name in the new processes: it must be a
  function defined at the top level of a module (not in a notebook cell);
- **one process group**: gloo over the loopback interface, the same calls that NCCL serves on
  GPUs (``init_process_group(backend, store=...)``). The rendezvous is a ``TCPStore`` that the
  caller starts on port 0 and keeps for the run: the OS picks the port as the store binds it
  and the ranks connect to that port, so no port is ever probed, released and reused (which
  two launches at once could race for);
- **results come back**: each rank's return value (tensors included) is serialised with
  ``torch.save`` and sent to the caller, which returns them in rank order;
- **failures end the run**: the first rank that raises sends its exception and traceback; the
  caller then stops every other rank (they may be blocked forever in a receive from the
  failed one) and raises that exception, with the remote traceback attached. A rank that dies
  without a word (killed, ``os._exit``) and a run that exceeds ``timeout`` end the same way.
  Every process is gone when :func:`launch` returns or raises.
"""

from __future__ import annotations

import datetime
import functools
import io
import pickle
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from attn_course import _validate

__all__ = ["RankFailed", "launch"]

_HOST = "127.0.0.1"   # the ranks and the rendezvous store all live on this machine

# How long the caller waits for a process to end after asking it to (terminate, then kill).
_GRACE_S = 5.0


class RankFailed(RuntimeError):
    """A rank ended without a result: it raised an exception that could not be sent back as itself,
    died without a word, or the run exceeded its time limit. The message names the rank."""


def _serialise(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _worker(rank: int, world_size: int, port: int, backend: str, timeout_s: float, threads: int,
            fn: Callable, args: tuple, results: Any) -> None:
    """The body of one spawned process: join the group, run ``fn``, send back its result or its error."""
    torch.set_num_threads(threads)
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        # A client of the caller's store, on the port it bound: the group meets there.
        store = dist.TCPStore(_HOST, port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        value = fn(rank, world_size, *args)
        results.put(("result", rank, _serialise(value)))
    except BaseException as error:                     # noqa: BLE001 - every failure must reach the caller
        remote = traceback.format_exc()
        try:
            payload = pickle.dumps(error)
            pickle.loads(payload)                      # an exception that cannot be rebuilt is sent as text
        except Exception:                              # noqa: BLE001
            payload = None
        results.put(("error", rank, (payload, type(error).__name__, str(error), remote)))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:                          # noqa: BLE001 - the group may be broken already
                pass


def _stop(processes: list) -> None:
    """End every process still alive: terminate, wait a little, then kill."""
    processes = [process for process in processes if process.pid is not None]   # those that started
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + _GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def _raise_failure(rank: int, info: tuple) -> None:
    payload, name, message, remote = info
    note = f"rank {rank} failed; its traceback:\n{remote}"
    if payload is not None:
        error = pickle.loads(payload)
        if isinstance(error, Exception):
            error.add_note(note)
            raise error
    raise RankFailed(f"rank {rank} raised {name}: {message}\n{note}")


def _raise_first_cause(rank: int, info: tuple, processes: list, results: Any) -> None:
    """Raise the error that started the failure. A rank that dies without a word (``os._exit``, a
    kill) makes its peers fail with connection errors, which arrive first; so wait a moment, and
    if a rank has exited silently, name it instead of the peer that noticed."""
    deadline = time.monotonic() + 1.0
    reported = {rank}
    while time.monotonic() < deadline:
        try:
            _, sender, _ = results.get(timeout=0.1)
            reported.add(sender)
        except queue.Empty:
            pass
        silent = [r for r, process in enumerate(processes) if r not in reported and process.exitcode not in (None, 0)]
        if silent:
            raise RankFailed(f"rank {silent[0]} exited with code {processes[silent[0]].exitcode} without a result or "
                             f"an error (killed, or ended by os._exit?); rank {rank} then failed with: {info[2]}")
    _raise_failure(rank, info)


def launch(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
           timeout: float = 120.0, threads: int = 1) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined in one process group.

    Args:
        fn: a function defined at the top level of an importable module (the spawned processes
            import it by name), taking ``(rank, world_size, *args)``; a ``functools.partial`` of one
            passes keyword arguments.
        world_size: ``P >= 1``, the number of processes (ranks ``0 .. P - 1``).
        *args: passed to every rank (pickled; tensors are copied into each process).
        backend: ``"gloo"`` (CPU tensors, any machine) or ``"nccl"`` (one CUDA GPU per rank).
        timeout: seconds for the whole run, start-up included; also each collective's timeout.
        threads: torch threads per process (1: ``P`` processes share the machine's cores).

    Returns:
        ``[fn's return value on rank 0, ..., on rank P - 1]``.

    Raises:
        TypeError, ValueError: ``fn`` not a top-level function, sizes that are not positive.
        The exception the first failing rank raised, with its traceback added as a note, or
        :class:`RankFailed` when a rank died without one or the run timed out. The other ranks are
        stopped first; no process outlives the call.

    Example:
        >>> from attn_course.distributed.demo import rank_and_sum
        >>> launch(rank_and_sum, 2, torch.ones(3))          # each rank returns (rank, sum of all ranks' inputs)
        [(0, 9.0), (1, 9.0)]
    """
    where = "launch"
    if not callable(fn):
        raise TypeError(f"{where}: fn must be a function, got {type(fn).__name__}")
    target = fn.func if isinstance(fn, functools.partial) else fn          # partial(f, option=...) is fine
    qualified = getattr(target, "__qualname__", "")
    if getattr(target, "__module__", None) in (None, "__main__") or "<" in qualified or "." in qualified:
        raise ValueError(f"{where}: fn must be defined at the top level of an importable module (the new processes "
                         f"import it by name), got {getattr(target, '__module__', '?')}.{qualified or target!r}; "
                         f"move it into a .py file next to the notebook and import it from there")
    world_size = _validate.integer(where, "world_size", world_size, minimum=1)
    timeout = _validate.positive_finite(where, "timeout", timeout)
    threads = _validate.integer(where, "threads", threads, minimum=1)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"{where}: backend must be 'gloo' or 'nccl', got {backend!r}")

    if "forkserver" in mp.get_all_start_methods():
        context = mp.get_context("forkserver")
        # What every rank would otherwise import anew: torch, and torch._dynamo, which the course's
        # peak_memory pulls in (2-3 s each, per process, on a laptop CPU).
        context.set_forkserver_preload(["torch", "torch._dynamo", "attn_course.distributed.launch"])
    else:
        context = mp.get_context("spawn")
    results = context.Queue()
    # The rendezvous: bound on port 0 (the OS picks a free one and the store keeps it) and alive
    # until every rank has ended, so the port cannot be taken by anyone else meanwhile.
    store = dist.TCPStore(_HOST, 0, None, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    port = store.port
    processes = [
        context.Process(target=_worker, args=(rank, world_size, port, backend, timeout, threads, fn, args, results),
                        daemon=True, name=f"attn_course rank {rank}")
        for rank in range(world_size)
    ]
    gathered: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            process.start()
        while len(gathered) < world_size:
            try:
                kind, rank, body = results.get(timeout=0.1)
            except queue.Empty:
                dead = [r for r, process in enumerate(processes) if r not in gathered and process.exitcode is not None]
                if dead:
                    try:                       # a rank's word is flushed before it exits: give it a moment
                        kind, rank, body = results.get(timeout=1.0)
                    except queue.Empty:
                        raise RankFailed(f"rank {dead[0]} exited with code {processes[dead[0]].exitcode} without a "
                                         f"result or an error (killed, or ended by os._exit?)") from None
                elif time.monotonic() > deadline:
                    missing = [r for r in range(world_size) if r not in gathered]
                    raise RankFailed(f"the run exceeded its timeout of {timeout:g} s; ranks {missing} had not "
                                     f"finished (waiting for a message that never comes?)") from None
                else:
                    continue
            if kind == "error":
                _raise_first_cause(rank, body, processes, results)
            gathered[rank] = torch.load(io.BytesIO(body), weights_only=False)   # from our own processes
    finally:
        _stop(processes)
        results.close()
        results.join_thread()
        del store                                      # closes the rendezvous port
    return [gathered[rank] for rank in range(world_size)]
