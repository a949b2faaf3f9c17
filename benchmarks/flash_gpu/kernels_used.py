"""Which of our kernels ran, in which launch configuration, read back after a measurement, and how
many kernel compilations a profile triggers.

Nothing here changes the kernels; it asks the launchers' own public functions. The forward's path
is :func:`~attn_course.flash.tma_attention.tma_forward_supported` on the same inputs. A tuned
kernel's configuration is the launcher's recorded winner for the inputs' length bucket
(:func:`~attn_course.flash.launch.tuned_configs`, by :func:`~attn_course.flash.launch.tuning_key`;
the TMA forward records its own under ``"forward_tma"``), else the autotuner's last ``best_config``;
in Triton's interpreter the first candidate. Flash-decoding's ``BLOCK_M`` and key splits are
recomputed (:func:`~attn_course.flash.decode.decode_layout`): the launcher keeps neither.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attn_course.flash import launch, tma_attention
from attn_course.flash.configs import CONFIGS, kernel_config
from attn_course.flash.decode import decode_layout, decode_merge_width
from attn_course.flash.tma_configs import HOPPER_LIMITS, prune_tma_configs, tma_forward_configs

__all__ = ["count_compilations", "decode_config", "describe_compilations", "describe_config", "prefill_kernels"]


def describe_config(config: object) -> str:
    """``"BLOCK_M=128 BLOCK_N=64 warps=4 stages=3"`` for a ``triton.Config`` or a
    :class:`~attn_course.flash.configs.KernelConfig`."""
    if hasattr(config, "kwargs"):   # triton.Config
        sizes = " ".join(f"{name}={value}" for name, value in sorted(config.kwargs.items()))
        return f"{sizes} warps={config.num_warps} stages={config.num_stages}"
    return (f"BLOCK_M={config.block_m} BLOCK_N={config.block_n} warps={config.num_warps} "
            f"stages={config.num_stages}")


def _tuned_winner(kernel: str, head_dim: int, *, causal: bool, dtype: torch.dtype, n_q: int, n_k: int,
                  groups: int):
    """The launcher's recorded winner for ``kernel`` on inputs of this length bucket, or None."""
    want = {"n_q": launch.length_bucket(n_q), "n_k": launch.length_bucket(n_k), "num_kv_groups": groups}
    for key, config in list(launch.tuned_configs().items()):
        if (isinstance(key, tuple) and len(key) == 5 and key[:3] == (kernel, head_dim, causal)
                and str(dtype) in key[3] and all(dict(key[4]).get(name, value) == value
                                                 for name, value in want.items())):
            return config
    return None


def _chosen(kernel: str, head_dim: int, *, causal: bool, dtype: torch.dtype, n_q: int, n_k: int,
            groups: int) -> str:
    """The configuration ``kernel`` ran with for these inputs: the interpreter's default, the
    launcher's tuned winner for their length bucket, or the autotuner's last ``best_config``."""
    if launch.runs_in_interpreter():
        chosen = describe_config(kernel_config(kernel, head_dim))
        if kernel == "decode":   # its BLOCK_M comes from the rows, not the configuration
            chosen = chosen.split(" ", 1)[1]
        return chosen + " (interpreter: the first candidate)"
    # The launcher tunes once per length bucket and launches that winner afterwards, keyed by
    # tuning_key: the winner for these inputs' bucket is in its table.
    winner = _tuned_winner(kernel, head_dim, causal=causal, dtype=dtype, n_q=n_q, n_k=n_k, groups=groups)
    if winner is not None:
        return describe_config(winner)
    best = getattr(launch.autotuned_kernel(kernel, head_dim), "best_config", None)
    if best is None:
        return "not known (the autotuner has not run)"
    return describe_config(best) + " (the autotuner's last choice)"


def _tma_chosen(head_dim: int, **shape) -> str:
    """The TMA forward's configuration for these inputs: its recorded winner for their length bucket."""
    winner = _tuned_winner("forward_tma", head_dim, **shape)
    if winner is not None:
        return describe_config(winner)
    return describe_config(tma_forward_configs(head_dim)[0]) + " (the default: no tuning recorded for this bucket)"


def prefill_kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str, *,
                    causal: bool) -> tuple[str, str]:
    """(path, config) of :func:`~attn_course.flash.flash_attention` on these inputs in ``mode``,
    read after it ran: ``"tma"`` or ``"pointer"`` for the forward, the backward always ``"pointer"``."""
    head_dim = q.shape[-1]
    shape = dict(causal=causal, dtype=q.dtype, n_q=q.shape[2], n_k=k.shape[2], groups=q.shape[1] // k.shape[1])
    paths, parts = [], []
    if mode in ("forward", "forward+backward"):
        # The launcher allocates its own contiguous output, so asking without one asks what it asked.
        if tma_attention.tma_forward_supported(q.detach(), k.detach(), v.detach()):
            paths.append("tma")
            parts.append("forward(tma) " + _tma_chosen(head_dim, **shape))
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
    """The configuration :func:`~attn_course.flash.decode_attention` ran with on ``q``, ``k``, read after it ran."""
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

    Ours: one per (kernel, configuration, dtype, head dim, causal), every autotuning candidate
    included (the autotuner compiles each to time it). Triton also specialises on integer
    arguments equal to 1 and on divisibility by 16, so grouped-query rows (group size 4, not 1)
    can compile the same tuple again: ``ours_with_group`` counts that too, an upper estimate.
    Flash-decoding's merge kernel is compiled per width (``SPLITS``), which follows N_k.
    FlexAttention compiled: per shape (``dynamic=False``) an inference graph (the forward timed
    under ``torch.no_grad``), a training forward and its backward.

    Args:
        plan: ``[(kind, options)]`` as :func:`~benchmarks.flash_gpu.plan.plan_phases` returns.
        sizes: :data:`~benchmarks.flash_gpu.plan.GPU_SIZES` or the dry run's.
        tma: the forward takes the TMA kernel (a Hopper GPU, tuned over the candidates
            :func:`~attn_course.flash.tma_configs.prune_tma_configs` keeps for an H100/H200) rather
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
                for n_q in options["query_lengths"]:
                    for n_k in options["kv_lengths"]:
                        *_, splits = decode_layout(decode["batch"], decode["heads"], decode["kv_heads"], n_q, n_k,
                                                   multiprocessors=multiprocessors)
                        ours.add(("decode_merge", f"SPLITS={decode_merge_width(splits)} warps=4", dtype, d, False,
                                  True))
                continue
            group = options["group_size"]
            methods = options.get("methods", ("ours (Triton)", "flex compiled"))
            for d in options["head_dims"]:
                for causal in options["causal"]:
                    modes = options.get("modes", ("forward", "backward", "forward+backward"))
                    kernels = [("backward_dkdv", c) for c in CONFIGS["backward_dkdv", d]]
                    kernels += [("backward_dq", c) for c in CONFIGS["backward_dq", d]]
                    if tma:
                        kernels += [("forward_tma", c)
                                    for c in prune_tma_configs(tma_forward_configs(d), d, **HOPPER_LIMITS)]
                    else:
                        kernels += [("forward", c) for c in CONFIGS["forward", d]]
                    if "ours (Triton)" in methods:
                        for kernel, config in kernels:
                            ours.add((kernel, describe_config(config), dtype, d, causal, group == 1))
                    if "flex compiled" not in methods:
                        continue
                    for n in options["lengths"]:
                        shape = (dtype, d, causal, n, group)
                        flex.add((*shape, "inference"))
                        if any(mode != "forward" for mode in modes) or "forward" in modes:
                            # measure() makes its first call with gradients on, whatever the mode
                            flex.update({(*shape, "training forward"), (*shape, "backward")})
    by_kernel: dict[str, int] = {}
    for entry in {entry[:5] for entry in ours}:
        by_kernel[entry[0]] = by_kernel.get(entry[0], 0) + 1
    return {"ours": len({entry[:5] for entry in ours}), "ours_with_group": len(ours), "flex": len(flex),
            "by_kernel": dict(sorted(by_kernel.items()))}


def describe_compilations(compilations: dict, profile: str, dry_run: bool = False) -> str:
    """One line for :func:`~benchmarks.flash_gpu.kernels_used.count_compilations`' counts."""
    kernels = ", ".join(f"{kernel} {count}" for kernel, count in compilations["by_kernel"].items())
    where = "on an H200 (assumed: TMA forward, 132 multiprocessors)" if dry_run else "on this GPU"
    return (f"kernel compilations of the {profile} profile {where}: ours {compilations['ours']} distinct (kernel, "
            f"config, dtype, d, causal) [{kernels}], up to {compilations['ours_with_group']} with Triton's "
            f"group-size-1 specialisation; FlexAttention compiled {compilations['flex']} graphs (per shape: "
            "inference, training forward, backward)")
