"""Chapter 12's small decoders: their measures against independent computations, training's determinism, and
the cached runs showing what the chapter says they show."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.models.decoder_attention import DecoderAttention, DecoderAttentionConfig
from attn_course.open_models import RunSetup, SmallDecoder, SmallDecoderConfig, start_token_batch, train_small_decoder
from attn_course.open_models.tasks import FIRST_MEASURED, vocab_size
from attn_course.open_models.trained import trained_runs
from attn_course.open_models.training import measure
from attn_course.variants.receptive_field import reach_by_depth


def reference_logits(attention: DecoderAttention, x: torch.Tensor) -> torch.Tensor:
    """q·k · scale in float64 from the weights, with RoPE written out here (half-split pairs)."""
    c, (batch, tokens, _) = attention.config, x.shape
    x = x.double()

    def heads(projection, count):
        out = x @ projection.weight.double().T
        out = out.view(batch, tokens, count, c.head_dim).transpose(1, 2)            # [B, H, N, d]
        norm = getattr(projection, "norm", None)
        if norm is not None:
            out = out / torch.sqrt(out.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight.double()
        half = c.head_dim // 2
        angle = torch.arange(tokens, dtype=torch.float64)[:, None] * c.rope_base ** (
            -torch.arange(half, dtype=torch.float64) / half)                          # [N, d/2]
        first, second = out[..., :half], out[..., half:]
        return torch.cat((first * angle.cos() - second * angle.sin(), second * angle.cos() + first * angle.sin()), -1)

    q, k = heads(attention.q_proj, c.num_heads), heads(attention.k_proj, c.num_kv_heads)
    k = k.repeat_interleave(c.num_heads // c.num_kv_heads, dim=1)
    scores = q @ k.transpose(-1, -2) * c.softmax_scale
    hidden = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
    return scores.masked_fill(hidden, -math.inf)


@pytest.mark.parametrize("qk_norm", [None, "rms"])
def test_logits_are_the_scores_and_their_softmax_with_the_sink_gives_the_weights(qk_norm):
    torch.manual_seed(0)
    attention = DecoderAttention(DecoderAttentionConfig(32, 4, 2, 8, qk_norm=qk_norm, sinks=True))
    with torch.no_grad():
        attention.sinks.copy_(torch.tensor([-1.0, 0.0, 1.0, 3.0]))
        if qk_norm:
            attention.q_proj.norm.weight.mul_(1.5)
    x = torch.randn(2, 7, 32)
    expected = reference_logits(attention, x)
    assert torch.allclose(attention.logits(x).double(), expected, atol=1e-5)
    sink = attention.sinks.double()[None, :, None, None].expand(2, 4, 7, 1)
    weights = torch.softmax(torch.cat((expected, sink), -1), -1)[..., :7]             # the sink's share dropped
    assert torch.allclose(attention(x)[1].double(), weights, atol=1e-6)


def test_measures_equal_a_loop_over_queries():
    torch.manual_seed(1)
    model = SmallDecoder(SmallDecoderConfig(vocab_size("repeats"), sinks=True)).eval()
    batch = start_token_batch("repeats", 6, torch.Generator().manual_seed(3))
    measured = measure(model, batch)
    _, recording = model(batch.inputs, record=True)
    for layer, weights in enumerate(recording.weights):
        for head in range(4):
            first = [weights[b, head, i, 0].item() for b in range(6) for i in range(40) if batch.idle[b, i]]
            share = [1 - weights[b, head, i].sum().item() for b in range(6) for i in range(40) if batch.idle[b, i]]
            assert measured["first_token_mass"][layer][head] == pytest.approx(sum(first) / len(first), abs=1e-6)
            assert measured["sink_share"][layer][head] == pytest.approx(sum(share) / len(share), abs=1e-6)
    assert measured["largest_activation"][1] == recording.residuals[1].abs().max().item()


def test_idle_queries_are_outside_the_second_copy_and_start_late_enough():
    batch = start_token_batch("repeats", 32, torch.Generator().manual_seed(0))
    assert not batch.idle[:, :FIRST_MEASURED].any()
    # An idle query's input token is never a copy of the token one period back (as far as the repeat goes).
    repeated = batch.inputs[:, FIRST_MEASURED:] == batch.inputs[:, FIRST_MEASURED - 4:-4]
    assert batch.idle.any() and (~batch.idle[:, FIRST_MEASURED:]).any() and repeated.any()
    assert (batch.targets[:, :-1] == batch.inputs[:, 1:]).all()
    assert (batch.inputs[:, 0] == vocab_size("repeats") - 1).all()


def test_training_is_deterministic_and_each_switch_changes_it():
    setup = RunSetup(steps=6, record_every=3)
    _, first = train_small_decoder(4, setup)
    _, again = train_small_decoder(4, setup)
    assert first.digests == again.digests and first.loss == again.loss
    for switch in ("qk_norm", "sinks", "output_gate"):
        _, other = train_small_decoder(4, RunSetup(steps=6, record_every=3, **{switch: True}))
        assert other.loss[-1] != first.loss[-1]


def test_a_cached_run_is_reproduced_by_training_it_again():
    cached = trained_runs("qk_norm")[0]                                   # lr 0.01, plain, seed 0
    _, fresh = train_small_decoder(cached["seed"], RunSetup(**{**cached["setup"], "steps": 50}))
    assert fresh.steps == cached["steps"][:3]
    for name in ("loss", "largest_logit", "largest_activation"):
        assert torch.allclose(torch.tensor(getattr(fresh, name)), torch.tensor(cached[name][:3]), rtol=1e-3), name


def test_the_cache_shows_what_chapter_12_says():
    runs = trained_runs("qk_norm")
    assert len(runs) == 18 and {run["seed"] for run in runs} == {0, 1, 2}
    for rate in (0.03, 0.1):
        plain = [max(run["largest_logit"][-1]) for run in runs if run["setup"]["learning_rate"] == rate
                 and not run["setup"]["qk_norm"]]
        normed = [max(run["largest_logit"][-1]) for run in runs if run["setup"]["learning_rate"] == rate
                  and run["setup"]["qk_norm"]]
        assert min(plain) > 5 * max(normed), (rate, plain, normed)
    assert len(trained_runs("sinks_and_gates")) == 9


@pytest.mark.parametrize("seed", range(4))
def test_reach_through_layers_is_window_minus_one_per_sliding_layer_until_a_full_one(seed):
    generator = torch.Generator().manual_seed(seed)
    kinds = ["full_attention" if torch.rand(1, generator=generator) < 0.2 else "sliding_attention" for _ in range(8)]
    window, tokens = int(torch.randint(2, 9, (1,), generator=generator)), 48
    expected, back = [], 0
    for kind in kinds:
        back = tokens - 1 if kind == "full_attention" else min(tokens - 1, back + window - 1)
        expected.append(back)
    assert reach_by_depth(kinds, window=window, tokens=tokens) == expected


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="task"):
        RunSetup(task="poems")
    with pytest.raises(ValueError, match="record_every"):
        RunSetup(steps=10, record_every=3)
    with pytest.raises(ValueError, match="ids"):
        SmallDecoder(SmallDecoderConfig(10))(torch.tensor([[3, 10]]))
    with pytest.raises(ValueError, match="kinds"):
        reach_by_depth(["linear_attention"], window=4, tokens=8)
    with pytest.raises(ValueError, match="experiment"):
        trained_runs("gates")
