"""Linear attention: the parallel (quadratic), recurrent (RNN) and chunked forms agree."""

import pytest
import torch

from attn_course.variants.linear_attention import (
    elu_feature_map,
    linear_attention,
    linear_attention_parallel,
    linear_attention_recurrent,
)


def inputs(*batch, n=50, d=8, d_v=5, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*batch, n, width, generator=generator, dtype=dtype) for width in (d, d, d_v)]


def by_hand(q, k, v, causal):
    """out_i = Σ_j w_ij v_j / Σ_j w_ij with w_ij = Σ_c φ(q_ic) φ(k_jc), as loops over i and j."""
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    rows = []
    for i in range(q.shape[-2]):
        keys = range(i + 1) if causal else range(k.shape[-2])
        weights = torch.stack([(phi_q[..., i, :] * phi_k[..., j, :]).sum(-1) for j in keys], dim=-1)  # [..., J]
        values = torch.stack([v[..., j, :] for j in keys], dim=-2)                                     # [..., J, d_v]
        rows.append((weights[..., :, None] * values).sum(-2) / (weights.sum(-1, keepdim=True) + 1e-6))
    return torch.stack(rows, dim=-2)


@pytest.mark.parametrize("causal", [False, True])
def test_parallel_form_is_the_formula(causal):
    q, k, v = inputs(2, n=9)
    torch.testing.assert_close(linear_attention_parallel(q, k, v, causal=causal), by_hand(q, k, v, causal),
                               rtol=0, atol=1e-13)


@pytest.mark.parametrize("batch", [(), (3,), (2, 4)])
def test_recurrent_form_equals_the_causal_parallel_form(batch):
    q, k, v = inputs(*batch)
    difference = (linear_attention_recurrent(q, k, v) - linear_attention_parallel(q, k, v, causal=True)).abs().max()
    assert difference < 1e-13, difference


@pytest.mark.parametrize("chunk_size", [1, 7, 16, 50, 64])
def test_chunked_causal_form_equals_the_parallel_form(chunk_size):
    # 50 tokens: chunks that do and do not divide the length, one chunk, a chunk longer than it.
    q, k, v = inputs(2)
    difference = (linear_attention(q, k, v, causal=True, chunk_size=chunk_size)
                  - linear_attention_parallel(q, k, v, causal=True)).abs().max()
    assert difference < 1e-13, difference


def test_non_causal_linear_time_form_equals_the_parallel_form():
    q, k, v = inputs(3, n=40)
    k2, v2 = inputs(3, n=25, seed=1)[1:]                      # cross-attention: N_k != N_q
    for keys, values in ((k, v), (k2, v2)):
        torch.testing.assert_close(linear_attention(q, keys, values), linear_attention_parallel(q, keys, values),
                                   rtol=0, atol=1e-13)


def test_float32_stays_close_to_float64():
    q, k, v = inputs(2, n=300, d=16, d_v=16)
    exact = linear_attention_parallel(q, k, v, causal=True)
    fast = linear_attention(q.float(), k.float(), v.float(), causal=True)
    assert (fast.double() - exact).abs().max() < 1e-5


def test_outputs_are_averages_of_the_values():
    # φ > 0, so every weight is positive and each output a convex combination of the values seen
    # (with eps negligible: eps shrinks every output towards 0 by a factor 1 - eps / Σ_j w_ij).
    q, k, v = inputs(1, n=30)
    out = linear_attention(q, k, v, causal=True, chunk_size=8, eps=1e-30)
    seen_min, seen_max = v.cummin(dim=-2).values, v.cummax(dim=-2).values
    assert ((out >= seen_min - 1e-12) & (out <= seen_max + 1e-12)).all()
    assert (elu_feature_map(torch.linspace(-30, 30, 101, dtype=torch.float64)) > 0).all()


def test_bottom_right_causal_parallel_form_is_the_last_rows():
    q, k, v = inputs(2, n=12)
    full = linear_attention_parallel(q, k, v, causal=True)
    torch.testing.assert_close(linear_attention_parallel(q[..., 9:, :], k, v, causal=True), full[..., 9:, :],
                               rtol=0, atol=1e-14)


@pytest.mark.parametrize("call, error, message", [
    (lambda q, k, v: linear_attention(q, k, v[..., :3, :]), ValueError, r"v \[2, 3, 5\]"),
    (lambda q, k, v: linear_attention(q, k.float(), v), TypeError, "one dtype"),
    (lambda q, k, v: linear_attention(q.long(), k, v), TypeError, "q must be a floating tensor"),
    (lambda q, k, v: linear_attention(q, k, v, causal=True, chunk_size=0), ValueError, "chunk_size must be >= 1"),
    (lambda q, k, v: linear_attention(q, k, v, causal=1), TypeError, "causal must be a bool"),
    (lambda q, k, v: linear_attention(q, k, v, eps=0.0), ValueError, "eps"),
    (lambda q, k, v: linear_attention(q[..., :4, :], k, v, causal=True), ValueError, r"N_q = N_k"),
    (lambda q, k, v: linear_attention_recurrent(q[..., :4, :], k, v), ValueError, "one query per key"),
    (lambda q, k, v: elu_feature_map([1.0]), TypeError, "elu_feature_map: x must be a"),
])
def test_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call(*inputs(2, n=6))
