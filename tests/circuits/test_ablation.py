"""ablate_head and patch_head: removing the hook restores the exact output; effects match independent recomputations."""

from __future__ import annotations

import copy

import pytest
import torch
from circuits_reference import reference_forward

from attn_course.circuits import ablate_head, loss_from_logits, patch_head, record_head_outputs
from attn_course.models.attention_only import AttentionOnlyTransformer


@pytest.fixture
def model() -> AttentionOnlyTransformer:
    torch.manual_seed(3)
    return AttentionOnlyTransformer(13, n_layers=2, n_heads=3, d_model=12, max_len=8).eval()


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(13, (4, 8), generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("kind", ["zero", "mean"])
def test_leaving_the_block_restores_the_outputs_bit_for_bit(model, tokens, kind):
    with torch.no_grad():
        before = model(tokens)
        mean_over = tokens if kind == "mean" else None
        with ablate_head(model, 0, 1, kind, mean_over=mean_over):
            during = model(tokens)
        after = model(tokens)
    assert not torch.equal(during, before)
    assert torch.equal(after, before)
    assert all(not layer.hook_result._forward_hooks for layer in model.layers)


def test_the_hook_is_removed_even_when_the_block_raises(model, tokens):
    before = model(tokens)
    with pytest.raises(RuntimeError, match="inside"):
        with ablate_head(model, 1, 2):
            raise RuntimeError("inside")
    assert torch.equal(model(tokens), before)


def test_zero_ablation_equals_a_float64_model_without_that_head(model, tokens):
    with torch.no_grad(), ablate_head(model, 0, 2):
        ablated = model(tokens)
    reference = reference_forward(model, tokens, zero_heads=((0, 2),))["logits"]
    torch.testing.assert_close(ablated.double(), reference, atol=2e-5, rtol=1e-5)


def test_zero_ablation_equals_zeroing_the_heads_output_weights(model, tokens):
    """An independent way to silence a head: its columns of out_proj set to zero in a copy of the model."""
    silenced = copy.deepcopy(model)
    with torch.no_grad():
        silenced.layers[1].attention.out_proj.weight[:, 4:8] = 0.0        # head 1 of 3, d = 4
        expected = silenced(tokens)
        with ablate_head(model, 1, 1):
            ablated = model(tokens)
    torch.testing.assert_close(ablated, expected, atol=1e-6, rtol=1e-6)


def test_mean_ablation_writes_the_heads_mean_output_at_every_position(model, tokens):
    others = torch.randint(13, (6, 8), generator=torch.Generator().manual_seed(5))
    mean = record_head_outputs(model, others)[0][:, 1].double().mean(0)   # [N, E]
    reference = reference_forward(model, tokens)
    with torch.no_grad(), ablate_head(model, 0, 1, "mean", mean_over=others):
        recorded = record_head_outputs(model, tokens)
    torch.testing.assert_close(recorded[0][:, 1].double(), mean.expand(4, 8, 12), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(recorded[0][:, 0].double(), reference["results"][0][:, 0], atol=1e-6, rtol=1e-5)


def test_mean_ablation_over_the_same_single_sequence_changes_nothing(model, tokens):
    one = tokens[:1]
    with torch.no_grad():
        before = model(one)
        with ablate_head(model, 1, 0, "mean", mean_over=one):
            during = model(one)
    torch.testing.assert_close(during, before, atol=1e-6, rtol=1e-6)


def test_mean_ablation_refuses_a_run_longer_than_its_mean(model, tokens):
    with ablate_head(model, 0, 0, "mean", mean_over=tokens[:, :5]):
        model(tokens[:, :5])
        with pytest.raises(ValueError, match="longer than mean_over"):
            model(tokens)


def test_patching_the_last_layers_head_adds_its_clean_minus_corrupted_output_through_the_unembedding(model, tokens):
    """Layer 1 is the last: its head's output reaches the logits linearly, through W_U alone."""
    corrupted = torch.randint(13, (4, 8), generator=torch.Generator().manual_seed(6))
    result = patch_head(model, 1, 2, tokens, corrupted)
    clean_head = record_head_outputs(model, tokens)[1][:, 2]                # [B, N, E]
    corrupted_head = record_head_outputs(model, corrupted)[1][:, 2]
    with torch.no_grad():
        expected = model(corrupted) + (clean_head - corrupted_head) @ model.W_U
    torch.testing.assert_close(result.logits, expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert result.clean_loss == pytest.approx(loss_from_logits(model(tokens), tokens).item())
        assert result.corrupted_loss == pytest.approx(loss_from_logits(model(corrupted), tokens).item())
    assert result.patched_loss == pytest.approx(loss_from_logits(expected, tokens).item(), rel=1e-5)


def test_patching_a_head_from_an_identical_run_changes_nothing_and_positions_limit_the_patch(model, tokens):
    same = patch_head(model, 0, 1, tokens, tokens)
    with torch.no_grad():
        torch.testing.assert_close(same.logits, model(tokens), atol=1e-6, rtol=1e-6)
    corrupted = torch.randint(13, (4, 8), generator=torch.Generator().manual_seed(7))
    late = patch_head(model, 0, 1, tokens, corrupted, positions=slice(5, None))
    with torch.no_grad():
        unpatched = model(corrupted)
    torch.testing.assert_close(late.logits[:, :5], unpatched[:, :5])   # causal: earlier positions untouched
    assert not torch.allclose(late.logits[:, 5:], unpatched[:, 5:])


@pytest.mark.parametrize("call, error, words", [
    (lambda m, t: ablate_head(m, 2, 0).__enter__(), ValueError, "layer"),
    (lambda m, t: ablate_head(m, 0, 3).__enter__(), ValueError,
     r"\(layer, head\) must be in 0 .. 1 and 0 .. 2, got \(0, 3\)"),
    (lambda m, t: ablate_head(m, 0, 0, "random").__enter__(), ValueError, "kind"),
    (lambda m, t: ablate_head(m, 0, 0, "mean").__enter__(), ValueError, "mean_over"),
    (lambda m, t: ablate_head(m, 0, 0, "zero", mean_over=t).__enter__(), ValueError, "only used with kind='mean'"),
    (lambda m, t: ablate_head(torch.nn.Linear(2, 2), 0, 0).__enter__(), TypeError, "AttentionOnlyTransformer"),
    (lambda m, t: patch_head(m, 0, 0, t, t[:, :5]), ValueError, "one shape"),
    (lambda m, t: patch_head(m, 0, 0, t, t, span=(0, 3)), ValueError, "span"),
    (lambda m, t: patch_head(m, 0, 0, t, t, positions=3), TypeError, "slice"),
    (lambda m, t: patch_head(m, 0, 0, t.float(), t), TypeError, "integer"),
])
def test_bad_arguments_are_refused_by_name(model, tokens, call, error, words):
    with pytest.raises(error, match=words):
        call(model, tokens)
