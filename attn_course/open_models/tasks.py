"""The two tasks chapter 12's small decoders learn, every sequence after a start token at position 0.

- ``"rhymes"``: windows of characters of the course's nursery rhymes
  (:func:`~attn_course.data.rhymes.load_pretraining_text`), the next character to predict: ordinary text,
  for the learning-rate experiment on QK-norm.
- ``"repeats"``: chapter 11's random tokens with one segment said twice
  (:func:`~attn_course.data.repeated_tokens.placed_repeats`). A head that copies from the first copy has
  work only in the second; at every other query it must attend *somewhere* and add nothing. That is the
  situation in which attention sinks are said to form, for the experiments on sinks and gates.

The start token is a token of its own (the last id), the same in every sequence, as a model's
beginning-of-sequence token is: it is the "first token" whose attention mass the chapter measures.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from attn_course import _validate
from attn_course.data.repeated_tokens import placed_repeats
from attn_course.data.rhymes import load_pretraining_text
from attn_course.data.tokenizers import CharTokenizer

__all__ = ["TASKS", "REPEATS_VOCABULARY", "SEQUENCE_TOKENS", "FIRST_MEASURED", "StartTokenBatch", "vocab_size",
           "start_token_batch"]

TASKS = ("rhymes", "repeats")
REPEATS_VOCABULARY = 48          # random tokens of the repeats task (the start token is one more)
SEQUENCE_TOKENS = 40             # tokens after the start token in both tasks
FIRST_MEASURED = 8               # first query position whose attention is measured: a query at 1 has 2 keys


@dataclass(frozen=True)
class StartTokenBatch:
    """A batch of one task.

    Attributes:
        inputs: ``[B, N]`` ids, the start token first.
        targets: ``[B, N]`` the id after each input.
        idle: ``[B, N]`` bool, the queries measured for first-token mass: positions from
            :data:`FIRST_MEASURED` on, and in ``"repeats"`` only those outside the second copy (nothing to copy).
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    idle: torch.Tensor


@functools.cache
def _rhymes() -> tuple[CharTokenizer, torch.Tensor]:
    text = load_pretraining_text()
    tokenizer = CharTokenizer(text)
    return tokenizer, tokenizer.encode(text)


def _task(where: str, task: object) -> str:
    if task not in TASKS:
        raise ValueError(f"{where}: task must be one of {', '.join(map(repr, TASKS))}, got {task!r}")
    return task


def vocab_size(task: str) -> int:
    """Ids of ``task``, the start token (the last one) included."""
    task = _task("vocab_size", task)
    return (_rhymes()[0].vocab_size if task == "rhymes" else REPEATS_VOCABULARY) + 1


def start_token_batch(task: str, batch: int, generator: torch.Generator) -> StartTokenBatch:
    """``batch`` sequences of ``task`` (:data:`SEQUENCE_TOKENS` tokens after the start token), drawn with ``generator``.

    Raises:
        ValueError: an unknown task, ``batch`` below 1. TypeError: ``generator`` not a torch.Generator.

    Example:
        >>> b = start_token_batch("repeats", 2, torch.Generator().manual_seed(0))
        >>> b.inputs.shape, bool((b.inputs[:, 0] == vocab_size("repeats") - 1).all()), b.idle[:, :8].any().item()
        (torch.Size([2, 40]), True, False)
    """
    where = "start_token_batch"
    task = _task(where, task)
    batch = _validate.integer(where, "batch", batch, minimum=1)
    _validate.instance(where, "generator", generator, torch.Generator)
    start = vocab_size(task) - 1
    if task == "rhymes":
        ids = _rhymes()[1]
        offsets = torch.randint(len(ids) - SEQUENCE_TOKENS, (batch,), generator=generator)      # [B]
        tokens = ids[offsets[:, None] + torch.arange(SEQUENCE_TOKENS)]                       # [B, N]
        idle = torch.ones(batch, SEQUENCE_TOKENS, dtype=torch.bool)
    else:
        repeats = placed_repeats(batch, SEQUENCE_TOKENS, REPEATS_VOCABULARY, periods=(4, 20), generator=generator)
        tokens = repeats.tokens                                                              # [B, N]
        # Input i + 1 holds token i: its query is idle where token i is not in the second copy.
        idle = torch.cat((torch.ones(batch, 1, dtype=torch.bool), ~repeats.second_copy[:, :-1]), dim=1)
    sequences = torch.cat((torch.full((batch, 1), start), tokens), dim=1)                    # [B, N + 1]
    idle = idle & (torch.arange(SEQUENCE_TOKENS) >= FIRST_MEASURED)
    return StartTokenBatch(sequences[:, :-1], sequences[:, 1:], idle)
