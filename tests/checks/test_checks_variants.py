"""Chapter 09's exercise checks: the solutions pass, each known mistake gets its own hint, and the
checks' own float64 references agree with the course's modules (RMSNorm, SwiGLU) and with Hugging
Face's LlamaRMSNorm / LlamaMLP, so that a check can never hold a student to a wrong answer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_course.checks import CheckFailed
from attn_course.checks.variants import (
    check_latent_cache_bytes,
    check_rms_norm,
    check_sink_eviction,
    check_swiglu,
)
from attn_course.models.llama import RMSNorm, SwiGLU
from attn_course.variants.attention_sinks import SinkKVCache
from attn_course.variants.kv_cache_size import DEEPSEEK_V2, cache_size_from_config


def hint(check, fn) -> str:
    with pytest.raises(CheckFailed) as failed:
        check(fn)
    return str(failed.value)


# --- RMSNorm ----------------------------------------------------------------------------------

def rms_with_module(x, weight, eps):
    norm = RMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm(x)


def rms_with_hugging_face(x, weight, eps):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm(x)


def test_rms_norm_check_accepts_the_formula_and_hugging_face_and_refuses_the_course_module():
    assert check_rms_norm(lambda x, w, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)
    with pytest.raises(CheckFailed, match="calls RMSNorm.forward, which this exercise forbids"):
        check_rms_norm(rms_with_module)                  # the exercise's answer may not be the module
    pytest.importorskip("transformers")
    assert check_rms_norm(rms_with_hugging_face)         # an independent RMSNorm agrees with the check


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda x, w, eps: F.layer_norm(x, x.shape[-1:], eps=eps) * w, "that is LayerNorm"),
        (lambda x, w, eps: x / (x.pow(2).mean(-1, keepdim=True) + eps) * w, "take its square root"),
        (lambda x, w, eps: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w, "eps after the square root"),
        (lambda x, w, eps: x / (x.pow(2).sum(-1, keepdim=True) + eps).sqrt() * w, "length of the vector"),
        (lambda x, w, eps: x / (x.pow(2).mean(0, keepdim=True) + eps).sqrt() * w, "wrong dimension"),
        (lambda x, w, eps: x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt(), "learned weight"),
        (lambda x, w, eps: x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() + w, "You add the weight"),
        (lambda x, w, eps: x[..., 1:], "should have shape"),
        (lambda x, w, eps: ..., "returns nothing yet"),
        (lambda x, w, eps: 2 * x, "differs from the reference"),
    ],
)
def test_rms_norm_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_rms_norm, fn)


# --- SwiGLU -----------------------------------------------------------------------------------

def swiglu_with_module(x, w_gate, w_up, w_down):
    ffn = SwiGLU(x.shape[-1], w_gate.shape[0])
    with torch.no_grad():
        ffn.gate.weight.copy_(w_gate)
        ffn.up.weight.copy_(w_up)
        ffn.down.weight.copy_(w_down)
    return ffn(x)


def swiglu_with_hugging_face(x, w_gate, w_up, w_down):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    mlp = LlamaMLP(LlamaConfig(hidden_size=x.shape[-1], intermediate_size=w_gate.shape[0], hidden_act="silu",
                               num_attention_heads=1, num_key_value_heads=1))
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(w_gate)
        mlp.up_proj.weight.copy_(w_up)
        mlp.down_proj.weight.copy_(w_down)
    return mlp(x)


def test_swiglu_check_refuses_the_course_module_and_accepts_hugging_face():
    with pytest.raises(CheckFailed, match=r"calls SwiGLU\.\w+, which this exercise forbids"):
        check_swiglu(swiglu_with_module)
    pytest.importorskip("transformers")
    assert check_swiglu(swiglu_with_hugging_face)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda x, g, u, d: (F.silu(x @ u.T) * (x @ g.T)) @ d.T, "SiLU to the up projection"),
        (lambda x, g, u, d: (F.gelu(x @ g.T) * (x @ u.T)) @ d.T, "You use GELU"),
        (lambda x, g, u, d: (F.relu(x @ g.T) * (x @ u.T)) @ d.T, "You use ReLU"),
        (lambda x, g, u, d: (torch.sigmoid(x @ g.T) * (x @ u.T)) @ d.T, "the original GLU"),
        (lambda x, g, u, d: F.silu(x @ g.T) @ d.T, "There is no gate"),
        (lambda x, g, u, d: F.silu((x @ g.T) * (x @ u.T)) @ d.T, "SiLU to the product"),
        (lambda x, g, u, d: F.silu(x @ g.T) * (x @ u.T), "before the down projection"),
        (lambda x, g, u, d: ..., "returns nothing yet"),
        (lambda x, g, u, d: (F.silu(x @ g) * (x @ u.T)) @ d.T, "Your function raised RuntimeError"),
    ],
)
def test_swiglu_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_swiglu, fn)


# --- the bytes of a latent cache ----------------------------------------------------------------

def latent_bytes(config):
    return config["num_hidden_layers"] * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) \
        * config["bytes_per_element"]


def test_latent_cache_check_accepts_the_formula_and_its_deepseek_v2_case_is_the_papers():
    assert check_latent_cache_bytes(latent_bytes)
    assert check_latent_cache_bytes(lambda c: torch.tensor(latent_bytes(c)))          # a 0-d tensor is a number
    # DeepSeek-V2, Table 1 of arXiv 2405.04434: (d_c + d_h^R) = 9/2 · d_h = 576 elements per token and layer.
    deepseek_v2 = cache_size_from_config(DEEPSEEK_V2)
    assert deepseek_v2.elements_per_token // DEEPSEEK_V2["num_hidden_layers"] == 576 == 9 * 128 // 2
    assert latent_bytes({**DEEPSEEK_V2, "bytes_per_element": 2}) == deepseek_v2.bytes(1, bits_per_element=16)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda c: c["num_hidden_layers"] * (c["kv_lora_rank"] + c["num_attention_heads"] * c["qk_rope_head_dim"])
         * c["bytes_per_element"], "shared by all heads"),
        (lambda c: c["num_hidden_layers"] * (2 * c["kv_lora_rank"] + c["qk_rope_head_dim"])
         * c["bytes_per_element"], "*jointly*"),
        (lambda c: c["num_hidden_layers"] * c["kv_lora_rank"] * c["bytes_per_element"], "cached too"),
        (lambda c: c["num_hidden_layers"] * c["num_attention_heads"]
         * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"]) * c["bytes_per_element"],
         "what MLA avoids"),
        (lambda c: (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * c["bytes_per_element"], "one layer's worth"),
        (lambda c: c["num_hidden_layers"] * (c["kv_lora_rank"] + c["qk_rope_head_dim"]), "You counted elements"),
        (lambda c: 8 * latent_bytes(c), "8 bits in a byte"),
        (lambda c: latent_bytes(c) + 1, "expected 69,120 bytes per token, got 69,121"),
        (lambda c: "many", "a number of bytes"),
        (lambda c: ..., "returns nothing yet"),
    ],
)
def test_latent_cache_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_latent_cache_bytes, fn)


# --- which tokens a sink cache keeps ----------------------------------------------------------------

def evict_solution(keys, values, sinks, recent):
    n = keys.shape[2]
    if n <= sinks + recent:
        return keys, values
    return (torch.cat((keys[:, :, :sinks], keys[:, :, n - recent:]), dim=2),
            torch.cat((values[:, :, :sinks], values[:, :, n - recent:]), dim=2))


def test_sink_eviction_check_accepts_the_solution():
    assert check_sink_eviction(evict_solution)


def test_sink_eviction_reference_is_what_a_sink_cache_holds():
    """The check's rule (first `sinks`, last `recent`) is what SinkKVCache keeps, token by token."""
    sinks, recent, n = 3, 4, 13
    cache = SinkKVCache(window=recent, sinks=sinks)    # the window counts the newest token
    keys, values = torch.randn(1, 2, n, 4, dtype=torch.float64), torch.randn(1, 2, n, 4, dtype=torch.float64)
    for t in range(n):
        held_keys, held_values = cache.append(keys[:, :, t:t + 1], values[:, :, t:t + 1])
    expected_keys, expected_values = evict_solution(keys, values, sinks, recent)
    assert torch.equal(held_keys, expected_keys) and torch.equal(held_values, expected_values)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda k, v, s, r: (k[:, :, -(s + r):], v[:, :, -(s + r):]), "the sinks are gone"),
        (lambda k, v, s, r: (torch.cat((k[:, :, :s], k[:, :, -r:]), 2), torch.cat((v[:, :, :s], v[:, :, -r:]), 2)),
         "holds some tokens twice"),
        (lambda k, v, s, r: (torch.cat((k[:, :, -r:], k[:, :, :s]), 2), torch.cat((v[:, :, -r:], v[:, :, :s]), 2))
         if k.shape[2] > s + r else (k, v), "the sinks go first"),
        (lambda k, v, s, r: evict_solution(k, v, s, r - 1) if k.shape[2] > s + r else (k, v), "one recent token"),
        (lambda k, v, s, r: (evict_solution(k, v, s, r)[0], v[:, :, :min(k.shape[2], s + r)]), "evict both alike"),
        (lambda k, v, s, r: k, "should return (keys, values)"),
        (lambda k, v, s, r: ..., "returns nothing yet"),
    ],
)
def test_sink_eviction_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_sink_eviction, fn)
