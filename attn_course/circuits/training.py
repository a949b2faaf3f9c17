"""Training an attention-only model until an induction head forms, measuring it along the way (chapter 11).

The model reads :func:`~attn_course.data.repeated_tokens.repeated_segment_tokens`: random tokens ending in a
segment said twice, its length drawn per sequence, so the repeat can be found only from the tokens (by an
induction head), not learnt as a fixed offset. Every ``record_every`` steps it is scored on one fixed
evaluation batch of :func:`~attn_course.data.repeated_tokens.repeated_random_tokens` (period
``L = half_length``, ``N = 2L``).

:func:`train_induction_model` is deterministic for a seed on a CPU: the weights come from
``torch.manual_seed(seed)`` (the caller's random state is restored afterwards), the batches from
generators of their own, and training runs on one thread, so sums are always added in the same order.
The history keeps a SHA-256 of the weights at every recorded step, to check that a rerun matches bit for bit.
"""

from __future__ import annotations

import dataclasses
import hashlib
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
from attn_course.models.training import clipped_step

__all__ = ["InductionSetup", "InductionHistory", "olsson_positions", "train_induction_model", "phase_change_step",
           "state_digest", "warmed_up_adamw", "EVALUATION_SEED"]

EVALUATION_SEED = 12345          # the one evaluation batch every seed is scored on


@dataclass(frozen=True)
class InductionSetup:
    """The model and the schedule of :func:`train_induction_model` (defaults: chapter 11's, chosen by measuring).

    Attributes:
        vocab_size: ``V``.
        half_length: ``L``, the evaluation period; sequences have ``N = 2L`` tokens.
        min_period: the shortest training period (the longest is ``L``).
        n_layers, n_heads, d_model, positions, layer_norm: the
            :class:`~attn_course.models.attention_only.AttentionOnlyTransformer`.
        batch_size: training sequences per step.
        learning_rate: AdamW's, after a linear warm-up of ``warmup_steps``.
        weight_decay: AdamW's.
        evaluation_batch: sequences in the evaluation batch.
    """

    vocab_size: int = 48
    half_length: int = 20
    min_period: int = 16
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

    def build_model(self) -> AttentionOnlyTransformer:
        """A fresh model of this setup (weights from torch's global random state)."""
        return AttentionOnlyTransformer(self.vocab_size, n_layers=self.n_layers, n_heads=self.n_heads,
                                        d_model=self.d_model, max_len=2 * self.half_length, positions=self.positions,
                                        layer_norm=self.layer_norm)

    def evaluation_tokens(self) -> torch.Tensor:
        """The fixed evaluation batch ``[evaluation_batch, 2L]`` (period ``L``), the same for every seed."""
        return repeated_random_tokens(self.evaluation_batch, self.half_length, self.vocab_size,
                                      generator=torch.Generator().manual_seed(EVALUATION_SEED))


@dataclass
class InductionHistory:
    """What :func:`train_induction_model` measured, one entry per recorded step (JSON-ready lists).

    Attributes:
        seed, setup: how the run was made (``setup`` as a dict of :class:`InductionSetup`'s fields).
        steps: optimiser steps taken at each record (0: before the first).
        repeated_loss: mean loss of the repeated half's predictable tokens ``L + 1 .. 2L − 1`` (nats).
        first_half_loss: mean loss of tokens ``1 .. L − 1`` (random: ``ln V`` at best).
        induction_scores, previous_token_scores, duplicate_token_scores: ``[layer][head]`` at each record
            (:mod:`~attn_course.circuits.scores`), means over the evaluation batch.
        icl_score: Olsson et al.'s in-context-learning score, loss of token ``late`` minus loss of token
            ``early`` (:func:`olsson_positions`), on the evaluation batch.
        train_loss: the mean training-batch loss over the steps since the previous record (None at step 0).
        digests: SHA-256 of the weights at each record (:func:`state_digest`).
    """

    seed: int
    setup: dict
    steps: list[int] = field(default_factory=list)
    repeated_loss: list[float] = field(default_factory=list)
    first_half_loss: list[float] = field(default_factory=list)
    induction_scores: list[list[list[float]]] = field(default_factory=list)
    previous_token_scores: list[list[list[float]]] = field(default_factory=list)
    duplicate_token_scores: list[list[list[float]]] = field(default_factory=list)
    icl_score: list[float] = field(default_factory=list)
    train_loss: list[float | None] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """Plain dict for JSON (``InductionHistory(**d)`` rebuilds it)."""
        return dataclasses.asdict(self)


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


def warmed_up_adamw(model: torch.nn.Module, setup) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW at ``setup.learning_rate`` and ``setup.weight_decay``, its rate ramped up linearly over
    ``setup.warmup_steps`` steps and then constant: the schedule of both of chapter 11's trainings
    (:class:`InductionSetup`, :class:`~attn_course.circuits.rhymes.RhymesSetup`).

    Raises:
        TypeError: ``model`` not a torch.nn.Module.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"warmed_up_adamw: model must be a torch.nn.Module, got {type(model).__name__}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.learning_rate, weight_decay=setup.weight_decay)
    warmup = max(1, setup.warmup_steps)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))


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
    where = "train_induction_model"
    seed = _validate.integer(where, "seed", seed, minimum=0)
    steps = _validate.integer(where, "steps", steps, minimum=1)
    record_every = _validate.integer(where, "record_every", record_every, minimum=1)
    setup = InductionSetup() if setup is None else setup
    if not isinstance(setup, InductionSetup):
        raise TypeError(f"{where}: setup must be an InductionSetup or None, got {type(setup).__name__}")
    with one_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = setup.build_model()
        batches = torch.Generator().manual_seed(seed + 1_000_003)
        evaluation = setup.evaluation_tokens()                                   # [B_eval, 2L]
        optimizer, schedule = warmed_up_adamw(model, setup)
        history = InductionHistory(seed=seed, setup=dataclasses.asdict(setup))
        since_record: list[float] = []

        def keep(step: int) -> None:
            for name, value in _measure(model, evaluation, setup).items():
                getattr(history, name).append(value)
            history.steps.append(step)
            history.train_loss.append(sum(since_record) / len(since_record) if since_record else None)
            history.digests.append(state_digest(model))
            since_record.clear()

        keep(0)
        model.train()
        for step in range(1, steps + 1):
            tokens, _ = repeated_segment_tokens(setup.batch_size, 2 * setup.half_length, setup.vocab_size,
                                               periods=(setup.min_period, setup.half_length), generator=batches)
            logits = model(tokens)                                               # [B, N, V]
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
            since_record.append(clipped_step(loss, model, optimizer, schedule))
            if step % record_every == 0 or step == steps:
                keep(step)
    return model.eval(), history


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
