"""Warming Triton's on-disk cache in parallel processes before the benchmark measures."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from attn_course.flash import decode_attention, flash_attention
from benchmarks.flash_gpu.backends import flex_function
from benchmarks.flash_gpu.plan import DECODE_QUERY_LENGTHS

__all__ = ["warm_triton_cache", "warm_up_job", "warm_up_jobs"]


def warm_up_jobs(plan: list[tuple[str, dict]], sizes: dict, dry_run: bool) -> list[dict]:
    """One job per kernel specialization the plan needs: (dtype, d, causal, group size) for attention, a dtype
    for decoding, then a shape for FlexAttention compiled (Inductor's on-disk caches, like Triton's, serve
    the benchmark's process). The dry run warms only the first, to run the code, not to save time."""
    device = "cpu" if dry_run else "cuda"
    n = 64 if dry_run else 1024            # a multiple of 16, like every N measured: the same specialization
    jobs, decoding, flex = [], [], []
    for kind, options in plan:
        for dtype in options["dtypes"]:
            dtype = str(dtype).removeprefix("torch.")
            if kind == "decode":
                decode = sizes["decode"]
                decoding.append(dict(kind="decode", dtype=dtype, head_dim=decode["head_dim"], causal=False,
                                     n=decode["kv_lengths"][0], heads=decode["heads"], kv_heads=decode["kv_heads"],
                                     batch=decode["batch"], device=device))
                continue
            methods = options.get("methods", ("ours (Triton)", "flex compiled"))
            for d, causal in itertools.product(options["head_dims"], options["causal"]):
                heads = options["model_dim"] // d
                shape = dict(dtype=dtype, head_dim=d, causal=causal, heads=heads,
                             kv_heads=heads // options["group_size"], device=device)
                if "ours (Triton)" in methods:
                    jobs.append(dict(kind="attention", **shape, n=n))
                if "flex compiled" in methods:   # FlexAttention compiles per shape (dynamic=False): a job per N
                    flex += [dict(kind="flex", **shape, n=length, batch=max(1, options["tokens"] // length))
                             for length in options["lengths"]]
    unique = list({json.dumps(job, sort_keys=True): job for job in jobs + decoding + flex}.values())
    return unique[:1] if dry_run else unique


def warm_up_job(job: dict) -> None:
    """Run one warm-up job (in its own process): the kernels, every autotuning candidate included, compile
    into Triton's on-disk cache, where the benchmark's process finds them."""
    dtype, device, d = getattr(torch, job["dtype"]), job["device"], job["head_dim"]
    if job["kind"] == "attention":
        q = torch.randn(1, job["heads"], job["n"], d, dtype=dtype, device=device, requires_grad=True)
        k, v = (torch.randn(1, job.get("kv_heads", job["heads"]), job["n"], d, dtype=dtype, device=device,
                            requires_grad=True) for _ in range(2))
        out = flash_attention(q, k, v, causal=job["causal"])
        out.backward(torch.randn_like(out))
    elif job["kind"] == "flex":
        fn, _, _, _ = flex_function(job["causal"], job["n"], torch.device(device), job["kv_heads"] < job["heads"])
        q = torch.randn(job["batch"], job["heads"], job["n"], d, dtype=dtype, device=device, requires_grad=True)
        k, v = (torch.randn(job["batch"], job["kv_heads"], job["n"], d, dtype=dtype, device=device,
                            requires_grad=True) for _ in range(2))
        with torch.no_grad():                 # the graph the forward rows time
            fn(q, k, v)
        if device == "cuda":                  # the training graphs; no backward on the CPU
            out = fn(q, k, v)
            out.backward(torch.randn_like(out))
    else:
        k, v = (torch.randn(job["batch"], job["kv_heads"], job["n"], d, dtype=dtype, device=device) for _ in range(2))
        for n_q in DECODE_QUERY_LENGTHS:
            decode_attention(torch.randn(job["batch"], job["heads"], n_q, d, dtype=dtype, device=device), k, v)
    if device == "cuda":
        torch.cuda.synchronize()


def warm_triton_cache(jobs: list[dict], *, timeout_s: float, interpret: bool,
                      parallel: int | None = None) -> dict:
    """Run the warm-up jobs in their order, in parallel processes, at most ``parallel`` at once (default: one
    per core: compiling is single-threaded); failures are reported, never raised."""
    started = time.monotonic()
    parallel = parallel or os.cpu_count() or 1
    # The same environment as this process (Triton's cache key includes some TRITON_* variables),
    # but for the dry run's interpreter; one Inductor compile thread per process, since the
    # processes already fill the cores (the thread count is not part of Inductor's cache key).
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    waiting, running, failures = list(jobs), [], []
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                job, log = waiting.pop(0), tempfile.TemporaryFile("w+")
                running.append((job, log, subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.flash_gpu", "--warm-up", json.dumps(job)],
                    stdout=log, stderr=subprocess.STDOUT, text=True, env=env)))
            time.sleep(0.1)
            for entry in list(running):
                job, log, process = entry
                if process.poll() is None:
                    continue
                running.remove(entry)
                if process.returncode:
                    log.seek(0)
                    last = log.read().strip().splitlines()[-1:] or ["no output"]
                    failures.append(f"{job}: exit status {process.returncode}: {last[0][:300]}")
                log.close()
            if time.monotonic() - started > timeout_s:
                failures += [f"{job}: timed out after {timeout_s:.0f} s" for job, _, _ in running]
                failures += [f"{job}: not started within {timeout_s:.0f} s" for job in waiting]
                break
    finally:   # SIGTERM while waiting, or the timeout: leave no warm-up process behind
        for _, log, process in running:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    return {"jobs": len(jobs), "seconds": round(time.monotonic() - started, 1), "failures": failures}
