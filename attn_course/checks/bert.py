"""Checks for chapter 07's exercises: the masked-language-model loss."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer, call_student, check_shape, diagnose, same, watched
from attn_course.checks.forbidden import Forbidden
from attn_course.models.bert.masking import IGNORE_INDEX

__all__ = ["check_mlm_loss", "check_attention_weight_count", "check_head_most_on", "check_masked_mean"]

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


#: What chapter 07's find-the-bug exercise may not call: the course's own loss.
MLM_LOSS_RULES = (
    Forbidden("attn_course.models.bert.masked_lm.masked_lm_loss",
              "the statement asks you not to call masked_lm_loss: fix the classmate's loss"),
)


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

    Example (a wrong answer, and what it is told):
        >>> import torch.nn.functional as F
        >>> check_mlm_loss(lambda logits, labels: F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten()))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your loss averages over every position, the unchosen ones too ...
    """
    loss_fn = watched("check_mlm_loss", loss_fn, MLM_LOSS_RULES)
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


# --- exercise 2: counting the attention weights of all-MiniLM-L6-v2 ------------------------------------

LAYERS, HEADS = 6, 12
ONE_LAYER = ("Your count is one layer's worth: 12 heads × n². The model has 6 layers, and each computes "
             "its own 12 maps.")
ONE_HEAD_PER_LAYER = ("Your count has one map per layer: 6 × n². Each of the 6 layers has 12 heads, and each "
                      "head computes its own n × n map.")
LINEAR = ("Your count grows like n, but each head holds an n × n map: one weight for every (query, key) pair, "
          "so n² per head.")
SPECIALS_TWICE = ("Your count adds [CLS] and [SEP] again: n_tokens already includes them, so each map is "
                  "n_tokens × n_tokens.")
NO_SELF = ("Your count leaves out each token's weight on itself. A query attends to every key, itself "
           "included: n² per head, not n·(n - 1).")


def check_attention_weight_count(count_fn: Callable[[int], object]) -> bool:
    """Check ``fn(n_tokens) -> int``: all-MiniLM-L6-v2's attention weights for one sentence, 6 · 12 · n².

    Tried at ``n_tokens`` = 10 (the bank sentence), 23 and 1; ints or whole floats are fine.

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: naming a missing factor (layers, heads), a linear count, the special tokens
            counted twice, the diagonal left out, or the value expected.

    Example (a wrong answer, and what it is told):
        >>> check_attention_weight_count(lambda n: 12 * n * n)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your count is one layer's worth: 12 heads × n². The model has 6 ...
    """
    for n in (10, 23, 1):
        result = call_answer("check_attention_weight_count", count_fn, n, described=f"n_tokens={n}")
        if isinstance(result, torch.Tensor) and result.numel() == 1:
            result = result.item()
        if isinstance(result, bool) or not isinstance(result, (int, float)):
            raise CheckFailed(f"Your count should be a number (an int), but it is a {type(result).__name__}.")
        expected = LAYERS * HEADS * n * n
        if result == expected:
            continue
        mistakes = [(ONE_LAYER, HEADS * n * n), (ONE_HEAD_PER_LAYER, LAYERS * n * n), (LINEAR, LAYERS * HEADS * n),
                    (SPECIALS_TWICE, LAYERS * HEADS * (n + 2) ** 2), (NO_SELF, LAYERS * HEADS * n * (n - 1))]
        for message, value in mistakes:
            if result == value:
                raise CheckFailed(message)
        raise CheckFailed(f"For n_tokens = {n} your count is {result:g}, but the model computes {expected} weights. "
                          "Hint: how many heads per layer, how many layers, and how many weights in one head's map?")
    return True


# --- exercise 4: the head that gives one key the most attention ------------------------------------------

MAX_OVER_QUERIES = ("Your head is the one where a single query gives the key the most. The exercise asks for the "
                    "attention on the key averaged over all queries: take the column attentions[layer][0, head, :, "
                    "key] and its mean.")
ONE_QUERY = ("Your head is the one where the first query (usually [CLS]) gives the key the most. Average the "
             "column attentions[layer][0, head, :, key] over all the queries.")
ROW_NOT_COLUMN = ("You used the key's row (where that token looks) instead of its column (how much every query "
                  "gives it): the key is the last index, attentions[layer][0, head, :, key].")
WRONG_UNFLATTEN = ("Your flat index is turned back into (layer, head) with the wrong divisor: with the scores "
                   "stacked as [L, H], layer = index // H and head = index % H.")
FLAT_INDEX = "Your function returns one number; it should return the pair (layer, head)."


def _maps() -> tuple[torch.Tensor, ...]:
    """Three layers of ``[1, 4, 6, 6]`` weights in which each known mistake points at another head."""
    generator = torch.Generator().manual_seed(11)
    maps = torch.rand(3, 1, 4, 6, 6, generator=generator) * 0.2
    key = 4
    maps[2, 0, 1, :, key] += 1.0              # mean over queries: layer 2, head 1 (the answer)
    maps[0, 0, 3, 2, key] += 4.0              # one query looks very hard: layer 0, head 3
    maps[1, 0, 2, 0, key] += 3.0              # the first query: layer 1, head 2
    maps[1, 0, 0, key, :] += 1.5              # the key's own row: layer 1, head 0
    return tuple(maps)                        # rows need not sum to 1 here: the row mistake shows


#: What chapter 07's head exercise may not call: the course's own head finders.
HEAD_RULES = (
    Forbidden("attn_course.models.bert.analysis.strongest_head",
              "the exercise is to find the head yourself, from the attention maps"),
    Forbidden("attn_course.models.bert.analysis.attention_share",
              "the exercise is to find the head yourself, from the attention maps"),
)


def check_head_most_on(head_fn: Callable[[tuple[torch.Tensor, ...], int], object]) -> bool:
    """Check ``fn(attentions, key) -> (layer, head)``: the head giving ``key`` most attention (query mean).

    ``attentions`` is a tuple of ``L`` maps ``[1, H, N, N]`` built so that each usual mistake (the
    largest single weight, the first query only, the key's row instead of its column, the flat
    index unflattened with ``L`` instead of ``H``) picks a different head.

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: naming the mistake, or the head expected.

    Example (a wrong answer, and what it is told):
        >>> from attn_course.models.bert.analysis import strongest_head
        >>> check_head_most_on(lambda attentions, key: tuple(strongest_head(attentions, 0, key))[:2])
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_head_most_on: your answer calls strongest_head, which this ...
    """
    head_fn = watched("check_head_most_on", head_fn, HEAD_RULES)
    maps, key = _maps(), 4
    result = call_answer("check_head_most_on", head_fn, tuple(m.clone() for m in maps), key,
                         described="3 layers of [1, 4, 6, 6] maps and key=4")
    if isinstance(result, torch.Tensor):
        result = result.tolist()
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        raise CheckFailed(FLAT_INDEX)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise CheckFailed(f"Your function should return (layer, head), but it returned {result!r}.")
    try:
        got = tuple(int(v) for v in result)
    except (TypeError, ValueError):
        raise CheckFailed(f"Your (layer, head) should be two integers, got {result!r}.") from None
    stacked = torch.stack(maps)[:, 0]                                              # [L, H, N, N]
    expected = divmod(int(stacked[..., key].mean(-1).argmax()), stacked.shape[1])
    if got == expected:
        return True
    flat = int(stacked[..., key].mean(-1).argmax())
    mistakes = [
        (MAX_OVER_QUERIES, divmod(int(stacked[..., key].amax(-1).argmax()), stacked.shape[1])),
        (ONE_QUERY, divmod(int(stacked[..., 0, key].argmax()), stacked.shape[1])),
        (ROW_NOT_COLUMN, divmod(int(stacked[:, :, key, :].mean(-1).argmax()), stacked.shape[1])),
        (WRONG_UNFLATTEN, divmod(flat, stacked.shape[0])),
    ]
    for message, wrong in mistakes:
        if got == wrong:
            raise CheckFailed(message)
    raise CheckFailed(f"Your (layer, head) is {got}, but the head whose attention on key {key}, averaged over the "
                      f"queries, is largest is {expected}.")


# --- chapter 07, exercise 1: the average of the real tokens -------------------------------------

#: What chapter 07's mean-pooling exercise may not call: the course's own pooling.
MEAN_POOL_RULES = (
    Forbidden("attn_course.models.bert.analysis.mean_pool",
              "the statement asks you not to call mean_pool: average the real tokens yourself"),
)

DIVIDED_BY_N = ("Your averages leave the padding out of the sum but still divide by N, every position of the "
                "batch: a sequence with padding comes out too small (by its share of real tokens). Divide "
                "each sequence's sum by its own number of real tokens, the sum of its mask.")
PADDING_COUNTED = ("Your averages count the padding: they are the plain mean over all N positions. Multiply "
                   "the vectors by the mask before summing, and divide by the number of real tokens.")


def check_masked_mean(mean_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(hidden [B, N, E], attention_mask [B, N]) -> [B, E]``, the average of the real tokens.

    Called with a mask of integers, then of booleans; one sequence is whole, one has two
    padding positions and one is a single token. The expected averages are taken by slicing
    each sequence to its real tokens, in float64.

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: naming a call of ``mean_pool`` (:data:`MEAN_POOL_RULES`), the padding
            counted, a sum divided by N, a wrong shape, or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_masked_mean(lambda hidden, attention_mask: hidden.mean(dim=1))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your averages count the padding: they are the plain mean ...
    """
    mean_fn = watched("check_masked_mean", mean_fn, MEAN_POOL_RULES)
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 6, 4, generator=generator, dtype=torch.float64)        # [B, N, E]
    lengths = (6, 4, 1)
    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in lengths])                 # [B, N]
    expected = torch.stack([hidden[b, :n].mean(dim=0) for b, n in enumerate(lengths)])   # [B, E]
    for given in (mask, mask.bool()):
        got = call_student("check_masked_mean", mean_fn, hidden.clone(), given.clone())
        check_shape(got, expected, "Your averages")
        if same(got.double(), expected):
            continue
        summed = (hidden * mask[..., None]).sum(dim=1)                                  # [B, E]
        diagnose(got.double(), expected, [(PADDING_COUNTED, hidden.mean(dim=1)), (DIVIDED_BY_N, summed / 6)],
                 ("sequence", "feature"), "Your averages")
    return True
