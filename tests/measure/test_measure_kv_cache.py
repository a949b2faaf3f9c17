"""attn_course.measure.kv_cache: generation with and without a cache, its rows and tables (no timing assertions)."""

from __future__ import annotations

import pytest
import torch

from attn_course.measure import flash, kv_cache
from attn_course.models.tiny_language_model import LanguageModelConfig, TinyLanguageModel


def tiny_kv_cache(**changes):
    options = dict(new_tokens=(2, 4), prompt_length=3, embed_dim=16, num_layers=1)
    return kv_cache.kv_cache_speedup(**{**options, **changes})


def test_kv_cache_speedup_returns_one_row_per_count():
    rows = tiny_kv_cache()
    assert all(isinstance(row, kv_cache.KvCacheRow) for row in rows)
    assert [row.new_tokens for row in rows] == [2, 4]
    assert [(row.positions_without, row.positions_with) for row in rows] == [(3 + 4, 3 + 1), (3 + 4 + 5 + 6, 3 + 3)]
    for row in rows:
        assert row.seconds_without > 0 and row.seconds_with > 0
        assert row.speedup == pytest.approx(row.seconds_without / row.seconds_with)


def test_kv_cache_speedup_refuses_to_time_generation_that_disagrees(monkeypatch):
    generate = TinyLanguageModel.generate

    def cached_goes_wrong(self, prompt, count, *, use_cache=True, **options):
        out = generate(self, prompt, count, use_cache=use_cache, **options)
        return out + 1 if use_cache else out

    monkeypatch.setattr(TinyLanguageModel, "generate", cached_goes_wrong)
    with pytest.raises(RuntimeError, match=r"^kv_cache_speedup: cached and uncached generation disagree at new_tokens"):
        tiny_kv_cache()


@pytest.mark.parametrize("prompt_length, new_tokens", [(1, 1), (3, 4), (5, 11)])
def test_positions_processed_counts_what_generation_feeds_the_model(prompt_length, new_tokens):
    """Counted independently: a hook on the position table sees every position a pass uses."""
    torch.manual_seed(0)
    config = LanguageModelConfig(vocab_size=5, max_length=prompt_length + new_tokens)
    model = TinyLanguageModel(config).eval()
    seen = []
    model.position_embedding.register_forward_hook(lambda module, args, output: seen.append(args[0].numel()))
    counts = []
    for use_cache in (False, True):
        seen.clear()
        model.generate(torch.zeros(prompt_length, dtype=torch.long), new_tokens, use_cache=use_cache)
        counts.append(sum(seen))
    assert kv_cache.positions_processed(prompt_length, new_tokens) == tuple(counts)


@pytest.mark.parametrize("arguments, error, message", [
    ((0, 3), ValueError, r"prompt_length must be >= 1, got 0"),
    ((3, 0), ValueError, r"new_tokens must be >= 1, got 0"),
    ((3, 2.0), TypeError, r"new_tokens must be an int, got float"),
])
def test_positions_processed_rejects_bad_input(arguments, error, message):
    with pytest.raises(error, match=r"^positions_processed: " + message):
        kv_cache.positions_processed(*arguments)


def test_benchmarks_leave_the_global_rng_as_it_was():
    state = torch.random.get_rng_state()
    tiny_kv_cache(new_tokens=(2,), seed=7)
    flash.cpu_rows(lengths=(16,), head_dim=4, block=8, repeats=1)
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("changes, error, message", [
    ({"new_tokens": (4, 0)}, ValueError, r"new_tokens\[1\] must be >= 1, got 0"),
    ({"new_tokens": (4, 2.5)}, TypeError, r"new_tokens\[1\] must be an int, got float"),
    ({"new_tokens": 4}, TypeError, r"new_tokens must be a sequence of ints, got int"),
    ({"new_tokens": ()}, ValueError, r"new_tokens must not be empty"),
    ({"prompt_length": 0}, ValueError, r"prompt_length must be >= 1, got 0"),
    ({"embed_dim": 10}, ValueError, r"embed_dim must be a multiple of 4"),
    ({"num_layers": True}, TypeError, r"num_layers must be an int, got bool"),
    ({"repeats": 0}, ValueError, r"repeats must be >= 1, got 0"),
    ({"seed": -1}, ValueError, r"seed must be >= 0, got -1"),
])
def test_kv_cache_speedup_rejects_bad_input(changes, error, message):
    with pytest.raises(error, match=r"^kv_cache_speedup: " + message):
        tiny_kv_cache(**changes)


def test_decode_step_times_returns_one_row_per_length_with_the_same_calls_at_every_length():
    rows = kv_cache.decode_step_times((2, 5, 9), embed_dim=8, num_layers=2, repeats=2)
    assert all(isinstance(row, kv_cache.DecodeStepRow) for row in rows)
    assert [row.length for row in rows] == [2, 5, 9]
    assert all(row.seconds_cached > 0 and row.seconds_uncached > 0 for row in rows)
    assert len({row.torch_calls for row in rows}) == 1 and rows[0].torch_calls > 0
    more_layers = kv_cache.decode_step_times((2,), embed_dim=8, num_layers=4, repeats=1)
    assert more_layers[0].torch_calls > rows[0].torch_calls           # the calls are per layer


def test_decode_step_times_leaves_the_global_rng_as_it_was():
    state = torch.random.get_rng_state()
    kv_cache.decode_step_times((3,), embed_dim=8, num_layers=1, repeats=1, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("changes, error, message", [
    ({"lengths": (4, 1)}, ValueError, r"lengths\[1\] must be >= 2, got 1"),
    ({"lengths": ()}, ValueError, r"lengths must not be empty"),
    ({"lengths": 4}, TypeError, r"lengths must be a sequence of ints, got int"),
    ({"embed_dim": 10}, ValueError, r"embed_dim must be a multiple of 4"),
    ({"num_layers": 0}, ValueError, r"num_layers must be >= 1, got 0"),
    ({"repeats": 1.0}, TypeError, r"repeats must be an int, got float"),
    ({"seed": -2}, ValueError, r"seed must be >= 0, got -2"),
])
def test_decode_step_times_rejects_bad_input(changes, error, message):
    options = {"lengths": (2,), "embed_dim": 8, "num_layers": 1, "repeats": 1}
    with pytest.raises(error, match=r"^decode_step_times: " + message):
        kv_cache.decode_step_times(**{**options, **changes})


def test_median_time_is_the_median_of_single_timed_calls(monkeypatch):
    """The single calls' times made up, out of order: the result is their median, not their minimum."""
    times, seen = iter([0.5, 0.1, 0.9, 0.3, 0.7]), []

    def one_call(fn, repeats, *, setup=None):
        assert repeats == 1                                   # every call timed on its own
        seen.append(setup())
        return next(times)

    monkeypatch.setattr(kv_cache, "best_time", one_call)
    untimed = []
    assert kv_cache.median_time(untimed.append, 5, setup=lambda: "fresh") == 0.5
    assert seen == ["fresh"] * 5
    assert untimed == ["fresh"]                               # one warm-up call, outside the timings


@pytest.mark.parametrize("arguments, error, message", [
    ((None, 3), TypeError, r"fn must be callable, got NoneType"),
    ((print, 0), ValueError, r"repeats must be >= 1, got 0"),
    ((print, 2.0), TypeError, r"repeats must be an int, got float"),
])
def test_median_time_rejects_bad_input(arguments, error, message):
    with pytest.raises(error, match=r"^median_time: " + message):
        kv_cache.median_time(*arguments)
    with pytest.raises(TypeError, match=r"^median_time: setup must be callable or None, got int"):
        kv_cache.median_time(print, 1, setup=3)
