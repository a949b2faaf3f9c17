"""benchmarks.selfcheck: the kernels checked without pytest, as on a GPU image that lacks it."""

from __future__ import annotations

import pytest
import torch

from benchmarks import selfcheck


def test_selfcheck_passes_a_correct_attention_and_fails_a_wrong_one():
    from attn_course.flash import flash_attention

    def sdpa(q, k, v, *, causal):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    options = dict(batch=1, heads=4, kv_heads=2, n_q=20, n_k=20, head_dim=16, dtype=torch.float32, causal=True,
                   backward=True, device="cpu", name="t")
    good = selfcheck.run_case(sdpa, **options)
    assert good.passed and set(good.errors) == {"output", "dq", "dk", "dv"}
    wrong = selfcheck.run_case(lambda q, k, v, causal: sdpa(q, k, v, causal=causal) * 1.01, **options)
    assert not wrong.passed
    raised = selfcheck.run_case(lambda q, k, v, causal: q[0, 0, 0, 99], **options)
    assert not raised.passed and raised.error.startswith("IndexError")
    ours = selfcheck.run_case(flash_attention, **{**options, "n_q": 5, "n_k": 40})   # bottom-right causal
    assert ours.passed, ours


def test_selfcheck_cases_cover_both_kernels_and_refuse_a_bad_device():
    found = selfcheck.cases("cuda")
    assert {c["kernel"] for c in found} == {"flash", "decode"}
    assert {c["dtype"] for c in found} == {torch.float16, torch.bfloat16}
    assert {c["head_dim"] for c in found} == {64, 128}
    assert any(c["kv_heads"] < c["heads"] and c["n_q"] < c["n_k"] and c["causal"] for c in found)
    with pytest.raises(ValueError, match=r"^cases: device must be 'cuda' or 'cpu', got 'tpu'"):
        selfcheck.cases("tpu")
    with pytest.raises(ValueError, match=r"^run_case: heads must be a multiple of kv_heads"):
        selfcheck.run_case(lambda *a, **k: None, batch=1, heads=3, kv_heads=2, n_q=1, n_k=1, head_dim=8,
                           dtype=torch.float32, causal=False, backward=False, device="cpu", name="x")
