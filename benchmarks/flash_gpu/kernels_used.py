"""Which of our kernels ran and in which configuration, read back from the launchers after a measurement
(nothing here changes the kernels), and how many compilations a profile triggers."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence

import torch

from attn_course.flash import launch, tma_attention
from attn_course.flash.configs import CONFIGS, kernel_config
from attn_course.flash.decode import decode_layout, decode_merge_width
from attn_course.flash.tma_configs import HOPPER_LIMITS, prune_tma_configs, tma_forward_configs

__all__ = ["count_compilations", "decode_config", "describe_compilations", "describe_config", "prefill_kernels"]


def describe_config(config: object) -> str:
    """``"BLOCK_M=128 BLOCK_N=64 warps=4 stages=3"`` for a ``triton.Config`` or a ``KernelConfig``."""
    if hasattr(config, "kwargs"):   # triton.Config
        sizes = " ".join(f"{name}={value}" for name, value in sorted(config.kwargs.items()))
        return f"{sizes} warps={config.num_warps} stages={config.num_stages}"
    return (f"BLOCK_M={config.block_m} BLOCK_N={config.block_n} warps={config.num_warps} "
            f"stages={config.num_stages}")


def _tuned_winner(kernel: str, head_dim: int, *, causal: bool, dtype: torch.dtype, n_q: int, n_k: int,
                  groups: int):
    """The launcher's recorded winner (:func:`~attn_course.flash.launch.tuned_configs`, keyed by
    :func:`~attn_course.flash.launch.tuning_key`) for ``kernel`` on inputs of this length bucket, or None."""
    want = {"n_q": launch.length_bucket(n_q), "n_k": launch.length_bucket(n_k), "num_kv_groups": groups}
    for key, config in list(launch.tuned_configs().items()):
        if (isinstance(key, tuple) and len(key) == 5 and key[:3] == (kernel, head_dim, causal)
                and str(dtype) in key[3] and all(dict(key[4]).get(name, value) == value
                                                 for name, value in want.items())):
            return config
    return None


def _chosen(kernel: str, head_dim: int, *, causal: bool, dtype: torch.dtype, n_q: int, n_k: int,
            groups: int) -> str:
    """The configuration ``kernel`` ran with for these inputs: the interpreter's first candidate, the
    launcher's tuned winner for their length bucket, or the autotuner's last ``best_config``."""
    if launch.runs_in_interpreter():
        chosen = describe_config(kernel_config(kernel, head_dim))
        if kernel == "decode":   # its BLOCK_M comes from the rows, not the configuration
            chosen = chosen.split(" ", 1)[1]
        return chosen + " (interpreter: the first candidate)"
    winner = _tuned_winner(kernel, head_dim, causal=causal, dtype=dtype, n_q=n_q, n_k=n_k, groups=groups)
    if winner is not None:
        return describe_config(winner)
    best = getattr(launch.autotuned_kernel(kernel, head_dim), "best_config", None)
    if best is None:
        return "not known (the autotuner has not run)"
    return describe_config(best) + " (the autotuner's last choice)"


def prefill_kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str, *,
                    causal: bool) -> tuple[str, str]:
    """(path, config) of :func:`~attn_course.flash.flash_attention` on these inputs in ``mode``, read after it
    ran: the forward ``"tma"`` (:func:`~attn_course.flash.tma_attention.tma_forward_supported`) or
    ``"pointer"``, the backward always ``"pointer"``."""
    head_dim = q.shape[-1]
    shape = dict(causal=causal, dtype=q.dtype, n_q=q.shape[2], n_k=k.shape[2], groups=q.shape[1] // k.shape[1])
    paths, parts = [], []
    if mode in ("forward", "forward+backward"):
        # The launcher allocates its own contiguous output, so asking without one asks what it asked.
        if tma_attention.tma_forward_supported(q.detach(), k.detach(), v.detach()):
            paths.append("tma")
            winner = _tuned_winner("forward_tma", head_dim, **shape)     # the TMA forward's own tuning
            default = " (the default: no tuning recorded for this bucket)"
            parts.append("forward(tma) " + (describe_config(winner) if winner is not None
                                            else describe_config(tma_forward_configs(head_dim)[0]) + default))
        else:
            paths.append("pointer")
            parts.append("forward " + _chosen("forward", head_dim, **shape))
    if mode in ("backward", "forward+backward"):
        if "pointer" not in paths:
            paths.append("pointer")
        parts += [f"dkdv {_chosen('backward_dkdv', head_dim, **shape)}",
                  f"dq {_chosen('backward_dq', head_dim, **shape)}"]
    path = "+".join(paths) + (" (interpreter)" if launch.runs_in_interpreter() else "")
    return path, "; ".join(parts)


def decode_config(q: torch.Tensor, k: torch.Tensor, *, causal: bool = False) -> str:
    """The configuration :func:`~attn_course.flash.decode_attention` ran with on ``q``, ``k``, read after it ran
    (``BLOCK_M`` and the splits recomputed by :func:`~attn_course.flash.decode.decode_layout`)."""
    batch, heads, n_q, head_dim = q.shape
    multiprocessors = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
    block_m, _, splits = decode_layout(batch, heads, k.shape[1], n_q, k.shape[2], multiprocessors=multiprocessors)
    chosen = _chosen("decode", head_dim, causal=causal, dtype=q.dtype, n_q=n_q, n_k=k.shape[2],
                     groups=heads // k.shape[1])
    return (f"decode {chosen} BLOCK_M={block_m}; splits={splits} "
            f"(recomputed by the launcher's rule); merge SPLITS={decode_merge_width(splits)} warps=4")


def count_compilations(plan: Sequence[tuple[str, dict]], sizes: dict, *, tma: bool = True,
                       multiprocessors: int = 132) -> dict:
    """The distinct kernel compilations a plan of :func:`~benchmarks.flash_gpu.plan.plan_phases` triggers.

    Ours: one per (kernel, configuration, dtype, d, causal), every autotuning candidate included; Triton
    also specialises an integer argument equal to 1, so grouped-query rows can compile the same again
    (``ours_with_group``, an upper estimate); flash-decoding's merge once per width (``SPLITS``, following
    N_k). FlexAttention compiled: per shape an inference graph, a training forward and its backward.

    Args:
        plan: ``[(kind, options)]`` as :func:`~benchmarks.flash_gpu.plan.plan_phases` returns.
        sizes: :data:`~benchmarks.flash_gpu.plan.GPU_SIZES` or the dry run's.
        tma: the forward takes the TMA kernel, tuned over the candidates kept for an H100/H200, rather
            than the autotuned pointer one.
        multiprocessors: the GPU's (132 on an H100 or H200), for flash-decoding's splits.

    Returns:
        ``{"ours": int, "ours_with_group": int, "flex": int, "by_kernel": {kernel: int}}``.
    """
    ours, flex = set(), set()
    for kind, options in plan:
        for dtype in options["dtypes"]:
            dtype = str(dtype).removeprefix("torch.")
            if kind == "decode":
                decode = sizes["decode"]
                d, group = decode["head_dim"], decode["heads"] // decode["kv_heads"]
                for c in CONFIGS["decode", d]:
                    ours.add(("decode", describe_config(c), dtype, d, False, group == 1))
                for n_q, n_k in itertools.product(options["query_lengths"], options["kv_lengths"]):
                    *_, splits = decode_layout(decode["batch"], decode["heads"], decode["kv_heads"], n_q, n_k,
                                               multiprocessors=multiprocessors)
                    ours.add(("decode_merge", f"SPLITS={decode_merge_width(splits)} warps=4", dtype, d, False, True))
                continue
            group = options["group_size"]
            methods = options.get("methods", ("ours (Triton)", "flex compiled"))
            for d, causal in itertools.product(options["head_dims"], options["causal"]):
                tuned = prune_tma_configs(tma_forward_configs(d), d, **HOPPER_LIMITS) if tma else CONFIGS["forward", d]
                kernels = [("forward_tma" if tma else "forward", c) for c in tuned]
                kernels += [(kernel, c) for kernel in ("backward_dkdv", "backward_dq") for c in CONFIGS[kernel, d]]
                if "ours (Triton)" in methods:
                    ours.update((kernel, describe_config(c), dtype, d, causal, group == 1) for kernel, c in kernels)
                if "flex compiled" in methods:   # measure()'s first call has gradients on: a training graph too
                    flex.update((dtype, d, causal, n, group, graph) for n in options["lengths"]
                                for graph in ("inference", "training forward", "backward"))
    distinct = {entry[:5] for entry in ours}
    return {"ours": len(distinct), "ours_with_group": len(ours), "flex": len(flex),
            "by_kernel": dict(sorted(collections.Counter(entry[0] for entry in distinct).items()))}


def describe_compilations(compilations: dict, profile: str, dry_run: bool = False) -> str:
    """One line for :func:`count_compilations`' counts."""
    kernels = ", ".join(f"{kernel} {count}" for kernel, count in compilations["by_kernel"].items())
    where = "on an H200 (assumed: TMA forward, 132 multiprocessors)" if dry_run else "on this GPU"
    return (f"kernel compilations of the {profile} profile {where}: ours {compilations['ours']} distinct (kernel, "
            f"config, dtype, d, causal) [{kernels}], up to {compilations['ours_with_group']} with Triton's "
            f"group-size-1 specialisation; FlexAttention compiled {compilations['flex']} graphs (per shape: "
            "inference, training forward, backward)")
