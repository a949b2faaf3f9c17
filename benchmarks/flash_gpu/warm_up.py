"""Warming Triton's on-disk cache in parallel processes before the benchmark measures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from benchmarks.flash_gpu.backends import ours_decode
from benchmarks.flash_gpu.sizes import DECODE_QUERY_LENGTHS

__all__ = ["warm_triton_cache", "warm_up_job", "warm_up_jobs"]


def warm_up_jobs(sizes: dict, dry_run: bool) -> list[dict]:
    """One job per kernel specialization the run will need: (dtype, d, causal) for attention and one per
    dtype for decoding. The dry run warms only the first, to run the code, not to save time."""
    device = "cpu" if dry_run else "cuda"
    n = 64 if dry_run else 1024            # a multiple of 16, like every N measured: the same specialization
    jobs = [dict(kind="attention", dtype=str(dtype).removeprefix("torch."), head_dim=d, causal=causal, n=n,
                 heads=sizes["model_dim"] // d, device=device)
            for dtype in sizes["dtypes"] for d in sizes["head_dims"] for causal in (False, True)]
    decode = sizes["decode"]
    decoding = [dict(kind="decode", dtype=str(dtype).removeprefix("torch."), head_dim=decode["head_dim"],
                     causal=False, n=decode["kv_lengths"][0], heads=decode["heads"], kv_heads=decode["kv_heads"],
                     batch=decode["batch"], device=device) for dtype in sizes["dtypes"]]
    return jobs[:1] if dry_run else jobs + decoding


def warm_up_job(job: dict) -> None:
    """Run one warm-up job (in its own process): the kernels compile, and the autotuner compiles
    every candidate, into Triton's on-disk cache, where the benchmark's process finds them."""
    from attn_course.flash import triton_attention

    dtype, device, d = getattr(torch, job["dtype"]), job["device"], job["head_dim"]
    if job["kind"] == "attention":
        q, k, v = (torch.randn(1, job["heads"], job["n"], d, dtype=dtype, device=device, requires_grad=True)
                   for _ in range(3))
        out = triton_attention.flash_attention(q, k, v, causal=job["causal"])
        out.backward(torch.randn_like(out))
    else:
        _, decode, _ = ours_decode()
        k, v = (torch.randn(job["batch"], job["kv_heads"], job["n"], d, dtype=dtype, device=device) for _ in range(2))
        for n_q in DECODE_QUERY_LENGTHS:
            decode(torch.randn(job["batch"], job["heads"], n_q, d, dtype=dtype, device=device), k, v)
    if device == "cuda":
        torch.cuda.synchronize()


def warm_triton_cache(jobs: list[dict], *, timeout_s: float, interpret: bool) -> dict:
    """Run the warm-up jobs in parallel processes (compiling is single-threaded and CPU-bound;
    a GPU machine has cores to spare). Failures are reported, never raised: it is only a warm-up."""
    started = time.monotonic()
    # The same environment as this process (Triton's cache key includes some TRITON_* variables),
    # but for the dry run's interpreter.
    env = {**os.environ, "TRITON_INTERPRET": "1"} if interpret else dict(os.environ)
    processes = [subprocess.Popen([sys.executable, "-m", "benchmarks.flash_gpu", "--warm-up", json.dumps(job)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                 for job in jobs]
    failures = []
    try:
        for job, process in zip(jobs, processes):
            try:
                output, _ = process.communicate(timeout=max(1.0, timeout_s - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
                failures.append(f"{job}: timed out after {timeout_s:.0f} s")
                continue
            if process.returncode:
                last = (output or "").strip().splitlines()[-1:] or ["no output"]
                failures.append(f"{job}: exit status {process.returncode}: {last[0][:300]}")
    finally:   # SIGTERM while waiting: leave no warm-up process behind
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return {"jobs": len(jobs), "seconds": round(time.monotonic() - started, 1), "failures": failures}
