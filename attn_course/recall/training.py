"""Training a :class:`~attn_course.recall.models.RecallModel` on MQAR and scoring its recall.

Each step draws a batch with ``P`` pairs, ``P`` uniform in ``min_pairs .. max_pairs`` (a new ``P`` every step,
as Zoology trains on several), and the loss is the cross-entropy of the answers only (the query positions).
The default trains on 4 to 16 pairs (sequences of 12 to 48 tokens: a run takes seconds on a CPU) and scores up
to 64: beyond 16 every model meets more pairs than it was trained on, and the recurrent ones more than their
state of ``H`` matrices ``d × d`` can hold apart (2 · 16 keys of 16 dimensions), while softmax attention, with
the same layers otherwise, shows how much of the drop the longer sequences alone would explain.
Every ``record_every`` steps the model is scored on fixed evaluation batches, :data:`EVALUATION_BATCH`
sequences for each ``P`` of :data:`EVALUATION_PAIRS` (seed :data:`EVALUATION_SEED`, the same for every run):
``accuracy`` is the share of answers whose largest logit is the right value.

Training is AdamW (β = 0.9, 0.95, no weight decay) with a linear warm-up and a cosine decay to zero, on one
thread, with the weights from ``torch.manual_seed(seed)`` (the caller's random state is restored) and batches
from a generator of its own: a seed gives the same history, bit for bit, on the same CPU kernels; ``digests``
holds a SHA-256 of the weights at every record to check it.
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
from attn_course.recall.models import RecallModel, RecallModelConfig
from attn_course.recall.tasks import KEYS, VOCAB_SIZE, RecallBatch, recall_batch

__all__ = ["MODELS", "EVALUATION_PAIRS", "EVALUATION_BATCH", "EVALUATION_SEED", "RunSetup", "RunHistory",
           "evaluation_batches", "recall_accuracy", "train_recall_model"]

#: The models the chapter compares: each layer's mixer. Two layers, so the hybrid is one delta-rule layer under
#: one softmax layer (Qwen3-Next's three-to-one at its smallest: the softmax layer last, where the lookup is).
MODELS = {"softmax": ("softmax", "softmax"), "linear": ("linear", "linear"), "delta": ("delta", "delta"),
          "hybrid": ("delta", "softmax")}
EVALUATION_PAIRS = (4, 8, 16, 32, 48, 64)
EVALUATION_BATCH = 64
EVALUATION_SEED = 999


@dataclass(frozen=True)
class RunSetup:
    """One training run: the model, the schedule, the pairs per sequence.

    Attributes:
        mixers: each layer's mixer (:data:`~attn_course.recall.models.MIXERS`), e.g. a value of :data:`MODELS`.
        learning_rate: AdamW's peak rate, reached after ``warmup_steps`` (linear), then a cosine down to 0.
        steps: optimiser steps; ``record_every`` divides it.
        batch_size: sequences per step.
        min_pairs, max_pairs: the range ``P`` is drawn from, every step.
        d_model, n_heads, head_dim, conv_kernel: the model's sizes (:class:`RecallModelConfig`).

    Raises:
        TypeError, ValueError: a field of the wrong type or out of range (named).
    """

    mixers: tuple[str, ...] = ("delta", "delta")
    learning_rate: float = 1e-2
    steps: int = 600
    record_every: int = 200
    warmup_steps: int = 30
    batch_size: int = 32
    min_pairs: int = 4
    max_pairs: int = 16
    d_model: int = 64
    n_heads: int = 2
    head_dim: int = 16
    conv_kernel: int = 4

    def __post_init__(self) -> None:
        where = "RunSetup"
        _validate.positive_finite(where, "learning_rate", self.learning_rate)
        steps, every = _validate.integers(where, minimum=1, steps=self.steps, record_every=self.record_every,
                                          batch_size=self.batch_size, min_pairs=self.min_pairs)[:2]
        _validate.integers(where, minimum=0, warmup_steps=self.warmup_steps)
        if steps % every:
            raise ValueError(f"{where}: record_every={every} must divide steps={steps}")
        _validate.integer(where, "max_pairs", self.max_pairs, minimum=self.min_pairs)
        if self.max_pairs > KEYS:
            raise ValueError(f"{where}: max_pairs must be at most KEYS={KEYS}, got {self.max_pairs}")
        object.__setattr__(self, "mixers", self.model_config().mixers)    # checked there; a list kept as a tuple

    def model_config(self) -> RecallModelConfig:
        return RecallModelConfig(VOCAB_SIZE, tuple(self.mixers), self.d_model, self.n_heads, self.head_dim,
                                 self.conv_kernel)


@dataclass
class RunHistory:
    """What :func:`train_recall_model` recorded at each of ``steps``.

    Attributes:
        seed: the run's seed; setup: its :class:`RunSetup` as a dict.
        steps: the steps recorded (0 and every ``record_every``).
        loss: the training loss, averaged over the steps since the record before (the first: at step 0).
        accuracy: per record, the accuracy at each ``P`` of ``pairs``.
        pairs: :data:`EVALUATION_PAIRS`.
        digests: a SHA-256 of the weights at each record.
    """

    seed: int
    setup: dict
    pairs: list[int] = field(default_factory=lambda: list(EVALUATION_PAIRS))
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    accuracy: list[list[float]] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def evaluation_batches(pairs: tuple[int, ...] = EVALUATION_PAIRS, batch: int = EVALUATION_BATCH,
                       seed: int = EVALUATION_SEED) -> list[RecallBatch]:
    """The fixed batches every run is scored on: ``batch`` sequences for each ``P`` of ``pairs``, from ``seed``.

    Raises:
        TypeError, ValueError: ``pairs`` not a non-empty sequence of ints in ``1 .. KEYS``, a bad ``batch``
            or ``seed``.

    Example:
        >>> [b.inputs.shape[1] for b in evaluation_batches((4, 64), batch=2)]
        [12, 160]
    """
    where = "evaluation_batches"
    pairs = _validate.integer_sequence(where, "pairs", pairs, minimum=1, nonempty=True)
    batch = _validate.integer(where, "batch", batch, minimum=1)
    generator = torch.Generator().manual_seed(_validate.integer(where, "seed", seed, minimum=0))
    return [recall_batch(p, batch, generator) for p in pairs]


@torch.no_grad()
def recall_accuracy(model: RecallModel, batch: RecallBatch) -> float:
    """The share of ``batch``'s answers (its query positions) whose largest logit is the right value.

    Raises:
        TypeError: ``model`` not a :class:`RecallModel`, ``batch`` not a :class:`RecallBatch`.

    Example:
        >>> model = RecallModel(RecallModelConfig(VOCAB_SIZE))
        >>> 0.0 <= recall_accuracy(model, recall_batch(4, 2, torch.Generator().manual_seed(0))) <= 1.0
        True
    """
    _validate.instance("recall_accuracy", "model", model, RecallModel)
    _validate.instance("recall_accuracy", "batch", batch, RecallBatch)
    predicted = model(batch.inputs).argmax(-1)                                     # [B, N]
    return (predicted == batch.targets)[batch.queries].float().mean().item()


def _learning_rate(setup: RunSetup, step: int) -> float:
    """Linear warm-up to the peak over ``warmup_steps``, then a cosine down to 0 at ``steps``."""
    if step < setup.warmup_steps:
        return setup.learning_rate * (step + 1) / setup.warmup_steps
    progress = (step - setup.warmup_steps) / max(1, setup.steps - setup.warmup_steps)
    return setup.learning_rate * 0.5 * (1 + math.cos(math.pi * progress))


@one_thread()
def train_recall_model(seed: int, setup: RunSetup | None = None) -> tuple[RecallModel, RunHistory]:
    """Train a :class:`RecallModel` on MQAR from ``seed``, scoring its recall every ``record_every`` steps.

    Args:
        seed: the weights' seed (``torch.manual_seed``) and the training batches' (a generator of its own).
        setup: the :class:`RunSetup`; default ``RunSetup()``.

    Returns:
        ``(model, history)``: the trained model in eval mode and its :class:`RunHistory`.

    Raises:
        TypeError, ValueError: ``seed`` not an int >= 0, ``setup`` not a :class:`RunSetup`.

    Example:
        >>> model, history = train_recall_model(0, RunSetup(steps=2, record_every=2, batch_size=2, max_pairs=4))
        >>> history.steps, len(history.accuracy[-1]) == len(EVALUATION_PAIRS)
        ([0, 2], True)
    """
    seed = _validate.integer("train_recall_model", "seed", seed, minimum=0)
    setup = _validate.instance("train_recall_model", "setup", setup or RunSetup(), RunSetup)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = RecallModel(setup.model_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.learning_rate, betas=(0.9, 0.95), weight_decay=0.0)
    batches = torch.Generator().manual_seed(seed)
    evaluation = evaluation_batches()
    history = RunHistory(seed, dataclasses.asdict(setup))
    losses: list[float] = []
    for step in range(setup.steps + 1):
        if step % setup.record_every == 0:
            model.eval()
            history.steps.append(step)
            history.accuracy.append([recall_accuracy(model, batch) for batch in evaluation])
            if step == 0:
                with torch.no_grad():
                    batch = evaluation[0]
                    losses = [F.cross_entropy(model(batch.inputs).flatten(0, 1), batch.targets.flatten()).item()]
            history.loss.append(sum(losses) / len(losses))
            history.digests.append(state_digest(model))
            model.train()
            losses = []
        if step == setup.steps:
            break
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(setup, step)
        pairs = int(torch.randint(setup.min_pairs, setup.max_pairs + 1, (), generator=batches))
        batch = recall_batch(pairs, setup.batch_size, batches)
        loss = F.cross_entropy(model(batch.inputs).flatten(0, 1), batch.targets.flatten())   # ignores -100
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model.eval(), history
