"""Training the tiny character language model of chapter 04 (and the losses used to score it).

- :func:`train_language_model`: AdamW on random windows of a text, scored on a held-out tail,
  keeping the weights with the best held-out loss;
- :func:`nonoverlapping_windows`, :func:`mean_window_loss`: the held-out score;
- :class:`TrainingHistory`: what was measured along the way.
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

__all__ = ["TrainingHistory", "nonoverlapping_windows", "mean_window_loss", "train_language_model"]


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


def mean_window_loss(model: nn.Module, windows: torch.Tensor) -> float:
    """The mean next-token cross-entropy (nats) of ``model`` over ``windows`` (eval mode, no gradients).

    Args:
        model: maps ids ``[W, N]`` to logits ``[W, N, V]``; its training mode is restored afterwards.
        windows: ``[W, N + 1]`` ids, e.g. from :func:`nonoverlapping_windows`.

    Returns:
        the loss as a float.
    """
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(windows[:, :-1])                                     # [W, N, V]
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
            too), it must return a module mapping ``[B, N]`` ids to ``[B, N, V]`` logits;
            ``config`` must then be None. Chapter 08 trains its position schemes this way.

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
    train_losses, validation_steps, validation_losses = [], [], []
    best_state, best_step = None, None
    iterator = range(1, steps + 1)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="training", unit="step")
    with torch.random.fork_rng(devices=[]), one_thread():                 # keep the caller's RNG
        torch.manual_seed(seed)                                          # the weights, then any dropout
        model = TinyLanguageModel(config) if make_model is None else make_model(tokenizer.vocab_size)
        if not isinstance(model, nn.Module):
            raise TypeError(f"{where}: make_model must return a torch.nn.Module, got {type(model).__name__}")
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / steps))
        )

        def score(step: int) -> bool:
            """Measure the validation loss after ``step`` steps; True when training should stop."""
            nonlocal best_state, best_step
            validation_steps.append(step)
            validation_losses.append(mean_window_loss(model, validation_windows))
            if validation_losses[-1] < min(validation_losses[:-1], default=math.inf):
                best_state, best_step = copy.deepcopy(model.state_dict()), step
            return patience is not None and len(validation_steps) - 1 - validation_steps.index(best_step) >= patience

        if validation_windows is not None:
            score(0)
        model.train()
        for step in iterator:
            starts = torch.randint(0, len(data) - sequence_length - 1, (batch_size, 1), generator=generator)
            windows = data[starts + offsets]                               # [B, N + 1]
            logits = model(windows[:, :-1])                                # [B, N, V]
            loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            train_losses.append(loss.item())
            stop = validation_windows is not None and (step % eval_every == 0 or step == steps) and score(step)
            if progress:
                postfix = {"loss": f"{loss.item():.3f}"}
                if validation_losses:
                    postfix["validation"] = f"{validation_losses[-1]:.3f}"
                iterator.set_postfix(postfix, refresh=False)
            if stop:
                break
        if best_state is not None:
            model.load_state_dict(best_state)
    if progress:
        iterator.close()
    model.eval()
    history = TrainingHistory(train_losses, validation_steps, validation_losses, best_step)
    return model, tokenizer, history
