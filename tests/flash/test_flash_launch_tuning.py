"""attn_course.flash.launch: on a GPU, one tuning per length bucket, not per exact length (issue 32).

Triton's autotuner keys on exact argument values, so a generation loop whose key count grows by
one each token would time every candidate again at every step. The launcher keeps each tuning's
winner by a bucketed key and launches it directly afterwards. Here the GPU is played by fakes: a
kernel that records its launches and an autotuner that counts the times it benchmarks.
"""

from __future__ import annotations

import types

import pytest
import torch

from attn_course.flash import launch
from attn_course.flash.configs import CONFIGS

ARG_NAMES = ["Q", "K", "Out", "num_kv_groups", "n_q", "n_k", "scale"]


class FakeKernel:
    """A ``@triton.jit`` function as the launcher sees it: its argument names, and launches."""

    arg_names = ARG_NAMES

    def __init__(self):
        self.fixed_launches = []

    def __getitem__(self, grid):
        def run(*args, **options):
            self.fixed_launches.append(options)
        return run


class FakeTuner:
    """``triton.autotune(...)(kernel)``: benchmarks every candidate for each exact key it has not
    seen (as Triton's does), then keeps the winner as ``best_config``."""

    def __init__(self, winner):
        self.benchmarks, self.seen, self.best_config, self.winner = 0, set(), None, winner

    def __getitem__(self, grid):
        def run(*args, **constants):
            assert constants["enable_fp_fusion"] is True
            key = tuple(a for a in args if isinstance(a, int))
            if key not in self.seen:
                self.seen.add(key)
                self.benchmarks += 1
            self.best_config = self.winner
        return run


@pytest.fixture
def on_a_fake_gpu(monkeypatch):
    kernel = FakeKernel()
    candidate = CONFIGS["decode", 64][-1]                    # the winner: not the default
    winner = types.SimpleNamespace(kwargs={"BLOCK_N": candidate.block_n}, num_warps=candidate.num_warps,
                                   num_stages=candidate.num_stages)
    tuner = FakeTuner(winner)
    monkeypatch.setattr(launch, "runs_in_interpreter", lambda: False)
    monkeypatch.setattr(launch, "kernel_function", lambda name: kernel)
    monkeypatch.setattr(launch, "autotuned_kernel", lambda name, head_dim: tuner)
    monkeypatch.setattr(launch, "_tuned", {})
    return kernel, tuner, candidate


def decode_step(n_k: int, dtype=torch.float16) -> None:
    q, k, out = (torch.empty(1, dtype=dtype) for _ in range(3))
    launch.launch("decode", 4, 8, q, k, out, 4, 1, n_k, 0.125, head_dim=64, causal=False)


def test_a_50_token_generation_loop_tunes_once_per_length_bucket(on_a_fake_gpu):
    kernel, tuner, candidate = on_a_fake_gpu
    prompt = 100
    for step in range(50):                                   # keys 101 .. 150: buckets 128 and 256
        decode_step(prompt + 1 + step)
    assert tuner.benchmarks == 2                             # Triton's exact key alone: 50
    assert len(kernel.fixed_launches) == 48                  # every other step launches the winner
    assert {o["BLOCK_N"] for o in kernel.fixed_launches} == {candidate.block_n}
    assert {o["num_warps"] for o in kernel.fixed_launches} == {candidate.num_warps}
    assert {o["enable_fp_fusion"] for o in kernel.fixed_launches} == {True}    # explicit, whatever Triton's default
    assert list(launch.tuned_configs().values()) == [candidate, candidate]        # the two buckets' winners


def test_another_dtype_or_group_count_is_tuned_apart(on_a_fake_gpu):
    _, tuner, _ = on_a_fake_gpu
    decode_step(200)
    decode_step(201, dtype=torch.bfloat16)
    assert tuner.benchmarks == 2
    decode_step(202)
    assert tuner.benchmarks == 2                             # float16 at 256 was tuned already


@pytest.mark.parametrize("n, bucket", [(1, 16), (16, 16), (17, 32), (1000, 1024), (1024, 1024), (1025, 2048)])
def test_length_bucket_is_the_next_power_of_two_from_16(n, bucket):
    assert launch.length_bucket(n) == bucket


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_length_bucket_refuses_what_is_not_a_positive_int(n):
    with pytest.raises((TypeError, ValueError), match="length_bucket"):
        launch.length_bucket(n)
