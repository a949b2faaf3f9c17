"""Attention over a whole sequence: TFLOP/s of ours, SDPA's backends and naive attention."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.flash import flash_attention
from attn_course.measure.flash import attention_flops
from benchmarks.flash_gpu.backends import flex_function, sdpa_context
from benchmarks.flash_gpu.kernels_used import prefill_kernels
from benchmarks.flash_gpu.measuring import (
    TIME_BUDGET_SPENT,
    Measured,
    check_choices,
    describe_error,
    measure,
    past,
    setup,
    skipped,
)
from benchmarks.flash_gpu.plan import FLEX, GPU_HEAD_DIMS, GPU_LENGTHS, METHODS, MODES, NAIVE_UP_TO, SDPA_BACKENDS
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
    """TFLOP/s of our Triton kernel, SDPA's backends, FlexAttention compiled and naive attention,
    forward and backward.

    Batch and heads follow the FlashAttention papers: ``B = tokens / N`` sequences (at least 1)
    of ``H = model_dim / d`` heads, of which every ``group_size`` share one key/value head
    (grouped-query prefill: ``H_kv = H / group_size``). Every (dtype, d, causal, N) gives one row
    per method and mode, naming the path and configuration that ran; a method that is unavailable
    or raises gives ``status="skipped"`` rows with the reason. Naive attention is skipped above
    N = 4096 and where its N × N float32 matrices would not fit in free memory.

    Args:
        lengths: sequence lengths N, measured in this order.
        head_dims: d values; each must divide ``model_dim``.
        dtypes: floating dtypes; default float16 and bfloat16 on a GPU, float16 and float32 on the CPU.
        causal: the mask settings to measure, e.g. ``(False, True)``.
        modes: a subset of ``"forward"``, ``"backward"``, ``"forward+backward"``.
        methods: a subset of :data:`~benchmarks.flash_gpu.plan.METHODS`, measured in that table's
            order (the runs measure FlexAttention in phases of its own, after ours and SDPA's).
        tokens: B · N per measurement.
        model_dim: H · d per measurement.
        group_size: query heads per key/value head; must divide every ``H``. SDPA gets the
            grouped K/V with ``enable_gqa=True`` (a backend that refuses it is skipped with the
            reason), naive attention expands them inside its call.
        seed: for the random inputs, ``>= 0`` (a generator on the device; the global RNG is not touched).
        device: ``"cuda"``, or ``"cpu"`` for the dry run (Triton's interpreter, a wall-clock timer).
        deadline: a ``time.monotonic()`` value; a measurement that would start later becomes a
            skipped row (``reason`` says so). None: no limit.
        on_row: called with each row as soon as it is measured (e.g. to append it to a CSV).
        progress: called with one line of text per configuration.
        machine: the :class:`MachineInfo` the rows name (default: :func:`machine_info`).

    Returns:
        One :class:`GpuRow` per (dtype, d, causal, N, method, mode), in that nesting order.

    Raises:
        TypeError: an argument of the wrong type (a size not an int, a dtype not a floating
            ``torch.dtype``, a callback not callable).
        ValueError: empty or non-positive sizes, a head dim that does not divide ``model_dim``,
            a ``group_size`` that does not divide the heads, an unknown mode or method, a negative
            seed, or an unknown device.
        RuntimeError: ``device="cuda"`` without a CUDA GPU.
    """
    where = "gpu_rows"
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1, nonempty=True)
    head_dims = _validate.integer_sequence(where, "head_dims", head_dims, minimum=1, nonempty=True)
    causal = [_validate.boolean(where, f"causal[{index}]", value)
              for index, value in enumerate(_validate.sequence(where, "causal", causal, of="bools"))]
    if not causal:
        raise ValueError(f"{where}: causal must not be empty")
    modes = check_choices(where, "modes", modes, MODES)
    methods = check_choices(where, "methods", methods, METHODS)
    methods = [method for method in METHODS if method in methods]
    tokens = _validate.integer(where, "tokens", tokens, minimum=1)
    model_dim = _validate.integer(where, "model_dim", model_dim, minimum=1)
    group_size = _validate.integer(where, "group_size", group_size, minimum=1)
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
    for dtype in run["dtypes"]:
        for head_dim in head_dims:
            for is_causal in causal:
                for n in lengths:
                    started = time.perf_counter()
                    batch, heads = max(1, tokens // n), model_dim // head_dim
                    config = dict(dtype=str(dtype).removeprefix("torch."), head_dim=head_dim, causal=is_causal,
                                  batch=batch, heads=heads, kv_heads=heads // group_size, n=n)
                    new = []

                    def emit(method, results, kernels, config=config, new=new):
                        """Write one method's rows the moment it is measured (before the next compiles)."""
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


def one_configuration(config, dtype, modes, methods, clock, generator, deadline, emit):
    """Measure one (dtype, d, causal, N): ``emit(method, {mode: Measured}, kernels)`` for each method as
    it is measured; ``kernels(mode)`` gives the row's (path, config), read then (``kernels(None)``
    for a skipped row)."""
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
        if method == "naive" and naive_bytes > 0.8 * clock.free_bytes():
            emit(method, skipped(f"needs about {naive_bytes / 2**30:.0f} GiB for its N x N float32 matrices, "
                                 f"{clock.free_bytes() / 2**30:.0f} GiB free", modes), paths[method])
            continue
        note = ""
        if method == FLEX:
            try:
                functions[method], path, launched, note = flex_function(causal, n, device, group > 1)
            except Exception as error:   # no FlexAttention in this torch, or no mask for this shape
                emit(method, skipped(describe_error(error), modes), paths[method])
                continue
            paths[method] = fixed(path, launched)
            if device.type != "cuda":    # FlexAttention has no backward on the CPU
                method_modes = [mode for mode in modes if mode == "forward"]
            elif "forward" in modes and not past(deadline):
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
            results = measure(functions[method], q, k, v, grad_out, reference, method_modes, clock, deadline)
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
    parts = []
    for method in dict.fromkeys(r.method for r in rows):
        values = [next(r for r in rows if r.method == method and r.mode == mode) for mode in modes]
        parts.append(f"{method} " + "/".join("-" if r.tflops is None else f"{r.tflops:.3g}" for r in values))
    mask = "causal" if config["causal"] else "full"
    return (f"{config['dtype']} d={config['head_dim']} {mask} N={config['n']} (B={config['batch']} "
            f"H={config['heads']} H_kv={config['kv_heads']}) TFLOP/s {'/'.join(modes)}: " + ", ".join(parts)
            + f"  [{seconds:.1f} s]")
