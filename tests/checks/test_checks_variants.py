"""Chapter 09's exercise checks: the solutions pass, each known mistake gets its own hint, and the
checks' own references agree with the course's modules (RMSNorm, SwiGLU, what MultiHeadLatentAttention
stores and multiplies, measured) and with Hugging Face's LlamaRMSNorm / LlamaMLP, so that a check can
never hold a student to a wrong answer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from attn_course.checks import CheckFailed
from attn_course.checks.latent_costs import check_decode_costs
from attn_course.checks.variants import (
    check_rms_norm,
    check_sink_eviction,
    check_swiglu,
)
from attn_course.core.attention import self_attention
from attn_course.core.norms import RMSNorm
from attn_course.models.llama import SwiGLU
from attn_course.variants.attention_sinks import SinkKVCache
from attn_course.variants.kv_cache_size import DEEPSEEK_V2
from attn_course.variants.latent_attention import MLAConfig, MultiHeadLatentAttention
from attn_course.variants.latent_cache import LatentCache


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
        # the crash of a mean without keepdim, named (either operand first)
        (lambda x, w, eps: x / (x.pow(2).mean(-1) + eps).sqrt() * w, "keepdim=True"),
        (lambda x, w, eps: torch.rsqrt(x.pow(2).mean(-1) + eps) * x * w, "keepdim=True"),
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
        (lambda x, g, u, d: (F.silu(x @ g.T) * F.silu(x @ u.T)) @ d.T, "SiLU to both projections"),
        (lambda x, g, u, d: (F.silu(x @ g) * (x @ u)) @ d, "as [in, out]"),
        (lambda x, g, u, d: F.silu(x @ g.T) * (x @ u.T), "before the down projection"),
        (lambda x, g, u, d: ..., "returns nothing yet"),
        (lambda x, g, u, d: (F.silu(x @ g) * (x @ u.T)) @ d.T, "Your function raised RuntimeError"),
    ],
)
def test_swiglu_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_swiglu, fn)


# --- what decoding from a latent cache costs per cached token --------------------------------------------

def decode_costs(config, form):
    heads, latent, rope = config["num_attention_heads"], config["kv_lora_rank"], config["qk_rope_head_dim"]
    key, value = config["qk_nope_head_dim"] + rope, config["v_head_dim"]
    if form == "absorbed":
        return latent + rope, heads * (latent + rope + latent)
    return heads * (key + value), heads * (key + value)


def _measured_costs(config: MLAConfig, absorbed: bool) -> tuple[int, int]:
    """What the course's MLA stores and multiplies per cached token, measured: the cached tensors' widths (the
    latent cache absorbed, the per-head K and V its plain form builds expanded) and the FLOP count of one
    decoding step against 10 and against 30 cached tokens (FlopCounterMode), less the up-projections that
    rebuild K and V from the latent (an expanded cache holds them already)."""
    mla = MultiHeadLatentAttention(config).eval()
    seen = {}

    def recording(q, k, v, *args, **kwargs):
        seen["width"] = k.shape[1] * k.shape[-1] + v.shape[1] * v.shape[-1]      # heads × (key + value), per token
        return self_attention(q, k, v, *args, **kwargs)

    def step_flops(cached: int) -> tuple[float, LatentCache]:
        cache = LatentCache()
        with torch.no_grad():
            mla(torch.randn(1, cached, config.hidden_size), cache)
            with FlopCounterMode(display=False) as counter:
                mla(torch.randn(1, 1, config.hidden_size), cache, absorbed=absorbed)
        counts = {name: sum(by_op.values()) for name, by_op in counter.get_flop_counts().items()}
        rebuilding = sum(counts.get(f"MultiHeadLatentAttention.{name}", 0) for name in ("key_up", "value_up"))
        return counter.get_total_flops() - rebuilding, cache

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("attn_course.variants.latent_attention.self_attention", recording)
        short, _ = step_flops(10)
        long, cache = step_flops(30)
    multiply_adds = (long - short) / 20 / 2                                      # 2 FLOPs per multiply-add
    cached = cache.latent.shape[-1] + cache.rope_key.shape[-1] if absorbed else seen["width"]
    return cached, multiply_adds


@pytest.mark.parametrize("form", ["absorbed", "expanded"])
def test_decode_costs_reference_is_what_the_course_mla_stores_and_multiplies(form):
    config = MLAConfig(64, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
    as_dict = dict(num_attention_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
    assert _measured_costs(config, absorbed=form == "absorbed") == decode_costs(as_dict, form)


def test_decode_costs_check_accepts_the_count_and_deepseek_v2s_are_the_chapters():
    assert check_decode_costs(decode_costs)
    assert check_decode_costs(lambda c, form: tuple(torch.tensor(n) for n in decode_costs(c, form)))   # 0-d tensors
    assert check_decode_costs(lambda c, form: list(decode_costs(c, form)))
    # Section 5: a 576-wide key [c_KV; k_R] and a 512-wide value shared by all 128 heads, against per-head keys
    # of 128 + 64 and values of 128, cached per head: 128 · (192 + 128) = 40,960.
    assert decode_costs(DEEPSEEK_V2, "absorbed") == (512 + 64, 128 * (576 + 512)) == (576, 139_264)
    assert decode_costs(DEEPSEEK_V2, "expanded") == (128 * (192 + 128),) * 2 == (40_960, 40_960)


def _wrong(absorbed=None, expanded=None):
    """decode_costs with one form's answer replaced by ``absorbed(c)`` or ``expanded(c)``."""
    def fn(c, form):
        replaced = absorbed if form == "absorbed" else expanded
        return replaced(c) if replaced else decode_costs(c, form)
    return fn


def _dims(c):
    return c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]


def _no_rope(c):
    h, latent, _, content, value = _dims(c)
    return (latent, h * 2 * latent), (h * (content + value), h * (content + value))


def _one_head(c):
    h, latent, rope, content, value = _dims(c)
    return (latent + rope, 2 * latent + rope), (content + rope + value, content + rope + value)


def _value_in_key(c):                                  # the key's content width taken from v_head_dim
    h, latent, rope, content, value = _dims(c)
    return h * (2 * value + rope), h * (2 * value + rope)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda c, form: decode_costs(c, "expanded" if form == "absorbed" else "absorbed"), "two forms are swapped"),
        (lambda c, form: decode_costs(c, form)[::-1], "(multiply-adds, numbers cached)"),
        (lambda c, form: _no_rope(c)[form == "expanded"], "left out the rotary part"),
        (_wrong(absorbed=lambda c: _no_rope(c)[0]), "left out the rotary part"),
        (_wrong(expanded=lambda c: _no_rope(c)[1]), "left out the rotary part"),
        (lambda c, form: _one_head(c)[form == "expanded"], "You counted one head"),
        (_wrong(expanded=lambda c: _one_head(c)[1]), "You counted one head"),
        (_wrong(expanded=_value_in_key), "value's width in the key"),
        (_wrong(expanded=lambda c: (decode_costs(c, "expanded")[0],
                                    _dims(c)[0] * (c["qk_nope_head_dim"] + _dims(c)[2] + 2 * c["v_head_dim"]))),
         "value's width in the key"),
        (_wrong(absorbed=lambda c: (decode_costs(c, "absorbed")[0],
                                    _dims(c)[0] * (3 * c["kv_lora_rank"] + _dims(c)[2]))), "value's width in the key"),
        (_wrong(absorbed=lambda c: (_dims(c)[0] * decode_costs(c, "absorbed")[0], decode_costs(c, "absorbed")[1])),
         "once per head"),
        (_wrong(absorbed=lambda c: (c["kv_lora_rank"] + _dims(c)[0] * _dims(c)[2], decode_costs(c, "absorbed")[1])),
         "rotary key for every head"),
        (_wrong(absorbed=lambda c: (2 * c["kv_lora_rank"] + _dims(c)[2], decode_costs(c, "absorbed")[1])),
         "cache the absorbed value separately"),
        (_wrong(absorbed=lambda c: (decode_costs(c, "absorbed")[0], _dims(c)[0] * decode_costs(c, "absorbed")[0])),
         "the scores only"),
        (_wrong(expanded=lambda c: (decode_costs(c, "expanded")[0],
                                    _dims(c)[0] * (c["qk_nope_head_dim"] + _dims(c)[2]))), "the scores only"),
        (_wrong(absorbed=lambda c: (decode_costs(c, "absorbed")[0], 2 * decode_costs(c, "absorbed")[1]
                                    - _dims(c)[0] * 2 * c["kv_lora_rank"])), "whole key [c_KV; k_R]"),
        (_wrong(expanded=lambda c: (_dims(c)[0] * (c["qk_nope_head_dim"] + c["v_head_dim"]) + _dims(c)[2],
                                    decode_costs(c, "expanded")[1])), "its own copy"),
        (_wrong(absorbed=lambda c: (576, 139_264)), "num_attention_heads=16, kv_lora_rank=256, qk_rope_head_dim=32, "
         "qk_nope_head_dim=64, v_head_dim=96, your number cached and count of multiply-adds are not right"),
        (_wrong(absorbed=lambda c: (decode_costs(c, "absorbed")[0], 7)), "your count of multiply-adds is not right"),
        (_wrong(expanded=lambda c: (7, decode_costs(c, "expanded")[1])), "your number cached is not right"),
        (lambda c, form: 576, "two numbers"),
        (lambda c, form: (576, "many"), "two numbers"),
        (lambda c, form: (True, 3), "two numbers"),
        (lambda c, form: ..., "returns nothing yet"),
        (lambda c, form: c["kv_lora_rank_"], "Your function raised KeyError"),
    ],
)
def test_decode_costs_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_decode_costs, fn)


def _from_the_course(c, form):
    from attn_course.variants.kv_cache_size import mla_cache_elements

    return mla_cache_elements(c["kv_lora_rank"], c["qk_rope_head_dim"]), decode_costs(c, form)[1]


def _from_the_module(c, form):
    config = MLAConfig(64, c["num_attention_heads"], kv_lora_rank=c["kv_lora_rank"],
                       qk_nope_head_dim=c["qk_nope_head_dim"], qk_rope_head_dim=c["qk_rope_head_dim"],
                       v_head_dim=c["v_head_dim"])
    MultiHeadLatentAttention(config)
    return decode_costs(c, form)


@pytest.mark.parametrize("fn, called", [(_from_the_course, "mla_cache_elements"),
                                        (_from_the_module, "MultiHeadLatentAttention.__init__")])
def test_decode_costs_check_refuses_the_course_counts_and_its_mla(fn, called):
    assert f"your answer calls {called}, which this exercise forbids" in hint(check_decode_costs, fn)


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
