"""The TMA forward's candidates and their pruning, with made-up device limits (no GPU needed).

The estimates are recomputed here from the tiles themselves (tensors of the tiles' shapes and
dtypes, their bytes and elements counted by PyTorch), not from the formulas under test; what the
sm_90 builds really take is checked by ``test_flash_tma.py``'s ahead-of-time tests.
"""

import pytest
import torch

from attn_course.flash.configs import KernelConfig
from attn_course.flash.tma_configs import (
    HOPPER_LIMITS,
    REGISTER_OVERHEAD,
    SHARED_OVERHEAD,
    estimated_registers,
    estimated_shared_memory,
    gpu_limits,
    prune_tma_configs,
    pruned_because,
    tma_forward_configs,
)


def config(m, n, warps, stages):
    return KernelConfig(block_m=m, block_n=n, num_warps=warps, num_stages=stages)


def tile_bytes(c, head_dim):
    """Q, and num_stages pairs of K and V tiles, as float16 tensors: what shared memory holds."""
    q = torch.empty(c.block_m, head_dim, dtype=torch.float16, device="meta")
    kv = torch.empty(c.num_stages, 2, c.block_n, head_dim, dtype=torch.float16, device="meta")
    return q.nbytes + kv.nbytes + SHARED_OVERHEAD


def registers(c, head_dim):
    """The float32 accumulator and score tile, one register per element, over the program's threads."""
    acc = torch.empty(c.block_m, head_dim, device="meta")
    scores = torch.empty(c.block_m, c.block_n, device="meta")
    return (acc.numel() + scores.numel()) // (32 * c.num_warps) + REGISTER_OVERHEAD


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128])
def test_estimates_count_the_tiles(head_dim):
    for c in tma_forward_configs(head_dim):
        assert estimated_shared_memory(c, head_dim) == tile_bytes(c, head_dim)
        assert estimated_registers(c, head_dim) == registers(c, head_dim)


def test_hopper_keeps_what_fits_and_drops_the_tutorials_eight_warp_small_tiles():
    kept = {d: prune_tma_configs(tma_forward_configs(d), d, **HOPPER_LIMITS) for d in (16, 32, 64, 128)}
    assert kept[16] == [config(128, 64, 4, 3)] and kept[32] == [config(128, 64, 4, 3)]
    # d = 64: 128 x 128 with 4 warps needs 256 + 64 registers by the estimate (ptxas: 226-248), dropped.
    assert kept[64] == [config(128, 64, 4, 3), config(128, 64, 4, 4), config(128, 128, 8, 2), config(128, 128, 8, 3)]
    # d = 128: 4 warps hold a 128 x 128 float32 accumulator, 128 registers each before the scores:
    # dropped (ptxas spilled 8 to 1,456 bytes); 8 warps on 128 x 64 is the tutorial's Hopper rule.
    assert kept[128] == [config(128, 128, 8, 2), config(128, 128, 8, 3)]


def test_made_up_limits_prune_by_shared_memory_and_registers_per_block():
    candidates = tma_forward_configs(64)
    small = prune_tma_configs(candidates, 64, shared_memory_limit=90_000, registers_per_block=65536, capability=90)
    assert small == [c for c in candidates if tile_bytes(c, 64) <= 90_000 and registers(c, 64) <= 255
                     and not (c.num_warps == 8 and c.block_n < 128)]
    assert config(128, 128, 8, 3) not in small and config(128, 64, 4, 4) in small
    few_registers = prune_tma_configs(candidates, 64, shared_memory_limit=10**6, registers_per_block=40_000,
                                      capability=90)
    assert few_registers == [c for c in candidates if registers(c, 64) * 32 * c.num_warps <= 40_000
                             and registers(c, 64) <= 255]
    assert few_registers == [config(128, 64, 4, 3), config(128, 64, 4, 4)]


def test_the_eight_warp_rule_is_hoppers_alone():
    # An A100 (sm_80: 163 KiB per block) keeps 8 warps on 128 x 64 at d = 128 and drops what does not fit.
    a100 = prune_tma_configs(tma_forward_configs(128), 128, shared_memory_limit=163 * 1024,
                             registers_per_block=65536, capability=80)
    assert a100 == [config(128, 128, 8, 2), config(128, 64, 8, 3)]


def test_when_nothing_fits_the_default_is_kept():
    candidates = tma_forward_configs(128)
    assert prune_tma_configs(candidates, 128, shared_memory_limit=1, registers_per_block=1, capability=90) == [
        candidates[0]]
    assert prune_tma_configs([], 128, **HOPPER_LIMITS) == []


def test_errors_name_the_argument():
    c = tma_forward_configs(64)[0]
    with pytest.raises(ValueError, match=r"tma_forward_configs: head_dim must be one of \(16, 32, 64, 128\), got 48"):
        tma_forward_configs(48)
    with pytest.raises(TypeError, match=r"prune_tma_configs: config must be a KernelConfig, got tuple"):
        prune_tma_configs([(128, 64, 4, 3)], 64, **HOPPER_LIMITS)
    with pytest.raises(ValueError, match=r"prune_tma_configs: shared_memory_limit must be >= 1, got 0"):
        prune_tma_configs([c], 64, shared_memory_limit=0, registers_per_block=65536, capability=90)
    with pytest.raises(TypeError, match=r"prune_tma_configs: registers_per_block must be an int, got float"):
        prune_tma_configs([c], 64, shared_memory_limit=1000, registers_per_block=6.5e4, capability=90)
    with pytest.raises(TypeError, match=r"estimated_registers: config must be a KernelConfig, got dict"):
        estimated_registers({"block_m": 128}, 64)
    with pytest.raises(ValueError, match=r"estimated_shared_memory: head_dim must be >= 1, got 0"):
        estimated_shared_memory(c, 0)


def test_each_pruned_candidate_says_why():
    reasons = {(d, (c.block_n, c.num_warps, c.num_stages)): pruned_because(c, d, **HOPPER_LIMITS)
               for d in (64, 128) for c in tma_forward_configs(d)}
    assert reasons[64, (128, 4, 3)] == "about 256 registers per thread > 255"
    assert reasons[128, (64, 4, 3)] == "about 256 registers per thread > 255"
    assert reasons[128, (128, 4, 3)] == "about 320 registers per thread > 255"
    assert reasons[128, (64, 8, 3)] == "8 warps on a 128 x 64 tile (Triton tutorial: pruned on Hopper)"
    kept = {(d, (c.block_n, c.num_warps, c.num_stages)) for d in (64, 128)
            for c in prune_tma_configs(tma_forward_configs(d), d, **HOPPER_LIMITS)}
    assert {key for key, reason in reasons.items() if reason is None} == kept
    small = pruned_because(config(128, 128, 8, 3), 128, shared_memory_limit=200_000, registers_per_block=65536,
                           capability=90)
    assert small == f"shared memory {tile_bytes(config(128, 128, 8, 3), 128)} > 200000 bytes"
    with pytest.raises(ValueError, match=r"pruned_because: capability must be >= 10, got 9"):
        pruned_because(config(128, 64, 4, 3), 64, shared_memory_limit=1000, registers_per_block=1000, capability=9)


def test_gpu_limits_are_read_only_of_a_cuda_device():
    with pytest.raises(TypeError, match="device must be a torch.device, got str"):
        gpu_limits("cuda")
    with pytest.raises(ValueError, match="must be a CUDA device, got cpu"):
        gpu_limits(torch.device("cpu"))
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
        assert gpu_limits(torch.device("cuda")) == HOPPER_LIMITS       # an H100 or H200: 227 KiB, 64 Ki registers
