"""What the GPU benchmark measures, and in which order: its sizes, the dry run's tiny ones, the
profiles and their phases, most important first."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["DECODE_KV_LENGTHS", "DECODE_QUERY_LENGTHS", "DRY_RUN", "DRY_RUN_DTYPES", "FLEX", "FLEX_COMPILE_MARGIN_S",
           "GPU_DTYPES", "GPU_HEAD_DIMS", "GPU_LENGTHS", "GPU_SIZES", "KERNEL_METHODS", "LONG_FROM", "METHODS", "MODES",
           "NAIVE_UP_TO", "PROFILES", "SDPA_BACKENDS", "TARGETS", "TARGET_REFERENCES", "WARM_UP_SECONDS",
           "check_profile", "plan_phases"]

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
TARGETS = {"forward": 1.0, "backward": 0.8}         # ours / reference, in speed
SDPA_BACKENDS = {"sdpa flash": "FLASH_ATTENTION", "sdpa efficient": "EFFICIENT_ATTENTION",
                 "sdpa cudnn": "CUDNN_ATTENTION"}
# The targets hold against each of two references, judged apart (issue 42): FlashAttention-2 (SDPA's
# flash backend), the class of kernel chapter 07 builds and expects to match, and cuDNN (SDPA's cuDNN
# backend), against which the targets were first set as SDPA's fastest on Hopper, and which a kernel
# of FlashAttention-2's structure is not expected to reach. A row that misses one says which; it is
# reported, never a failure of the run.
TARGET_REFERENCES = {"FA2": "sdpa flash", "cuDNN": "sdpa cudnn"}
# The Triton attention a PyTorch user would pick: torch.compile(flex_attention), whose kernel
# Inductor generates in Triton. A peer measured in the same run as SDPA's backends.
FLEX = "flex compiled"
#: Seconds before the deadline (``max_minutes``) from which no FlexAttention compile starts. The
#: deadline is checked only before a compile starts, and a compile cannot be stopped: one started
#: just before it ran past ``timeout`` (issue 42). Per shape FlexAttention compiles three graphs
#: (an inference graph, a training forward, its backward), each checked before it starts, so the
#: margin is one compile's worst case. Measured: the first ``torch.compile(flex_attention)`` call
#: took about 35 s on this course's busy 2-core CPU (NOTES.md, "FlexAttention on the CPU"); no GPU
#: compile has been timed yet (the rows record each one: ``first_call_s``, and the forward rows'
#: reason for the inference graph), and a GPU machine's 16 cores compile from Inductor's cache,
#: warmed just before FlexAttention's phases. 30 s, plus the 37 s between the first profile's
#: deadline (1.3 min) and its ``timeout`` (115 s), leave a 67-second compile room to finish.
FLEX_COMPILE_MARGIN_S = 30.0
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

#: The methods of the attention phases before FlexAttention's own.
KERNEL_METHODS = tuple(method for method in METHODS if method != FLEX)


def check_profile(where: str, profile: object) -> str:
    if not isinstance(profile, str):
        raise TypeError(f"{where}: profile must be a str, one of {list(PROFILES)}, got {type(profile).__name__}")
    if profile not in PROFILES:
        raise ValueError(f"{where}: profile must be one of {list(PROFILES)}, got {profile!r}")
    return profile


def plan_phases(sizes: dict, lengths: Sequence[int] | None, profile: str = "long") -> list[tuple[str, dict]]:
    """The measurements in order of importance, as ``[(kind, options)]``; ``lengths`` replaces the attention N.

    ``"essential"`` (issue 32's first-contact rows): float16 over both d, both masks and all modes at the
    profile's N, decoding (N_q = 1), grouped-query prefill (causal, H = 32 over H_kv = 8), then bfloat16 as
    float16. ``"long"``: long sequences, decoding at N_q = 1, the second dtype, decoding at N_q = 16 and in
    the second dtype, grouped-query prefill in every dtype and mask, the short sequences last. FlexAttention
    compiled comes after, on the same cases: it compiles per shape, and a budget that runs out should cut
    the peer, not the comparison with SDPA.

    Raises:
        TypeError, ValueError: ``profile`` not a str, or not one of :data:`PROFILES`.
    """
    check_profile("plan_phases", profile)
    full = list(lengths or sizes["lengths"])
    first, *others = sizes["dtypes"]
    decode, gqa = sizes["decode"], sizes["gqa"]

    def attention(dtypes, chosen, causal=(False, True), methods=KERNEL_METHODS):
        return ("attention", dict(dtypes=list(dtypes), lengths=list(chosen), head_dims=list(sizes["head_dims"]),
                                  causal=list(causal), tokens=sizes["tokens"], model_dim=sizes["model_dim"],
                                  group_size=1, methods=list(methods)))

    def grouped(dtypes, causal, methods=KERNEL_METHODS):
        return ("attention", dict(dtypes=list(dtypes), lengths=list(lengths or gqa["lengths"]),
                                  head_dims=[gqa["head_dim"]], causal=list(causal), tokens=gqa["tokens"],
                                  model_dim=gqa["heads"] * gqa["head_dim"],
                                  group_size=gqa["heads"] // gqa["kv_heads"], methods=list(methods)))

    def decoding(dtypes, query_lengths, kv_lengths):
        return ("decode", dict(dtypes=list(dtypes), query_lengths=list(query_lengths), kv_lengths=list(kv_lengths)))

    if profile == "essential":
        chosen = list(lengths or sizes["essential_lengths"])
        phases = [attention([first], chosen), decoding([first], [1], decode["essential_kv_lengths"]),
                  grouped([first], [True]), attention(others, chosen),
                  attention([first], chosen, methods=[FLEX]), grouped([first], [True], methods=[FLEX]),
                  attention(others, chosen, methods=[FLEX])]
    else:
        long = [n for n in full if n >= sizes["long_from"]]
        short = [n for n in full if n < sizes["long_from"]]
        phases = [attention([first], long), decoding([first], [1], decode["kv_lengths"]), attention(others, long),
                  decoding([first], [16], decode["kv_lengths"]),
                  decoding(others, DECODE_QUERY_LENGTHS, decode["kv_lengths"]),
                  grouped(sizes["dtypes"], (False, True)), attention(sizes["dtypes"], short),
                  attention(sizes["dtypes"], long, methods=[FLEX]), grouped(sizes["dtypes"], (False, True), [FLEX]),
                  attention(sizes["dtypes"], short, methods=[FLEX])]
    return [(kind, options) for kind, options in phases if options["dtypes"] and options.get("lengths", [1])]
