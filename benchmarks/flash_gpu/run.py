"""The whole GPU benchmark: most important measurements first, each row written as it is measured."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence

from attn_course import _validate
from benchmarks.flash_gpu.attention import gpu_rows
from benchmarks.flash_gpu.budget import TIME_BUDGET_SPENT, Terminated, sigterm_stops
from benchmarks.flash_gpu.checks import check_callback, check_device, nonempty_ints
from benchmarks.flash_gpu.clock import Clock
from benchmarks.flash_gpu.csv_stream import CsvStream, write_table
from benchmarks.flash_gpu.decode import decode_rows
from benchmarks.flash_gpu.machine import machine_facts, machine_info
from benchmarks.flash_gpu.plots import plot_gpu_rows
from benchmarks.flash_gpu.rows import DecodeRow, GpuRow, SummaryRow
from benchmarks.flash_gpu.sizes import DECODE_QUERY_LENGTHS, DRY_RUN, GPU_SIZES, WARM_UP_SECONDS
from benchmarks.flash_gpu.summary import print_summary, speedup_summary
from benchmarks.flash_gpu.warm_up import warm_triton_cache, warm_up_jobs

__all__ = ["GpuBenchmarkResult", "plan_phases", "run_gpu_benchmark"]


@dataclasses.dataclass
class GpuBenchmarkResult:
    """What :func:`run_gpu_benchmark` measured and wrote.

    Attributes:
        rows, decode, summary: the :class:`GpuRow`, :class:`DecodeRow` and :class:`SummaryRow` lists.
        files: name → path of every file written (``"rows"``, ``"decode"``, ``"summary"``, ``"machine"``,
            ``"plot"``, ``"decode_plot"``; plots only where matplotlib is installed).
        seconds: the run's wall-clock time.
        stopped: ``""`` when everything planned was attempted, ``"max_minutes"`` when the time budget
            left measurements out, ``"SIGTERM"`` when the run was terminated.
    """

    rows: list
    decode: list
    summary: list
    files: dict
    seconds: float
    stopped: str


def plan_phases(sizes: dict, lengths: Sequence[int] | None) -> list[tuple[str, dict]]:
    """The measurements in order of importance: long sequences in the first dtype (both d, both
    masks, all modes), decoding at N_q = 1, the second dtype, decoding at N_q = 16 and in the
    second dtype, and the short sequences last."""
    lengths = list(lengths or sizes["lengths"])
    long = [n for n in lengths if n >= sizes["long_from"]]
    short = [n for n in lengths if n < sizes["long_from"]]
    first, *others = sizes["dtypes"]
    phases = [("attention", dict(dtypes=[first], lengths=long)),
              ("decode", dict(dtypes=[first], query_lengths=[1]))]
    phases += [("attention", dict(dtypes=others, lengths=long))]
    phases += [("decode", dict(dtypes=[first], query_lengths=[16])),
               ("decode", dict(dtypes=others, query_lengths=list(DECODE_QUERY_LENGTHS)))]
    phases += [("attention", dict(dtypes=list(sizes["dtypes"]), lengths=short))]
    return [(kind, options) for kind, options in phases if options["dtypes"] and options.get("lengths", [1])]


def run_gpu_benchmark(out: str | os.PathLike, *, lengths: Sequence[int] | None = None, dry_run: bool = False,
                      max_minutes: float | None = None, decode: bool = True, warm_up: bool = True,
                      progress: Callable[[str], None] | None = print) -> GpuBenchmarkResult:
    """The whole GPU benchmark, most important measurements first, each row written as measured.

    Writes into ``out``: ``flash-gpu.csv`` (:class:`GpuRow`), ``flash-gpu-decode.csv``
    (:class:`DecodeRow`), ``flash-gpu-summary.csv`` (:class:`SummaryRow`, rewritten after each
    phase), ``machine.json`` (the machine, the plan, the timer and how the run ended) and the
    plots ``flash-gpu.png`` and ``flash-gpu-decode.png`` (if matplotlib is installed). After
    ``max_minutes`` no new measurement starts (the one under way finishes: allow a minute
    more); SIGTERM, as from ``timeout``, stops the run the same way and the summary and
    plots are still written.

    Cost on an H200 (estimate, not yet measured): ours has 2 or 3 autotuning candidates per kernel,
    so about 60 compilations of a few seconds each, done first in parallel (:func:`_warm_triton_cache`,
    about 30 s with 10 processes); the autotuner then times the candidates once per N (about 1 s
    per configuration); then 48 configurations × 5 methods × 3 modes of ``do_bench`` at 0.05 to
    1 s each, and 28 decoding configurations × 5 methods: about 4 minutes in all. The budget
    cuts whatever does not fit, short N last.

    Args:
        out: the folder for the files (created if missing).
        lengths: sequence lengths N for the attention rows (default: 512 … 16384; the dry run's 64, 128).
        dry_run: run on the CPU at tiny sizes (:data:`DRY_RUN`): the kernels in Triton's
            interpreter, float16 and float32, a wall-clock timer.
        max_minutes: the time budget, > 0; None: no limit.
        decode: also run :func:`decode_rows`.
        warm_up: first compile the kernels into Triton's on-disk cache in parallel processes, one
            per (dtype, d, causal) and per dtype for decoding (at most 120 s, inside the budget;
            a failure there is reported in ``machine.json``, not raised).
        progress: called with each line of progress text (None: silent).

    Returns:
        A :class:`GpuBenchmarkResult`.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a non-positive ``max_minutes`` or length.
        RuntimeError: no CUDA GPU and not ``dry_run``.
    """
    where = "run_gpu_benchmark"
    out = _validate.path(where, "out", out)
    if lengths is not None:
        lengths = nonempty_ints(where, "lengths", lengths)
    dry_run = _validate.boolean(where, "dry_run", dry_run)
    decode = _validate.boolean(where, "decode", decode)
    warm_up = _validate.boolean(where, "warm_up", warm_up)
    if max_minutes is not None:
        max_minutes = _validate.positive_finite(where, "max_minutes", max_minutes)
    progress = check_callback(where, "progress", progress) or (lambda line: None)
    device = check_device(where, "cpu" if dry_run else "cuda")
    sizes = DRY_RUN if dry_run else GPU_SIZES
    started, started_at = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    deadline = None if max_minutes is None else started + 60 * max_minutes
    machine = machine_info(device.type)
    out.mkdir(parents=True, exist_ok=True)
    files = {"rows": out / "flash-gpu.csv", "decode": out / "flash-gpu-decode.csv",
             "summary": out / "flash-gpu-summary.csv", "machine": out / "machine.json"}
    streams = {"rows": CsvStream(files["rows"], GpuRow), "decode": CsvStream(files["decode"], DecodeRow)}
    plan = plan_phases(sizes, lengths)
    if not decode:
        plan = [phase for phase in plan if phase[0] != "decode"]
    rows, decode_found, summary = [], [], []
    facts = {"machine": dataclasses.asdict(machine), **machine_facts(device), "dry_run": dry_run,
             "timer": Clock(device).name, "max_minutes": max_minutes, "started": started_at,
             "plan": [{"kind": kind, **{k: [str(x) for x in v] if k == "dtypes" else v for k, v in options.items()}}
                      for kind, options in plan],
             "sizes": {k: v for k, v in sizes.items() if k not in ("dtypes", "lengths")}}
    progress(f"# {machine.title()}; timer: {facts['timer']}; budget: "
             f"{'none' if max_minutes is None else f'{max_minutes:g} min'}")

    def write_summary(stopped: str) -> list[SummaryRow]:
        """Rewrite the summary and ``machine.json`` from the rows so far: a killed run keeps both."""
        summary = speedup_summary(rows, decode_found, long_from=sizes["long_from"])
        write_table(files["summary"], SummaryRow, summary)         # the header alone when nothing ran yet
        facts.update(stopped=stopped, seconds=round(time.monotonic() - started, 1),
                     measured=sum(r.status == "ok" for r in rows + decode_found),
                     skipped=sum(r.status != "ok" for r in rows + decode_found),
                     not_reached=sum(r.reason == TIME_BUDGET_SPENT for r in rows + decode_found))
        files["machine"].write_text(json.dumps(facts, indent=2, default=str) + "\n")
        return summary

    stopped = ""
    try:
        with sigterm_stops():
            if warm_up:
                jobs = warm_up_jobs(sizes, dry_run)
                progress(f"## warming Triton's cache: {len(jobs)} processes at once (at most {WARM_UP_SECONDS} s)")
                facts["warm_up"] = warm_triton_cache(jobs, timeout_s=WARM_UP_SECONDS, interpret=dry_run)
                progress(f"warm-up: {facts['warm_up']['seconds']} s, "
                         f"{len(facts['warm_up']['failures'])} failed" + "".join(
                             f"\n  {failure}" for failure in facts["warm_up"]["failures"]))
            for index, (kind, options) in enumerate(plan, 1):
                common = dict(device=device.type, deadline=deadline, progress=progress, machine=machine)
                progress(f"## phase {index}/{len(plan)}: {kind} {options}  "
                         f"[{time.monotonic() - started:.0f} s so far]".replace("torch.", ""))
                if kind == "attention":
                    rows += gpu_rows(options["lengths"], dtypes=options["dtypes"], head_dims=sizes["head_dims"],
                                     tokens=sizes["tokens"], model_dim=sizes["model_dim"], on_row=streams["rows"].write,
                                     seed=index, **common)
                else:
                    decode_found += decode_rows(sizes["decode"]["kv_lengths"], query_lengths=options["query_lengths"],
                                                dtypes=options["dtypes"], on_row=streams["decode"].write, seed=index,
                                                **{k: v for k, v in sizes["decode"].items() if k != "kv_lengths"},
                                                **common)
                write_summary("running")
            if any(r.reason == TIME_BUDGET_SPENT for r in rows + decode_found):
                stopped = "max_minutes"
    except Terminated:
        stopped = "SIGTERM"
        progress("terminated (SIGTERM): writing the summary and plots of what was measured")
    finally:
        for stream in streams.values():
            stream.close()
    summary = write_summary(stopped or "complete")
    if summary:
        print_summary(summary)
    title = f"FlashAttention benchmark{' (CPU dry run)' if dry_run else ''}: {machine.title()}"
    for name, found in (("plot", rows), ("decode_plot", decode_found)):
        if not found:
            continue
        path = out / ("flash-gpu.png" if name == "plot" else "flash-gpu-decode.png")
        try:
            plot_gpu_rows(found, path, title=title)
        except ImportError:   # a bare GPU image may lack matplotlib; the CSVs hold the numbers
            progress("matplotlib is not installed: no plot")
            break
        files[name] = path
    seconds = time.monotonic() - started
    if stopped == "max_minutes":
        progress(f"stopped by max_minutes={max_minutes:g}: {facts['not_reached']} rows not measured "
                 "(status 'skipped', reason 'time budget ...')")
    progress(f"# {facts['measured']} rows measured, {facts['skipped']} skipped, in {seconds:.0f} s; wrote "
             + ", ".join(str(path) for path in files.values()))
    return GpuBenchmarkResult(rows=rows, decode=decode_found, summary=summary, files=files, seconds=seconds,
                              stopped=stopped)
