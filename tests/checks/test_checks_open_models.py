"""Chapter 12's exercise checks: the solutions pass, each known mistake gets its own hint, what the statements forbid
is refused by name, and the checks' references agree with Hugging Face's Qwen3, gpt-oss and Qwen3-Next attention
(random small configs, no download) and, for the cache ranking, with the caches counted from the configs' fields
by hand."""

from __future__ import annotations

import json
import math
from importlib import resources

import pytest
import torch
import torch.nn.functional as F

from attn_course.checks import CheckFailed
from attn_course.checks.open_models import (
    _gate_cases,
    _qk_cases,
    check_gated_output,
    check_qk_norm_scores,
    check_sink_softmax,
    qk_norm_reference,
    sink_softmax_reference,
)
from attn_course.checks.open_models_cache import check_cache_ranking
from attn_course.positions.rope import RotaryEmbedding

from support.planted import planted_12

transformers = pytest.importorskip("transformers")


def hint(check, fn) -> str:
    with pytest.raises(CheckFailed) as failed:
        check(fn)
    return str(failed.value)


def answer(name: str, code: str):
    namespace = {"torch": torch, "math": math, "F": F, "RotaryEmbedding": RotaryEmbedding}   # the chapter's imports
    exec(compile(code, f"<{name}>", "exec"), namespace)
    return namespace[name]


def qk_norm_scores(q, k, q_weight, k_weight, eps, rope_base):
    rope = RotaryEmbedding(q_weight.shape[0], base=rope_base)
    d = q_weight.shape[0]

    def normed(t, weight):
        heads = t.unflatten(-1, (-1, d)).transpose(1, 2)                           # [B, H, N, d]
        return rope(heads / torch.sqrt(heads.pow(2).mean(-1, keepdim=True) + eps) * weight)

    return normed(q, q_weight) @ normed(k, k_weight).transpose(-2, -1) / math.sqrt(d)


def softmax_with_sink(scores, sinks):
    sink = sinks.view(-1, 1, 1)
    top = torch.maximum(scores.amax(-1, keepdim=True), sink)
    e = torch.exp(scores - top)
    return e / (e.sum(-1, keepdim=True) + torch.exp(sink - top))


def gated_output(heads, x, w_gate, w_out):
    return (heads * torch.sigmoid(x @ w_gate.T)) @ w_out.T


SMALLEST_FIRST = ["qwen3-next-80b-a3b-instruct", "gpt-oss-120b", "gemma-3-27b-it", "qwen3-8b"]


def test_the_solutions_pass():
    assert check_qk_norm_scores(qk_norm_scores)
    assert check_sink_softmax(softmax_with_sink)
    assert check_gated_output(gated_output)
    assert check_cache_ranking(lambda names: sorted(names, key=SMALLEST_FIRST.index))
    assert check_cache_ranking(lambda names: sorted(names, key=SMALLEST_FIRST.index), seed=7, shuffles=5)


# --- the references against Hugging Face ------------------------------------------------------------------------

SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, head_dim=8, intermediate_size=32,
             vocab_size=32, num_hidden_layers=1, max_position_embeddings=32, rms_norm_eps=0.05)


def hugging_face_layer(module, config_class, **fields):
    config = getattr(transformers, config_class)(**SMALL, **fields)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    layer = getattr(module, config_class.replace("Config", "Attention"))(config, layer_idx=0).eval()
    with torch.no_grad():
        for parameter in layer.parameters():                  # weights, norms and sinks all away from their defaults
            vector = parameter.dim() == 1
            parameter.copy_(torch.randn_like(parameter) * (1.0 if vector else 0.3) + (1.0 if vector else 0.0))
    rotary = getattr(module, config_class.replace("Config", "RotaryEmbedding"))(config)
    return config, layer, rotary


def causal(n: int) -> torch.Tensor:
    return torch.full((n, n), -math.inf).triu(1)[None, None]                        # [1, 1, N, N] additive


def test_the_qk_norm_reference_gives_hugging_faces_qwen3_attention_weights():
    from transformers.models.qwen3 import modeling_qwen3
    config, layer, rotary = hugging_face_layer(modeling_qwen3, "Qwen3Config")
    x, n = torch.randn(2, 7, 32), 7
    with torch.no_grad():
        _, weights = layer(x, rotary(x, torch.arange(n)[None]), causal(n))
        q, k = x @ layer.q_proj.weight.T, x @ layer.k_proj.weight.T                  # [B, N, H·d] each
        scores = qk_norm_reference(q, k, layer.q_norm.weight, layer.k_norm.weight, config.rms_norm_eps,
                                   config.rope_parameters["rope_theta"])
    assert torch.allclose((scores + causal(n)).softmax(-1).float(), weights, atol=1e-5)
    with torch.no_grad():
        ours = qk_norm_scores(q, k, layer.q_norm.weight, layer.k_norm.weight, config.rms_norm_eps,
                              config.rope_parameters["rope_theta"])
    assert torch.allclose((ours + causal(n)).softmax(-1), weights, atol=1e-5)


def test_the_sink_reference_gives_hugging_faces_gpt_oss_weights():
    from transformers.models.gpt_oss import modeling_gpt_oss
    _, layer, _ = hugging_face_layer(modeling_gpt_oss, "GptOssConfig", num_local_experts=2, num_experts_per_tok=1)
    q, k, v = (torch.randn(2, 4, 6, 8) * 0.5 for _ in range(3))
    with torch.no_grad():
        layer.sinks.copy_(torch.tensor([-2.0, 0.0, 3.0, 8.0]))
        _, weights = modeling_gpt_oss.eager_attention_forward(layer, q, k, v, None, scaling=1.0)
    scores = q @ k.transpose(-2, -1)
    assert torch.allclose(sink_softmax_reference(scores, layer.sinks.detach()).float(), weights, atol=1e-6)
    assert torch.allclose(softmax_with_sink(scores, layer.sinks.detach()), weights, atol=1e-6)
    assert (weights.sum(-1) < 1).all()


def test_the_gate_reference_gives_hugging_faces_qwen3_next_output(monkeypatch):
    from transformers.models.qwen3_next import modeling_qwen3_next
    _, layer, rotary = hugging_face_layer(modeling_qwen3_next, "Qwen3NextConfig", layer_types=["full_attention"])
    recorded = []
    original = modeling_qwen3_next.eager_attention_forward

    def recording(*args, **kwargs):
        out, weights = original(*args, **kwargs)
        recorded.append(out)                                                         # [B, N, H, d]: before the gate
        return out, weights

    monkeypatch.setattr(modeling_qwen3_next, "eager_attention_forward", recording)
    x, n = torch.randn(2, 5, 32), 5
    with torch.no_grad():
        expected, _ = layer(x, rotary(x, torch.arange(n)[None]), causal(n))
    heads = recorded[0].flatten(-2)                                                  # [B, N, H·d]
    # Hugging Face's q_proj holds, per head, d query rows and then d gate rows.
    w_gate = layer.q_proj.weight.detach().unflatten(0, (4, 2, 8))[:, 1].flatten(0, 1)  # [H·d, E]
    got = gated_output(heads, x, w_gate, layer.o_proj.weight.detach())
    assert torch.allclose(got, expected, atol=1e-5)


# --- the cache ranking against the configs counted by hand ------------------------------------------------------

def by_hand(name: str, tokens: int) -> int:
    """Keys and values of every full layer for ``tokens``, of every sliding layer for its window less one, and
    Gated DeltaNet's fixed state, read from the shipped JSON."""
    config = json.loads(resources.files("attn_course.data").joinpath(f"published_configs/{name}.json").read_text())
    config = config.get("text_config", config) if "num_hidden_layers" not in config else config
    layers = config["num_hidden_layers"]
    per_token = 2 * config["num_key_value_heads"] * config["head_dim"]
    if name == "gemma-3-27b-it":
        full = layers // 6
        return full * per_token * tokens + (layers - full) * per_token * (config["sliding_window"] - 1)
    if name == "gpt-oss-120b":
        return layers // 2 * per_token * tokens + layers // 2 * per_token * (config["sliding_window"] - 1)
    if name == "qwen3-next-80b-a3b-instruct":
        full = layers // 4
        state = 32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 4
        return full * per_token * tokens + (layers - full) * state
    return layers * per_token * tokens


def test_the_order_at_128k_is_the_one_counted_by_hand_and_differs_from_4k():
    at = {tokens: sorted(SMALLEST_FIRST, key=lambda name: by_hand(name, tokens)) for tokens in (4096, 131072)}
    assert at[131072] == SMALLEST_FIRST
    assert at[4096] == ["qwen3-next-80b-a3b-instruct", "gpt-oss-120b", "qwen3-8b", "gemma-3-27b-it"]
    assert round(by_hand("gemma-3-27b-it", 4096) * 2 / 1e6) == 771 and round(by_hand("qwen3-8b", 4096) * 2 / 1e6) == 604


# --- the planted mistakes and the forbidden calls ----------------------------------------------------------------

CHECKS = {"qk_norm_scores": check_qk_norm_scores, "fixed_softmax_with_sink": check_sink_softmax,
          "gated_output": check_gated_output, "cache_ranking": check_cache_ranking}


@pytest.mark.parametrize("student, name", [(student, name) for student, functions in planted_12.PLANTED.items()
                                           for name in functions])
def test_each_planted_mistake_gets_its_hint_from_the_check(student, name):
    code, _, phrase = planted_12.PLANTED[student][name]
    assert phrase in hint(CHECKS[name], answer(name, code))


def qk_variant(*, only=None, swapped=False, scale_first=False, unscaled=False, no_rope=False):
    def scores(q, k, q_weight, k_weight, eps, rope_base):
        rope = RotaryEmbedding(q_weight.shape[0], base=rope_base)
        d = q_weight.shape[0]
        wq, wk = (k_weight, q_weight) if swapped else (q_weight, k_weight)

        def normed(t, weight, which):
            heads = t.unflatten(-1, (-1, d)).transpose(1, 2) / (math.sqrt(d) if scale_first else 1.0)
            if only not in (None, which):
                return heads if no_rope else rope(heads)
            heads = heads / torch.sqrt(heads.pow(2).mean(-1, keepdim=True) + eps) * weight
            return heads if no_rope else rope(heads)

        product = normed(q, wq, "q") @ normed(k, wk, "k").transpose(-2, -1)
        return product if unscaled or scale_first else product / math.sqrt(d)
    return scores


@pytest.mark.parametrize("fn, fragment", [
    (qk_variant(only="k"), "keys only"), (qk_variant(swapped=True), "k_weight and the keys by q_weight"),
    (qk_variant(unscaled=True), "√d times too large"), (qk_variant(scale_first=True), "√d times too large"),
    (qk_variant(no_rope=True), "carry no positions"),
    (lambda q, k, qw, kw, eps, rope_base: torch.zeros(q.shape[0], q.shape[-1] // qw.shape[0], q.shape[1], q.shape[1]),
     "Your scores differs from the reference"),
])
def test_each_qk_norm_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_qk_norm_scores, fn)


@pytest.mark.parametrize("fn, fragment", [
    (lambda s, k: s.exp() / (s.exp().sum(-1, keepdim=True) + k.view(-1, 1, 1)), "sink itself"),
    (lambda s, k: s.exp() / s.exp().sum(-1, keepdim=True), "rows sum to one"),
    (lambda s, k: torch.nn.functional.softmax(s, -1), "calls F.softmax, which this exercise forbids"),
])
def test_each_sink_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_sink_softmax, fn)


@pytest.mark.parametrize("fn, fragment", [
    (lambda h, x, g, o: (torch.sigmoid(h) * (x @ g.T)) @ o.T, "sigmoid to the heads"),
    (lambda h, x, g, o: (h * torch.sigmoid(h)) @ o.T, "computed from the heads"),
    (lambda h, x, g, o: (h + torch.sigmoid(x @ g.T)) @ o.T, "add the gate"),
    (lambda h, x, g, o: (h * torch.sigmoid(x @ g)) @ o, "[in, out]"),
])
def test_each_gate_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_gated_output, fn)


def test_the_decoder_attention_is_refused_in_the_gate():
    from attn_course.models.decoder_attention import DecoderAttention, DecoderAttentionConfig

    def through_the_layer(heads, x, w_gate, w_out):
        DecoderAttention(DecoderAttentionConfig(x.shape[-1], 1, 1, heads.shape[-1], output_gate=True))
        return gated_output(heads, x, w_gate, w_out)
    assert "DecoderAttention" in hint(check_gated_output, through_the_layer)


@pytest.mark.parametrize("fn, fragment", [
    (lambda names: list(names), "in the order they came"),
    (lambda names: list(SMALLEST_FIRST), "return exactly the names you were given"),
    (lambda names: sorted(names, key=lambda n: [SMALLEST_FIRST, SMALLEST_FIRST[::-1]][int(torch.randint(2, ()))]
                          .index(n)), "calls torch.randint, which this exercise forbids"),
    (lambda names: sorted(names, key=["qwen3-next-80b-a3b-instruct", "gemma-3-27b-it", "gpt-oss-120b",
                                      "qwen3-8b"].index), "at 131,072 tokens gpt-oss-120b keeps 4.8 GB"),
    (lambda names: sorted(names, key=SMALLEST_FIRST.index if len(names) == 2 else [
        "qwen3-next-80b-a3b-instruct", "gemma-3-27b-it", "gpt-oss-120b", "qwen3-8b"].index), "every pair"),
    (lambda names: "qwen3-8b", "should return a list of the names"),
])
def test_each_ranking_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_cache_ranking, fn)


def test_the_cases_show_the_mistakes_they_are_there_for():
    # a large eps on small vectors, and a gate case as wide as the model (where a gate after W_o runs)
    (q, _, _, _, eps, _), _ = _qk_cases()
    assert eps >= 0.1 and q.pow(2).mean() < 0.5
    heads, x, w_gate, w_out = _gate_cases()[0]
    assert heads.shape[-1] == x.shape[-1] and any(c[0].shape[-1] != c[1].shape[-1] for c in _gate_cases())
