"""Training an attention-only model until an induction head forms, measuring it along the way (chapter 11).

The model reads :func:`~attn_course.data.repeated_tokens.repeated_segment_tokens`: random tokens ending in a
segment said twice, its length drawn per sequence, so the repeat can be found only from the tokens (by an
induction head), not learnt as a fixed offset. Every ``record_every`` steps it is scored on one fixed
evaluation batch of :func:`~attn_course.data.repeated_tokens.repeated_random_tokens` (period
``L = half_length``, ``N = 2L``).

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
from attn_course.circuits.losses import first_half_span, repeated_span, token_losses
from attn_course.circuits.recording import record_patterns
from attn_course.circuits.scores import duplicate_token_score, induction_score, previous_token_score
from attn_course.data.repeated_tokens import repeated_random_tokens, repeated_segment_tokens
from attn_course.models.attention_only import AttentionOnlyTransformer
from attn_course.models.training import optimizer_step, warmed_up_adamw

__all__ = ["AttentionOnlySetup", "InductionSetup", "RecordedHistory", "InductionHistory", "olsson_positions",
           "train_and_record", "train_induction_model", "phase_change_step", "state_digest", "EVALUATION_SEED"]

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
        half_length: ``L``, the evaluation period; sequences have ``N = 2L`` tokens.
        min_period: the shortest training period (the longest is ``L``).
    """

    vocab_size: int = 48
    half_length: int = 20
    min_period: int = 16

    def evaluation_tokens(self) -> torch.Tensor:
        """The fixed evaluation batch ``[evaluation_batch, 2L]`` (period ``L``), the same for every seed."""
        return repeated_random_tokens(self.evaluation_batch, self.half_length, self.vocab_size,
                                      generator=torch.Generator().manual_seed(EVALUATION_SEED))


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
    """What :func:`train_induction_model` measured: :class:`RecordedHistory`'s lists, on the evaluation batch
    (``repeated_loss``: tokens ``L + 1 .. 2L − 1``), and these.

    Attributes:
        first_half_loss: mean loss of tokens ``1 .. L − 1`` (random: ``ln V`` at best).
        duplicate_token_scores: ``[layer][head]`` at each record, as the other scores.
        icl_score: Olsson et al.'s in-context-learning score, loss of token ``late`` minus loss of token
            ``early`` (:func:`olsson_positions`), on the evaluation batch.
    """

    first_half_loss: list[float] = field(default_factory=list)
    duplicate_token_scores: list[list[list[float]]] = field(default_factory=list)
    icl_score: list[float] = field(default_factory=list)


def olsson_positions(length: int) -> tuple[int, int]:
    """The early and late tokens of the in-context-learning score, scaled from Olsson et al.'s 50 and 500 of 512.

    ``(round(50/512 · N), min(N − 1, round(500/512 · N)))``: for ``N = 40``, tokens 4 and 39.

    Raises:
        TypeError: not an int. ValueError: ``length`` below 12 (the two would meet or leave the sequence).

    Example:
        >>> olsson_positions(40), olsson_positions(512)
        ((4, 39), (50, 500))
    """
    length = _validate.integer("olsson_positions", "length", length, minimum=12)
    return max(1, round(50 / 512 * length)), min(length - 1, round(500 / 512 * length))


def state_digest(model: torch.nn.Module) -> str:
    """SHA-256 (hex) of every parameter's bytes, in ``state_dict`` order: equal digests, equal weights bit for bit."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _measure(model: AttentionOnlyTransformer, tokens: torch.Tensor, setup: InductionSetup) -> dict:
    """The evaluation batch's losses and every head's scores."""
    half = setup.half_length
    losses = token_losses(model, tokens)                                         # [B, N - 1], column t - 1: token t
    early, late = olsson_positions(tokens.shape[1])
    (r0, r1), (f0, f1) = repeated_span(half), first_half_span(half)
    patterns = record_patterns(model, tokens)                                    # {layer: [B, H, N, N]}
    return {
        "repeated_loss": losses[:, r0 - 1:r1 - 1].mean().item(),
        "first_half_loss": losses[:, f0 - 1:f1 - 1].mean().item(),
        "induction_scores": [induction_score(p, half).mean(0).tolist() for p in patterns.values()],
        "previous_token_scores": [previous_token_score(p).mean(0).tolist() for p in patterns.values()],
        "duplicate_token_scores": [duplicate_token_score(p, half).mean(0).tolist() for p in patterns.values()],
        "icl_score": (losses[:, late - 1].mean() - losses[:, early - 1].mean()).item(),
    }


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


def train_induction_model(seed: int, steps: int = 1000, *, setup: InductionSetup | None = None,
                          record_every: int = 25) -> tuple[AttentionOnlyTransformer, InductionHistory]:
    """Train a two-layer attention-only model on repeating random tokens, scoring it every ``record_every`` steps.

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
        >>> history.steps, len(history.induction_scores[0]), len(history.induction_scores[0][1])
        ([0, 2, 4], 2, 4)
    """
    setup = InductionSetup() if setup is None else setup
    if not isinstance(setup, InductionSetup):
        raise TypeError(f"train_induction_model: setup must be an InductionSetup or None, got {type(setup).__name__}")
    evaluation = setup.evaluation_tokens()                                       # [B_eval, 2L]
    length = 2 * setup.half_length

    def batch_loss(model: torch.nn.Module, batches: torch.Generator) -> torch.Tensor:
        tokens, _ = repeated_segment_tokens(setup.batch_size, length, setup.vocab_size,
                                           periods=(setup.min_period, setup.half_length), generator=batches)
        logits = model(tokens)                                                   # [B, N, V]
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())

    history = InductionHistory(seed=seed, setup=dataclasses.asdict(setup))
    model = train_and_record(seed, steps, record_every, setup, history,
                             build_model=lambda: setup.build_model(setup.vocab_size, length), batch_loss=batch_loss,
                             measure=lambda model: _measure(model, evaluation, setup), caller="train_induction_model")
    return model, history


def phase_change_step(history: InductionHistory | dict, *, threshold: float = 0.3, layer: int = 1) -> int | None:
    """The first recorded step at which some head of ``layer`` has an induction score of at least ``threshold``.

    Args:
        history: an :class:`InductionHistory` (or its dict).
        threshold: in ``(0, 1)``. 0.3 is about nine times what uniform causal attention gives at ``N = 40``
            (mean of ``1/(i+1)`` over ``i = 20 .. 39``: 0.035) and, in the runs measured, is crossed in the
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
