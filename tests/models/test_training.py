"""The parts every training loop shares (models/training.py): the best weights kept, one step, AdamW's schedule."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attn_course.models.training import BestWeights, optimizer_step, warmed_up_adamw


def test_the_weights_of_the_lowest_loss_are_restored_not_the_last():
    model, best = nn.Linear(3, 2), BestWeights()
    best.record(0, 2.0, model)
    with torch.no_grad():
        model.weight.fill_(1.0)
    kept = model.weight.detach().clone()
    assert best.record(5, 1.0, model)
    with torch.no_grad():
        model.weight.fill_(7.0)
    assert not best.record(10, 1.0, model)                       # a tie is no improvement
    assert not best.record(15, math.nan, model)                  # nor a NaN
    best.restore(model)
    assert torch.equal(model.weight, kept)
    assert (best.steps, best.best_step, best.scorings_since_best) == ([0, 5, 10, 15], 5, 2)


def test_restoring_before_any_record_leaves_the_model_as_it_is():
    model, best = nn.Linear(2, 2), BestWeights()
    before = model.weight.detach().clone()
    best.restore(model)
    assert torch.equal(model.weight, before) and best.best_step is None and best.scorings_since_best == 0
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got dict"):
        best.record(0, 1.0, {})


def test_a_clipped_step_moves_the_weights_by_the_gradient_scaled_to_the_norm():
    torch.manual_seed(0)
    model = nn.Linear(4, 1, bias=False)
    x = torch.randn(8, 4)
    before = model.weight.detach().double().clone()
    gradient = 10 * x.double().sum(0, keepdim=True)                 # d/dw of 10 · Σ_n w·x_n, [1, 4]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    loss = 10 * model(x).sum()
    value = loss.item()
    assert optimizer_step(loss, model, optimizer, schedule, max_norm=0.5) == value
    expected = before - gradient * (0.5 / gradient.norm())
    assert torch.allclose(model.weight.double(), expected, atol=1e-6)
    with pytest.raises(ValueError, match="loss must be a scalar"):
        optimizer_step(model(x), model, optimizer, schedule)


def test_without_max_norm_the_step_follows_the_whole_gradient():
    torch.manual_seed(0)
    model = nn.Linear(4, 1, bias=False)
    x = torch.randn(8, 4)
    before = model.weight.detach().double().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    optimizer_step(10 * model(x).sum(), model, optimizer, max_norm=None)
    expected = before - 0.01 * 10 * x.double().sum(0, keepdim=True)
    assert torch.allclose(model.weight.double(), expected, atol=1e-6)


@pytest.mark.parametrize("warmup, decay", [(0, None), (5, None), (0, 20), (4, 20)])
def test_the_learning_rate_ramps_up_then_stays_or_follows_a_cosine(warmup, decay):
    model = nn.Linear(2, 1)
    optimizer, schedule = warmed_up_adamw(model, 0.1, weight_decay=0.0, warmup_steps=warmup, decay_steps=decay)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["weight_decay"] == 0.0
    for step in range(25):
        ramp = (step + 1) / warmup if warmup and step < warmup else 1.0
        cosine = 1.0 if decay is None else (1 + math.cos(math.pi * step / decay)) / 2
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * min(ramp, cosine), abs=1e-12), step
        optimizer.step()
        schedule.step()
    with pytest.raises(TypeError, match="^warmed_up_adamw: model must be a torch.nn.Module"):
        warmed_up_adamw({}, 0.1)
    with pytest.raises(ValueError, match="^warmed_up_adamw: decay_steps must be >= 1"):
        warmed_up_adamw(model, 0.1, decay_steps=0)
