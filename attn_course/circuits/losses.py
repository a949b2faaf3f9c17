"""Next-token losses token by token, and over a span of tokens: what the ablations and the training history measure.

Conventions: "the loss of token ``t``" is the cross-entropy of ``tokens[:, t]`` under the logits at position
``t − 1`` (so token 0 has none). A span ``(start, stop)`` is the tokens ``start .. stop − 1``, ``start ≥ 1``.
On :func:`~attn_course.data.repeated_tokens.repeated_random_tokens` of period ``L`` (``N = 2L``),
:func:`repeated_span` is ``(L + 1, 2L)``, the tokens an induction head can predict (token ``L``, the first of
the repeat, cannot be: it follows token ``L − 1``, which has not occurred before), and :func:`first_half_span`
is ``(1, L)``, tokens no model can predict better than chance (``ln V``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate

__all__ = ["token_losses", "span_loss", "loss_from_logits", "repeated_span", "first_half_span", "check_span"]


def check_span(where: str, span: object, tokens: int) -> tuple[int, int]:
    """``span`` as ``(start, stop)`` with ``1 <= start < stop <= tokens``, else a clear error."""
    pair = _validate.integer_sequence(where, "span", span)
    if len(pair) != 2 or not 1 <= pair[0] < pair[1] <= tokens:
        raise ValueError(f"{where}: span must be (start, stop) with 1 <= start < stop <= N = {tokens} "
                         f"(the tokens predicted), got {tuple(pair)}")
    return pair[0], pair[1]


def loss_from_logits(logits: torch.Tensor, targets: torch.Tensor, span: tuple[int, int] | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy of ``targets`` under ``logits`` over the tokens of ``span``.

    Args:
        logits: ``[B, N, V]``; position ``t − 1`` predicts token ``t``.
        targets: ``[B, N]`` ids.
        span: ``(start, stop)``, the tokens scored (default ``(1, N)``: all that have a prediction).

    Returns:
        a scalar tensor (nats).

    Raises:
        TypeError, ValueError: tensors of the wrong kind or shape, or a span outside ``1 .. N``.

    Example:
        >>> logits = torch.zeros(1, 4, 5)                      # uniform over 5 tokens
        >>> loss_from_logits(logits, torch.zeros(1, 4, dtype=torch.long)).item() == torch.tensor(5.0).log().item()
        True
    """
    where = "loss_from_logits"
    logits = _validate.floating_tensor(where, "logits", logits)
    targets = _validate.integer_tensor(where, "targets", targets)
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"{where}: logits must be [B, N, V] and targets [B, N], got shapes "
                         f"{_validate.shape_str(logits)} and {_validate.shape_str(targets)}")
    start, stop = check_span(where, (1, logits.shape[1]) if span is None else span, logits.shape[1])
    predicted = logits[:, start - 1:stop - 1]                                   # [B, S, V]
    return F.cross_entropy(predicted.flatten(0, 1), targets[:, start:stop].flatten())


def token_losses(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The loss of every token but the first, under ``model`` (no gradients, eval mode restored).

    Args:
        model: maps ``[B, N]`` ids to ``[B, N, V]`` logits.
        tokens: ``[B, N]`` ids, ``N ≥ 2``.

    Returns:
        ``[B, N − 1]``: column ``t − 1`` holds the loss of token ``t``.

    Raises:
        TypeError: ``tokens`` not an integer tensor.
        ValueError: not 2-D with ``N ≥ 2``.

    Example:
        >>> class Uniform(nn.Module):
        ...     def forward(self, tokens):
        ...         return torch.zeros(*tokens.shape, 4)
        >>> token_losses(Uniform(), torch.zeros(2, 3, dtype=torch.long)).shape
        torch.Size([2, 2])
    """
    where = "token_losses"
    tokens = _validate.integer_tensor(where, "tokens", tokens)
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"{where}: tokens must be [B, N] with N >= 2, got shape {_validate.shape_str(tokens)}")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(tokens)                                              # [B, N, V]
    finally:
        model.train(was_training)
    losses = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    return losses.view(tokens.shape[0], tokens.shape[1] - 1)                    # [B, N - 1]


def span_loss(model: nn.Module, tokens: torch.Tensor, span: tuple[int, int] | None = None) -> float:
    """The mean loss of the tokens ``span = (start, stop)`` (default all but the first) under ``model``.

    Raises:
        TypeError, ValueError: as :func:`token_losses`, or a span outside ``1 .. N``.
    """
    losses = token_losses(model, tokens)                                        # [B, N - 1]
    start, stop = check_span("span_loss", (1, tokens.shape[1]) if span is None else span, tokens.shape[1])
    return losses[:, start - 1:stop - 1].mean().item()


def repeated_span(half_length: int) -> tuple[int, int]:
    """``(L + 1, 2L)``: the tokens of a period-``L`` repeat that an induction head can predict.

    Example:
        >>> repeated_span(20)
        (21, 40)
    """
    half_length = _validate.integer("repeated_span", "half_length", half_length, minimum=2)
    return half_length + 1, 2 * half_length


def first_half_span(half_length: int) -> tuple[int, int]:
    """``(1, L)``: the tokens of the first half that have a prediction (all random: ``ln V`` at best).

    Example:
        >>> first_half_span(20)
        (1, 20)
    """
    half_length = _validate.integer("first_half_span", "half_length", half_length, minimum=2)
    return 1, half_length
