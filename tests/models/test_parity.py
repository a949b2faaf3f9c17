"""attention_layer_errors catches each layer's own input and finds a converter's mistake."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from attn_course.models.hugging_face import parity  # noqa: E402


@pytest.mark.parametrize("model_type", sorted(parity.SMALL_MODELS))
def test_every_layer_of_every_small_model_matches(model_type):
    """What chapter 12's table shows (its numbers are round-off, and vary with the CPU's kernels)."""
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    errors = parity.attention_layer_errors(parity.small_random_model(model_type), ids)
    assert errors and max(error for _, error in errors) < 1e-5


def test_a_wrong_layer_is_seen(monkeypatch):
    ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(0))
    model = parity.small_random_model("gemma3_text")
    errors = parity.attention_layer_errors(model, ids)
    assert [kind for kind, _ in errors] == model.config.layer_types and max(e for _, e in errors) < 1e-5
    converted = parity.convert_layer

    def without_its_window(module, config):                       # a converter that forgets the window
        layer = converted(module, config)
        object.__setattr__(layer.config, "window", None)
        return layer

    monkeypatch.setattr(parity, "convert_layer", without_its_window)
    errors = dict(enumerate(e for _, e in parity.attention_layer_errors(model, ids)))
    assert errors[0] > 1e-3 and errors[3] < 1e-5                  # sliding layers differ, the full one does not


def test_unknown_models_and_bad_ids_are_named():
    with pytest.raises(ValueError, match="model_type"):
        parity.small_random_model("llama4")
    with pytest.raises(ValueError, match="input_ids"):
        parity.attention_layer_errors(parity.small_random_model("qwen3"), torch.tensor([[64]]))
