"""Chapter 13's recall experiment: MQAR batches read back independently, each mixer against a float64
reference written here from its formula, training's determinism, the memory count, and the cached runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_course.recall import (
    MODELS,
    RecallModel,
    RecallModelConfig,
    RunSetup,
    TokenMixer,
    decoding_memory,
    recall_accuracy,
    recall_batch,
    recall_table,
    train_recall_model,
    trained_runs,
)
from attn_course.recall.tasks import KEYS, MAX_QUERIES, VALUES, VOCAB_SIZE, sequence_length
from attn_course.recall.trained import model_name
from attn_course.recall.training import EVALUATION_PAIRS
from attn_course.variants.delta_rule import gated_delta_rule


@pytest.mark.parametrize("pairs", [1, 5, 40, 64])
def test_a_batch_lists_distinct_pairs_then_asks_distinct_keys_whose_targets_are_their_values(pairs):
    batch = recall_batch(pairs, 8, torch.Generator().manual_seed(pairs))
    asked = min(pairs, MAX_QUERIES)
    assert batch.inputs.shape == (8, 2 * pairs + asked) == (8, sequence_length(pairs))
    for tokens, targets, queries in zip(batch.inputs.tolist(), batch.targets.tolist(), batch.queries.tolist()):
        keys, values = tokens[0:2 * pairs:2], tokens[1:2 * pairs:2]
        assert all(0 <= key < KEYS for key in keys) and len(set(keys)) == pairs
        assert all(KEYS <= value < KEYS + VALUES for value in values)
        table = dict(zip(keys, values))
        questions = tokens[2 * pairs:]
        assert len(set(questions)) == asked and set(questions) <= set(keys)
        assert targets == [-100] * (2 * pairs) + [table[key] for key in questions]
        assert queries == [False] * (2 * pairs) + [True] * asked


def test_the_same_generator_state_gives_the_same_batch():
    first, again = (recall_batch(12, 4, torch.Generator().manual_seed(7)) for _ in range(2))
    assert torch.equal(first.inputs, again.inputs) and torch.equal(first.targets, again.targets)


def reference_projections(mixer: TokenMixer, x: torch.Tensor) -> list[torch.Tensor]:
    """q, k, v [B, H, N, d] in float64: the projection, then the causal depthwise convolution as a sum."""
    c = mixer.config
    mixed = x.double() @ mixer.qkv.weight.double().T                                     # [B, N, 3·H·d]
    if mixer.conv is not None:
        taps = mixer.conv.weight.double()[:, 0]                                          # [3·H·d, K]
        padded = torch.cat((mixed.new_zeros(x.shape[0], c.conv_kernel - 1, mixed.shape[-1]), mixed), dim=1)
        mixed = sum(padded[:, j:j + x.shape[1]] * taps[:, j] for j in range(c.conv_kernel))
    batch, tokens = x.shape[:2]
    return [t.reshape(batch, tokens, c.n_heads, c.head_dim).transpose(1, 2) for t in mixed.chunk(3, dim=-1)]


def reference_linear(q, k, v):
    """Katharopoulos et al.'s causal formula, a loop over queries: φ(q_t)ᵀ Σ_{j≤t} φ(k_j) v_jᵀ / φ(q_t)ᵀ Σ φ(k_j)."""
    phi = lambda t: torch.where(t > 0, t + 1, t.exp())                                  # noqa: E731  elu + 1
    outputs = []
    for t in range(q.shape[2]):
        weights = (phi(q[:, :, t, None]) * phi(k[:, :, :t + 1])).sum(-1)                 # [B, H, t + 1]
        outputs.append((weights[..., None] * v[:, :, :t + 1]).sum(2) / (weights.sum(-1, keepdim=True) + 1e-6))
    return torch.stack(outputs, dim=2)


def reference_delta(mixer: TokenMixer, x, q, k, v):
    """The gated delta rule as the papers write it, S [d_v, d_k]: S_t = α S + β (v − α S k) kᵀ, o = S q (scale 1)."""
    x = x.double()
    beta = torch.sigmoid(x @ mixer.beta.weight.double().T + mixer.beta.bias.double())    # [B, N, H]
    alpha = torch.exp(-mixer.A_log.double().exp() * F.softplus(
        x @ mixer.decay.weight.double().T + mixer.decay.bias.double() + mixer.dt_bias.double()))
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    batch, heads, tokens, d = q.shape
    state = q.new_zeros(batch, heads, d, d)
    outputs = []
    for t in range(tokens):
        a, b = alpha[:, t, :, None, None], beta[:, t, :, None, None]                     # [B, H, 1, 1]
        k_t, v_t = k[:, :, t, :, None], v[:, :, t, :, None]                              # columns [B, H, d, 1]
        state = a * state + b * (v_t - a * state @ k_t) @ k_t.transpose(-1, -2)
        outputs.append((state @ q[:, :, t, :, None])[..., 0])
    return torch.stack(outputs, dim=2)


@pytest.mark.parametrize("kind", ["softmax", "linear", "delta"])
@pytest.mark.parametrize("conv_kernel", [1, 3])
def test_each_mixer_equals_its_float64_reference(kind, conv_kernel):
    torch.manual_seed(0)
    mixer = TokenMixer(kind, RecallModelConfig(VOCAB_SIZE, d_model=16, n_heads=2, head_dim=4,
                                               conv_kernel=conv_kernel, chunk_size=4))
    x = torch.randn(2, 11, 16)
    q, k, v = reference_projections(mixer, x)
    if kind == "softmax":
        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif kind == "linear":
        heads = reference_linear(q, k, v)
    else:
        heads = reference_delta(mixer, x, q, k, v)
    expected = heads.transpose(1, 2).flatten(2) @ mixer.out.weight.double().T          # [B, N, E]
    assert torch.allclose(mixer(x).double(), expected, atol=1e-5), (mixer(x).double() - expected).abs().max()


def test_a_model_runs_its_layers_in_order_and_no_position_sees_the_future():
    torch.manual_seed(1)
    model = RecallModel(RecallModelConfig(VOCAB_SIZE, mixers=["delta", "linear", "softmax"]))
    assert model.config.mixers == ("delta", "linear", "softmax")
    ids = torch.randint(VOCAB_SIZE, (2, 9))
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % VOCAB_SIZE
    assert torch.allclose(model(ids)[:, :5], model(changed)[:, :5])


def test_accuracy_is_the_share_of_right_answers_at_the_query_positions():
    torch.manual_seed(2)
    model = RecallModel(RecallModelConfig(VOCAB_SIZE)).eval()
    batch = recall_batch(20, 4, torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(batch.inputs)
    right = [logits[b, i].argmax().item() == batch.targets[b, i].item()
             for b in range(4) for i in range(batch.inputs.shape[1]) if i >= 40]
    assert recall_accuracy(model, batch) == pytest.approx(sum(right) / len(right))


def test_training_is_reproducible_bit_for_bit_and_the_seed_matters():
    setup = RunSetup(mixers=("delta", "softmax"), steps=3, record_every=3, batch_size=4, max_pairs=8)
    model, first = train_recall_model(5, setup)
    again_model, again = train_recall_model(5, setup)
    assert first.as_dict() == again.as_dict()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again_model.state_dict().values()))
    _, other = train_recall_model(6, setup)
    assert other.digests[-1] != first.digests[-1]
    assert RunSetup(**first.setup) == setup                               # the history re-creates its setup


def test_a_state_stays_the_same_size_and_a_cache_grows_by_its_keys_and_values():
    delta, softmax = (RecallModelConfig(VOCAB_SIZE, mixers=MODELS[name]) for name in ("delta", "softmax"))
    heads, d, kernel = delta.n_heads, delta.head_dim, delta.conv_kernel
    # The delta rule's state, as gated_delta_rule returns it, per sequence and layer; the convolution keeps K - 1.
    q = F.normalize(torch.randn(1, heads, 30, d), dim=-1)
    _, state = gated_delta_rule(q, q, torch.randn(1, heads, 30, d), -torch.rand(1, heads, 30), torch.rand(1, heads, 30))
    per_layer = state.numel() + (kernel - 1) * 3 * heads * d
    for tokens in (1, 100, 10_000):
        assert decoding_memory(delta, tokens).total_bytes == 2 * per_layer * 4
        assert decoding_memory(delta, tokens).cache_bytes == 0
        cache = decoding_memory(softmax, tokens).cache_bytes
        assert cache == 2 * 2 * heads * d * tokens * 4                   # layers · (K and V) · H · d · N · float32
    assert decoding_memory(softmax, 2000).bytes_per_token < decoding_memory(softmax, 1000).bytes_per_token
    assert decoding_memory(delta, 2000, bytes_per_element=2).bytes_per_token == pytest.approx(2 * per_layer / 1000)


def test_the_cache_has_every_model_rate_and_seed_and_reads_as_a_table():
    runs = trained_runs()
    assert sorted((model_name(run), run["setup"]["learning_rate"], run["seed"]) for run in runs) == sorted(
        (name, rate, seed) for name in MODELS for rate in (1e-2, 3e-2) for seed in (0, 1, 2))
    for run in runs:
        setup = RunSetup(**run["setup"])
        assert run["steps"][-1] == setup.steps and run["pairs"] == list(EVALUATION_PAIRS)
        assert len(run["digests"]) == len(run["accuracy"]) == len(run["steps"])
    table = recall_table(runs)
    assert len(table) == len(MODELS) * len(EVALUATION_PAIRS) and (table["seeds"] == 3).all()
    assert ((table["min"] <= table["mean"]) & (table["mean"] <= table["max"])).all()
    every_rate = recall_table(runs, best_rate=False)
    for (name, rate), rows in every_rate.groupby(["model", "learning_rate"]):
        finals = [accuracy for run in runs if model_name(run) == name and run["setup"]["learning_rate"] == rate
                  for accuracy in run["accuracy"][-1]]
        assert rows["mean"].mean() == pytest.approx(sum(finals) / len(finals))
        chosen = table.loc[table["model"] == name, "learning_rate"].iloc[0]
        best = every_rate[(every_rate["model"] == name) & (every_rate["learning_rate"] == chosen)]["mean"].mean()
        assert rows["mean"].mean() <= best


def test_the_cache_shows_attention_recalling_every_pair_and_the_fixed_states_filling_up():
    table = recall_table().set_index(["model", "pairs"])["mean"]
    for name in ("softmax", "hybrid"):                                    # a softmax layer keeps every pair
        assert (table[name] > 0.99).all(), table[name]
    for name in ("linear", "delta"):                                      # 2 · 16 × 16 numbers per layer
        assert table[name][8] > 0.95 and table[name][64] < 0.6, table[name]
        assert table[name].is_monotonic_decreasing, table[name]                # fuller, worse


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="pairs"):
        recall_batch(KEYS + 1, 2, torch.Generator())
    with pytest.raises(TypeError, match="generator"):
        recall_batch(4, 2, 0)
    with pytest.raises(ValueError, match="batch"):
        recall_batch(4, 0, torch.Generator())
    with pytest.raises(ValueError, match="mixers"):
        RecallModelConfig(VOCAB_SIZE, mixers=("delta", "mamba"))
    with pytest.raises(ValueError, match="kind"):
        TokenMixer("gla", RecallModelConfig(VOCAB_SIZE))
    with pytest.raises(ValueError, match="x must be"):
        TokenMixer("linear", RecallModelConfig(VOCAB_SIZE))(torch.randn(2, 5, 32))
    with pytest.raises(ValueError, match="ids"):
        RecallModel(RecallModelConfig(VOCAB_SIZE))(torch.tensor([[0, VOCAB_SIZE]]))
    with pytest.raises(ValueError, match="record_every"):
        RunSetup(steps=10, record_every=3)
    with pytest.raises(ValueError, match="max_pairs"):
        RunSetup(min_pairs=8, max_pairs=4)
    with pytest.raises(TypeError, match="setup"):
        train_recall_model(0, {"steps": 2})
    with pytest.raises(ValueError, match="tokens"):
        decoding_memory(RecallModelConfig(VOCAB_SIZE), 0)
    with pytest.raises(ValueError, match="runs"):
        recall_table([])
