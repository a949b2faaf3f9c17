"""Speculative decoding's verification: which of a draft model's tokens the target model keeps.

A small draft model proposes ``k`` tokens one by one; the target model scores all of them in one forward
pass, which costs about what one decoding step costs when decoding is memory-bound. Leviathan et al. (2023)
and Chen et al. (2023) keep draft token ``x_i`` with probability ``min(1, p_i(x_i) / q_i(x_i))``, where
``q_i`` is the draft's distribution and ``p_i`` the target's; at the first rejection they draw a token from
the residual ``max(0, p_i - q_i)``, normalised, and stop; when all ``k`` are kept, one more token comes from
``p_{k+1}`` for free. Every token produced this way is distributed exactly as the target alone would
sample it: the draft changes the speed, never the distribution. Greedy decoding is the case where ``p`` and
``q`` put all their mass on their argmax: a draft token is kept while it equals the target's choice.
"""

from __future__ import annotations

import torch

from attn_course import _validate

__all__ = ["verify_greedy", "verify_sampled"]


def verify_greedy(draft_tokens: list[int], target_logits: torch.Tensor) -> list[int]:
    """The tokens greedy decoding keeps: the draft's while they are the target's argmax, then the target's own.

    Args:
        draft_tokens: the ``k`` proposed tokens.
        target_logits: ``[k + 1, V]``, the target's logits after the context and after each draft token.

    Returns:
        1 to ``k + 1`` tokens: those kept, then the target's token at the first disagreement (or after the last).

    Raises:
        TypeError, ValueError: tokens that are not ints, logits that are not ``[k + 1, V]`` floating.

    Example:
        >>> logits = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])   # the target's choices: 1, 2, 0
        >>> verify_greedy([1, 0], logits), verify_greedy([1, 2], logits)
        ([1, 2], [1, 2, 0])
    """
    draft_tokens, target_logits = _check(draft_tokens, target_logits, "verify_greedy", "target_logits")
    chosen = target_logits.argmax(-1).tolist()                          # [k + 1]
    kept = 0
    while kept < len(draft_tokens) and draft_tokens[kept] == chosen[kept]:
        kept += 1
    return draft_tokens[:kept] + [chosen[kept]]


def verify_sampled(draft_tokens: list[int], draft_probabilities: torch.Tensor, target_probabilities: torch.Tensor,
                   *, generator: torch.Generator | None = None) -> list[int]:
    """The tokens rejection sampling keeps, distributed exactly as sampling from the target alone.

    Args:
        draft_tokens: the ``k`` tokens the draft sampled.
        draft_probabilities: ``[k, V]``, the draft's distribution at each of them (``q``).
        target_probabilities: ``[k + 1, V]``, the target's after the context and after each draft token (``p``).
        generator: the random generator.

    Returns:
        1 to ``k + 1`` tokens.

    Raises:
        TypeError, ValueError: tokens that are not ints, probabilities that are not ``[k, V]`` and ``[k + 1, V]``
            floating tensors, a draft token its own distribution gives no probability.

    Example:
        >>> q = torch.tensor([[0.5, 0.5, 0.0]])                          # the draft's guess at one position
        >>> p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])         # the target agrees, then says 2
        >>> verify_sampled([1], q, p, generator=torch.Generator().manual_seed(0))
        [1, 2]
    """
    where = "verify_sampled"
    draft_tokens, target_probabilities = _check(draft_tokens, target_probabilities, where, "target_probabilities")
    draft_probabilities = _validate.floating_tensor(where, "draft_probabilities", draft_probabilities)
    if draft_probabilities.shape != (len(draft_tokens), target_probabilities.shape[1]):
        raise ValueError(f"{where}: draft_probabilities must be [k, V] = [{len(draft_tokens)}, "
                         f"{target_probabilities.shape[1]}], got {_validate.shape_str(draft_probabilities)}")
    p, q = target_probabilities.double(), draft_probabilities.double()
    for index, token in enumerate(draft_tokens):
        if q[index, token] <= 0:
            raise ValueError(f"{where}: draft token {token} at place {index} has draft probability 0")
        # Keep it with probability min(1, p / q): where the draft over-proposes a token, it is kept less often.
        if torch.rand((), dtype=torch.float64, generator=generator) * q[index, token] < p[index, token]:
            continue
        residual = (p[index] - q[index]).clamp(min=0)                   # the mass the draft under-proposed
        return draft_tokens[:index] + [int(torch.multinomial(residual / residual.sum(), 1, generator=generator))]
    return draft_tokens + [int(torch.multinomial(p[-1], 1, generator=generator))]


def _check(draft_tokens: object, scores: object, where: str, name: str) -> tuple[list[int], torch.Tensor]:
    draft_tokens = _validate.integer_sequence(where, "draft_tokens", draft_tokens, minimum=0)
    scores = _validate.floating_tensor(where, name, scores)
    if scores.dim() != 2 or scores.shape[0] != len(draft_tokens) + 1:
        raise ValueError(f"{where}: {name} must be [k + 1, V] = [{len(draft_tokens) + 1}, V], got "
                         f"{_validate.shape_str(scores)}")
    if draft_tokens and max(draft_tokens) >= scores.shape[1]:
        raise ValueError(f"{where}: draft token {max(draft_tokens)} is outside the vocabulary 0..{scores.shape[1] - 1}")
    return draft_tokens, scores
