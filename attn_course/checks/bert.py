"""Check chapter 08's exercises: BERT's 80/10/10 corruption and what the model sees of it, the
masked-language-model loss, the parking head."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer, call_student, check_shape, name_mistake, watched
from attn_course.checks.forbidden import RANDOM, Forbidden
from attn_course.models.bert.masking import IGNORE_INDEX

__all__ = ["check_corruption", "check_unchanged_share", "check_mlm_loss", "check_head_most_on"]

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


#: What chapter 08's find-the-bug exercise may not call: the course's own loss.
MLM_LOSS_RULES = (
    Forbidden("attn_course.models.bert.masked_lm.masked_lm_loss",
              "the statement asks you not to call masked_lm_loss: fix the classmate's loss"),
)


def check_mlm_loss(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(logits [B, N, V], labels [B, N]) -> scalar``: the mean, over the positions whose label is not
    -100, of ``-log softmax(logits)[label]``.

    Raises:
        CheckFailed: naming the mistake (every position averaged, the wrong denominator, a sum, a mean of
            per-sequence means, raw scores instead of log-probabilities), or the expected and the returned value.

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
        got = _as_number(call_answer("check_mlm_loss", loss_fn, logits, labels,
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
        name_mistake(got, mistakes, lambda got, value: abs(got - value) <= 1e-5 * max(1.0, abs(value)))
        raise CheckFailed(f"Your loss is {got:.4f} where the mean cross-entropy over the chosen positions is "
                          f"{expected:.4f}. Hint: -log softmax(logits)[label], averaged over the positions whose "
                          f"label is not -100.")
    return True


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


#: What chapter 08's head exercise may not call: the course's own head finders.
HEAD_RULES = (
    Forbidden("attn_course.models.bert.analysis.strongest_head",
              "the exercise is to find the head yourself, from the attention maps"),
    Forbidden("attn_course.models.bert.analysis.attention_share",
              "the exercise is to find the head yourself, from the attention maps"),
)


def check_head_most_on(head_fn: Callable[[tuple[torch.Tensor, ...], int], object]) -> bool:
    """Check ``fn(attentions, key) -> (layer, head)``: the head giving ``key`` most attention (query mean), on
    ``L`` maps ``[1, H, N, N]`` in which each usual mistake picks a different head.

    Raises:
        CheckFailed: naming the mistake (the largest single weight, the first query only, the key's row
            instead of its column, the flat index unflattened with ``L``), or the head expected.

    Example (a wrong answer, and what it is told):
        >>> from attn_course.models.bert.analysis import strongest_head
        >>> check_head_most_on(lambda attentions, key: tuple(strongest_head(attentions, 0, key))[:2])
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_head_most_on: your answer calls strongest_head, which this ...
    """
    head_fn = watched("check_head_most_on", head_fn, HEAD_RULES)
    maps, key = _maps(), 4
    result = call_answer("check_head_most_on", head_fn, maps, key,
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
    name_mistake(got, mistakes)
    raise CheckFailed(f"Your (layer, head) is {got}, but the head whose attention on key {key}, averaged over the "
                      f"queries, is largest is {expected}.")


#: What chapter 08's corruption exercise may not call: the course's own corruption.
CORRUPTION_RULES = (
    Forbidden("attn_course.models.bert.masking.mask_tokens",
              "the statement asks you not to call mask_tokens: apply the 80/10/10 rule yourself"),
)

NOT_CHOSEN_CHANGED = ("Your function changes positions that were not chosen ({share:.0%} of them): the "
                      "80/10/10 rule applies to the chosen positions only, and every other token must reach "
                      "the model as it was. Draw the fate of every position if you like, but use it only "
                      "where chosen is True.")
ALL_MASKED = ("Your function turns every chosen token into [MASK] ({share:.0%} of them). BERT's rule is "
              "80% [MASK], 10% a random token, 10% left unchanged, so that [MASK] does not mark every "
              "position the model is asked about.")
SPECIALS_DRAWN = ("Your random replacements include special tokens (ids {ids} appeared): draw the random "
                  "token from the ordinary ids only, those in 0..vocab_size-1 that are not in special_ids.")
OUT_OF_RANGE = "Your function returns ids outside 0..{top}: every id must be a token of the vocabulary."
NOT_VARIED = ("Your random replacements are always among a few ids ({count} different ones): draw each one "
              "uniformly from all the ordinary ids.")
IGNORES_GENERATOR = ("Your function gives two different results for the same seed: draw every random number "
                     "from generator = torch.Generator().manual_seed(seed) (torch.rand(shape, generator=generator), "
                     "torch.randint(..., generator=generator)), so that a seed gives one result.")
WRONG_SHARES = ("Of the chosen positions, yours sent {mask:.0%} to [MASK], {other:.0%} to another token and "
                "left {same:.0%} unchanged: BERT's rule gives about 80%, 10% and 10% (a random token is "
                "the original again once in a while, so slightly more than 10% stay the same).")


def _corruption_inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[200, 50]`` ids (``[CLS]`` 2 first, ``[SEP]`` 3 last, some ``[PAD]`` 0) and about half of the words chosen."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (200, 50), generator=generator)                         # [B, N] ordinary words
    ids[:, 0], ids[:, -1], ids[150:, -10:] = 2, 3, 0
    chosen = (torch.rand(ids.shape, generator=generator) < 0.5) & (ids >= 5)          # [B, N]
    return ids, chosen


def check_corruption(corrupt_fn: Callable[..., torch.Tensor]) -> bool:
    """Check ``fn(input_ids, chosen, mask_id, special_ids, vocab_size, seed) -> [B, N]``, the 80/10/10 rule.

    Called on ``[200, 50]`` ids of a 40-token vocabulary (ids 0-4 special, 4 = ``[MASK]``), about half of
    the ordinary tokens chosen: every unchosen token must come back as it was, and of the chosen ones about
    80% must be ``[MASK]``, 10% a random ordinary token and 10% unchanged (each within 4 points). The same
    seed must give the same result.

    Raises:
        CheckFailed: naming a call of ``mask_tokens`` (:data:`CORRUPTION_RULES`), positions changed
            that were not chosen, every chosen token masked, special tokens drawn as random
            replacements, replacements that are not varied, shares other than 80/10/10, or a result
            that ignores the seed.

    Example (a wrong answer, and what it is told):
        >>> check_corruption(lambda input_ids, chosen, mask_id, special_ids, vocab_size, seed:
        ...                  torch.where(chosen, mask_id, input_ids))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your function turns every chosen token into [MASK] (100% of ...
    """
    corrupt_fn = watched("check_corruption", corrupt_fn, CORRUPTION_RULES)
    specials, mask_id, vocab_size = [0, 1, 2, 3, 4], 4, 40
    ids, chosen = _corruption_inputs(3)

    def run(seed: int) -> torch.Tensor:
        got = call_student("check_corruption", corrupt_fn, ids, chosen, mask_id, list(specials), vocab_size, seed)
        if type(got) is torch.Tensor and (got.dtype.is_floating_point or got.dtype == torch.bool or got.is_complex()):
            raise CheckFailed(f"Your corrupted ids are {got.dtype}; token ids are integers (torch.long).")
        check_shape(got, ids, "Your corrupted ids")
        return got.long()

    got = run(12)
    if got.min() < 0 or got.max() >= vocab_size:
        raise CheckFailed(OUT_OF_RANGE.format(top=vocab_size - 1))
    changed = got != ids                                                                # [B, N]
    if changed[~chosen].any():
        raise CheckFailed(NOT_CHOSEN_CHANGED.format(share=changed[~chosen].double().mean().item()))
    picked = got[chosen]                                                                # [M]
    masked = (picked == mask_id).double().mean().item()
    if masked > 0.95:
        raise CheckFailed(ALL_MASKED.format(share=masked))
    others = picked[(picked != mask_id) & changed[chosen]]                              # the random replacements
    drawn_specials = sorted(set(others.tolist()) & set(specials))
    if drawn_specials:
        raise CheckFailed(SPECIALS_DRAWN.format(ids=", ".join(map(str, drawn_specials))))
    other, same_share = changed[chosen].double().mean().item() - masked, (~changed[chosen]).double().mean().item()
    if abs(masked - 0.8) > 0.04 or abs(other - 0.1) > 0.04 or abs(same_share - 0.1) > 0.04:
        raise CheckFailed(WRONG_SHARES.format(mask=masked, other=other, same=same_share))
    if len(set(others.tolist())) < 25:
        raise CheckFailed(NOT_VARIED.format(count=len(set(others.tolist()))))
    if not torch.equal(run(12), got):
        raise CheckFailed(IGNORES_GENERATOR)
    return True


#: What chapter 08's prediction may not do: sample the share instead of predicting it.
SHARE_RULES = (
    Forbidden(RANDOM, "the statement asks for a formula: predict the share, do not sample it"),
    Forbidden("attn_course.models.bert.masking.mask_tokens",
              "the statement asks for a formula: predict the share, do not sample it"),
)

ONLY_KEPT = ("Your share is 0.1, the tokens the rule leaves alone. A random replacement is drawn uniformly from "
             "the n_ordinary ordinary tokens, so it is the original token again with probability 1 / n_ordinary: "
             "that adds 0.1 / n_ordinary.")
RANDOM_AS_KEPT = ("Your share counts every random replacement as unchanged (0.1 + 0.1): only one in n_ordinary "
                  "of them draws the original token back.")
NO_KEPT = ("Your share counts only the random draws that hit the original token, 0.1 / n_ordinary: the 10% "
           "that the rule leaves as they are come on top.")


def check_unchanged_share(share_fn: Callable[[int], object]) -> bool:
    """Check ``fn(n_ordinary) -> float``: the expected share of chosen tokens seen unchanged, ``0.1 + 0.1 / n``
    (kept by the rule, or drawn back as the random replacement), at ``n`` = 51, 4 and 1.

    Raises:
        CheckFailed: naming random numbers drawn (:data:`SHARE_RULES`), the random coincidences left
            out, every random replacement counted, the kept tokens left out, or the expected and the
            returned value.

    Example (a wrong answer, and what it is told):
        >>> check_unchanged_share(lambda n_ordinary: 0.1)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your share is 0.1, the tokens the rule leaves alone. ...
    """
    share_fn = watched("check_unchanged_share", share_fn, SHARE_RULES)
    for n in (51, 4, 1):
        got = call_answer("check_unchanged_share", share_fn, n, described=f"n_ordinary={n}")
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise CheckFailed(f"Your share should be a number, but for n_ordinary={n} it is a {type(got).__name__}.")
        expected = 0.1 + 0.1 / n
        if abs(got - expected) <= 1e-6:
            continue
        name_mistake(got, ((ONLY_KEPT, 0.1), (RANDOM_AS_KEPT, 0.2), (NO_KEPT, 0.1 / n)),
                     lambda got, value: abs(got - value) <= 1e-6)
        raise CheckFailed(f"For n_ordinary={n} your share is {got:.4f}; the expected share is {expected:.4f}. Hint: "
                          f"the tokens the rule keeps, plus the random replacements that draw the original back.")
    return True
