"""Check chapter 12's prediction: which of the four published layouts keeps the smallest cache at 128k tokens.

The chapter shows the four models' caches at 4,096 tokens and how each kind of layer grows: a full layer with
every token, a sliding layer up to its window and no further, a linear-attention layer not at all. The answer
orders any of the four models by their cache at 131,072 tokens, smallest first, from that reasoning: it may
not count the caches with the course's functions (the check refuses them, and random numbers). The check
counts them itself (:func:`~attn_course.variants.layout_cache_size.cache_elements_by_layout`), shows the answer
the four names in shuffled orders and every pair of them, and asks each question twice.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer
from attn_course.checks.forbidden import RANDOM, Forbidden, forbid
from attn_course.variants.layout_cache_size import PUBLISHED_CONFIGS, cache_elements_by_layout, published_config

__all__ = ["TOKENS", "ORDER_AT_4K", "check_cache_ranking", "cache_sizes"]

#: The sequence the prediction is about: 128k tokens.
TOKENS = 131072
#: The order of the chapter's table at 4,096 tokens, smallest first.
ORDER_AT_4K = ("qwen3-next-80b-a3b-instruct", "gpt-oss-120b", "qwen3-8b", "gemma-3-27b-it")

_PREDICT = ("a prediction follows from how each kind of layer grows: count no cache with the course's functions, "
            "draw no random numbers")
_LAYOUT = "attn_course.variants.layout_cache_size."
_SIZES = "attn_course.variants.kv_cache_size."
#: What the prediction may not do: count the caches it predicts.
RANKING_RULES = (Forbidden(RANDOM, _PREDICT),
                 *forbid(_PREDICT, *(_LAYOUT + name for name in (
                     "cache_elements_by_layout", "layer_kinds", "linear_state_elements", "published_config",
                     "LayoutCache", "_kinds", "_linear_state", "_text_config", "_field")),
                         *(_SIZES + name for name in (
                             "cache_size_from_config", "CacheSize", "mha_cache_elements", "gqa_cache_elements",
                             "mqa_cache_elements", "mla_cache_elements", "cache_reduction", "cache_bytes_rows",
                             "_kv_heads", "_key_value"))))

NOT_NAMES = ("Your function should return a list of the names it was given, smallest cache first, got {what}. "
             "The names are those of PUBLISHED_CONFIGS, such as 'qwen3-8b'.")
OTHER_NAMES = ("Asked to order {asked}, you returned {got}: return exactly the names you were given (each once), "
               "ordered, not a fixed list.")
TWO_ANSWERS = ("Your function gave two different orders for the same names: it guesses instead of predicting. "
               "Return what follows from the layouts.")
AS_GIVEN = ("You return the names in the order they came: the check shuffles them. Put the model with the smallest "
            "cache at 128k tokens first.")
LARGEST_FIRST = "You order the models largest cache first; the check wants the smallest first."
KEPT_4K = ("You kept the order of the table at 4,096 tokens (or let every layer grow with N, which gives the same "
           "order). At 131,072 tokens only the full layers still grow: Gemma 3's 52 sliding layers stopped at "
           "1,023 tokens, and only its 10 global layers keep growing (2 · 16 · 128 = 4,096 numbers per token each), "
           "while all 36 of Qwen3-8B's layers grow (2 · 8 · 128 = 2,048 each). Where do the two cross?")
FIXED_STATE_LARGE = ("You put gpt-oss before Qwen3-Next. At 128k both are decided by their full layers: Qwen3-Next's "
                     "12 keep 2 · 2 · 256 = 1,024 numbers per token each, gpt-oss's 18 keep 2 · 8 · 64 = 1,024 each. "
                     "The 36 linear-attention states (some 20 million numbers in all) and gpt-oss's 128-token windows "
                     "do not grow: beside billions of cached numbers they no longer matter.")
LINEAR_GROWS = ("You let Qwen3-Next's 36 linear-attention (Gated DeltaNet) layers grow with the sequence, like full "
                "ones. A linear-attention layer keeps a state of fixed size whatever N: only its 12 full layers grow.")
WRONG_PAIR = ("Asked to order {asked}, you returned {got}: at 131,072 tokens {small} keeps {small_gb:.1f} GB per "
              "sequence in bf16, {large} {large_gb:.1f} GB.")
INCONSISTENT = ("Asked to order {asked}, you returned {got}, yet you order every pair of them right: an order of "
                "four is the order of its pairs. Sort the names by one predicted size per model.")


def cache_sizes(tokens: int = TOKENS) -> dict[str, int]:
    """``{name: elements}`` of each published config's cache for one sequence of ``tokens`` tokens."""
    return {name: cache_elements_by_layout(published_config(name), tokens).elements for name in PUBLISHED_CONFIGS}


def _as_names(answer: object) -> list[str]:
    if isinstance(answer, (list, tuple)) and all(isinstance(name, str) for name in answer):
        return list(answer)
    raise CheckFailed(NOT_NAMES.format(what=repr(answer)[:80]))


def _ask(rank_fn: Callable, names: Sequence[str]) -> list[str]:
    """The answer's order of ``names``, asked twice (the same both times), insisting on those names."""
    replies = [_as_names(call_answer("check_cache_ranking", rank_fn, list(names), forbidden=RANKING_RULES,
                                     described=f"the names {list(names)}")) for _ in range(2)]
    if replies[0] != replies[1]:
        raise CheckFailed(TWO_ANSWERS)
    if sorted(replies[0]) != sorted(names):
        raise CheckFailed(OTHER_NAMES.format(asked=list(names), got=replies[0]))
    return replies[0]


def _full_order_mistake(got: list[str], truth: list[str], asked: list[str]) -> str | None:
    """The mistake a wrong order of all four names shows, or None."""
    if got == truth[::-1]:
        return LARGEST_FIRST
    if got == asked:
        return AS_GIVEN
    if got == list(ORDER_AT_4K):
        return KEPT_4K
    if got.index("gpt-oss-120b") < got.index("qwen3-next-80b-a3b-instruct") and \
            [name for name in got if name != "qwen3-next-80b-a3b-instruct"] == \
            [name for name in truth if name != "qwen3-next-80b-a3b-instruct"]:
        return FIXED_STATE_LARGE if got.index("qwen3-next-80b-a3b-instruct") == 1 else LINEAR_GROWS
    return None


def check_cache_ranking(rank_fn: Callable[[list[str]], Sequence[str]], *, seed: int = 0, shuffles: int = 3) -> bool:
    """Check ``fn(names) -> names``: any of :data:`~attn_course.variants.layout_cache_size.PUBLISHED_CONFIGS`, ordered
    by the cache each model keeps for one sequence of 131,072 tokens, smallest first; predicted, not counted.

    The four names come in ``shuffles`` orders (shuffled by ``seed``), then every pair of them both ways; each
    question is asked twice.

    Raises:
        TypeError: ``rank_fn`` not callable.
        CheckFailed: naming an answer that is not a list of the names given, two answers to one question, the
            names returned as given, the largest first, the order at 4,096 tokens, gpt-oss before Qwen3-Next
            (fixed states taken for large, or linear layers that grow), or a pair in the wrong order with both
            caches.

    Example (a wrong answer, and what it is told):
        >>> order = ["qwen3-next-80b-a3b-instruct", "gpt-oss-120b", "qwen3-8b", "gemma-3-27b-it"]
        >>> check_cache_ranking(lambda names: sorted(names, key=order.index))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You kept the order of the table at 4,096 tokens (or let every ...
    """
    where = "check_cache_ranking"
    if not callable(rank_fn):
        raise TypeError(f"{where}: expected your function, got {type(rank_fn).__name__}")
    sizes = cache_sizes()
    shuffler = torch.Generator().manual_seed(seed)
    wrong = None
    for _ in range(shuffles):
        asked = [PUBLISHED_CONFIGS[int(i)] for i in torch.randperm(len(PUBLISHED_CONFIGS), generator=shuffler)]
        truth = sorted(asked, key=sizes.get)
        got = _ask(rank_fn, asked)
        if got != truth:
            mistake = _full_order_mistake(got, truth, asked)
            if mistake is not None:
                raise CheckFailed(mistake)
            wrong = (asked, got)                      # the pairs below say which two are the wrong way round
            break
    for pair in itertools.permutations(PUBLISHED_CONFIGS, 2):
        got = _ask(rank_fn, pair)
        small, large = sorted(pair, key=sizes.get)
        if got != [small, large]:
            raise CheckFailed(WRONG_PAIR.format(asked=list(pair), got=got, small=small, large=large,
                                                small_gb=sizes[small] * 2 / 1e9, large_gb=sizes[large] * 2 / 1e9))
    if wrong is not None:
        raise CheckFailed(INCONSISTENT.format(asked=wrong[0], got=wrong[1]))
    return True
