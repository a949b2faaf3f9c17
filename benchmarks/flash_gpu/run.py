"""The whole GPU benchmark: most important measurements first, each row written as it is measured."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence

import torch

from attn_course import _validate
from benchmarks.flash_gpu.attention import gpu_rows
from benchmarks.flash_gpu.decode import decode_rows
from benchmarks.flash_gpu.kernels_used import count_compilations, describe_compilations
from benchmarks.flash_gpu.measuring import TIME_BUDGET_SPENT, Clock, Terminated, check_device, past, sigterm_stops
from benchmarks.flash_gpu.plan import (
    DRY_RUN,
    FLEX,
    FLEX_COMPILE_MARGIN_S,
    GPU_SIZES,
    WARM_UP_SECONDS,
    check_profile,
    plan_phases,
)
from benchmarks.flash_gpu.report import plot_gpu_rows, speedup_summary, summary_table, target_verdicts
from benchmarks.flash_gpu.rows import CsvStream, DecodeRow, GpuRow, SummaryRow, machine_facts, machine_info
from benchmarks.flash_gpu.warm_up import warm_triton_cache, warm_up_jobs

__all__ = ["GpuBenchmarkResult", "run_gpu_benchmark"]


@dataclasses.dataclass
class GpuBenchmarkResult:
    """What :func:`run_gpu_benchmark` measured and wrote (``files``: name → path), in how many seconds, and
    why it ``stopped``: ``""`` (everything planned was attempted), ``"max_minutes"`` or ``"SIGTERM"``."""

    rows: list
    decode: list
    summary: list
    files: dict
    seconds: float
    stopped: str


def run_gpu_benchmark(out: str | os.PathLike, *, profile: str = "essential", lengths: Sequence[int] | None = None,
                      dry_run: bool = False, max_minutes: float | None = None, warm_up: bool = True,
                      progress: Callable[[str], None] | None = print) -> GpuBenchmarkResult:
    """The whole GPU benchmark, most important measurements first, each row written as measured.

    Writes into ``out``: ``flash-gpu.csv`` (:class:`GpuRow`), ``flash-gpu-decode.csv`` (:class:`DecodeRow`),
    ``flash-gpu-summary.csv`` (:class:`SummaryRow`, rewritten after each phase), ``machine.json`` (the
    machine, the plan, the kernel compilations it triggers, the timer and how the run ended) and, where
    matplotlib is installed, ``flash-gpu.png`` and ``flash-gpu-decode.png``. After ``max_minutes`` no new
    measurement starts (the one under way finishes); SIGTERM stops the run the same way; the summary and
    plots are written either way. Ours are first compiled in parallel processes (:func:`warm_triton_cache`),
    FlexAttention's shapes just before its first phase. No FlexAttention compile (its warm-up, its
    measurements) starts within :data:`~benchmarks.flash_gpu.plan.FLEX_COMPILE_MARGIN_S` of the deadline:
    its rows left are written as skipped, and ``stopped`` is ``"max_minutes"``.

    Args:
        out: the folder for the files (created if missing).
        profile: ``"essential"`` or ``"long"`` (:func:`~benchmarks.flash_gpu.plan.plan_phases`).
        lengths: the attention rows' N (default: the profile's).
        dry_run: on the CPU at tiny sizes (:data:`~benchmarks.flash_gpu.plan.DRY_RUN`), the kernels in
            Triton's interpreter, float16 and float32, a wall-clock timer.
        max_minutes: the time budget, > 0; None: no limit.
        warm_up: compile first, each warm-up at most 120 s inside the budget (failures are reported in
            ``machine.json``, not raised).
        progress: called with each line of progress text (None: silent).

    Returns:
        A :class:`GpuBenchmarkResult`.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an unknown profile, a non-positive ``max_minutes`` or length.
        RuntimeError: no CUDA GPU and not ``dry_run``.
    """
    where = "run_gpu_benchmark"
    out = _validate.path(where, "out", out)
    if lengths is not None:
        lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1, nonempty=True)
    check_profile(where, profile)
    dry_run, warm_up = _validate.boolean(where, "dry_run", dry_run), _validate.boolean(where, "warm_up", warm_up)
    if max_minutes is not None:
        max_minutes = _validate.positive_finite(where, "max_minutes", max_minutes)
    if progress is not None and not callable(progress):
        raise TypeError(f"{where}: progress must be callable or None, got {type(progress).__name__}")
    progress = progress or (lambda line: None)
    device = check_device(where, "cpu" if dry_run else "cuda")
    sizes = DRY_RUN if dry_run else GPU_SIZES
    started, started_at = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    deadline = None if max_minutes is None else started + 60 * max_minutes
    machine = machine_info(device.type)
    out.mkdir(parents=True, exist_ok=True)
    files = {"rows": out / "flash-gpu.csv", "decode": out / "flash-gpu-decode.csv",
             "summary": out / "flash-gpu-summary.csv", "machine": out / "machine.json"}
    streams = {"rows": CsvStream(files["rows"], GpuRow), "decode": CsvStream(files["decode"], DecodeRow)}
    # The compilations are counted for a GPU even on the dry run: what a GPU check's time estimate needs.
    plan, gpu_plan = plan_phases(sizes, lengths, profile), plan_phases(GPU_SIZES, lengths, profile)
    this_gpu = {} if device.type != "cuda" else dict(
        tma=torch.cuda.get_device_capability()[0] == 9,
        multiprocessors=torch.cuda.get_device_properties(0).multi_processor_count)
    compilations = count_compilations(gpu_plan, GPU_SIZES, **this_gpu)
    rows, decode_found, summary = streams["rows"].rows, streams["decode"].rows, []
    facts = {"machine": dataclasses.asdict(machine), **machine_facts(device), "dry_run": dry_run, "profile": profile,
             "compilations": compilations,
             "timer": Clock(device).name, "max_minutes": max_minutes, "started": started_at,
             "plan": [{"kind": kind, **{k: [str(x) for x in v] if k == "dtypes" else v for k, v in options.items()}}
                      for kind, options in plan],
             "sizes": {k: v for k, v in sizes.items() if k not in ("dtypes", "lengths")}}
    progress(f"# {machine.title()}; timer: {facts['timer']}; profile: {profile}; budget: "
             f"{'none' if max_minutes is None else f'{max_minutes:g} min'}")
    progress(f"# {describe_compilations(compilations, profile, dry_run)}")

    def write_summary(stopped: str) -> list[SummaryRow]:
        """Rewrite the summary and ``machine.json`` from the rows so far: a killed run keeps both."""
        summary = speedup_summary(rows, decode_found, long_from=sizes["long_from"])
        CsvStream(files["summary"], SummaryRow, summary).close()    # the header alone when nothing ran yet
        facts.update(stopped=stopped, seconds=round(time.monotonic() - started, 1),
                     measured=sum(r.status == "ok" for r in rows + decode_found),
                     skipped=sum(r.status != "ok" for r in rows + decode_found),
                     not_reached=sum(r.reason == TIME_BUDGET_SPENT for r in rows + decode_found))
        files["machine"].write_text(json.dumps(facts, indent=2, default=str) + "\n")
        return summary

    def warm(jobs: list[dict], what: str) -> dict:   # within the budget left
        limit = WARM_UP_SECONDS if deadline is None else max(1.0, min(WARM_UP_SECONDS, deadline - time.monotonic()))
        progress(f"## warming {what}: {len(jobs)} processes, at most {os.cpu_count()} at once (at most "
                 f"{limit:.0f} s)")
        report = warm_triton_cache(jobs, timeout_s=limit, interpret=dry_run)
        progress(f"warm-up: {report['seconds']} s, {len(report['failures'])} failed"
                 + "".join(f"\n  {failure}" for failure in report["failures"]))
        return report

    stopped = ""
    try:
        with sigterm_stops():
            jobs = warm_up_jobs(plan, sizes, dry_run) if warm_up else []
            # Ours first; FlexAttention's shapes just before its first phase, and only if the budget
            # reaches it (its compiles would otherwise delay ours against SDPA's, the rows that matter most).
            flex_jobs = [job for job in jobs if job["kind"] == "flex"]
            flex_deadline = None if deadline is None else deadline - FLEX_COMPILE_MARGIN_S
            if warm_up:
                facts["warm_up"] = warm([job for job in jobs if job["kind"] != "flex"], "Triton's cache")
            for index, (kind, options) in enumerate(plan, 1):
                if flex_jobs and FLEX in options.get("methods", ()) and not past(flex_deadline):
                    facts["warm_up_flex"] = warm(flex_jobs, "Inductor's caches for FlexAttention")
                    flex_jobs = []
                common = dict(device=device.type, deadline=deadline, progress=progress, machine=machine)
                progress(f"## phase {index}/{len(plan)}: {kind} {options}  "
                         f"[{time.monotonic() - started:.0f} s so far]".replace("torch.", ""))
                # Rows are kept as they come, not as a phase returns them: a phase cut short by SIGTERM
                # still counts in the summary and machine.json with what it measured.
                if kind == "attention":
                    gpu_rows(**options, on_row=streams["rows"].write, seed=index, **common)
                else:
                    shape = {k: v for k, v in sizes["decode"].items() if not k.endswith("kv_lengths")}
                    decode_rows(**options, **shape, on_row=streams["decode"].write, seed=index, **common)
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
        try:
            progress(summary_table(summary).to_string())
        except ImportError:   # a bare GPU image may lack pandas; the summary CSV holds the same
            progress(f"pandas is not installed: the summary is in {files['summary']}")
        for line in target_verdicts(summary):
            progress(line)
    title = f"FlashAttention benchmark{' (CPU dry run)' if dry_run else ''}: {machine.title()}"
    for name, found, path in (("plot", rows, out / "flash-gpu.png"),
                              ("decode_plot", decode_found, out / "flash-gpu-decode.png")):
        if not found:
            continue
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
