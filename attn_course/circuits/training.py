"""Training an attention-only model until an induction head forms, measuring it along the way (chapter 11).

The model reads :func:`~attn_course.data.repeated_tokens.placed_repeats`: random tokens holding a segment
said twice, its length and its place drawn per sequence, so the repeat can be found only from the tokens (by
an induction head), not learnt as a distance or a position. Every ``record_every`` steps it is scored on one
fixed evaluation batch of the same kind and on its no-repeat control (the same batch with the first copy
replaced by fresh tokens): every loss and score is recorded on both.

:func:`train_induction_model` is deterministic for a seed on a CPU: the weights come from
``torch.manual_seed(seed)`` (the caller's random state is restored afterwards), the batches from
generators of their own, and training runs on one thread, so sums are always added in the same order.
The history keeps a SHA-256 of the weights at every recorded step, to check whether a rerun matches bit
for bit (it does on the same CPU kernels; another kernel path rounds differently).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course._threads import one_thread
from attn_course.circuits.losses import span_loss
from attn_course.circuits.recording import record_patterns
from attn_course.circuits.scores import duplicate_token_score, induction_score, previous_token_score
from attn_course.data.repeated_tokens import PlacedRepeats, placed_repeats
from attn_course.models.attention_only import AttentionOnlyTransformer
from attn_course.models.training import optimizer_step, warmed_up_adamw

__all__ = ["AttentionOnlySetup", "InductionSetup", "RecordedHistory", "InductionHistory", "train_and_record",
           "train_induction_model", "phase_change_step", "state_digest", "EVALUATION_SEED"]

EVALUATION_SEED = 12345          # the one evaluation batch every seed is scored on


@dataclass(frozen=True)
class AttentionOnlySetup:
    """What both of chapter 11's trainings share: the attention-only model and its schedule (chosen by measuring).

    Attributes:
        n_layers, n_heads, d_model, positions, layer_norm: the
            :class:`~attn_course.models.attention_only.AttentionOnlyTransformer`.
        batch_size: training sequences per step.
        learning_rate: AdamW's, after a linear warm-up of ``warmup_steps``
            (:func:`~attn_course.models.training.warmed_up_adamw`).
        weight_decay: AdamW's.
        evaluation_batch: sequences in the evaluation batch.
    """

    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    positions: str = "learned"
    layer_norm: bool = False
    batch_size: int = 32
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    evaluation_batch: int = 64

    def build_model(self, vocab_size: int, max_len: int) -> AttentionOnlyTransformer:
        """A fresh model of this setup (weights from torch's global random state)."""
        return AttentionOnlyTransformer(vocab_size, n_layers=self.n_layers, n_heads=self.n_heads, d_model=self.d_model,
                                        max_len=max_len, positions=self.positions, layer_norm=self.layer_norm)


@dataclass(frozen=True)
class InductionSetup(AttentionOnlySetup):
    """:func:`train_induction_model`'s setup: :class:`AttentionOnlySetup` and the tokens (defaults: chapter 11's).

    Attributes:
        vocab_size: ``V``.
        length: ``N``, tokens per sequence.
        min_period, max_period: the lengths of the repeated segment (both included, ``2·max_period ≤ N``).
        evaluation_batch: sequences in the evaluation batch (and in its control).
    """

    vocab_size: int = 48
    length: int = 40
    min_period: int = 4
    max_period: int = 20
    evaluation_batch: int = 128

    def repeats(self, batch: int, generator: torch.Generator | None = None) -> PlacedRepeats:
        """``batch`` sequences of this setup's kind (:func:`~attn_course.data.repeated_tokens.placed_repeats`)."""
        return placed_repeats(batch, self.length, self.vocab_size, periods=(self.min_period, self.max_period),
                              generator=generator)

    def evaluation_repeats(self) -> PlacedRepeats:
        """The fixed evaluation batch and its control, the same for every seed."""
        return self.repeats(self.evaluation_batch, torch.Generator().manual_seed(EVALUATION_SEED))


@dataclass
class RecordedHistory:
    """What :func:`train_and_record` keeps at every recorded step (JSON-ready lists); each training adds its own.

    Attributes:
        seed, setup: how the run was made (``setup`` as a dict of its setup's fields).
        steps: optimiser steps taken at each record (0: before the first).
        repeated_loss: mean loss of the predictable tokens of a repeat (nats).
        induction_scores, previous_token_scores: ``[layer][head]`` at each record
            (:mod:`~attn_course.circuits.scores`), means over the evaluation batch.
        train_loss: the mean training-batch loss over the steps since the previous record (None at step 0).
        digests: SHA-256 of the weights at each record (:func:`state_digest`).
    """

    seed: int
    setup: dict
    steps: list[int] = field(default_factory=list)
    repeated_loss: list[float] = field(default_factory=list)
    induction_scores: list[list[list[float]]] = field(default_factory=list)
    previous_token_scores: list[list[list[float]]] = field(default_factory=list)
    train_loss: list[float | None] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """Plain dict for JSON (``type(history)(**d)`` rebuilds it)."""
        return dataclasses.asdict(self)


@dataclass
class InductionHistory(RecordedHistory):
    """What :func:`train_induction_model` measured on the evaluation batch: :class:`RecordedHistory`'s lists
    (``repeated_loss``: the :attr:`~attn_course.data.repeated_tokens.PlacedRepeats.predictable` tokens; the scores
    over the second copy, each sequence at its own period), and the same on the no-repeat control.

    Attributes:
        duplicate_token_scores: ``[layer][head]`` at each record, as the other scores.
        control_loss: the loss of the same tokens in the control, where nothing earlier repeats them.
        control_induction_scores, control_duplicate_token_scores, control_previous_token_scores: the scores
            read at the same queries and keys of the control.
    """

    duplicate_token_scores: list[list[list[float]]] = field(default_factory=list)
    control_loss: list[float] = field(default_factory=list)
    control_induction_scores: list[list[list[float]]] = field(default_factory=list)
    control_duplicate_token_scores: list[list[list[float]]] = field(default_factory=list)
    control_previous_token_scores: list[list[list[float]]] = field(default_factory=list)


def state_digest(model: torch.nn.Module) -> str:
    """SHA-256 (hex) of every parameter's bytes, in ``state_dict`` order: equal digests, equal weights bit for bit."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _measure(model: AttentionOnlyTransformer, batch: PlacedRepeats) -> dict:
    """The evaluation batch's and its control's losses and every head's scores."""
    measured = {}
    for prefix, tokens in (("", batch.tokens), ("control_", batch.control)):
        patterns = record_patterns(model, tokens)                                # {layer: [B, H, N, N]}
        loss = span_loss(model, tokens, batch.predictable)
        measured["repeated_loss" if not prefix else "control_loss"] = loss
        for name, score in (("induction_scores", induction_score), ("duplicate_token_scores", duplicate_token_score)):
            measured[prefix + name] = [score(p, batch.periods, batch.second_copy).mean(0).tolist()
                                       for p in patterns.values()]
        measured[prefix + "previous_token_scores"] = [previous_token_score(p).mean(0).tolist()
                                                      for p in patterns.values()]
    return measured


def train_and_record(seed: int, steps: int, record_every: int, setup: AttentionOnlySetup, history: RecordedHistory,
                     *, build_model: Callable[[], torch.nn.Module],
                     batch_loss: Callable[[torch.nn.Module, torch.Generator], torch.Tensor],
                     measure: Callable[[torch.nn.Module], dict], caller: str = "train_and_record") -> torch.nn.Module:
    """The loop of chapter 11's trainings: deterministic for a seed on a CPU, measured as it goes.

    On one thread, with the caller's random state restored afterwards: ``torch.manual_seed(seed)``, the model
    from ``build_model()``, its batches from a generator of their own; AdamW with ``setup``'s warm-up
    (:func:`~attn_course.models.training.warmed_up_adamw`), gradients clipped to norm 1. Before the first
    step, every ``record_every`` steps and after the last, ``measure(model)``'s values are appended to the
    history's lists of those names, with the step, the mean training loss since the last record and the
    weights' :func:`state_digest`.

    Args:
        seed: the weights' and the batches' seed (an int ≥ 0).
        steps: optimiser steps, at least 1.
        record_every: at least 1.
        setup: the schedule.
        history: filled in place.
        build_model: the model, from torch's (seeded) global random state.
        batch_loss: ``(model, generator) -> loss`` of one training batch drawn from ``generator``.
        measure: ``model -> {history field: value}``.
        caller: the name the errors give.

    Returns:
        The trained model, in eval mode.

    Raises:
        TypeError, ValueError: ``seed`` below 0, ``steps`` or ``record_every`` below 1, a ``setup`` or
            ``history`` of another kind.
    """
    seed = _validate.integer(caller, "seed", seed, minimum=0)
    steps = _validate.integer(caller, "steps", steps, minimum=1)
    record_every = _validate.integer(caller, "record_every", record_every, minimum=1)
    for name, value, kind in (("setup", setup, AttentionOnlySetup), ("history", history, RecordedHistory)):
        if not isinstance(value, kind):
            raise TypeError(f"{caller}: {name} must be a {kind.__name__}, got {type(value).__name__}")
    with one_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model()
        batches = torch.Generator().manual_seed(seed + 1_000_003)
        optimizer, schedule = warmed_up_adamw(model, setup.learning_rate, weight_decay=setup.weight_decay,
                                              warmup_steps=setup.warmup_steps)
        since_record: list[float] = []

        def keep(step: int) -> None:
            for name, value in measure(model).items():
                getattr(history, name).append(value)
            history.steps.append(step)
            history.train_loss.append(sum(since_record) / len(since_record) if since_record else None)
            history.digests.append(state_digest(model))
            since_record.clear()

        keep(0)
        model.train()
        for step in range(1, steps + 1):
            since_record.append(optimizer_step(batch_loss(model, batches), model, optimizer, schedule))
            if step % record_every == 0 or step == steps:
                keep(step)
    return model.eval()


def train_induction_model(seed: int, steps: int = 2000, *, setup: InductionSetup | None = None,
                          record_every: int = 25) -> tuple[AttentionOnlyTransformer, InductionHistory]:
    """Train a two-layer attention-only model on random tokens with a repeat, scoring it every ``record_every`` steps.

    Args:
        seed: the weights' and the batches' seed (an int ≥ 0).
        steps: optimiser steps (AdamW, gradients clipped to norm 1), at least 1.
        setup: sizes and schedule (default :class:`InductionSetup`'s).
        record_every: score the model after every this many steps (and before the first, and after the last).

    Returns:
        ``(model, history)``: the trained model (eval mode) and an :class:`InductionHistory`.

    Raises:
        TypeError: ints of the wrong kind, a ``setup`` of another kind.
        ValueError: ``seed`` below 0, ``steps`` or ``record_every`` below 1.

    Example:
        >>> model, history = train_induction_model(0, steps=4, record_every=2)
        >>> history.steps, len(history.induction_scores[0]), len(history.control_induction_scores[0][1])
        ([0, 2, 4], 2, 4)
    """
    setup = InductionSetup() if setup is None else setup
    if not isinstance(setup, InductionSetup):
        raise TypeError(f"train_induction_model: setup must be an InductionSetup or None, got {type(setup).__name__}")
    evaluation = setup.evaluation_repeats()

    def batch_loss(model: torch.nn.Module, batches: torch.Generator) -> torch.Tensor:
        tokens = setup.repeats(setup.batch_size, batches).tokens                # [B, N]
        logits = model(tokens)                                                   # [B, N, V]
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())

    history = InductionHistory(seed=seed, setup=dataclasses.asdict(setup))
    model = train_and_record(seed, steps, record_every, setup, history,
                             build_model=lambda: setup.build_model(setup.vocab_size, setup.length),
                             batch_loss=batch_loss, measure=lambda model: _measure(model, evaluation),
                             caller="train_induction_model")
    return model, history


def phase_change_step(history: InductionHistory | dict, *, threshold: float = 0.3, layer: int = 1) -> int | None:
    """The first recorded step at which some head of ``layer`` has an induction score of at least ``threshold``.

    Args:
        history: an :class:`InductionHistory` (or its dict).
        threshold: in ``(0, 1)``. 0.3 is several times what uniform causal attention gives on chapter 11's
            evaluation batch (its control's scores, about 0.06) and, in the runs measured, is crossed in the
            middle of the loss drop.
        layer: whose heads (default 1, where induction heads sit in a two-layer model).

    Returns:
        the step, or None if no head of ``layer`` ever reached ``threshold``.

    Raises:
        TypeError: a history of another kind, a non-number threshold.
        ValueError: ``threshold`` outside ``(0, 1)``, a layer the history does not have.
    """
    where = "phase_change_step"
    if isinstance(history, InductionHistory):
        history = history.as_dict()
    if not isinstance(history, dict) or "induction_scores" not in history:
        raise TypeError(f"{where}: history must be an InductionHistory or its dict, got {type(history).__name__}")
    threshold = _validate.positive_finite(where, "threshold", threshold)
    if threshold >= 1:
        raise ValueError(f"{where}: threshold must be in (0, 1), got {threshold}")
    layer = _validate.integer(where, "layer", layer, minimum=0)
    layers = len(history["induction_scores"][0])
    if layer >= layers:
        raise ValueError(f"{where}: layer must be in 0 .. {layers - 1}, got {layer}")
    for step, scores in zip(history["steps"], history["induction_scores"]):
        if max(scores[layer]) >= threshold:
            return step
    return None
