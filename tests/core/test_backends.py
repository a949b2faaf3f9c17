"""The attention registry (attn_course.core.backends): names, errors, custom backends, and eager and SDPA
against attention written out in float64."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.core import backends
from attn_course.core.attention import eager_attention
from attn_course.core.backends import attention_backend, register_attention_backend, sdpa_attention
from attn_course.core.kv_cache import KVCache
from attn_course.core.multihead import MultiHeadAttention

from helpers import randn, random_mask

E, H, H_KV = 16, 4, 2
D = E // H


@pytest.fixture
def registry(monkeypatch):
    """The registry as it is, restored after the test (so test backends do not leak)."""
    monkeypatch.setattr(backends, "_BACKENDS", dict(backends._BACKENDS))
    return backends._BACKENDS


def reference(module: MultiHeadAttention, x: torch.Tensor, allowed: torch.Tensor | None,
              additive: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, N, E]`` float64: every head by its own loop, key/value head ``h // G``, softmax of masked scores."""
    w = {n: getattr(module, n).weight.detach().double() for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
    b = {n: getattr(module, n).bias.detach().double() for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
    x = x.double()
    outputs = []
    for batch in range(x.shape[0]):
        heads = []
        for h in range(H):
            g = h // (H // H_KV)
            q = (x[batch] @ w["q_proj"].T + b["q_proj"])[:, h * D:(h + 1) * D]           # [N, d]
            k = (x[batch] @ w["k_proj"].T + b["k_proj"])[:, g * D:(g + 1) * D]           # [N, d]
            v = (x[batch] @ w["v_proj"].T + b["v_proj"])[:, g * D:(g + 1) * D]           # [N, d]
            scores = q @ k.T / math.sqrt(D)                                              # [N, N]
            if additive is not None:
                scores = scores + additive.double()
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            heads.append(torch.softmax(scores, dim=-1) @ v)
        outputs.append(torch.cat(heads, dim=-1) @ w["out_proj"].T + b["out_proj"])       # [N, E]
    return torch.stack(outputs)


def module(backend: str) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(E, H, num_kv_heads=H_KV, attention_backend=backend).eval()


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("masking", ["causal", "boolean", "additive"])
def test_eager_and_sdpa_agree_with_float64_math(backend, masking):
    attention, x = module(backend), randn(2, 7, E, seed=1)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    allowed = random_mask(7, 7, seed=2) | torch.eye(7, dtype=torch.bool)        # no fully masked row
    additive = randn(7, 7, seed=3)
    with torch.no_grad():
        if masking == "causal":
            ours, expected = attention(x, is_causal=True, need_weights=False)[0], reference(attention, x, causal)
        elif masking == "boolean":
            ours, expected = attention(x, mask=allowed, need_weights=False)[0], reference(attention, x, allowed)
        else:
            ours = attention(x, mask=additive, is_causal=True, need_weights=False)[0]
            expected = reference(attention, x, causal, additive)
    assert (ours.double() - expected).abs().max().item() < 1e-5


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_decoding_with_a_cache_is_bottom_right_causal_on_every_backend(backend):
    attention, x = module(backend), randn(1, 9, E, seed=4)
    cache = KVCache()
    with torch.no_grad():
        prompt = attention(x[:, :5], is_causal=True, kv_cache=cache, need_weights=False)[0]
        rest = attention(x[:, 5:], is_causal=True, kv_cache=cache, need_weights=False)[0]
    expected = reference(attention, x, torch.ones(9, 9, dtype=torch.bool).tril())
    assert (torch.cat([prompt, rest], dim=1).double() - expected).abs().max().item() < 1e-5


def test_an_unknown_backend_says_how_to_register_it():
    with pytest.raises(ValueError, match=r"MultiHeadAttention: no attention backend 'mine' is registered \(register "
                                         r"it with attn_course.core.backends.register_attention_backend\)"):
        MultiHeadAttention(E, H, attention_backend="mine")


def test_the_flash_backend_unregistered_says_which_import_registers_it(registry):
    registry.pop("flash", None)                    # as in a session that has not imported attn_course.flash
    with pytest.raises(ValueError, match=r"no attention backend 'flash' is registered \(import attn_course.flash "
                                         r"registers it\)"):
        MultiHeadAttention(E, H, attention_backend="flash")


def test_a_registered_custom_backend_is_called_with_the_grouped_heads(registry):
    calls = []

    def recording(q, k, v, mask=None, **options):
        calls.append((q.shape, k.shape, mask, options))
        return eager_attention(q, k, v, mask, **options)

    register_attention_backend("recording", recording)
    ours, plain, x = module("recording"), module("eager"), randn(2, 5, E, seed=5)
    with torch.no_grad():
        output, weights = ours(x, is_causal=True)
        expected, expected_weights = plain(x, is_causal=True)
    assert calls == [((2, H, 5, D), (2, H_KV, 5, D), None,
                      {"is_causal": True, "dropout": 0.0, "need_weights": True})]
    assert torch.equal(output, expected) and torch.equal(weights, expected_weights)


def test_auto_takes_an_automatic_backend_only_when_nothing_blocks_it(registry):
    used = []

    def doubling(q, k, v, mask=None, **options):
        used.append(True)
        output, _ = eager_attention(q, k, v, mask, **options)
        return 2 * output, None

    register_attention_backend("doubling", doubling, automatic=lambda q: True,
                               blockers=lambda q, k, *, mask, need_weights, dropout:
                               ["need_weights=True"] if need_weights else [])
    attention, x = module("auto"), randn(1, 4, E, seed=6)
    with torch.no_grad():
        attention(x, need_weights=True)                       # blocked: eager
        assert used == []
        attention(x, need_weights=False)
    assert used == [True]


def test_a_named_backend_that_the_call_blocks_is_an_error_and_sdpa_gives_no_weights():
    with pytest.raises(ValueError, match=r"attention_backend='sdpa', but this call has need_weights=True"):
        module("sdpa")(randn(1, 3, E))
    q = randn(1, 2, 3, D)
    assert sdpa_attention(q, q, q)[1] is None


@pytest.mark.parametrize("arguments, error, message", [
    (("auto", eager_attention), ValueError, "name must be a non-empty name other than 'auto'"),
    (("", eager_attention), ValueError, "name must be a non-empty name"),
    ((3, eager_attention), TypeError, "name must be a str, got int"),
    (("x", "not callable"), TypeError, "function must be callable, got str"),
])
def test_registration_checks_its_arguments(registry, arguments, error, message):
    with pytest.raises(error, match="register_attention_backend: " + message):
        register_attention_backend(*arguments)


def test_eager_and_sdpa_are_registered_under_their_names():
    assert attention_backend("eager").function is eager_attention
    assert attention_backend("sdpa").function is sdpa_attention
