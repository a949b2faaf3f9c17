"""benchmarks.flash_gpu's profiles, the paths and configurations rows record, CUDA-graph timing and the
compile count, without a GPU (what needs one is made up, or checked on the CPU's side of the branch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from made_up_rows import MACHINE, decode_row, gpu_row

from benchmarks import flash_gpu
from benchmarks.flash_gpu import kernels_used, measuring, run
from benchmarks.flash_gpu.measuring import Clock
from benchmarks.flash_gpu.plan import plan_phases


def test_the_essential_profile_is_issue_32s_list_most_important_first():
    plan = plan_phases(flash_gpu.GPU_SIZES, None, "essential")
    kinds = [kind for kind, _ in plan]
    assert kinds == ["attention", "decode", "attention", "attention", "attention", "attention", "attention"]
    float16, decode, grouped, bfloat16, *flex = (options for _, options in plan)
    # FlexAttention on the same cases, after ours and SDPA's: a budget that runs out cuts the peer.
    assert all("flex compiled" not in options["methods"] for options in (float16, grouped, bfloat16))
    assert [{**options, "methods": None} for options in flex] == [
        {**options, "methods": None} for options in (float16, grouped, bfloat16)]
    assert {tuple(options["methods"]) for options in flex} == {("flex compiled",)}
    for options, dtype in ((float16, torch.float16), (bfloat16, torch.bfloat16)):
        assert options["dtypes"] == [dtype] and options["lengths"] == [4096, 16384]
        assert sorted(options["head_dims"]) == [64, 128] and options["causal"] == [False, True]
        assert options["group_size"] == 1
    assert decode == dict(dtypes=[torch.float16], query_lengths=[1], kv_lengths=[1024, 4096, 16384, 65536])
    # Grouped-query prefill: H = 32 query heads over H_kv = 8, d = 128, causal, as Llama 3 8B.
    assert grouped["model_dim"] // grouped["head_dims"][0] == 32 and grouped["group_size"] == 4
    assert grouped["causal"] == [True] and grouped["dtypes"] == [torch.float16]


def test_the_long_profile_keeps_the_whole_sweep_and_lengths_override_both():
    plan = plan_phases(flash_gpu.GPU_SIZES, None, "long")
    attention = [options for kind, options in plan if kind == "attention"]
    assert sorted({n for options in attention for n in options["lengths"]}) == list(flash_gpu.GPU_LENGTHS)
    assert {n_q for kind, options in plan if kind == "decode" for n_q in options["query_lengths"]} == {1, 16}
    assert any(options["group_size"] > 1 and options["causal"] == [False, True] for options in attention)
    essential = plan_phases(flash_gpu.GPU_SIZES, [2048], "essential")
    assert {n for kind, options in essential if kind == "attention" for n in options["lengths"]} == {2048}


def test_run_gpu_benchmark_refuses_an_unknown_profile(tmp_path):
    with pytest.raises(ValueError, match=r"^run_gpu_benchmark: profile must be one of \['essential', 'long'\], "
                                         r"got 'short'"):
        flash_gpu.run_gpu_benchmark(tmp_path, profile="short", dry_run=True)
    with pytest.raises(TypeError, match=r"^plan_phases: profile must be a str, one of .+, got int"):
        plan_phases(flash_gpu.GPU_SIZES, None, 1)


def test_the_long_profile_runs_to_its_end_under_a_spent_budget(tmp_path):
    result = flash_gpu.run_gpu_benchmark(tmp_path, profile="long", dry_run=True, max_minutes=1e-9, warm_up=False,
                                         progress=None)
    assert result.stopped == "max_minutes" and {r.reason for r in result.rows} == {flash_gpu.TIME_BUDGET_SPENT}
    assert {r.kv_heads < r.heads for r in result.rows} == {False, True}       # grouped-query rows are planned
    facts = json.loads((tmp_path / "machine.json").read_text())
    assert facts["profile"] == "long" and facts["compilations"]["ours"] > 0


def test_the_essential_profile_counts_every_autotuning_candidate_once_per_dtype_and_mask():
    """The count a GPU check's time estimate rests on, from the candidates in attn_course.flash.configs."""
    from attn_course.flash.configs import CONFIGS
    from attn_course.flash.tma_configs import HOPPER_LIMITS, prune_tma_configs, tma_forward_configs

    plan = plan_phases(flash_gpu.GPU_SIZES, None, "essential")
    counts = kernels_used.count_compilations(plan, flash_gpu.GPU_SIZES)

    def candidates(kernel):   # float16 and bfloat16, both masks, d = 64 and 128
        return 2 * 2 * sum(len(CONFIGS[kernel, d]) for d in (64, 128))

    def tma_kept(d):          # the TMA forward tunes over what the pruning keeps on an H200
        return len(prune_tma_configs(tma_forward_configs(d), d, **HOPPER_LIMITS))

    expected = {"backward_dkdv": candidates("backward_dkdv"), "backward_dq": candidates("backward_dq"),
                "decode": len(CONFIGS["decode", 128]), "forward_tma": 2 * 2 * (tma_kept(64) + tma_kept(128))}
    assert expected["forward_tma"] == 2 * 2 * (4 + 2)
    assert {k: v for k, v in counts["by_kernel"].items() if k != "decode_merge"} == expected
    assert 1 <= counts["by_kernel"]["decode_merge"] <= 4                # one width per N_k at most
    assert counts["ours"] == sum(counts["by_kernel"].values())
    # The grouped-query rows (float16, d = 128, causal) again, as group size 4: the TMA forward's and
    # both backward kernels' candidates.
    grouped = tma_kept(128) + len(CONFIGS["backward_dkdv", 128]) + len(CONFIGS["backward_dq", 128])
    assert counts["ours_with_group"] == counts["ours"] + grouped
    assert counts["flex"] == (16 + 2) * 3                   # per shape: inference, training forward, backward
    pointer = kernels_used.count_compilations(plan, flash_gpu.GPU_SIZES, tma=False)
    assert pointer["by_kernel"]["forward"] == candidates("forward") and "forward_tma" not in pointer["by_kernel"]


def test_count_compilations_prints_without_running_anything():
    completed = subprocess.run([sys.executable, "-m", "benchmarks.flash_gpu", "--count-compilations", "essential"],
                               capture_output=True, text=True, timeout=120, check=True)
    counts = kernels_used.count_compilations(plan_phases(flash_gpu.GPU_SIZES, None, "essential"),
                                             flash_gpu.GPU_SIZES)
    assert f"ours {counts['ours']} distinct (kernel, config, dtype, d, causal)" in completed.stdout
    assert json.loads(completed.stdout.splitlines()[-1]) == counts
    refused = subprocess.run([sys.executable, "-m", "benchmarks.flash_gpu", "--count-compilations", "short"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "must be one of ['essential', 'long']" in refused.stderr


def test_describe_config_reads_triton_configs_and_kernel_configs():
    import triton

    from attn_course.flash.configs import kernel_config
    from attn_course.flash.tma_configs import tma_forward_configs

    assert kernels_used.describe_config(triton.Config({"BLOCK_N": 64, "BLOCK_M": 128}, num_warps=8, num_stages=2)
                                        ) == "BLOCK_M=128 BLOCK_N=64 warps=8 stages=2"
    assert kernels_used.describe_config(kernel_config("forward", 64)) == "BLOCK_M=128 BLOCK_N=64 warps=4 stages=3"
    assert kernels_used.describe_config(tma_forward_configs(128)[0]) == "BLOCK_M=128 BLOCK_N=128 warps=8 stages=2"


def test_prefill_kernels_in_the_interpreter_name_the_pointer_path_and_first_candidates():
    q = k = v = torch.zeros(1, 2, 64, 64)
    path, config = kernels_used.prefill_kernels(q, k, v, "forward+backward", causal=True)
    assert path == "pointer (interpreter)"
    assert config.startswith("forward BLOCK_M=128 BLOCK_N=64 warps=4 stages=3 (interpreter") and "; dq " in config


def test_prefill_kernels_on_a_gpu_read_the_tma_switch_and_the_launchers_tuned_winner(monkeypatch):
    """The GPU side with the launcher's answers made up: the TMA switch, its table of tuned winners
    (the exact bucket matched: another length's or dtype's winner is not taken), the autotuner."""
    import triton

    from attn_course.flash import launch, tma_attention
    from attn_course.flash.configs import CONFIGS

    class Tuned:
        best_config = triton.Config({"BLOCK_M": 32, "BLOCK_N": 128}, num_warps=8, num_stages=2)

    dkdv, dq = CONFIGS["backward_dkdv", 128][-1], CONFIGS["backward_dq", 128][-1]
    fp16 = ("torch.float16",) * 4
    table = {("backward_dkdv", 128, True, fp16, (("n_k", 1024), ("n_q", 1024), ("num_kv_groups", 1))): dkdv,
             ("backward_dkdv", 128, True, fp16, (("n_k", 2048), ("n_q", 2048), ("num_kv_groups", 1))): dq,
             ("backward_dq", 128, True, ("torch.bfloat16",), (("n_k", 1024), ("n_q", 1024),
                                                             ("num_kv_groups", 1))): dkdv,
             ("backward_dq", 128, True, fp16, (("n_k", 1024), ("n_q", 1024), ("num_kv_groups", 1))): dq}
    monkeypatch.setattr(launch, "runs_in_interpreter", lambda: False)
    monkeypatch.setattr(launch, "autotuned_kernel", lambda kernel, head_dim: Tuned())
    monkeypatch.setattr(launch, "tuned_configs", lambda: table)
    monkeypatch.setattr(tma_attention, "tma_forward_supported", lambda q, k, v, out=None: True)
    q = k = v = torch.zeros(1, 2, 1000, 128, dtype=torch.float16)            # bucket 1024
    assert kernels_used.prefill_kernels(q, k, v, "forward", causal=True) == (
        "tma", "forward(tma) BLOCK_M=128 BLOCK_N=128 warps=8 stages=2 (the default: no tuning recorded for "
               "this bucket)")
    # The TMA forward's own tuning records its winner under "forward_tma" (q, k, v, out: four dtypes).
    tma_winner = CONFIGS["backward_dq", 128][0]           # any KernelConfig stands for a winner here
    table[("forward_tma", 128, True, fp16, (("n_k", 1024), ("n_q", 1024), ("num_kv_groups", 1)))] = tma_winner
    table[("forward_tma", 128, False, fp16, (("n_k", 1024), ("n_q", 1024), ("num_kv_groups", 1)))] = dkdv
    assert kernels_used.prefill_kernels(q, k, v, "forward", causal=True) == (
        "tma", "forward(tma) " + kernels_used.describe_config(tma_winner))
    path, config = kernels_used.prefill_kernels(q, k, v, "forward+backward", causal=True)
    assert path == "tma+pointer" and config.endswith(
        f"; dkdv {kernels_used.describe_config(dkdv)}; dq {kernels_used.describe_config(dq)}")
    monkeypatch.setattr(tma_attention, "tma_forward_supported", lambda q, k, v, out=None: False)
    assert kernels_used.prefill_kernels(q, k, v, "forward", causal=True) == (
        "pointer", "forward BLOCK_M=32 BLOCK_N=128 warps=8 stages=2 (the autotuner's last choice)")
    Tuned.best_config = None
    assert kernels_used.prefill_kernels(q, k, v, "backward", causal=False)[1].startswith("dkdv not known")


def test_decode_is_timed_from_a_cuda_graph_or_plainly_with_the_reason(monkeypatch):
    """Both sides of the CUDA-graph branch, with the GPU's timer and capture made up (no GPU here)."""
    import triton.testing

    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **options: fn() or 2.0)
    gpu = Clock(torch.device("cuda"))
    replayed = []

    class Graph:
        def replay(self):
            replayed.append(1)

    monkeypatch.setattr(measuring, "capture_graph", lambda call, device: Graph())
    assert gpu.graphed_milliseconds(lambda: None) == (2.0, "cuda graph", "", 2.0) and replayed == [1]

    def refuses(call, device):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(measuring, "capture_graph", refuses)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    ms, timing, note, plain = gpu.graphed_milliseconds(lambda: None)
    assert (ms, timing, plain) == (2.0, "plain", None)
    assert note == ("CUDA graph capture failed (RuntimeError: operation not permitted when stream is capturing): "
                    "timed without a graph, Python's launch overhead included")
    ms, timing, note, plain = Clock(torch.device("cpu")).graphed_milliseconds(lambda: None)
    assert timing == "plain" and note.startswith("CPU dry run: no CUDA graphs") and plain is None and ms >= 0


def test_the_summary_keeps_grouped_query_rows_apart_and_compares_with_flex():
    rows = [gpu_row(n=4096, milliseconds=2.0), gpu_row(n=4096, method="sdpa flash", milliseconds=1.0),
            gpu_row(n=4096, method="flex compiled", path="flex-compiled", milliseconds=3.0),
            gpu_row(n=4096, kv_heads=8, milliseconds=1.0), gpu_row(n=4096, kv_heads=8, method="sdpa flash",
                                                                  milliseconds=1.5)]
    summary = {(r.heads, r.kv_heads): r for r in flash_gpu.speedup_summary(rows, [decode_row()])
               if r.kind == "attention"}
    assert summary[32, 32].ratio == 0.5 and summary[32, 32].flex_ratio == 1.5 and summary[32, 32].flex_ms == 3.0
    assert summary[32, 8].ratio == 1.5 and summary[32, 8].flex_ms is None
    assert MACHINE.gpu == summary[32, 8].gpu


def test_flex_attention_is_warmed_up_just_before_its_first_phase_and_ours_first(tmp_path, monkeypatch):
    """The run's order with the measuring made up: ours' warm-up, the phases without FlexAttention,
    then FlexAttention's warm-up, then its phases."""
    calls, lines = [], []
    monkeypatch.setattr(run, "warm_up_jobs", lambda plan, sizes, dry_run: [dict(kind="attention"), dict(kind="flex"),
                                                                           dict(kind="decode")])
    monkeypatch.setattr(run, "warm_triton_cache", lambda jobs, timeout_s, interpret: calls.append(
        ([job["kind"] for job in jobs], lines[-1])) or {"jobs": len(jobs), "seconds": 0.0, "failures": []})
    monkeypatch.setattr(run, "gpu_rows", lambda *args, **kwargs: [])
    monkeypatch.setattr(run, "decode_rows", lambda *args, **kwargs: [])
    flash_gpu.run_gpu_benchmark(tmp_path, dry_run=True, progress=lines.append)
    assert [kinds for kinds, _ in calls] == [["attention", "decode"], ["flex"]]
    assert calls[1][1].startswith("## warming Inductor's caches for FlexAttention: 1 processes")
    phases = [line for line in lines if line.startswith("## ")]
    assert phases.index(calls[1][1]) == 5 and phases[4].startswith("## phase 4/7") and "flex" not in phases[4]
    assert "'methods': ['flex compiled']" in phases[6]
    facts = json.loads((tmp_path / "machine.json").read_text())
    assert facts["warm_up"]["jobs"] == 2 and facts["warm_up_flex"]["jobs"] == 1
