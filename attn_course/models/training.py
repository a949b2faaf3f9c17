"""The course's training loops and the parts they share; chapter 04's character language model is trained here.

- :func:`warmed_up_adamw`, :func:`optimizer_step`, :class:`BestWeights`: AdamW with a warm-up and a cosine
  decay, one optimiser step with clipped gradients, and the weights with the best held-out loss; every
  training of the course uses them (chapters 03, 04, 05, 08, 09 and 11);
- :func:`train_language_model`: AdamW on random windows of a text, scored on a held-out tail,
  keeping the weights with the best held-out loss, and :class:`TrainingHistory`, what it measured;
- :func:`nonoverlapping_windows`, :func:`mean_window_loss`: the held-out score.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course._threads import one_thread
from attn_course.data.rhymes import held_out_split
from attn_course.data.tokenizers import CharTokenizer
from attn_course.models.tiny_language_model import LanguageModelConfig, TinyLanguageModel

__all__ = ["TrainingHistory", "BestWeights", "warmed_up_adamw", "optimizer_step", "nonoverlapping_windows",
           "mean_window_loss", "train_language_model"]


@dataclass(frozen=True)
class TrainingHistory:
    """What :func:`train_language_model` measured while training.

    Attributes:
        train_losses: the cross-entropy of each step's batch, one per step taken.
        validation_steps: after how many steps each validation loss was measured (0: before
            the first step).
        validation_losses: the mean cross-entropy over the held-out windows, one per entry of
            ``validation_steps``.
        best_step: the step (one of ``validation_steps``) with the lowest validation loss, whose
            weights the returned model holds; None when nothing was held out (the model then
            holds the last step's weights).
    """

    train_losses: list[float]
    validation_steps: list[int]
    validation_losses: list[float]
    best_step: int | None

    @property
    def best_validation_loss(self) -> float | None:
        """The lowest validation loss, or None when nothing was held out."""
        return min(self.validation_losses) if self.validation_losses else None


class BestWeights:
    """The held-out losses of a training run, and a copy of the weights that scored lowest.

    Attributes:
        steps: after how many steps each loss was measured.
        losses: the held-out losses, one per entry of ``steps``.
        best_step: the entry of ``steps`` with the lowest loss (the first, on a tie), or None before any.

    Example:
        >>> model, best = nn.Linear(2, 1), BestWeights()
        >>> best.record(0, 0.9, model), best.record(10, 0.5, model), best.record(20, 0.7, model)
        (True, True, False)
        >>> best.best_step, best.scorings_since_best
        (10, 1)
    """

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.best_step: int | None = None
        self._state: dict[str, torch.Tensor] | None = None

    def record(self, step: int, loss: float, model: nn.Module) -> bool:
        """Note the held-out ``loss`` after ``step`` steps; keep a copy of ``model``'s weights if it is the lowest.

        Returns:
            True when ``loss`` is lower than every loss before it (NaN never is).

        Raises:
            TypeError: ``model`` not a ``torch.nn.Module``.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"BestWeights.record: model must be a torch.nn.Module, got {type(model).__name__}")
        improved = loss < min(self.losses, default=math.inf)
        self.steps.append(step)
        self.losses.append(loss)
        if improved:
            self._state, self.best_step = copy.deepcopy(model.state_dict()), step
        return improved

    @property
    def scorings_since_best(self) -> int:
        """How many scorings came after the best one (all of them while there is none)."""
        if self.best_step is None:
            return len(self.steps)
        return len(self.steps) - 1 - self.steps.index(self.best_step)

    def restore(self, model: nn.Module) -> None:
        """Load the best weights into ``model`` (nothing happens before a first :meth:`record`)."""
        if self._state is not None:
            model.load_state_dict(self._state)


def warmed_up_adamw(model: nn.Module, learning_rate: float, *, weight_decay: float = 0.01, warmup_steps: int = 0,
                    decay_steps: int | None = None) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its schedule: the rate ramps up linearly over ``warmup_steps``, then stays, or decays as a cosine.

    The factor on ``learning_rate`` at step ``t`` is ``min(1, (t + 1) / warmup_steps)`` (1 without a
    warm-up), and with ``decay_steps = T`` at most ``(1 + cos(π t / T)) / 2``, which reaches 0 at ``T``.

    Args:
        model: whose parameters are optimised.
        learning_rate: the peak rate.
        weight_decay: AdamW's.
        warmup_steps: steps of the linear ramp (0: none).
        decay_steps: ``T`` of the cosine decay, or None to keep the peak rate.

    Returns:
        ``(optimizer, schedule)``: step the schedule after every optimiser step (:func:`optimizer_step` does).

    Raises:
        TypeError, ValueError: ``model`` not a torch.nn.Module, a rate or counts out of range.

    Example:
        >>> optimizer, schedule = warmed_up_adamw(nn.Linear(2, 1), 1.0, warmup_steps=2, decay_steps=4)
        >>> [round(schedule.lr_lambdas[0](step), 3) for step in range(5)]   # the ramp, then the cosine
        [0.5, 0.854, 0.5, 0.146, 0.0]
    """
    where = "warmed_up_adamw"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{where}: model must be a torch.nn.Module, got {type(model).__name__}")
    learning_rate = _validate.positive_finite(where, "learning_rate", learning_rate)
    warmup = max(1, _validate.integer(where, "warmup_steps", warmup_steps, minimum=0))
    if decay_steps is not None:
        decay_steps = _validate.integer(where, "decay_steps", decay_steps, minimum=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay)

    def factor(step: int) -> float:
        ramp = min(1.0, (step + 1) / warmup)
        return ramp if decay_steps is None else min(ramp, 0.5 * (1 + math.cos(math.pi * step / decay_steps)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def optimizer_step(loss: torch.Tensor, model: nn.Module, optimizer: torch.optim.Optimizer,
                   schedule: torch.optim.lr_scheduler.LRScheduler | None = None, *,
                   max_norm: float | None = 1.0) -> float:
    """One optimiser step on ``loss``: gradients, their norm clipped to ``max_norm``, the step, the schedule.

    Args:
        loss: a scalar tensor with a graph back to ``model``'s parameters.
        model: whose gradients are clipped.
        optimizer: takes the step.
        schedule: its learning-rate schedule, stepped after it, or None.
        max_norm: the largest total gradient norm, or None to leave the gradients as they are.

    Returns:
        ``loss`` as a float.

    Raises:
        ValueError: ``loss`` not a scalar, or ``max_norm`` not a positive finite number.

    Example:
        >>> model = nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> optimizer_step(model(torch.ones(1, 2)).pow(2).sum() * 0, model, optimizer)
        0.0
    """
    loss = _validate.floating_tensor("optimizer_step", "loss", loss)
    if loss.dim() != 0:
        raise ValueError(f"optimizer_step: loss must be a scalar, got shape {_validate.shape_str(loss)}")
    if max_norm is not None:
        max_norm = _validate.positive_finite("optimizer_step", "max_norm", max_norm)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    if schedule is not None:
        schedule.step()
    return loss.item()


def nonoverlapping_windows(data: torch.Tensor, length: int) -> torch.Tensor:
    """Cut ids into non-overlapping windows of ``length + 1``, so that each one after the first is a target once.

    Args:
        data: ``[T]`` token ids.
        length: ``N``, the inputs per window (each window has one more id, the last target).

    Returns:
        ``[W, N + 1]`` with ``W = (T - 1) // N``; a tail too short for a window is left out.

    Example:
        >>> nonoverlapping_windows(torch.arange(8), 3).tolist()
        [[0, 1, 2, 3], [3, 4, 5, 6]]
    """
    starts = torch.arange(0, len(data) - length, length)                  # [W]
    return data[starts[:, None] + torch.arange(length + 1)]                # [W, N + 1]


def _logits(output: object) -> torch.Tensor:
    """A model's logits: its output, or the output's ``.logits``."""
    return getattr(output, "logits", output)


def mean_window_loss(model: nn.Module, windows: torch.Tensor) -> float:
    """The mean next-token cross-entropy (nats) of ``model`` over ``windows`` (eval mode, no gradients).

    Args:
        model: maps ids ``[W, N]`` to logits ``[W, N, V]`` (or to an output whose ``.logits`` they are, as the
            course's Llama and Hugging Face's models return); its training mode is restored afterwards.
        windows: ``[W, N + 1]`` ids, e.g. from :func:`nonoverlapping_windows`.

    Returns:
        the loss as a float.
    """
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = _logits(model(windows[:, :-1]))                            # [W, N, V]
        loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    model.train(was_training)
    return loss


def train_language_model(
    text: str,
    config: LanguageModelConfig | None = None,
    *,
    steps: int = 600,
    batch_size: int = 32,
    sequence_length: int = 64,
    learning_rate: float = 3e-3,
    validation_fraction: float = 0.1,
    eval_every: int = 25,
    patience: int | None = 4,
    seed: int = 0,
    progress: bool = True,
    make_model: Callable[[int], nn.Module] | None = None,
) -> tuple[nn.Module, CharTokenizer, TrainingHistory]:
    """Train a :class:`TinyLanguageModel` to predict the next character of ``text``.

    The last ``validation_fraction`` of the text (cut at a blank line, see
    :func:`held_out_split`) is held out: every ``eval_every`` steps the model is scored on it,
    and the model returned holds the weights with the lowest validation loss. Training stops
    early once ``patience`` scorings in a row have not improved on the best.

    Args:
        text: the training text; its characters make the vocabulary.
        config: model sizes; when omitted, ``vocab_size`` comes from the text and
            ``max_length`` is ``sequence_length``. A given config must have
            ``max_length == sequence_length``, so that every position embedding is trained.
        steps: the most optimisation steps (AdamW, learning rate cosine-decayed over ``steps``).
        batch_size: random windows per step.
        sequence_length: characters per window: the context window ``N`` of the model.
        learning_rate: peak learning rate.
        validation_fraction: share of the text held out, in ``[0, 1)``; 0 trains on all of it
            and keeps the last weights.
        eval_every: steps between two validation scorings.
        patience: stop after this many scorings without a new best; None never stops early.
        seed: seeds the initial weights, the batches and any dropout; the caller's global
            random state is left as it was.
        progress: show a progress bar (tqdm).
        make_model: build another model instead of a :class:`TinyLanguageModel`: called with
            the vocabulary size ``V`` once the seed is set (so its initial weights are seeded
            too), it must return a module mapping ``[B, N]`` ids to ``[B, N, V]`` logits (or to an output
            with ``.logits``, as the course's Llama returns: chapter 14 trains one this way);
            ``config`` must then be None. Chapter 09 trains its position schemes this way.

    Returns:
        ``(model, tokenizer, history)``: the model in eval mode, and a :class:`TrainingHistory`.

    Raises:
        TypeError, ValueError: a training or held-out part shorter than a window, a config
            whose ``max_length`` differs from ``sequence_length``, both ``config`` and
            ``make_model``, or sizes that are not positive.
    """
    where = "train_language_model"
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be a str, got {type(text).__name__}")
    if config is not None and not isinstance(config, LanguageModelConfig):
        raise TypeError(f"{where}: config must be a LanguageModelConfig, got {type(config).__name__}")
    if make_model is not None and not callable(make_model):
        raise TypeError(f"{where}: make_model must be callable (vocab_size -> model), got {type(make_model).__name__}")
    if make_model is not None and config is not None:
        raise ValueError(f"{where}: give config or make_model, not both (make_model builds its own model)")
    seed = _validate.integer(where, "seed", seed, minimum=0)
    steps = _validate.integer(where, "steps", steps, minimum=1)
    batch_size = _validate.integer(where, "batch_size", batch_size, minimum=1)
    sequence_length = _validate.integer(where, "sequence_length", sequence_length, minimum=1)
    learning_rate = _validate.positive_finite(where, "learning_rate", learning_rate)
    validation_fraction = _validate.dropout(where, validation_fraction, name="validation_fraction")
    eval_every = _validate.integer(where, "eval_every", eval_every, minimum=1)
    if patience is not None:
        patience = _validate.integer(where, "patience", patience, minimum=1)
    tokenizer = CharTokenizer(text)
    train_text, held_out = held_out_split(text, validation_fraction)
    data, validation_data = tokenizer.encode(train_text), tokenizer.encode(held_out)
    if len(data) <= sequence_length + 1:
        raise ValueError(f"{where}: the training part of the text ({len(data)} characters) must be longer "
                         f"than sequence_length + 1 = {sequence_length + 1}")
    if validation_fraction and len(validation_data) <= sequence_length:
        raise ValueError(f"{where}: the held-out part ({len(validation_data)} characters) must be longer than "
                         f"sequence_length = {sequence_length}; hold out more or use shorter windows")
    config = config or LanguageModelConfig(vocab_size=tokenizer.vocab_size, max_length=sequence_length)
    if make_model is None and (config.vocab_size != tokenizer.vocab_size or config.max_length != sequence_length):
        raise ValueError(
            f"{where}: config.vocab_size must be {tokenizer.vocab_size} and config.max_length must equal "
            f"sequence_length={sequence_length} (a longer context would have position embeddings that "
            f"training never reaches), got {config}"
        )
    validation_windows = nonoverlapping_windows(validation_data, sequence_length) if validation_fraction else None
    generator = torch.Generator().manual_seed(seed)                    # the batches
    offsets = torch.arange(sequence_length + 1)
    train_losses, best = [], BestWeights()
    iterator = range(1, steps + 1)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="training", unit="step")
    with torch.random.fork_rng(devices=[]), one_thread():                 # keep the caller's RNG
        torch.manual_seed(seed)                                          # the weights, then any dropout
        model = TinyLanguageModel(config) if make_model is None else make_model(tokenizer.vocab_size)
        if not isinstance(model, nn.Module):
            raise TypeError(f"{where}: make_model must return a torch.nn.Module, got {type(model).__name__}")
        optimizer, schedule = warmed_up_adamw(model, learning_rate, decay_steps=steps)
        if validation_windows is not None:
            best.record(0, mean_window_loss(model, validation_windows), model)
        model.train()
        for step in iterator:
            starts = torch.randint(0, len(data) - sequence_length - 1, (batch_size, 1), generator=generator)
            windows = data[starts + offsets]                               # [B, N + 1]
            logits = _logits(model(windows[:, :-1]))                       # [B, N, V]
            loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
            train_losses.append(optimizer_step(loss, model, optimizer, schedule))
            stop = False
            if validation_windows is not None and (step % eval_every == 0 or step == steps):
                best.record(step, mean_window_loss(model, validation_windows), model)
                stop = patience is not None and best.scorings_since_best >= patience
            if progress:
                postfix = {"loss": f"{train_losses[-1]:.3f}"}
                if best.losses:
                    postfix["validation"] = f"{best.losses[-1]:.3f}"
                iterator.set_postfix(postfix, refresh=False)
            if stop:
                break
        best.restore(model)
    if progress:
        iterator.close()
    model.eval()
    history = TrainingHistory(train_losses, best.steps, best.losses, best.best_step)
    return model, tokenizer, history
