"""Decoding: N_q new queries against a long grouped-query KV cache, in milliseconds and K/V GB/s."""

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
from attn_course.flash import decode_attention
from benchmarks.flash_gpu.attention import SDPA_CONFIG
from benchmarks.flash_gpu.backends import sdpa_context, sdpa_has_enable_gqa
from benchmarks.flash_gpu.kernels_used import decode_config
from benchmarks.flash_gpu.measuring import (
    TIME_BUDGET_SPENT,
    Measured,
    describe_error,
    measure,
    past,
    recorded_warnings,
    setup,
)
from benchmarks.flash_gpu.plan import DECODE_KV_LENGTHS, SDPA_BACKENDS
from benchmarks.flash_gpu.rows import DecodeRow, MachineInfo

__all__ = ["decode_rows"]


def decode_rows(kv_lengths: Sequence[int] = DECODE_KV_LENGTHS, *, query_lengths: Sequence[int] = (1,),
                dtypes: Sequence[torch.dtype] | None = None, batch: int = 4, heads: int = 32, kv_heads: int = 8,
                head_dim: int = 128, seed: int = 0, device: str = "cuda", deadline: float | None = None,
                on_row: Callable[[DecodeRow], None] | None = None, progress: Callable[[str], None] | None = None,
                machine: MachineInfo | None = None) -> list[DecodeRow]:
    """Decoding time and achieved K/V bandwidth: our decode kernel against SDPA's backends and naive attention.

    Each call is replayed from a CUDA graph (:meth:`Clock.graphed_milliseconds`): below about 8k keys a
    decoding step takes less GPU time than Python takes to launch it. Decoding is memory-bound (the N_q new
    queries read the whole cache, no mask), so the number to compare is ``kv_gbps``, the cache's bytes over
    the time. Ours reads grouped K/V in place; SDPA gets them with ``enable_gqa=True`` where this torch and
    the backend take it, else expanded to H heads once, outside the timing (which favours SDPA: a model
    would pay for the copy); naive attention gets them expanded.

    Args:
        kv_lengths: cache lengths N_k, measured in this order.
        query_lengths: N_q values, at most 16 (the decode kernel's range).
        dtypes, seed, device, deadline, on_row, progress, machine: as in :func:`gpu_rows`.
        batch, heads, kv_heads, head_dim: B, H, H_kv (dividing H) and d.

    Returns:
        One :class:`DecodeRow` per (dtype, N_q, N_k, method), in that nesting order.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: empty or non-positive sizes, N_q > 16, H not a multiple of H_kv, seed < 0, another device.
        RuntimeError: ``device="cuda"`` without a CUDA GPU.
    """
    where = "decode_rows"
    kv_lengths = _validate.integer_sequence(where, "kv_lengths", kv_lengths, minimum=1, nonempty=True)
    query_lengths = _validate.integer_sequence(where, "query_lengths", query_lengths, minimum=1, nonempty=True)
    for index, n_q in enumerate(query_lengths):
        if n_q > 16:
            raise ValueError(f"{where}: query_lengths[{index}] must be <= 16 (decoding), got {n_q}")
    batch, heads, kv_heads, head_dim = _validate.integers(where, minimum=1, batch=batch, heads=heads,
                                                         kv_heads=kv_heads, head_dim=head_dim)
    if heads % kv_heads:
        raise ValueError(f"{where}: heads must be a multiple of kv_heads, got heads={heads}, kv_heads={kv_heads}")
    run = setup(where, dtypes=dtypes, seed=seed, deadline=deadline, on_row=on_row, progress=progress,
                machine=machine, device=device)
    clock, machine = run["clock"], run["machine"]
    rows = []
    for dtype, n_q, n_k in itertools.product(run["dtypes"], query_lengths, kv_lengths):
        started = time.perf_counter()
        config = dict(dtype=str(dtype).removeprefix("torch."), head_dim=head_dim, batch=batch, heads=heads,
                      kv_heads=kv_heads, n_q=n_q, n_k=n_k)
        kv_bytes = 2 * batch * kv_heads * n_k * head_dim * dtype.itemsize
        new = []
        measured = one_decode(config, dtype, clock, run["generator"], run["deadline"])
        clock.empty_cache()
        for method, layout, result, (path, launched) in measured:
            ms = result.milliseconds
            row = DecodeRow(method=method, path=path, **config, kv_layout=layout, **dataclasses.asdict(result),
                            kv_gbps=None if ms is None else kv_bytes / ms / 1e6, config=launched,
                            **dataclasses.asdict(machine))
            new.append(row)
            run["on_row"](row)
        rows += new
        parts = ", ".join(f"{r.method} " + ("-" if r.kv_gbps is None else f"{r.kv_gbps:.3g}") for r in new)
        run["progress"](f"decode {config['dtype']} N_q={n_q} N_k={n_k} (B={batch} H={heads} H_kv={kv_heads} "
                        f"d={head_dim}) K/V GB/s: {parts}  [{time.perf_counter() - started:.1f} s]")
    return rows


def one_decode(config, dtype, clock, generator, deadline):
    """[(method, kv_layout, Measured, (path, config))] for one (dtype, N_q, N_k)."""
    ours = "ours (decode_attention)"
    methods = [ours, *SDPA_BACKENDS, "naive"]
    expanded_layout = "expanded (repeat_interleave, outside the timing)"
    layouts = {ours: "grouped (in place)", "naive": expanded_layout}
    paths = {ours: "flash-decoding", "naive": "naive", **{m: m.replace(" ", "-") for m in SDPA_BACKENDS}}
    if past(deadline):
        spent = Measured("skipped", reason=TIME_BUDGET_SPENT)
        return [(method, layouts.get(method, ""), spent, (paths[method], "")) for method in methods]
    device = clock.device
    b, h, h_kv, d = config["batch"], config["heads"], config["kv_heads"], config["head_dim"]
    try:
        q = torch.randn(b, h, config["n_q"], d, dtype=dtype, device=device, generator=generator)
        k, v = (torch.randn(b, h_kv, config["n_k"], d, dtype=dtype, device=device, generator=generator)
                for _ in range(2))
        k_wide, v_wide = (t.repeat_interleave(h // h_kv, dim=1) for t in (k, v))     # [B, H, N_k, d]
    except Exception as error:   # out of memory
        failed = Measured("skipped", reason=describe_error(error))
        return [(method, layouts.get(method, ""), failed, (paths[method], "")) for method in methods]
    try:
        with torch.no_grad():
            reference = F.scaled_dot_product_attention(q.float(), k_wide.float(), v_wide.float())
    except Exception:
        reference = None
    found = []
    for method in methods:
        note = ""
        if method == ours:
            fn = decode_attention
        elif method == "naive":
            fn = lambda q, k, v: self_attention(q, k_wide, v_wide)[0]   # noqa: E731
        else:
            fn, layouts[method], note = sdpa_decode_function(method, q, k, v, k_wide, v_wide, expanded_layout)
        context = sdpa_context(method) if method in SDPA_BACKENDS else contextlib.nullcontext()
        with context:
            result = measure(fn, q, k, v, None, reference, ["forward"], clock, deadline, graphed=True)["forward"]
        if note:
            result = dataclasses.replace(result, reason=f"{result.reason}; {note}" if result.reason else note)
        launched = SDPA_CONFIG if method in SDPA_BACKENDS else ""
        if method == ours and result.status == "ok":
            launched = decode_config(q, k)     # read now: the autotuner's choice is this call's
        found.append((method, layouts[method], result, (paths[method], launched)))
    return found   # the inputs are freed as this returns; the caller empties the cache


def sdpa_decode_function(method, q, k, v, k_wide, v_wide, expanded_layout):
    """(fn, kv_layout, note): SDPA on grouped K/V with ``enable_gqa`` if this backend takes it, else expanded."""
    def expanded(q, k, v):
        return F.scaled_dot_product_attention(q, k_wide, v_wide)

    if k.shape[1] == q.shape[1]:
        return expanded, "not grouped", ""
    if not sdpa_has_enable_gqa():
        return expanded, expanded_layout, f"torch {torch.__version__} has no enable_gqa"

    def grouped(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    with recorded_warnings() as caught:
        try:
            with sdpa_context(method), torch.no_grad():
                grouped(q, k, v)
        except Exception as error:
            return expanded, expanded_layout, f"enable_gqa=True refused ({describe_error(error, caught)[:300]})"
    return grouped, "grouped (enable_gqa=True)", ""
