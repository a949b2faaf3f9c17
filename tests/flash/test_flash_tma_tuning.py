"""The TMA forward's tuning skips a candidate that fails, as Triton's autotuner does (issue 42).

Triton's ``Autotuner._bench`` times a configuration as infinitely slow when compiling or loading it
raises ``OutOfResources`` (more shared memory than the GPU has: the d = 128, 128 x 128, 3-stage
candidate has a 2 KiB margin on Triton 3.6), ``PTXASError`` or ``CompileTimeAssertionFailure``. The
TMA forward tunes by itself (:func:`~attn_course.flash.tma_attention.tuned_tma_config`), so it must
do the same, or one candidate that does not fit crashes the forward. No GPU is needed: the timer
and the launches are played by fakes, the candidates made to fail by raising Triton's own errors.
"""

import math

import pytest
import torch

pytest.importorskip("triton")

from triton.runtime.errors import OutOfResources, PTXASError  # noqa: E402

from attn_course.flash import tma_attention, tma_configs  # noqa: E402
from attn_course.flash.configs import KernelConfig  # noqa: E402
from attn_course.flash.tma_configs import HOPPER_LIMITS, prune_tma_configs, tma_forward_configs  # noqa: E402

KEPT = prune_tma_configs(tma_forward_configs(64), 64, **HOPPER_LIMITS)   # what an H100/H200 times at d = 64


@pytest.fixture
def fake_gpu(monkeypatch):
    """The tuning's GPU: H200 limits, a table of winners of this test's own, and a timer that runs the
    launch it is given (so that a failing candidate raises inside it, as in ``do_bench``) and answers
    each candidate faster than the one before. Returns the failures to raise, by candidate."""
    import triton.testing

    failures = {}
    launched = []

    def launch(q, k, v, out, lse, *, config, **options):
        launched.append(config)
        if config in failures:
            raise failures[config]

    timings = iter(range(100, 0, -1))
    monkeypatch.setattr(tma_attention, "is_interpreted", lambda kernel: False)
    monkeypatch.setattr(tma_attention, "gpu_limits", lambda device: HOPPER_LIMITS)
    table = {}
    monkeypatch.setattr(tma_attention, "tuned_config", table.get)
    monkeypatch.setattr(tma_attention, "record_tuned", table.__setitem__)
    monkeypatch.setattr(tma_attention, "launch_tma_forward", launch)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, *a, **kw: fn() or next(timings))
    return failures, launched


def tune():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 1000, 64, generator=generator).half() for _ in range(3))
    return tma_attention.tuned_tma_config(q, k, v, torch.empty_like(q), torch.empty(1, 4, 1000), causal=True,
                                          scale=0.125)


def test_candidates_that_run_out_of_shared_memory_or_fail_in_ptxas_are_skipped(fake_gpu):
    failures, launched = fake_gpu
    assert len(KEPT) >= 3, "the test needs two candidates to fail and one to win"
    # The fastest two (timed last) fail: the winner is the fastest of those that ran.
    failures[KEPT[-1]] = OutOfResources(234496, 232448, "shared memory")
    failures[KEPT[-2]] = PTXASError("ptxas fatal: made up for the test")
    with pytest.warns(RuntimeWarning) as warned:
        winner = tune()
    assert winner == KEPT[-3]
    assert launched == KEPT                                     # every kept candidate was tried once
    said = " | ".join(str(w.message) for w in warned)
    assert "OutOfResources" in said and "PTXASError" in said and str(KEPT[-1]) in said and str(KEPT[-2]) in said


def test_a_compiler_pass_that_fails_skips_the_candidate_too(fake_gpu):
    failures, _ = fake_gpu
    failures[KEPT[-1]] = RuntimeError("PassManager::run failed")    # what a failing MLIR pass raises
    with pytest.warns(RuntimeWarning, match="PassManager::run failed"):
        assert tune() == KEPT[-2]


def test_when_every_candidate_fails_the_errors_are_raised(fake_gpu):
    failures, _ = fake_gpu
    for config in KEPT:
        failures[config] = RuntimeError("Failed to find C compiler. Please specify via CC environment variable")
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match=r"no candidate ran: .*C compiler"):
        tune()


def test_time_candidates_checks_its_arguments():
    with pytest.raises(ValueError, match=r"^time_candidates: candidates must not be empty"):
        tma_configs.time_candidates([], lambda config: None)
    with pytest.raises(TypeError, match=r"^time_candidates: candidates\[0\] must be a KernelConfig, got tuple"):
        tma_configs.time_candidates([(128, 64, 4, 3)], lambda config: None)
    with pytest.raises(TypeError, match=r"^time_candidates: run must be callable, got int"):
        tma_configs.time_candidates([KernelConfig(128, 64, 4, 3)], 3)


def test_failed_candidates_time_as_infinitely_slow(monkeypatch):
    import triton.testing

    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, *a, **kw: fn() or 2.5)

    def run(config):
        if config.num_stages == 4:
            raise OutOfResources(300000, 232448, "shared memory")

    candidates = [KernelConfig(128, 64, 4, 3), KernelConfig(128, 64, 4, 4)]
    with pytest.warns(RuntimeWarning, match="shared memory"):
        assert tma_configs.time_candidates(candidates, run) == [2.5, math.inf]
