"""Checks for chapter 07's exercises: the masked-language-model loss."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_course.bert.mlm import IGNORE_INDEX
from attn_course.checks.diagnosis import CheckFailed, call_answer

__all__ = ["check_mlm_loss"]

ALL_POSITIONS = (
    "Your loss averages over every position, the unchosen ones too (their label -100 turned into a "
    "token id), so most of it scores guesses nobody asked for. Average the cross-entropy over the "
    "chosen positions only: those whose label is not -100."
)
DIVIDED_BY_ALL = (
    "Your loss adds up the right positions but divides by every position, B·N, not by the number of "
    "chosen ones: the loss shrinks when fewer tokens are chosen. Divide by (labels != -100).sum()."
)
SUMMED = (
    "Your loss is the sum over the chosen positions, not their mean: it grows with the batch and the "
    "number of blanks. Divide by the number of chosen positions."
)
MEAN_OF_MEANS = (
    "Your loss averages each sequence's blanks first and then the sequences, so a sequence with one "
    "blank weighs as much as one with five. Average over all chosen positions of the batch at once."
)
NO_LOG_SOFTMAX = (
    "Your loss uses the raw score of the right token, not its log-probability: cross-entropy is "
    "-log softmax(logits)[label]. Apply log_softmax over the vocabulary first (or use F.cross_entropy)."
)


def _inputs(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``[3, 8, 11]`` logits and labels with 1, 3 and 5 chosen positions in the three sequences."""
    logits = 2 * torch.randn(3, 8, 11, generator=generator, dtype=torch.float64)      # [B, N, V]
    labels = torch.full((3, 8), IGNORE_INDEX)                                          # [B, N]
    for row, count in enumerate((1, 3, 5)):
        where = torch.randperm(8, generator=generator)[:count]
        labels[row, where] = torch.randint(11, (count,), generator=generator)
    return logits, labels


def _as_number(result: object) -> float:
    if isinstance(result, torch.Tensor):
        if result.numel() != 1:
            raise CheckFailed(f"Your loss should be one number (a scalar tensor), but it has shape "
                              f"{list(result.shape)}: average over the chosen positions.")
        return float(result.detach().double())
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise CheckFailed(f"Your loss should be a scalar tensor, but it is a {type(result).__name__}.")
    return float(result)


def check_mlm_loss(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(logits [B, N, V], labels [B, N]) -> scalar``: the MLM loss on chosen positions only.

    The reference is the mean, over every position whose label is not -100, of
    ``-log softmax(logits)[label]``. A wrong answer is compared with what the usual mistakes give
    (every position averaged, the wrong denominator, a sum, a mean of per-sequence means, raw scores
    instead of log-probabilities), and the one it matches is named.

    Args:
        loss_fn: the student's function.

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: naming the mistake, or the expected and the returned value.

    Example:
        >>> import torch.nn.functional as F
        >>> check_mlm_loss(lambda logits, labels: F.cross_entropy(logits.flatten(0, 1), labels.flatten()))
        True
    """
    generator = torch.Generator().manual_seed(7)
    for _ in range(2):
        logits, labels = _inputs(generator)
        got = _as_number(call_answer("check_mlm_loss", loss_fn, logits.clone(), labels.clone(),
                                     described="logits [3, 8, 11] and labels [3, 8] (1, 3 and 5 chosen positions)"))
        log_p = logits.log_softmax(-1)                                                 # [B, N, V]
        chosen = labels != IGNORE_INDEX                                                # [B, N]
        targets = labels.clamp(min=0)
        per_position = -log_p.gather(-1, targets[..., None])[..., 0]                    # [B, N]
        expected = per_position[chosen].mean().item()
        if abs(got - expected) <= 1e-5 * max(1.0, abs(expected)):
            continue
        raw = -logits.gather(-1, targets[..., None])[..., 0]                            # [B, N]
        mistakes = [
            (ALL_POSITIONS, per_position.mean().item()),
            (DIVIDED_BY_ALL, (per_position * chosen).sum().item() / chosen.numel()),
            (SUMMED, per_position[chosen].sum().item()),
            (MEAN_OF_MEANS, ((per_position * chosen).sum(-1) / chosen.sum(-1)).mean().item()),
            (NO_LOG_SOFTMAX, raw[chosen].mean().item()),
        ]
        for message, value in mistakes:
            if abs(got - value) <= 1e-5 * max(1.0, abs(value)):
                raise CheckFailed(message)
        raise CheckFailed(f"Your loss is {got:.4f} where the mean cross-entropy over the chosen positions is "
                          f"{expected:.4f}. Hint: -log softmax(logits)[label], averaged over the positions whose "
                          f"label is not -100.")
    return True
