"""The FlashAttention rule (attn_course.flash.accuracy): its yardstick and its verdicts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_course.flash.accuracy import FACTORS, FLOORS, RuleCheck, flash_rule, plain_attention, report_flash_rule

from helpers import randn


def sdpa(q, k, v, *, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def inputs(n=40, d=16, dtype=torch.float16, seed=0):
    return [randn(1, 2, n, d, seed=seed + i, dtype=dtype) for i in range(4)]


@pytest.mark.parametrize("causal", [False, True])
def test_plain_attention_equals_sdpa_and_logsumexp_in_float64(causal):
    q, k, v, _ = inputs(n=33, dtype=torch.float64)
    out, lse = plain_attention(q, k, v, causal=causal)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal), rtol=0, atol=1e-12)
    scores = q @ k.transpose(-2, -1) / 4.0                                   # d = 16
    if causal:
        scores = scores.masked_fill(torch.ones(33, 33, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_pytorch_attention_in_float16_passes_the_rule(causal):
    checks = flash_rule(sdpa, *inputs(), causal=causal)
    assert [c.quantity for c in checks] == ["output", "dq", "dk", "dv"]
    assert all(c.passed for c in checks), checks
    assert all(0 < c.plain_error < 0.05 for c in checks)


def test_an_lse_that_is_returned_is_judged_too():
    def with_lse(q, k, v, *, causal, scale):
        return plain_attention(q, k, v, causal=causal, scale=scale)

    checks = flash_rule(with_lse, *inputs(), causal=True)
    assert [c.quantity for c in checks] == ["output", "lse", "dq", "dk", "dv"]
    lse = checks[1]
    assert lse.passed and lse.allowed == pytest.approx(FACTORS["lse"] * lse.plain_error + FLOORS[torch.float16])


def test_planted_mistakes_fail_the_rule():
    q, k, v, grad_out = inputs()

    def wrong_scale(q, k, v, *, causal, scale):             # 5% too sharp a softmax
        return sdpa(q, k, v, causal=causal, scale=1.05 / 4.0)

    def values_detached(q, k, v, *, causal, scale):         # dv silently zero
        return sdpa(q, k, v.detach(), causal=causal, scale=scale) + 0 * v.sum()

    assert not flash_rule(wrong_scale, q, k, v, grad_out)[0].passed
    by_quantity = {c.quantity: c for c in flash_rule(values_detached, q, k, v, grad_out)}
    assert by_quantity["output"].passed and not by_quantity["dv"].passed


def test_report_says_within_or_outside(capsys):
    report_flash_rule([RuleCheck("output", 2.8e-4, 3.2e-4, 1.64e-3), RuleCheck("dq", 5e-3, 1e-4, 1.3e-3)],
                      label="causal=True ", dtype="float16")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("causal=True output: kernel's max difference 2.8e-04, plain float16 attention's "
                        "max difference 3.2e-04, within the rule")
    assert lines[1].endswith("OUTSIDE the rule (allowed 1.3e-03)")


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda q, k, v, g: flash_rule("sdpa", q, k, v, g), TypeError, "flash_rule: attention must be callable"),
        (lambda q, k, v, g: flash_rule(sdpa, q, k, v, g[..., :8]), ValueError, "flash_rule: grad_out must be"),
        (lambda q, k, v, g: flash_rule(sdpa, q, k, v, g.float()), ValueError, "grad_out must be torch.float16"),
        (lambda q, k, v, g: flash_rule(sdpa, q[0], k, v, g), ValueError, "flash_rule: q must be 4-D"),
        (lambda q, k, v, g: plain_attention(q, k[:, :, :5], v, causal=True), ValueError, "plain_attention:"),
        (lambda q, k, v, g: report_flash_rule([1.0]), TypeError, "report_flash_rule: checks must hold RuleCheck"),
    ],
)
def test_bad_arguments_are_named(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call(*inputs())
