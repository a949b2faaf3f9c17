"""Attention over a whole sequence: TFLOP/s of ours, SDPA's backends and naive attention."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.flash import flash_attention
from attn_course.measure.flash import attention_flops
from attn_course.measure.memory import available_memory_bytes
from benchmarks.flash_gpu.backends import flex_function, sdpa_context
from benchmarks.flash_gpu.kernels_used import prefill_kernels
from benchmarks.flash_gpu.measuring import TIME_BUDGET_SPENT, Measured, describe_error, measure, past, setup, skipped
from benchmarks.flash_gpu.plan import (
    FLEX,
    FLEX_COMPILE_MARGIN_S,
    GPU_HEAD_DIMS,
    GPU_LENGTHS,
    METHODS,
    MODES,
    NAIVE_UP_TO,
    SDPA_BACKENDS,
)
from benchmarks.flash_gpu.rows import GpuRow, MachineInfo

__all__ = ["SDPA_CONFIG", "gpu_rows"]

#: What an SDPA row can say of its configuration: PyTorch picks its kernels' tiles inside and exposes none.
SDPA_CONFIG = "chosen inside PyTorch's kernel (not exposed)"


def gpu_rows(lengths: Sequence[int] = GPU_LENGTHS, *, head_dims: Sequence[int] = GPU_HEAD_DIMS,
             dtypes: Sequence[torch.dtype] | None = None, causal: Sequence[bool] = (False, True),
             modes: Sequence[str] = MODES, methods: Sequence[str] = METHODS, tokens: int = 16384,
             model_dim: int = 2048, group_size: int = 1, seed: int = 0,
             device: str = "cuda", deadline: float | None = None, on_row: Callable[[GpuRow], None] | None = None,
             progress: Callable[[str], None] | None = None, machine: MachineInfo | None = None) -> list[GpuRow]:
    """TFLOP/s of our Triton kernel, SDPA's backends, FlexAttention compiled and naive attention, forward and
    backward, each row naming the path and configuration that ran.

    As in the FlashAttention papers, ``B = tokens / N`` sequences (at least 1) of ``H = model_dim / d`` heads,
    every ``group_size`` of them sharing a key/value head (``H_kv = H / group_size``: SDPA gets
    ``enable_gqa=True``, and a backend that refuses it K/V expanded inside the timed call; naive attention
    expands them). A method that is unavailable or raises gives skipped rows with the reason; naive
    attention is skipped above N = 4096 and where its N x N float32 matrices would not fit in free memory.

    Args:
        lengths, head_dims, dtypes, causal, modes: what to measure, in this order (``dtypes`` default:
            float16 and bfloat16 on a GPU, float16 and float32 on the CPU); each d must divide ``model_dim``.
        methods: a subset of :data:`~benchmarks.flash_gpu.plan.METHODS`, measured in that table's order.
        tokens, model_dim, group_size: B · N, H · d and the query heads per key/value head.
        seed: for the random inputs (a generator on the device), ``>= 0``.
        device: ``"cuda"``, or ``"cpu"`` for the dry run (Triton's interpreter, a wall-clock timer).
        deadline: a ``time.monotonic()`` value after which measurements become skipped rows; None: no limit.
            FlexAttention starts no compile (nor its measurement) within
            :data:`~benchmarks.flash_gpu.plan.FLEX_COMPILE_MARGIN_S` of it: a compile cannot be stopped.
        on_row: called with each row as soon as it is measured; progress: with a line per configuration.
        machine: the :class:`MachineInfo` the rows name (default: :func:`machine_info`).

    Returns:
        One :class:`GpuRow` per (dtype, d, causal, N, method, mode), in that nesting order.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: empty or non-positive sizes, d not dividing ``model_dim`` or ``group_size`` not dividing H,
            an unknown mode, method or device, seed < 0.
        RuntimeError: ``device="cuda"`` without a CUDA GPU.
    """
    where = "gpu_rows"
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1, nonempty=True)
    head_dims = _validate.integer_sequence(where, "head_dims", head_dims, minimum=1, nonempty=True)
    causal = [_validate.boolean(where, f"causal[{index}]", value)
              for index, value in enumerate(_validate.sequence(where, "causal", causal, of="bools"))]
    if not causal:
        raise ValueError(f"{where}: causal must not be empty")
    modes = _choices(where, "modes", modes, MODES)
    methods = _choices(where, "methods", methods, METHODS)
    methods = [method for method in METHODS if method in methods]
    tokens, model_dim, group_size = _validate.integers(where, minimum=1, tokens=tokens, model_dim=model_dim,
                                                       group_size=group_size)
    for index, head_dim in enumerate(head_dims):
        if model_dim % head_dim:
            raise ValueError(f"{where}: head_dims[{index}] must divide model_dim={model_dim}, got {head_dim}")
        if (model_dim // head_dim) % group_size:
            raise ValueError(f"{where}: group_size must divide the heads H = model_dim / head_dims[{index}] = "
                             f"{model_dim // head_dim}, got {group_size}")
    run = setup(where, dtypes=dtypes, seed=seed, deadline=deadline, on_row=on_row, progress=progress,
                machine=machine, device=device)
    clock, machine = run["clock"], run["machine"]
    rows = []
    for dtype, head_dim, is_causal, n in itertools.product(run["dtypes"], head_dims, causal, lengths):
        started = time.perf_counter()
        batch, heads = max(1, tokens // n), model_dim // head_dim
        config = dict(dtype=str(dtype).removeprefix("torch."), head_dim=head_dim, causal=is_causal,
                      batch=batch, heads=heads, kv_heads=heads // group_size, n=n)
        new = []

        def emit(method, results, kernels, config=config, new=new):   # as soon as it is measured
            for mode in modes:
                result = results[mode]
                flops = attention_flops(config["batch"], config["heads"], config["n"], config["head_dim"],
                                        causal=config["causal"], mode=mode)
                ms = result.milliseconds
                path, launched = kernels(mode) if result.status == "ok" else kernels(None)
                row = GpuRow(method=method, path=path, **config, mode=mode, status=result.status,
                             milliseconds=ms, tflops=None if ms is None else flops / ms / 1e9,
                             max_difference=result.max_difference, first_call_s=result.first_call_s,
                             reason=result.reason, config=launched, **dataclasses.asdict(machine))
                new.append(row)
                run["on_row"](row)

        one_configuration(config, dtype, modes, methods, clock, run["generator"], run["deadline"], emit)
        clock.empty_cache()
        rows += new
        run["progress"](progress_line(new, config, time.perf_counter() - started))
    return rows


def _choices(where: str, name: str, values: object, allowed: Sequence[str]) -> list[str]:
    values = _validate.labels(where, name, values)
    for index, value in enumerate(values):
        if value not in allowed:
            raise ValueError(f"{where}: {name}[{index}] must be one of {list(allowed)}, got {value!r}")
    if not values:
        raise ValueError(f"{where}: {name} must not be empty")
    return values


def one_configuration(config, dtype, modes, methods, clock, generator, deadline, emit):
    """Measure one (dtype, d, causal, N): ``emit(method, {mode: Measured}, kernels)`` for each method, where
    ``kernels(mode)`` reads the row's (path, config) then (``kernels(None)`` for a skipped row)."""
    device, causal, n = clock.device, config["causal"], config["n"]
    b, h, h_kv, d = config["batch"], config["heads"], config["kv_heads"], config["head_dim"]
    group = h // h_kv

    def fixed(path, launched=""):
        return lambda mode: (path, launched)

    paths = {"ours (Triton)": fixed("pointer or tma (did not run)"),
             "naive": fixed("naive", "self_attention: float32 N x N scores and weights, no tiles"),
             FLEX: fixed("flex-compiled" if device.type == "cuda" else "flex-eager"),
             **{method: fixed(method.replace(" ", "-"), SDPA_CONFIG) for method in SDPA_BACKENDS}}
    if past(deadline):
        for method in methods:
            emit(method, skipped(TIME_BUDGET_SPENT, modes), paths[method])
        return
    try:
        q, grad_out = (torch.randn(b, h, n, d, dtype=dtype, device=device, generator=generator) for _ in range(2))
        k, v = (torch.randn(b, h_kv, n, d, dtype=dtype, device=device, generator=generator) for _ in range(2))
    except Exception as error:   # out of memory
        for method in methods:
            emit(method, skipped(describe_error(error), modes), paths[method])
        return
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def wide(t):   # grouped K/V expanded to H heads, for the methods that take no grouped heads
        return t if group == 1 else t.repeat_interleave(group, dim=1)

    try:
        with torch.no_grad():
            reference = F.scaled_dot_product_attention(q.float(), wide(k).float(), wide(v).float(), is_causal=causal)
    except Exception:   # no reference: the rows say nothing about differences
        reference = None
    mask = causal_mask(n, device=device) if causal else None
    gqa = {"enable_gqa": True} if group > 1 else {}
    functions = {"ours (Triton)": lambda q, k, v: flash_attention(q, k, v, causal=causal),
                 "naive": lambda q, k, v: self_attention(q, wide(k), wide(v), mask)[0]}
    for method in SDPA_BACKENDS:
        functions[method] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)
    paths["ours (Triton)"] = lambda mode: (prefill_kernels(q, k, v, mode, causal=causal) if mode else
                                           ("pointer or tma (did not run)", ""))
    # Naive keeps about five B·H·N·N float32 matrices for its backward (scores, weights, their gradients).
    naive_bytes = 5 * 4 * b * h * n * n
    for method in methods:
        method_modes = modes
        if method == "naive" and n > NAIVE_UP_TO:
            emit(method, skipped(f"naive is left out above N = {NAIVE_UP_TO}: its N x N float32 matrices take "
                                 "GBs and milliseconds a call; the time goes to the kernels", modes), paths[method])
            continue
        if method == "naive" and naive_bytes > 0.8 * available_memory_bytes(device):
            emit(method, skipped(f"needs about {naive_bytes / 2**30:.0f} GiB for its N x N float32 matrices, "
                                 f"{available_memory_bytes(device) / 2**30:.0f} GiB free", modes), paths[method])
            continue
        note = ""
        method_deadline = deadline
        if method == FLEX:
            # No compile starts within the margin: one under way runs to its end, past any deadline.
            method_deadline = None if deadline is None else deadline - FLEX_COMPILE_MARGIN_S
            if past(method_deadline):
                emit(method, skipped(TIME_BUDGET_SPENT, modes), paths[method])
                continue
            try:
                functions[method], path, launched, note = flex_function(causal, n, device, group > 1)
            except Exception as error:   # no FlexAttention in this torch, or no mask for this shape
                emit(method, skipped(describe_error(error), modes), paths[method])
                continue
            paths[method] = fixed(path, launched)
            if device.type != "cuda":    # FlexAttention has no backward on the CPU
                method_modes = [mode for mode in modes if mode == "forward"]
            elif "forward" in modes and not past(method_deadline):
                # The forward rows are timed under no_grad, a graph of its own: compile it here, so
                # that its time is recorded (first_call_s holds the training graph's) and not timed.
                try:
                    with torch.no_grad():
                        _, seconds = clock.first_call(lambda: functions[FLEX](q, k, v))
                except Exception as error:
                    emit(method, skipped(describe_error(error), modes), paths[method])
                    continue
                note = f"torch.compile: inference graph compiled in {seconds:.1f} s, the training graph in first_call_s"
        context = sdpa_context(method) if method in SDPA_BACKENDS else contextlib.nullcontext()
        with context:
            results = measure(functions[method], q, k, v, grad_out, reference, method_modes, clock, method_deadline)
            refused = [r.reason for r in results.values() if r.status != "ok" and r.reason != TIME_BUDGET_SPENT]
            if method in SDPA_BACKENDS and group > 1 and len(refused) == len(results):
                # A backend that takes no grouped K/V still gets compared, on K/V expanded to H heads
                # inside the timed call (the copy a model without enable_gqa would make).
                results = measure(lambda q, k, v: F.scaled_dot_product_attention(q, wide(k), wide(v),
                                                                                  is_causal=causal),
                                  q, k, v, grad_out, reference, method_modes, clock, deadline)
                note = f"enable_gqa=True refused ({refused[0][:200]}): K/V expanded inside the timed call"
                paths[method] = fixed(f"{method.replace(' ', '-')} (K/V expanded)", SDPA_CONFIG)
                results = {mode: r if r.status == "ok" else dataclasses.replace(r, reason=f"{r.reason}; {note}")
                           for mode, r in results.items()}
        for mode in modes:
            if mode not in results:
                results[mode] = Measured("skipped", reason=f"{note}; FlexAttention has no backward on the CPU")
            elif note and results[mode].status == "ok" and (mode == "forward" or device.type != "cuda"):
                results[mode] = dataclasses.replace(results[mode], reason=note)
        emit(method, results, paths[method])
        if method == FLEX and device.type == "cuda":
            functions[method] = None      # the compiled graphs and their memory go before the next method
    # The inputs are freed as this returns (the rows' kernels(...) have been read); the caller empties the cache.


def progress_line(rows: Sequence[GpuRow], config: dict, seconds: float) -> str:
    modes = list(dict.fromkeys(r.mode for r in rows))
    tflops = {(r.method, r.mode): "-" if r.tflops is None else f"{r.tflops:.3g}" for r in reversed(rows)}
    parts = [f"{method} " + "/".join(tflops[method, mode] for mode in modes)
             for method in dict.fromkeys(r.method for r in rows)]
    mask = "causal" if config["causal"] else "full"
    return (f"{config['dtype']} d={config['head_dim']} {mask} N={config['n']} (B={config['batch']} "
            f"H={config['heads']} H_kv={config['kv_heads']}) TFLOP/s {'/'.join(modes)}: " + ", ".join(parts)
            + f"  [{seconds:.1f} s]")
