"""What the GPU benchmark measures: its profiles and sizes, the dry run's tiny ones, the targets and the backends."""

from __future__ import annotations

import torch

__all__ = ["DECODE_KV_LENGTHS", "DECODE_QUERY_LENGTHS", "DRY_RUN", "DRY_RUN_DTYPES", "ESSENTIAL_DECODE_KV_LENGTHS",
           "ESSENTIAL_LENGTHS", "FLEX", "GPU_DTYPES", "GPU_HEAD_DIMS", "GPU_LENGTHS", "GPU_SIZES", "GQA_PREFILL",
           "LONG_FROM", "METHODS", "MODES", "NAIVE_UP_TO", "PROFILES", "SDPA_BACKENDS", "TARGETS", "WARM_UP_SECONDS"]


GPU_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
GPU_HEAD_DIMS = (128, 64)
GPU_DTYPES = (torch.float16, torch.bfloat16)
DRY_RUN_DTYPES = (torch.float16, torch.float32)    # the interpreter's tl.dot has no bfloat16
MODES = ("forward", "backward", "forward+backward")
DECODE_KV_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
DECODE_QUERY_LENGTHS = (1, 16)
LONG_FROM = 4096                                    # the targets are stated for N >= 4096
# Naive attention's longest N: at 4096 one call already takes milliseconds and GB; above it the
# run spent tens of seconds on a method whose only lesson (it is slow and large) 4096 already gives.
NAIVE_UP_TO = 4096
TARGETS = {"forward": 1.0, "backward": 0.8}         # ours / best SDPA backend, in speed
SDPA_BACKENDS = {"sdpa flash": "FLASH_ATTENTION", "sdpa efficient": "EFFICIENT_ATTENTION",
                 "sdpa cudnn": "CUDNN_ATTENTION"}
# The Triton attention a PyTorch user would pick: torch.compile(flex_attention), whose kernel
# Inductor generates in Triton. A peer measured in the same run as SDPA's backends.
FLEX = "flex compiled"
METHODS = ("ours (Triton)", *SDPA_BACKENDS, FLEX, "naive")
# The first-contact check's rows (issue 32), in order of importance, and the whole sweep.
PROFILES = ("essential", "long")
ESSENTIAL_LENGTHS = (4096, 16384)
ESSENTIAL_DECODE_KV_LENGTHS = (1024, 4096, 16384, 65536)
# Grouped-query prefill as in Llama 3 8B: 32 query heads share 8 key/value heads, d = 128, causal.
GQA_PREFILL = dict(heads=32, kv_heads=8, head_dim=128, tokens=16384, lengths=ESSENTIAL_LENGTHS)
# The GPU run's sizes, and the dry run's: the same code and loops, tiny sizes.
GPU_SIZES = dict(lengths=GPU_LENGTHS, essential_lengths=ESSENTIAL_LENGTHS, head_dims=GPU_HEAD_DIMS,
                 dtypes=GPU_DTYPES, tokens=16384, model_dim=2048, long_from=LONG_FROM, gqa=GQA_PREFILL,
                 decode=dict(kv_lengths=DECODE_KV_LENGTHS, essential_kv_lengths=ESSENTIAL_DECODE_KV_LENGTHS,
                             batch=4, heads=32, kv_heads=8, head_dim=128))
DRY_RUN = dict(lengths=(64, 128), essential_lengths=(128,), head_dims=(64,), dtypes=DRY_RUN_DTYPES, tokens=128,
               model_dim=128, long_from=128,
               gqa=dict(heads=4, kv_heads=2, head_dim=64, tokens=128, lengths=(128,)),
               decode=dict(kv_lengths=(128, 256), essential_kv_lengths=(256,), batch=1, heads=4, kv_heads=2,
                           head_dim=64))
WARM_UP_SECONDS = 120
