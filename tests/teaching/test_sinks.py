"""Chapter 09's attention-sink measurement: streaming held-out text through caches that forget, and the windows
on which the first key's attention is measured, each against a reference built here by hand."""

import pytest
import torch
import torch.nn.functional as F

from attn_course.core.kv_cache import KVCache
from attn_course.models.position_model import PositionConfig, PositionLanguageModel
from attn_course.teaching.experiments.sinks import first_token_windows, sink_streaming_losses
from attn_course.variants.attention_sinks import SinkKVCache


def _model(*, first_token, layers=1, vocab_size=9, seed=0):
    torch.manual_seed(seed)
    config = PositionConfig(vocab_size, "rope", embed_dim=16, num_heads=2, num_layers=layers, first_token=first_token)
    return PositionLanguageModel(config).eval()


def _reference_losses(model, ids, sinks, window):
    """A one-layer RoPE model streamed through SinkKVCache(window, sinks) is, at every step, one plain
    forward over the tokens the cache holds (numbered 0 .. held - 1): its keys depend on no position
    until they are read. Scored here by hand, in float64."""
    first = model.config.first_token_id
    stream = ids if first is None else torch.cat([torch.tensor([first]), ids])
    losses = []
    with torch.no_grad():
        for t in range(len(stream) - 1):
            held = list(range(min(sinks, t + 1))) + list(range(max(sinks, t - window + 1), t + 1))
            logits = model(stream[held][None])[0, -1].double()             # the newest token's prediction
            losses.append(-F.log_softmax(logits, dim=-1)[stream[t + 1]])
    losses = torch.stack(losses)
    return losses if first is None else losses[1:]


@pytest.mark.parametrize("first_token", [False, True])
@pytest.mark.parametrize("sinks, window", [(1, 4), (0, 5), (2, 3)])
def test_streamed_losses_are_those_of_a_forward_over_what_the_cache_holds(first_token, sinks, window):
    model = _model(first_token=first_token)
    ids = torch.randint(0, 8, (15,), generator=torch.Generator().manual_seed(3))
    got = sink_streaming_losses(model, ids, lambda: SinkKVCache(window=window, sinks=sinks))
    expected = _reference_losses(model, ids, sinks, window)
    assert got.shape == (14,)                                           # the losses of ids[1:], either way
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("first_token", [False, True])
def test_with_every_token_kept_the_losses_are_one_forward_over_the_text(first_token):
    model = _model(first_token=first_token, layers=2)
    ids = torch.randint(0, 8, (20,), generator=torch.Generator().manual_seed(4))
    stream = ids if not first_token else torch.cat([torch.tensor([model.config.first_token_id]), ids])
    with torch.no_grad():
        losses = F.cross_entropy(model(stream[None, :-1])[0], stream[1:], reduction="none")
    expected = losses if not first_token else losses[1:]
    torch.testing.assert_close(sink_streaming_losses(model, ids, KVCache), expected, rtol=0, atol=1e-5)


def test_windows_start_with_the_fixed_token_only_for_a_model_trained_with_it():
    ids = torch.arange(20) % 8
    with_token = first_token_windows(_model(first_token=True), ids, count=3, length=5)
    assert with_token.tolist() == [[8, 0, 1, 2, 3], [8, 4, 5, 6, 7], [8, 0, 1, 2, 3]]
    plain = first_token_windows(_model(first_token=False), ids, count=3, length=5)
    assert plain.tolist() == ids[:15].view(3, 5).tolist()


@pytest.mark.parametrize("call, error, message", [
    (lambda: sink_streaming_losses(lambda ids: ids, torch.arange(4), KVCache), TypeError, "PositionLanguageModel"),
    (lambda: sink_streaming_losses(_model(first_token=True), torch.arange(4.0), KVCache), TypeError, "integer"),
    (lambda: sink_streaming_losses(_model(first_token=True), torch.zeros(1, 4, dtype=torch.long), KVCache),
     ValueError, "1-D"),
    (lambda: sink_streaming_losses(_model(first_token=True), torch.arange(1), KVCache), ValueError, "at least 2"),
    (lambda: sink_streaming_losses(_model(first_token=True), torch.arange(4), 3), TypeError, "make_cache"),
    (lambda: first_token_windows(_model(first_token=True), torch.arange(8), 3, 4), ValueError, "fewer than"),
    (lambda: first_token_windows(_model(first_token=True), torch.arange(8), 0, 4), ValueError, "count"),
    (lambda: first_token_windows(_model(first_token=True), torch.arange(8), 2, 1), ValueError, "length"),
])
def test_bad_input_raises_naming_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()
