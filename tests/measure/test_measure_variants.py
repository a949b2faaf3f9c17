"""attn_course.measure.variants: every variant computes what its name says, exact memory, the crossover."""

from __future__ import annotations

import pytest
import torch

from attn_course.measure import variants
from attn_course.measure.crossover import crossover_from_rows

TINY = dict(heads=2, head_dim=16, window=8, chunk_size=16, repeats=1, budget_s=0)


def test_variants_peak_memory_grows_as_n_squared_for_softmax_and_as_n_for_linear():
    """Exact bytes from peak_memory, independent of timing: N four times longer."""
    rows = variants.measure_variants((64, 256), **TINY, variants=(
        "softmax self_attention", "sliding window mask", "linear chunked", "linear recurrent", "decode kv-cache",
        "decode rolling-cache", "decode linear state"))
    peak = {(r.variant, r.n): r.peak_bytes for r in rows}
    state = {(r.variant, r.n): r.state_bytes for r in rows}
    for name in ("softmax self_attention", "sliding window mask"):   # a mask saves no memory: still N²
        assert 15.0 < peak[name, 256] / peak[name, 64] <= 16.0, name
    for name in ("linear chunked", "linear recurrent"):
        assert 3.3 < peak[name, 256] / peak[name, 64] <= 4.0, name
    assert peak["linear chunked", 256] * 5 < peak["softmax self_attention", 256]
    # What decoding keeps: the full cache grows with N, the rolling window and the linear state do not.
    batch, heads, d, window = 1, TINY["heads"], TINY["head_dim"], TINY["window"]
    assert state["decode kv-cache", 256] == 2 * batch * heads * 256 * d * 4 == 4 * state["decode kv-cache", 64]
    assert state["decode rolling-cache", 64] == state["decode rolling-cache", 256] == 2 * heads * (window - 1) * d * 4
    assert state["decode linear state", 64] == state["decode linear state", 256] == heads * (d * d + d) * 4


def _float64_reference(q, k, v, window=None):
    """Causal (optionally windowed) softmax attention and causal linear attention, in float64, written out."""
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[-2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    visible = (j <= i) & ((j > i - window) if window else True)
    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~visible, float("-inf"))
    softmax = torch.softmax(scores, dim=-1) @ v
    phi_q, phi_k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    weights = (phi_q @ phi_k.transpose(-2, -1)) * (j <= i)
    linear = (weights @ v) / (weights.sum(-1, keepdim=True) + 1e-6)
    return softmax, linear


def test_every_timed_variant_computes_what_its_name_says():
    n, window = 40, 8
    q, k, v = (torch.randn(2, 3, n, 16, generator=torch.Generator().manual_seed(s)) for s in range(3))
    causal, linear = _float64_reference(q, k, v)
    local, _ = _float64_reference(q, k, v, window=window)
    expected = {"softmax sdpa": causal, "softmax self_attention": causal, "flex eager": causal,
                "sliding window mask": local, "linear chunked": linear, "linear recurrent": linear}
    functions = variants.prefill_functions(n, window, chunk_size=16)
    assert set(functions) == set(variants.PREFILL_VARIANTS)
    for name, fn in functions.items():
        assert (fn(q, k, v).double() - expected[name]).abs().max() < 1e-5, name
    # Decoding the last token: the full cache and the linear state match the last row of the
    # full computation, the rolling cache that of the windowed one.
    rows = variants._decode_rows(list(variants.DECODE_VARIANTS), q, k, v, n, window, repeats=1, budget_s=0)
    assert [r.variant for r in rows] == list(variants.DECODE_VARIANTS)
    assert all(r.max_difference < 1e-5 for r in rows)
    state = torch.zeros(2, 3, 16, 16), torch.zeros(2, 3, 16)
    for t in range(n):
        out = variants._linear_step(*state, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1])
    assert (out.double() - linear[:, :, -1:]).abs().max() < 1e-5


def test_a_variant_that_computes_the_wrong_thing_is_refused_not_timed(monkeypatch):
    real = variants.prefill_functions

    def with_a_wrong_window(n, window, chunk_size):
        wrong = real(n, window + 1, chunk_size)["sliding window mask"]
        return {**real(n, window, chunk_size), "sliding window mask": wrong}

    monkeypatch.setattr(variants, "prefill_functions", with_a_wrong_window)
    monkeypatch.setattr(variants, "best_time", lambda *args, **kwargs: pytest.fail("a wrong computation was timed"))
    with pytest.raises(RuntimeError, match=r"^measure_variants: sliding window mask differs from its reference"):
        variants.measure_variants((32,), **TINY, variants=("sliding window mask",))


def test_eager_flex_attention_warning_is_silenced_only_in_the_benchmark(monkeypatch):
    import warnings

    from torch.nn.attention import flex_attention as flex_module

    shown = getattr(flex_module, "_WARNINGS_SHOWN", None)
    if shown is not None:   # the warning is shown once per process: forget that it was
        monkeypatch.setattr(flex_module, "_WARNINGS_SHOWN", set())
    q = torch.randn(1, 1, 16, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        variants._flex_causal(q, q, q)
    assert not [w for w in caught if "flex_attention called without torch.compile" in str(w.message)]


def test_crossover_is_the_first_n_from_which_linear_stays_faster_interpolated_log_log():
    from attn_course.measure.variants import VariantRow

    def rows(linear_seconds):
        made = []
        for n, seconds in zip((100, 200, 400, 800), linear_seconds):
            made.append(VariantRow("softmax sdpa", "prefill", n, 1.0, 4 * n, 0, 0.0))
            made.append(VariantRow("linear chunked", "prefill", n, seconds, 2 * n + 100, 0, 0.0))
        return made

    # Noise at 200 (faster once, then slower again) does not count: from 400 on it stays faster.
    crossover = crossover_from_rows(rows([2.0, 0.9, 2.0, 0.5]))
    assert crossover.time_n == 800 and crossover.time_n_interpolated == pytest.approx((400 * 800) ** 0.5)
    assert crossover.memory_n == 100 and crossover.memory_n_interpolated is None   # at or below the grid
    assert "from N = 800" in crossover.describe() and "already at the smallest N measured, 100" in crossover.describe()
    never = crossover_from_rows(rows([2.0, 2.0, 2.0, 1.5]))
    assert never.time_n is None and "not faster than softmax sdpa for N <= 800" in never.describe()


def test_variants_functions_reject_bad_arguments():
    with pytest.raises(ValueError, match=r"^measure_variants: lengths must not be empty"):
        variants.measure_variants(())
    with pytest.raises(TypeError, match=r"^measure_variants: lengths must be a sequence of ints, got str"):
        variants.measure_variants("64")
    with pytest.raises(ValueError, match=r"^measure_variants: variants\[0\] must be one of .*, got 'softmax'"):
        variants.measure_variants((16,), variants=("softmax",))
    with pytest.raises(ValueError, match=r"^measure_variants: window must be >= 1, got 0"):
        variants.measure_variants((16,), window=0)
    with pytest.raises(ValueError, match=r"^measure_variants: budget_s must be >= 0 and finite, got -1"):
        variants.measure_variants((16,), budget_s=-1)
    with pytest.raises(ValueError, match=r"^crossover_from_rows: softmax must be one of"):
        crossover_from_rows([variants.VariantRow("softmax sdpa", "prefill", 16, 1.0, 1, 0, 0.0)], softmax="flex eager")
    with pytest.raises(TypeError, match=r"^crossover_from_rows: rows\[0\] must be VariantRow"):
        crossover_from_rows([object()])
