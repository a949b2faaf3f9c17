"""The TMA (tensor-descriptor) forward kernel against float64 math, and compiled for sm_90.

Triton's interpreter runs tensor descriptors (``tl.make_tensor_descriptor``, ``.load``,
``.store``) with TMA's rules: zero-filled rows out of bounds, 16-byte aligned base and strides.
So on the CPU the kernel is judged like the pointer kernel, by the FlashAttention rule against
float64 (:mod:`attn_course.flash.accuracy`'s factors and floors), with 64-row tiles to keep the
interpreter quick: float32 and float16, causal or not, lengths that are and are not tile
multiples, grouped- and multi-query heads, bottom-right causal with ``N_q < N_k``, strided inputs.
With a Hopper GPU the same tests run there, in float16 and bfloat16, with the tested config.

That the GPU code really uses TMA and ``wgmma`` is checked by compiling for sm_90 ahead of time
(marked slow; no GPU needed), in a subprocess with ``TRITON_INTERPRET=0`` because a process has
one Triton mode (:mod:`attn_course.flash.triton_mode`).
"""

import contextvars
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from attn_course.flash.tma_attention import (  # noqa: E402
    attention_forward_tma,
    tma_forward_config,
    tma_forward_supported,
)
from attn_course.flash.tma_configs import (  # noqa: E402
    HOPPER_LIMITS,
    estimated_shared_memory,
    gpu_limits,
    prune_tma_configs,
    tma_forward_configs,
)

from helpers import ROOT  # noqa: E402
from support.flash_rule import assert_flash_rule as shared_flash_rule  # noqa: E402
from support.flash_rule import random_inputs as inputs_and_grad  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = (torch.float16, torch.bfloat16) if ON_GPU else (torch.float16, torch.float32)
INTERPRETER_TILES = {"block_m": 64, "block_n": 64}    # small tiles: the interpreter's cost is per tile op
TILE = INTERPRETER_TILES["block_m"]


def launch_options(head_dim):
    return tma_forward_config(head_dim) if ON_GPU else INTERPRETER_TILES


def random_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, *, seed=0):
    """``q``, ``k``, ``v``: a forward kernel needs no ``grad_out``."""
    return inputs_and_grad(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, seed=seed)[:3]


def run_tma(q, k, v, *, causal, out=None, scale=None):
    """The kernel's output and LSE, into buffers pre-filled with NaN (so an unwritten element shows)."""
    if ON_GPU and not tma_forward_supported(q, k, v, out):
        pytest.skip("the TMA forward needs a Hopper GPU (capability 9.x) and a Triton with tensor descriptors")
    out = torch.full_like(q, float("nan")) if out is None else out.fill_(float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
    return attention_forward_tma(q, k, v, out, lse, causal=causal, scale=scale, **launch_options(q.shape[-1]))


def tma_kernel(q, k, v, *, causal, scale=None):
    """:func:`run_tma`, refusing any element it left unwritten (still NaN)."""
    out, lse = run_tma(q, k, v, causal=causal, scale=scale)
    for quantity, value in (("output", out), ("lse", lse)):
        assert torch.isfinite(value).all(), f"{quantity}: the kernel left elements unwritten (NaN)"
    return out, lse


def assert_flash_rule(q, k, v, *, causal):
    # The one rule and its float64 reference (attn_course.flash.accuracy); a forward kernel needs no dO.
    shared_flash_rule(q, k, v, None, causal=causal, kernel=tma_kernel, gradients=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 1)], ids=["gqa", "mqa"])
@pytest.mark.parametrize("length", [2 * TILE, 100], ids=["tile_multiple", "partial_tile"])
def test_matches_float64_by_the_flash_rule(length, heads, kv_heads, causal, dtype):
    assert_flash_rule(*random_inputs(2, heads, kv_heads, length, length, 32, dtype), causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_q, n_k", [
    (1, 5),                # one query after four cached keys: most of the tile is zero-filled
    (17, 200),             # partial tiles on both sides
    (TILE, 3 * TILE),      # tile multiples: the band is cut exactly on tile edges
    (70, 3 * TILE),        # partial query tile, full key tiles
])
def test_bottom_right_causal_with_fewer_queries_than_keys(n_q, n_k, dtype):
    assert_flash_rule(*random_inputs(1, 4, 2, n_q, n_k, 16, dtype, seed=1), causal=True)


def test_fewer_queries_than_keys_without_causal():
    assert_flash_rule(*random_inputs(1, 2, 2, 30, 150, 16, DTYPES[0], seed=2), causal=False)


def test_strided_inputs_and_output_give_the_contiguous_result():
    # [B, N, H, d] tensors viewed as [B, H, N, d]: rows H·d apart, heads d apart, as after a
    # projection; the descriptors take those strides, and the output is written through them too.
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in random_inputs(2, 4, 2, 90, 90, 32, DTYPES[0]))
    assert not q.is_contiguous() and q.stride(-1) == 1
    out = torch.empty(2, 90, 4, 32, dtype=q.dtype, device=q.device).transpose(1, 2)
    strided, strided_lse = run_tma(q, k, v, causal=True, out=out)
    contiguous, contiguous_lse = run_tma(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    torch.testing.assert_close(strided, contiguous, atol=0, rtol=0)
    torch.testing.assert_close(strided_lse, contiguous_lse, atol=0, rtol=0)


def test_query_sees_only_its_bottom_right_keys():
    # Key 8 of 10 is visible to queries 1 and 2 of 3 (offset 7), not to query 0.
    q, k, v = random_inputs(1, 1, 1, 3, 10, 16, DTYPES[0], seed=4)
    base, _ = run_tma(q, k, v, causal=True)
    changed_v = v.clone()
    changed_v[..., 8, :] += 1.0
    changed, _ = run_tma(q, k, changed_v, causal=True)
    difference = (changed - base).abs().amax(dim=-1)[0, 0]
    assert difference[0] == 0 and (difference[1:] > 0).all()


def test_descriptors_built_in_the_kernel_give_what_host_descriptors_give():
    # The fallback for a Triton without triton.tools.tensor_descriptor: the same tiles, the same bits.
    from attn_course.flash.tma_attention import has_device_tensor_descriptors, host_tensor_descriptor

    if host_tensor_descriptor() is None or not has_device_tensor_descriptors():
        pytest.skip("this Triton lacks one of the two kinds of tensor descriptors")
    q, k, v = random_inputs(2, 4, 2, 90, 150, 32, DTYPES[0], seed=5)
    results = []
    for host in (True, False):
        if ON_GPU and not tma_forward_supported(q, k, v):
            pytest.skip("the TMA forward needs a Hopper GPU")
        out, lse = torch.full_like(q, float("nan")), torch.empty(q.shape[:3], device=q.device)
        results.append(attention_forward_tma(q, k, v, out, lse, causal=True, host_descriptors=host,
                                             **launch_options(32)))
    torch.testing.assert_close(results[0], results[1], atol=0, rtol=0)
    assert torch.isfinite(results[0][0]).all()


def test_the_warp_specialised_option_changes_no_result():
    from attn_course.flash.tma_attention import warp_specialize_supported

    if ON_GPU:
        pytest.skip("warp specialisation is off by default on a GPU (it crashes Triton's compiler at d = 64)")
    if not warp_specialize_supported():
        pytest.skip("this Triton's tl.range has no warp_specialize")
    q, k, v = random_inputs(1, 2, 2, 100, 100, 32, DTYPES[0], seed=6)
    plain = run_tma(q, k, v, causal=True)
    out, lse = torch.empty_like(q), torch.empty(q.shape[:3])
    specialised = attention_forward_tma(q, k, v, out, lse, causal=True, warp_specialize=True, **INTERPRETER_TILES)
    torch.testing.assert_close(specialised, plain, atol=0, rtol=0)


def test_without_a_configuration_the_interpreter_runs_the_default(monkeypatch):
    # attention_forward_tma with no sizes asks tuned_tma_config, which in the interpreter times
    # nothing and answers the first candidate; the result is that configuration's, bit for bit.
    from attn_course.flash import tma_attention

    if ON_GPU:
        pytest.skip("on a GPU the configuration is tuned (test_tuning_on_a_gpu_picks_a_kept_candidate)")
    q, k, v = random_inputs(1, 2, 1, 130, 130, 16, torch.float16, seed=7)
    buffers_ = (torch.empty_like(q), torch.empty(q.shape[:3]))
    chosen = tma_attention.tuned_tma_config(q, k, v, *buffers_, causal=True, scale=0.25)
    assert chosen == tma_forward_configs(16)[0]
    default, _ = attention_forward_tma(q, k, v, *buffers_, causal=True)
    explicit, _ = attention_forward_tma(q, k, v, torch.empty_like(q), torch.empty(q.shape[:3]), causal=True,
                                        **tma_forward_config(16))
    torch.testing.assert_close(default, explicit, atol=0, rtol=0)


def test_tuning_on_a_gpu_picks_a_kept_candidate_once_per_length_bucket(monkeypatch):
    """The one test of the TMA forward's tuning (gpu_setup pins every other GPU test to the default).

    On a GPU: the real tuning, its winner checked against SDPA. Without one, the same tuning code with
    an H200's limits, a timer that makes the last kept candidate the fastest, and a table of winners of
    its own (the interpreter would otherwise run the default untimed): every kept candidate is timed
    once, the fastest recorded, and a second length in the same bucket times nothing.
    """
    import triton
    import triton.testing

    from attn_course.flash import launch, tma_attention

    calls = []
    if ON_GPU:
        import gpu_setup

        monkeypatch.setattr(tma_attention, "tuned_tma_config", gpu_setup.tuned_tma_config)
        q, k, v = random_inputs(1, 4, 4, 1000, 1000, 64, torch.float16, seed=8)
        if not tma_forward_supported(q, k, v):
            pytest.fail("the GPU check runs on Hopper; the TMA forward must be supported there")
        out, lse = attention_forward_tma(q, k, v, torch.empty_like(q), torch.empty(q.shape[:3], device=q.device),
                                         causal=True)
        reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(out, reference, atol=2e-3, rtol=0)
        limits = gpu_limits(q.device)
        fastest = None
    else:
        limits = HOPPER_LIMITS
        monkeypatch.setattr(tma_attention, "is_interpreted", lambda kernel: False)
        monkeypatch.setattr(tma_attention, "gpu_limits", lambda device: HOPPER_LIMITS)
        table = {}                                                       # this test's winners, not the process's
        monkeypatch.setattr(tma_attention, "tuned_config", table.get)
        monkeypatch.setattr(tma_attention, "record_tuned", table.__setitem__)
        timings = iter(range(100, 0, -1))                                # each candidate timed faster than the last
        monkeypatch.setattr(triton.testing, "do_bench", lambda fn, *a, **kw: calls.append(fn) or next(timings))
        q, k, v = random_inputs(1, 4, 4, 1000, 1000, 64, torch.float16, seed=8)
        tma_attention.tuned_tma_config(q, k, v, torch.empty_like(q), torch.empty(q.shape[:3]), causal=True,
                                       scale=0.125)
    kept = prune_tma_configs(tma_forward_configs(64), 64, **limits)
    assert len(kept) >= 2, "with one candidate kept there is nothing to tune"
    if not ON_GPU:
        assert len(calls) == len(kept), f"timed {len(calls)} times for {len(kept)} kept candidates"
        fastest = kept[-1]
    recorded = launch.tuned_configs() if ON_GPU else table
    entries = {key: config for key, config in recorded.items()                 # this test's bucket only
               if key[:3] == ("forward_tma", 64, True) and dict(key[4]).get("n_q") == 1024}
    assert len(entries) == 1 and next(iter(entries.values())) in kept
    if fastest is not None:
        assert next(iter(entries.values())) == fastest
    calls.clear()
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, *a, **kw: calls.append(fn) or 1.0)
    if ON_GPU:
        attention_forward_tma(q[:, :, :900], k[:, :, :900], v[:, :, :900], torch.empty_like(q[:, :, :900]),
                              torch.empty(1, 4, 900, device=q.device), causal=True)       # the same bucket, 1024
    else:
        short = [t[:, :, :900] for t in (q, k, v)]
        tma_attention.tuned_tma_config(*short, torch.empty_like(short[0]), torch.empty(1, 4, 900), causal=True,
                                       scale=0.125)
    assert calls == [], "a second length in the bucket timed the candidates again"


# ---------------------------------------------------------------------------------------------
# The launcher's checks
# ---------------------------------------------------------------------------------------------

def buffers(q):
    return torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)


def test_layouts_tma_cannot_read_are_refused_by_name():
    q, k, v = random_inputs(1, 2, 2, 8, 8, 16, torch.float16)
    out, lse = buffers(q)
    odd_rows = torch.zeros(1, 2, 8, 20, dtype=q.dtype, device=q.device)[..., :16]    # rows 40 bytes apart
    with pytest.raises(ValueError, match=r"forward_tma: q.s strides \(but the last\) must be multiples of 16"):
        attention_forward_tma(odd_rows, k, v, out, lse)
    shifted = torch.zeros(2 * 8 * 16 + 1, dtype=q.dtype, device=q.device)[1:].view(1, 2, 8, 16)   # 2 bytes off
    with pytest.raises(ValueError, match=r"attention_forward_tma: k's data pointer must be a multiple of 16"):
        attention_forward_tma(q, shifted, v, out, lse)
    column_major = torch.zeros(1, 2, 16, 8, dtype=q.dtype, device=q.device).transpose(2, 3)
    with pytest.raises(ValueError, match=r"attention_forward_tma: v must have stride 1 in its last dimension"):
        attention_forward_tma(q, k, column_major, out, lse)
    with pytest.raises(ValueError, match=r"out's strides"):
        attention_forward_tma(q, k, v, odd_rows, lse)


def test_clear_errors_for_buffers_shapes_and_options():
    q, k, v = random_inputs(1, 4, 3, 8, 8, 16, torch.float16)
    out, lse = buffers(q)
    with pytest.raises(ValueError, match=r"H % H_kv == 0, got q \[1, 4, 8, 16\], k \[1, 3, 8, 16\]"):
        attention_forward_tma(q, k, v, out, lse)
    q, k, v = random_inputs(1, 2, 2, 9, 8, 16, torch.float16)
    out, lse = buffers(q)
    with pytest.raises(ValueError, match=r"causal needs N_q <= N_k .*got N_q=9, N_k=8"):
        attention_forward_tma(q, k, v, out, lse, causal=True)
    with pytest.raises(ValueError, match=r"out must be shaped like q \[1, 2, 9, 16\], got \[1, 2, 8, 16\]"):
        attention_forward_tma(q, k, v, out[:, :, :8], lse)
    with pytest.raises(ValueError, match=r"lse must be contiguous float32 \[B, H, N_q\]"):
        attention_forward_tma(q, k, v, out, lse.double())
    with pytest.raises(TypeError, match=r"attention_forward_tma: lse must be a torch.Tensor, got NoneType"):
        attention_forward_tma(q, k, v, out, None)
    with pytest.raises(ValueError, match=r"block_m must be a power of two from 16 to 256, got 48"):
        attention_forward_tma(q, k, v, out, lse, block_m=48)
    with pytest.raises(TypeError, match=r"block_n must be an int, got str"):
        attention_forward_tma(q, k, v, out, lse, block_n="64")
    with pytest.raises(TypeError, match=r"causal must be a bool, got int"):
        attention_forward_tma(q, k, v, out, lse, causal=1)
    with pytest.raises(TypeError, match=r"attention_forward_tma: warp_specialize must be a bool, got str"):
        attention_forward_tma(q, k, v, out, lse, warp_specialize="yes")
    with pytest.raises(TypeError, match=r"attention_forward_tma: host_descriptors must be a bool, got int"):
        attention_forward_tma(q, k, v, out, lse, host_descriptors=1)


def test_options_this_triton_lacks_are_refused_by_name(monkeypatch):
    from attn_course.flash import tma_attention

    q, k, v = random_inputs(1, 2, 2, 8, 8, 16, torch.float16)
    out, lse = buffers(q)
    monkeypatch.setattr(tma_attention, "warp_specialize_supported", lambda: False)
    with pytest.raises(ValueError, match=r"warp_specialize=True needs a Triton whose tl.range takes warp_specialize"):
        attention_forward_tma(q, k, v, out, lse, warp_specialize=True)
    monkeypatch.setattr(tma_attention, "host_tensor_descriptor", lambda: None)
    with pytest.raises(ValueError, match=r"host_descriptors=True needs triton.tools.tensor_descriptor"):
        attention_forward_tma(q, k, v, out, lse, host_descriptors=True)


def test_supported_only_on_hopper_with_layouts_tma_can_read():
    from attn_course.flash.tma_attention import has_device_tensor_descriptors

    q, k, v = random_inputs(1, 2, 2, 8, 8, 16, DTYPES[0])
    hopper = ON_GPU and torch.cuda.get_device_capability()[0] == 9 and has_device_tensor_descriptors()
    assert tma_forward_supported(q, k, v) is hopper        # never in the interpreter: TMA gains nothing there
    odd_rows = torch.zeros(1, 2, 8, 20, dtype=q.dtype, device=q.device)[..., :16]
    assert tma_forward_supported(odd_rows, k, v) is False
    assert tma_forward_supported(q, k, v, out=odd_rows) is False
    with pytest.raises(TypeError, match=r"tma_forward_supported: v must be a torch.Tensor, got list"):
        tma_forward_supported(q, k, [])


def test_allocator_is_installed_only_when_none_is_set():
    import triton
    from triton.runtime import _allocation

    from attn_course.flash import tma_attention

    def current():
        allocator = _allocation._allocator
        return allocator.get() if hasattr(allocator, "get") else allocator

    def users_own(size, alignment, stream):   # pragma: no cover - never called here
        raise AssertionError

    def scenario():
        tma_attention._ensure_allocator()
        installed = current()
        triton.set_allocator(users_own)
        tma_attention._ensure_allocator()
        return installed, current()

    if not hasattr(_allocation._allocator, "get"):
        pytest.skip("this Triton keeps the allocator in a global, not a ContextVar: cannot isolate the test")
    # A fresh context starts with Triton's default (raising) allocator and keeps ours from leaking.
    fresh = contextvars.Context()
    installed, kept = fresh.run(scenario)
    assert installed is tma_attention._scratch_allocator
    assert kept is users_own


# ---------------------------------------------------------------------------------------------
# Ahead-of-time compilation for sm_90 (no GPU needed)
# ---------------------------------------------------------------------------------------------

SM90_SHARED_MEMORY_LIMIT = 227 * 1024   # bytes per thread block on H100/H200
# Every candidate of the two head dims with several (the others have one, compiled by the spill
# test), causal or not, float16; the defaults in bfloat16 too; the in-kernel descriptors (the
# fallback for a Triton without host descriptors) once.
AOT_CASES = [(head_dim, index, "float16", causal, False) for head_dim in (64, 128)
             for index in range(len(tma_forward_configs(head_dim))) for causal in (False, True)]
AOT_CASES += [(head_dim, 0, "bfloat16", True, False) for head_dim in (64, 128)] + [(64, 0, "float16", True, True)]
COMPILE_SCRIPT = """
import json, re, sys, time
from gpu_tools.aot import Case, compile_case
from gpu_tools.resources import resource_usage
for head_dim, index, dtype, causal, device in json.loads(sys.argv[1]):
    start = time.perf_counter()
    compiled = compile_case(Case("forward_tma", index, head_dim, dtype, causal, 90, device_descriptors=device))
    usage = resource_usage(compiled)
    seconds = time.perf_counter() - start
    ptx = compiled.asm["ptx"]
    found = sorted(set(re.findall(r"cp\\.async\\.bulk\\.tensor[\\w.:]*|wgmma\\.mma_async[\\w.]*", ptx)))
    ops = {op: len(re.findall(r"\\b" + re.escape(op) + r"\\b", ptx)) for op in ("fma.rn.f32", "sub.f32")}
    ops["ex2"] = len(re.findall(r"\\bex2\\.approx", ptx))
    print(json.dumps({"case": [head_dim, index, dtype, causal, device], "shared": compiled.metadata.shared,
                      "registers": usage.registers, "spill": usage.spill_stores + usage.spill_loads + usage.stack,
                      "seconds": round(seconds, 2), "found": found, "ops": ops}), flush=True)
"""


@pytest.fixture(scope="module")
def sm90_report():
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, json.dumps(AOT_CASES)], env=env,
                            capture_output=True, text=True, timeout=900, cwd=ROOT)   # gpu_tools: the checkout's
    assert result.returncode == 0, result.stderr[-3000:]
    report = {tuple(line["case"]): line for line in map(json.loads, result.stdout.splitlines())}
    table = [f"{'d':>3} {'config (m, n, warps, stages)':<28} {'dtype':<8} {'causal':<6} {'regs':>4} {'spill':>5} "
             f"{'shared':>6} {'kept':>4}"]
    for (head_dim, index, dtype, causal, device), line in report.items():
        config = tma_forward_configs(head_dim)[index]
        kept = config in prune_tma_configs(tma_forward_configs(head_dim), head_dim, **HOPPER_LIMITS)
        shape = (config.block_m, config.block_n, config.num_warps, config.num_stages)
        table.append(f"{head_dim:>3} {str(shape) + (' in-kernel desc.' if device else ''):<28} {dtype:<8} "
                     f"{str(causal):<6} {line['registers']:>4} {line['spill']:>5} {line['shared']:>6} {str(kept):>4}")
    print("\n" + "\n".join(table))
    return report


@pytest.mark.slow
@pytest.mark.parametrize("head_dim, index, dtype, causal, device", AOT_CASES)
def test_sm90_build_moves_tiles_by_tma_and_multiplies_with_wgmma(sm90_report, head_dim, index, dtype, causal, device):
    line = sm90_report[head_dim, index, dtype, causal, device]
    loads = [name for name in line["found"] if name.startswith("cp.async.bulk.tensor") and ".global.mbarrier" in name]
    stores = [name for name in line["found"] if name.startswith("cp.async.bulk.tensor") and ".global.shared" in name]
    assert loads, f"no TMA load (cp.async.bulk.tensor ... shared <- global) in the PTX: {line['found']}"
    assert stores, f"no TMA store (cp.async.bulk.tensor ... global <- shared) in the PTX: {line['found']}"
    assert any(name.startswith("wgmma.mma_async") for name in line["found"]), line["found"]
    # The pruning's shared-memory estimate never falls short of what the build takes.
    config = tma_forward_configs(head_dim)[index]
    assert 0 < line["shared"] <= estimated_shared_memory(config, head_dim), line


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [64, 128])
def test_sm90_build_of_every_candidate_kept_for_hopper_fits_without_spilling(sm90_report, head_dim):
    candidates = tma_forward_configs(head_dim)
    kept = prune_tma_configs(candidates, head_dim, **HOPPER_LIMITS)
    assert kept and kept[0] == candidates[0], "the default must survive the pruning on an H100/H200"
    for config in kept:
        for causal in (False, True):
            line = sm90_report[head_dim, candidates.index(config), "float16", causal, False]
            assert line["spill"] == 0 and line["registers"] <= 255, (config, line)
            assert line["shared"] <= SM90_SHARED_MEMORY_LIMIT, (config, line)


@pytest.mark.slow
def test_sm90_build_costs_each_score_one_fma_before_its_exp2(sm90_report):
    # The scale is folded after the row maximum: exp2(s * scale_log2 - m) is one FMA per score.
    # Scaling first and subtracting after (FMUL + FADD) would put at least one sub.f32 per score
    # of a tile per thread (128 x 64 scores over 128 threads: 64) in each of the two loops.
    line = sm90_report[64, 0, "float16", True, False]
    scores_per_thread = 128 * 64 // 128
    assert line["ops"]["sub.f32"] < scores_per_thread, line["ops"]
    assert line["ops"]["fma.rn.f32"] >= line["ops"]["ex2"] > 0, line["ops"]


def test_attention_forward_takes_the_tma_path_only_where_supported():
    # attention_forward(tma=None) picks the descriptor kernel by itself where it is supported;
    # tma=True insists (an error elsewhere, e.g. in the interpreter), tma=False never uses it.
    from attn_course.flash import tma_attention
    from attn_course.flash.triton_attention import attention_forward

    generator = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 2, 70, 64, generator=generator).to(DEVICE, DTYPES[0]) for _ in range(3))
    pointer_out, pointer_lse = attention_forward(q, k, v, causal=True, tma=False)
    if tma_attention.tma_forward_supported(q, k, v):
        tma_out, tma_lse = attention_forward(q, k, v, causal=True, tma=True)
        torch.testing.assert_close(tma_out, pointer_out, atol=2e-3, rtol=0)
        torch.testing.assert_close(tma_lse, pointer_lse, atol=1e-4, rtol=0)
    else:
        with pytest.raises(ValueError, match="tma=True needs CUDA tensors on a Hopper GPU"):
            attention_forward(q, k, v, causal=True, tma=True)
    with pytest.raises(TypeError, match="tma must be a bool"):
        attention_forward(q, k, v, tma=1)
