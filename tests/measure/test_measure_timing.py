"""attn_course.measure.timing and attn_course._threads: the timers' wiring, never a speed."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

import attn_course.measure
from attn_course import _threads
from attn_course.measure import kv_cache, timing


def test_package_and_chapter_imports_stay_where_the_chapters_import_them():
    assert attn_course.measure.kv_cache_speedup is kv_cache.kv_cache_speedup
    assert attn_course.measure.best_time is timing.best_time
    from attn_course.measure.crossover import crossover_from_rows  # noqa: F401
    from attn_course.measure.distributed import measure_rank_memory, measure_time, measure_traffic  # noqa: F401
    from attn_course.measure.flash import training_rows  # noqa: F401
    from attn_course.measure.kv_cache import decode_step_times, kv_cache_speedup  # noqa: F401
    from attn_course.measure.memory import peak_memory  # noqa: F401
    from attn_course.measure.variants import measure_variants, prefill_functions  # noqa: F401


@pytest.mark.slow
@pytest.mark.parametrize("code", ["import attn_course.measure.flash", "import benchmarks.flash_gpu",
                                  "import benchmarks.selfcheck", "import attn_course.measure.variants",
                                  "import attn_course.measure.distributed",
                                  "import attn_course.flash; import attn_course.measure"])
def test_imports_have_no_cycle_in_a_fresh_interpreter(code):
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_best_time_calls_fn_repeats_times_and_returns_the_shortest():
    calls = []
    assert 0 <= timing.best_time(lambda: calls.append(1), repeats=4) < 1
    assert len(calls) == 4


def test_best_time_gives_every_call_a_fresh_setup_and_times_only_the_call(monkeypatch):
    made, seen = [], []

    def setup():
        made.append(len(made))
        return made[-1]

    timing.best_time(seen.append, 3, setup=setup)
    assert seen == made == [0, 1, 2]                       # one fresh argument per call, in order


def test_best_time_is_the_minimum_of_the_samples(monkeypatch):
    """The timer's samples made up: the result is their minimum, whatever their order."""
    import timeit

    monkeypatch.setattr(timeit.Timer, "repeat", lambda self, repeat, number: [0.3, 0.1, 0.2][:repeat])
    assert timing.best_time(lambda: None, 3) == 0.1


def test_a_budget_adds_samples_from_blocked_autorange_for_fast_calls(monkeypatch):
    import timeit

    import torch.utils.benchmark as torch_benchmark

    asked = []

    class Measurement:
        times = [0.004, 0.002]

    def blocked_autorange(self, min_run_time):
        asked.append(min_run_time)
        return Measurement()

    monkeypatch.setattr(timeit.Timer, "repeat", lambda self, repeat, number: [0.01] * repeat)
    monkeypatch.setattr(torch_benchmark.Timer, "blocked_autorange", blocked_autorange)
    assert timing.best_time(lambda: None, 2, budget_s=0.5) == 0.002
    assert asked == [pytest.approx(0.48)]                     # the budget left after the single calls
    assert timing.best_time(lambda: None, 2, budget_s=0.01) == 0.01 and len(asked) == 1   # spent: no more


def test_a_budget_with_a_setup_adds_single_calls_until_it_is_spent():
    calls = []

    def step(argument):                 # a call of 1 ms or more: some 20 fit the budget, not 10**5
        calls.append(argument)
        time.sleep(0.001)

    timing.best_time(step, 1, setup=lambda: "x", budget_s=0.02)
    assert 1 < len(calls) <= 21 and set(calls) == {"x"}


def test_the_timers_keep_torch_threads_and_the_garbage_collector_as_they_were():
    import gc

    before, states = torch.get_num_threads(), []
    timing.best_time(lambda: states.append((torch.get_num_threads(), gc.isenabled())), 2, budget_s=0.01)
    assert set(states) == {(before, True)} and torch.get_num_threads() == before


def test_best_time_rejects_bad_input():
    with pytest.raises(TypeError, match=r"^best_time: fn must be callable, got int"):
        timing.best_time(3, repeats=1)
    with pytest.raises(ValueError, match=r"^best_time: repeats must be >= 1, got 0"):
        timing.best_time(lambda: None, repeats=0)
    with pytest.raises(TypeError, match=r"^best_time: repeats must be an int, got float"):
        timing.best_time(lambda: None, repeats=2.0)
    with pytest.raises(TypeError, match=r"^best_time: setup must be callable or None, got str"):
        timing.best_time(lambda: None, setup="x")
    with pytest.raises(ValueError, match=r"^best_time: budget_s must be >= 0 and finite, got inf"):
        timing.best_time(lambda: None, budget_s=float("inf"))
    with pytest.raises(TypeError, match=r"^best_time: budget_s must be a number of seconds, got bool"):
        timing.best_time(lambda: None, budget_s=True)


def test_timed_returns_the_result_and_the_seconds():
    result, seconds = timing.timed(lambda a, b=0: a + b, 2, b=3)
    assert result == 5 and seconds >= 0
    with pytest.raises(TypeError, match=r"^timed: fn must be callable, got int"):
        timing.timed(3)


def test_do_bench_gets_only_the_arguments_its_triton_version_takes(monkeypatch):
    """triton.testing.do_bench fails in Triton's interpreter (no driver): made up here, as two versions."""
    import inspect

    import triton.testing

    assert set(timing.DO_BENCH_OPTIONS) <= set(inspect.signature(triton.testing.do_bench).parameters)
    calls = []

    def triton_36_do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
        calls.append(dict(warmup=warmup, rep=rep, return_mode=return_mode))
        fn()
        return 1.5

    def ancient_do_bench(fn, warmup=25, rep=100, grad_to_none=None, percentiles=(0.2, 0.8)):
        fn()
        return (2.5, 2.0, 3.0)     # the median first, then the percentiles

    monkeypatch.setattr(triton.testing, "do_bench", triton_36_do_bench)
    assert timing.gpu_milliseconds(lambda: None) == 1.5
    assert calls == [dict(warmup=5, rep=25, return_mode="median")] and "return_mode='median'" in timing.gpu_timer_name()
    monkeypatch.setattr(triton.testing, "do_bench", ancient_do_bench)
    assert timing.gpu_milliseconds(lambda: None) == 2.5 and "return_mode" not in timing.gpu_timer_name()
    with pytest.raises(TypeError, match=r"^gpu_milliseconds: fn must be callable, got NoneType"):
        timing.gpu_milliseconds(None)


def test_machine_description_names_torch_and_triton():
    description = timing.machine_description()
    assert f"torch {torch.__version__}" in description and "Triton" in description


def test_threads_sets_and_restores_torch_threads_also_as_a_decorator():
    before = torch.get_num_threads()
    with _threads.threads(None):
        assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), _threads.one_thread():
        assert torch.get_num_threads() == 1
        raise RuntimeError("restored all the same")
    assert torch.get_num_threads() == before

    @_threads.one_thread()
    def inside():
        return torch.get_num_threads()

    assert inside() == 1 and inside() == 1 and torch.get_num_threads() == before


@pytest.mark.parametrize("count, error, message", [(0, ValueError, r"count must be >= 1, got 0"),
                                                   (1.0, TypeError, r"count must be an int or None, got float"),
                                                   (True, TypeError, r"count must be an int or None, got bool")])
def test_threads_rejects_bad_counts(count, error, message):
    with pytest.raises(error, match=r"^threads: " + message), _threads.threads(count):
        pass
