"""Next-token losses token by token, and over a span of tokens: what the ablations and the training history measure.

Conventions: "the loss of token ``t``" is the cross-entropy of ``tokens[:, t]`` under the logits at position
``t − 1`` (so token 0 has none). The tokens scored are a span ``(start, stop)``, the tokens ``start .. stop − 1``
(``start ≥ 1``), or a bool mask ``[B, N]`` that picks them sequence by sequence, such as
:attr:`~attn_course.data.repeated_tokens.PlacedRepeats.predictable`: the tokens of a repeat that an induction
head can predict (the first token of the second copy cannot be: it follows a token that has not occurred
before).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate

__all__ = ["token_losses", "span_loss", "loss_from_logits", "check_span"]


def check_span(where: str, span: object, shape: tuple[int, int]) -> torch.Tensor:
    """The tokens scored, ``[B, N]`` bool, from ``span``: ``(start, stop)`` with ``1 <= start < stop <= N``,
    or a bool mask ``[B, N]`` (``shape``) that leaves token 0 out and picks at least one token in each row;
    else a clear error."""
    batch, tokens = shape
    if isinstance(span, torch.Tensor):
        if span.dtype != torch.bool or span.shape != (batch, tokens):
            raise ValueError(f"{where}: span must be (start, stop) or a bool mask [B, N] = [{batch}, {tokens}], "
                             f"got a {span.dtype} tensor of shape {_validate.shape_str(span)}")
        if span[:, 0].any() or not span.any(dim=1).all():
            raise ValueError(f"{where}: a span mask must leave token 0 out (nothing predicts it) and pick at least "
                             "one token in every sequence")
        return span
    pair = _validate.integer_sequence(where, "span", span)
    if len(pair) != 2 or not 1 <= pair[0] < pair[1] <= tokens:
        raise ValueError(f"{where}: span must be (start, stop) with 1 <= start < stop <= N = {tokens} "
                         f"(the tokens predicted), got {tuple(pair)}")
    position = torch.arange(tokens)[None, :]                                    # [1, N]
    return ((position >= pair[0]) & (position < pair[1])).expand(batch, tokens)


def loss_from_logits(logits: torch.Tensor, targets: torch.Tensor,
                     span: tuple[int, int] | torch.Tensor | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy of ``targets`` under ``logits`` over the tokens of ``span``.

    Args:
        logits: ``[B, N, V]``; position ``t − 1`` predicts token ``t``.
        targets: ``[B, N]`` ids.
        span: ``(start, stop)``, the tokens scored (default ``(1, N)``: all that have a prediction), or a bool
            mask ``[B, N]`` of them.

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
    scored = check_span(where, (1, logits.shape[1]) if span is None else span, tuple(targets.shape))[:, 1:]
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), targets[:, 1:], reduction="none")   # [B, N - 1]
    return losses.masked_select(scored.expand_as(losses)).mean()


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


def span_loss(model: nn.Module, tokens: torch.Tensor, span: tuple[int, int] | torch.Tensor | None = None) -> float:
    """The mean loss of the tokens of ``span`` under ``model``: ``(start, stop)`` (default all but the first),
    or a bool mask ``[B, N]`` of the tokens scored.

    Raises:
        TypeError, ValueError: as :func:`token_losses`, or a span outside ``1 .. N`` (a mask of another shape).
    """
    losses = token_losses(model, tokens)                                        # [B, N - 1]
    scored = check_span("span_loss", (1, tokens.shape[1]) if span is None else span, tuple(tokens.shape))[:, 1:]
    return losses.masked_select(scored.expand_as(losses)).mean().item()
