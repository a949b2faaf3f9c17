"""Training a :class:`~attn_course.open_models.small_decoder.SmallDecoder` and measuring what its attention does.

Every ``record_every`` steps the model is scored on one fixed evaluation batch of its task (128 sequences,
seed :data:`EVALUATION_SEED`) and the history records, per layer:

- ``largest_logit``: the largest score ``q·k · scale`` of any head at any query: the logit growth that
  QK-norm is meant to stop (Dehghani et al. 2023; Wortsman et al. 2023);
- ``first_token_mass``: per head, the mean attention weight on the start token over the idle queries
  (:class:`~attn_course.open_models.tasks.StartTokenBatch`): an attention sink;
- ``sink_share``: per head, the mean share of the denominator the learned sink takes, ``1 − Σ_j p_ij`` (0
  without sinks);
- ``largest_activation``: the largest ``|x|`` in the residual stream after the layer (Sun et al. 2024's
  "massive activations").

Training is AdamW (β = 0.9, 0.95, no weight decay, no gradient clipping: what is measured is what the
learning rate does unchecked) after a linear warm-up, on one thread, with the weights from
``torch.manual_seed(seed)`` (the caller's random state is restored) and batches from a generator of its
own: a seed gives the same history, bit for bit, on the same CPU kernels; ``digests`` holds a SHA-256 of
the weights at every record to check it. A run whose loss is no longer finite stops there (``diverged``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course._reproducible import state_digest
from attn_course._threads import one_thread
from attn_course.open_models.small_decoder import SmallDecoder, SmallDecoderConfig
from attn_course.open_models.tasks import TASKS, StartTokenBatch, start_token_batch, vocab_size

__all__ = ["EVALUATION_SEED", "RunSetup", "RunHistory", "measure", "train_small_decoder"]

EVALUATION_SEED = 999


@dataclass(frozen=True)
class RunSetup:
    """One training run: the task, the model's switches, the schedule.

    Attributes:
        task: a key of :data:`~attn_course.open_models.tasks.TASKS`.
        learning_rate: AdamW's peak rate, reached after ``warmup_steps`` (linear ramp).
        steps: optimiser steps; ``record_every`` divides it.
        qk_norm, sinks, output_gate: the attention's switches (:class:`SmallDecoderConfig`).
        n_layers, d_model, n_heads: the model's sizes.
        batch_size: sequences per step.
    """

    task: str = "rhymes"
    learning_rate: float = 3e-3
    steps: int = 600
    record_every: int = 50
    warmup_steps: int = 0
    qk_norm: bool = False
    sinks: bool = False
    output_gate: bool = False
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    batch_size: int = 16

    def __post_init__(self) -> None:
        where = "RunSetup"
        if self.task not in TASKS:
            raise ValueError(f"{where}: task must be one of {', '.join(map(repr, TASKS))}, got {self.task!r}")
        _validate.positive_finite(where, "learning_rate", self.learning_rate)
        steps, every = _validate.integers(where, minimum=1, steps=self.steps, record_every=self.record_every)
        _validate.integers(where, minimum=0, warmup_steps=self.warmup_steps)
        if steps % every:
            raise ValueError(f"{where}: record_every={every} must divide steps={steps}")

    def model_config(self) -> SmallDecoderConfig:
        return SmallDecoderConfig(vocab_size(self.task), self.d_model, self.n_layers, self.n_heads,
                                  qk_norm=self.qk_norm, sinks=self.sinks, output_gate=self.output_gate)


@dataclass
class RunHistory:
    """What :func:`train_small_decoder` recorded at each of ``steps`` (lists over layers, then heads)."""

    seed: int
    setup: dict
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    largest_logit: list[list[float]] = field(default_factory=list)
    first_token_mass: list[list[list[float]]] = field(default_factory=list)
    sink_share: list[list[list[float]]] = field(default_factory=list)
    largest_activation: list[list[float]] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    diverged: bool = False

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@torch.no_grad()
def measure(model: SmallDecoder, batch: StartTokenBatch) -> dict:
    """The loss and every per-layer measure of the module docstring, on ``batch``."""
    logits, recording = model(batch.inputs, record=True)
    idle = batch.idle                                                              # [B, N]
    per_head = lambda values: (values * idle[:, None]).sum((0, 2)) / idle.sum()   # noqa: E731  [B, H, N] -> [H]
    return {
        "loss": F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten()).item(),
        "largest_logit": [scores.amax().item() for scores in recording.logits],
        "first_token_mass": [per_head(weights[..., 0]).tolist() for weights in recording.weights],
        "sink_share": [per_head(1 - weights.sum(-1)).tolist() for weights in recording.weights],
        "largest_activation": [residual.abs().amax().item() for residual in recording.residuals],
    }


@one_thread()
def train_small_decoder(seed: int, setup: RunSetup | None = None) -> tuple[SmallDecoder, RunHistory]:
    """Train a :class:`SmallDecoder` on ``setup.task`` from ``seed``, measuring it every ``record_every`` steps.

    Raises:
        TypeError, ValueError: ``seed`` not an int >= 0, ``setup`` not a :class:`RunSetup`.

    Example:
        >>> model, history = train_small_decoder(0, RunSetup(steps=4, record_every=2))
        >>> history.steps, len(history.largest_logit[0]), len(history.first_token_mass[0][0])
        ([0, 2, 4], 2, 4)
    """
    seed = _validate.integer("train_small_decoder", "seed", seed, minimum=0)
    setup = _validate.instance("train_small_decoder", "setup", setup or RunSetup(), RunSetup)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SmallDecoder(setup.model_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.learning_rate, betas=(0.9, 0.95), weight_decay=0.0)
    batches = torch.Generator().manual_seed(seed)
    evaluation = start_token_batch(setup.task, 128, torch.Generator().manual_seed(EVALUATION_SEED))
    history = RunHistory(seed, dataclasses.asdict(setup))
    for step in range(setup.steps + 1):
        if step % setup.record_every == 0:
            model.eval()
            measured = measure(model, evaluation)
            history.steps.append(step)
            for name, value in measured.items():
                getattr(history, name).append(value)
            history.digests.append(state_digest(model))
            model.train()
            if not math.isfinite(measured["loss"]):
                history.diverged = True
                break
        if step == setup.steps:
            break
        for group in optimizer.param_groups:
            group["lr"] = setup.learning_rate * min(1.0, (step + 1) / max(1, setup.warmup_steps))
        batch = start_token_batch(setup.task, setup.batch_size, batches)
        loss = F.cross_entropy(model(batch.inputs).flatten(0, 1), batch.targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return model.eval(), history
