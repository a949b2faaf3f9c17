"""The gated delta rule against a float64 recurrence written from the formula and against Hugging Face's
Qwen3-Next reference functions; the chunked form against the recurrent one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_course.variants.delta_rule import gated_delta_rule

#: Largest |difference| of outputs and states between forms, relative to the largest value (float64: round-off
#: of a few hundred operations; float32: Hugging Face computes in float32 with other sums).
FLOAT64, FLOAT32 = 1e-12, 2e-5


def inputs(batch=2, heads=3, tokens=23, d_k=8, d_v=5, *, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k = (F.normalize(torch.randn(batch, heads, tokens, d_k, generator=generator, dtype=dtype), dim=-1)
            for _ in range(2))
    v = torch.randn(batch, heads, tokens, d_v, generator=generator, dtype=dtype)
    g = -torch.rand(batch, heads, tokens, generator=generator, dtype=dtype) * 0.5     # decays in (0.6, 1]
    beta = torch.rand(batch, heads, tokens, generator=generator, dtype=dtype)
    return q, k, v, g, beta


def formula(q, k, v, g, beta, scale, initial=None):
    """S_t = α_t S_{t−1} + β_t (v_t − α_t S_{t−1} k_t) k_tᵀ with S [d_v, d_k], o_t = scale · S_t q_t: a loop per
    sequence and head, in the papers' convention (the transpose of the code's)."""
    batch, heads, tokens, d_k = q.shape
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float64)
    states = torch.zeros(batch, heads, v.shape[-1], d_k, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            S = torch.zeros(v.shape[-1], d_k, dtype=torch.float64) if initial is None else initial[b, h].double().T
            for t in range(tokens):
                alpha, kt = g[b, h, t].double().exp(), k[b, h, t].double()
                S = alpha * S + beta[b, h, t].double() * torch.outer(v[b, h, t].double() - alpha * S @ kt, kt)
                out[b, h, t] = scale * S @ q[b, h, t].double()
            states[b, h] = S
    return out, states.transpose(-1, -2)


def relative(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize("chunk_size", [None, 1, 4, 7, 23, 64])
def test_both_forms_equal_the_formula_in_float64(chunk_size):
    q, k, v, g, beta = inputs()
    initial = torch.randn(2, 3, 8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    out, state = gated_delta_rule(q, k, v, g, beta, chunk_size=chunk_size, scale=0.7, initial_state=initial)
    expected_out, expected_state = formula(q, k, v, g, beta, 0.7, initial)
    assert relative(out, expected_out) < FLOAT64 and relative(state, expected_state) < FLOAT64


def test_a_sequence_cut_in_two_continues_from_the_state():
    q, k, v, g, beta = inputs(tokens=20)
    whole, final = gated_delta_rule(q, k, v, g, beta, chunk_size=8)
    first, state = gated_delta_rule(*(x[:, :, :9] for x in (q, k, v, g, beta)), chunk_size=8)
    second, state = gated_delta_rule(*(x[:, :, 9:] for x in (q, k, v, g, beta)), initial_state=state)
    assert relative(torch.cat((first, second), 2), whole) < FLOAT64 and relative(state, final) < FLOAT64


def test_a_unit_key_with_beta_one_replaces_its_value_where_linear_attention_adds():
    """The point of the delta rule: writing v twice to the same key recalls the last v, not their sum."""
    key = torch.zeros(1, 1, 2, 4, dtype=torch.float64)
    key[..., 0] = 1.0
    values = torch.tensor([[[[1.0, 0.0], [0.0, 3.0]]]], dtype=torch.float64)          # [1, 1, 2, 2]
    zeros, ones = torch.zeros(1, 1, 2, dtype=torch.float64), torch.ones(1, 1, 2, dtype=torch.float64)
    out, _ = gated_delta_rule(key, key, values, zeros, ones, scale=1.0)
    assert out[0, 0, 1].tolist() == [0.0, 3.0]                                         # the first value is gone


transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_next.modeling_qwen3_next import (  # noqa: E402
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)


@pytest.mark.parametrize("chunk_size", [None, 16])
def test_equal_to_hugging_face_qwen3_next_references_in_float32(chunk_size):
    q, k, v, g, beta = inputs(tokens=37, d_k=16, d_v=12, dtype=torch.float32, seed=3)
    initial = torch.randn(2, 3, 16, 12, generator=torch.Generator().manual_seed(4))
    out, state = gated_delta_rule(q, k, v, g, beta, chunk_size=chunk_size, initial_state=initial)
    hf_inputs = [x.transpose(1, 2) for x in (q, k, v, g, beta)]                         # [B, N, H, ...]
    references = ((torch_recurrent_gated_delta_rule, {}), (torch_chunk_gated_delta_rule, {"chunk_size": 16}))
    for reference, options in references:
        expected, expected_state = reference(*hf_inputs, initial_state=initial, output_final_state=True, **options)
        assert relative(out, expected.transpose(1, 2)) < FLOAT32, reference.__name__
        assert relative(state, expected_state) < FLOAT32, reference.__name__


def test_bad_inputs_are_named():
    q, k, v, g, beta = inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match="g is the log"):
        gated_delta_rule(q, k, v, -g, beta)
    with pytest.raises(ValueError, match="beta must be"):
        gated_delta_rule(q, k, v, g, beta[..., :-1])
    with pytest.raises(ValueError, match="chunk_size"):
        gated_delta_rule(q, k, v, g, beta, chunk_size=0)
    with pytest.raises(ValueError, match="initial_state"):
        gated_delta_rule(q, k, v, g, beta, initial_state=torch.zeros(2, 3, 5, 8))
    with pytest.raises(TypeError):
        gated_delta_rule(q, k, v, g.double(), beta)
