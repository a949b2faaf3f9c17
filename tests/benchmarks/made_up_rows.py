"""Made-up rows of the GPU benchmark (these tests run without a GPU), shared by tests/benchmarks."""

from __future__ import annotations

import csv
import dataclasses

from benchmarks import flash_gpu

MACHINE_COLUMNS = ["gpu", "driver", "cuda", "torch_version", "triton_version"]
GPU_COLUMNS = ["method", "path", "dtype", "head_dim", "causal", "batch", "heads", "kv_heads", "n", "mode", "status",
               "milliseconds", "tflops", "max_difference", "first_call_s", "reason", "config", *MACHINE_COLUMNS]
DECODE_COLUMNS = ["method", "path", "dtype", "head_dim", "batch", "heads", "kv_heads", "n_q", "n_k", "kv_layout",
                  "status", "timing", "milliseconds", "plain_milliseconds", "kv_gbps", "max_difference", "first_call_s",
                  "reason", "config", *MACHINE_COLUMNS]
SUMMARY_COLUMNS = ["kind", "dtype", "head_dim", "heads", "kv_heads", "causal", "n_q", "n_k", "mode", "ours_ms",
                   "fa2_ms", "fa2_ratio", "cudnn_ms", "cudnn_ratio", "best_sdpa", "best_sdpa_ms", "ratio", "target",
                   "misses", "flex_ms", "flex_ratio", "note", *MACHINE_COLUMNS]
MACHINE = flash_gpu.MachineInfo(gpu="NVIDIA H200", driver="580.1", cuda="13.0", torch_version="2.11.0",
                                triton_version="3.6.0")


def gpu_row(**changes) -> flash_gpu.GpuRow:
    """A made-up GpuRow (these tests run without a GPU), with ``changes`` applied."""
    values = dict(method="ours (Triton)", path="tma", dtype="float16", head_dim=64, causal=False, batch=32, heads=32,
                  kv_heads=32, n=512, mode="forward", status="ok", milliseconds=0.5, tflops=123.4, max_difference=1e-3,
                  first_call_s=None, reason="", config="forward(tma) BLOCK_M=128 BLOCK_N=64 warps=4 stages=3",
                  **dataclasses.asdict(MACHINE))
    return flash_gpu.GpuRow(**{**values, **changes})


def decode_row(**changes) -> flash_gpu.DecodeRow:
    """A made-up DecodeRow, with ``changes`` applied."""
    values = dict(method="ours (decode_attention)", path="flash-decoding", dtype="float16", head_dim=128, batch=4,
                  heads=32, kv_heads=8, n_q=1, n_k=4096, kv_layout="grouped (in place)", status="ok",
                  timing="cuda graph", milliseconds=0.02, plain_milliseconds=0.07, kv_gbps=3355.4, max_difference=1e-3,
                  first_call_s=None, reason="", config="decode BLOCK_N=64 warps=4 stages=3 BLOCK_M=16; splits=9",
                  **dataclasses.asdict(MACHINE))
    return flash_gpu.DecodeRow(**{**values, **changes})


def read_csv(path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path) as handle:
        reader = csv.DictReader(handle)
        return reader.fieldnames, list(reader)
