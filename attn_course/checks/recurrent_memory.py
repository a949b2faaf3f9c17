"""Check chapter 13's prediction: which memory recalls more of what it stored, linear attention's sum or the delta rule.

The answer says, for ``P`` random unit keys and values of ``d = 32`` features written one after another, which
memory recalls more of a group of the pairs (all of them, the 8 written first, the 8 written last): linear
attention's state ``S = Σ k vᵀ``, or the delta rule's with ``β = 1`` (no decay), ``S ← S + k (v − Sᵀk)ᵀ``. A
key is read back as ``Sᵀk`` and decoded as the stored value nearest to it (largest dot product). It is a
prediction from the two update rules: the check refuses random numbers and the course's linear attention and
delta rule, runs the experiment itself (seeded, float64) and asks each question twice.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course.checks.diagnosis import CheckFailed, call_answer
from attn_course.checks.forbidden import RANDOM, Forbidden, forbid

__all__ = ["DIM", "GROUP", "QUESTIONS", "MEMORIES", "recall_shares", "check_memory_prediction"]

#: The keys' and values' width, d_k = d_v.
DIM = 32
#: How many pairs "oldest" and "newest" ask about.
GROUP = 8
#: The questions, ``(pairs, which)``: P = d, 2d and 4d; at P = d the newest pairs are left out (both memories
#: recall them all but a few percent, too close to call).
QUESTIONS = tuple((pairs, which) for pairs in (DIM, 2 * DIM, 4 * DIM) for which in ("all", "oldest", "newest")
                  if (pairs, which) != (DIM, "newest"))
#: The two answers.
MEMORIES = ("linear", "delta")

_PREDICT = ("a prediction follows from the two update rules: run no memory with the course's functions, draw no "
            "random numbers")
#: What the prediction may not do: store and recall with the course's memories, or run an experiment.
MEMORY_RULES = (Forbidden(RANDOM, _PREDICT),
                *forbid(_PREDICT, "attn_course.variants.delta_rule.gated_delta_rule",
                        "attn_course.variants.delta_rule._recurrent", "attn_course.variants.delta_rule._chunked",
                        "attn_course.variants.gated_deltanet.GatedDeltaNet",
                        "attn_course.variants.linear_attention.linear_attention",
                        "attn_course.variants.linear_attention.linear_attention_recurrent",
                        "attn_course.variants.linear_attention.linear_attention_parallel"))

NOT_A_MEMORY = "Your function should return 'linear' or 'delta', got {what}."
TWO_ANSWERS = ("Your function gave two different answers to the same question: it guesses instead of predicting. "
               "Return what follows from the two update rules.")
ALWAYS_DELTA = ("You pick the delta rule every time, as if a correction could only help. It does for the newest "
                "pairs: a write makes its own key recall its value exactly. But each correction, v − Sᵀk, carries "
                "what the key wrongly recalled as well, so it is usually longer than v, and writing it disturbs every "
                "older key that overlaps k: the oldest pairs fade first. Over all {pairs} pairs at P = d linear "
                "attention recalls {linear:.0%}, the delta rule {delta:.0%}. (A trained layer learns its keys and "
                "a β below 1; here the keys are random and β = 1.)")
ALWAYS_LINEAR = ("You pick linear attention every time. Its read-back is the value plus the crosstalk of every other "
                 "pair, Σ (k_j·k_i) v_j, the same for old and new pairs; the delta rule's newest pairs have had "
                 "little written after them, and the last one is recalled exactly. Of the {group} newest of "
                 "{pairs} pairs linear attention recalls {linear:.0%}, the delta rule {delta:.0%}.")
REVERSED = ("Every answer is the wrong way round: the delta rule keeps the newest pairs best (each write fixes its "
            "own key and disturbs the older ones), linear attention recalls all pairs alike, and better overall.")
EXACT_UP_TO_D = ("You expect linear attention to hold d pairs and then fail, and the delta rule to carry on. Linear "
                 "attention stores d pairs exactly only for orthogonal keys; with random keys each read-back is off "
                 "by crosstalk of size about √((P − 1)/d), which grows slowly: decoded to the nearest value it still "
                 "recalls {linear:.0%} of {pairs} pairs, the delta rule {delta:.0%}.")
DELTA_KEEPS_OLDEST = ("You expect the delta rule to keep its oldest pairs: it is the other way round. Every later "
                      "write disturbs an older key's read-back, and the delta rule's writes are the larger ones; of "
                      "the {group} oldest of {pairs} pairs it recalls {delta:.0%}, linear attention {linear:.0%}.")
WRONG_ONE = ("Asked about the {which} pairs of {pairs}, you answered {got!r}: the experiment recalls {linear:.0%} of "
             "them with linear attention, {delta:.0%} with the delta rule.")


def recall_shares(pairs: int, *, seed: int = 0, trials: int = 16) -> dict[str, tuple[float, float, float]]:
    """``{memory: (all, oldest, newest)}``: the share of pairs each memory recalls, over ``trials`` sets of ``pairs``
    random unit keys and values of :data:`DIM` features (float64, seeded), decoded to the nearest stored value;
    oldest and newest are the :data:`GROUP` pairs written first and last.

    Raises:
        TypeError, ValueError: ``pairs`` or ``trials`` not an int >= 1 (``pairs`` >= GROUP), ``seed`` not an int.

    Example:
        >>> shares = recall_shares(16, trials=2)
        >>> sorted(shares), len(shares["linear"])
        (['delta', 'linear'], 3)
    """
    where = "recall_shares"
    pairs = _validate.integer(where, "pairs", pairs, minimum=GROUP)
    trials = _validate.integer(where, "trials", trials, minimum=1)
    generator = torch.Generator().manual_seed(_validate.integer(where, "seed", seed))
    keys, values = (F.normalize(torch.randn(trials, pairs, DIM, generator=generator, dtype=torch.float64), dim=-1)
                    for _ in range(2))                                                  # [T, P, d] each
    summed = keys.transpose(-1, -2) @ values                                            # [T, d_k, d_v]: Σ k vᵀ
    corrected = torch.zeros(trials, DIM, DIM, dtype=torch.float64)
    for t in range(pairs):
        k, v = keys[:, t, :, None], values[:, t, :, None]                               # [T, d, 1]
        corrected = corrected + k @ (v - corrected.transpose(-1, -2) @ k).transpose(-1, -2)
    shares = {}
    for name, state in (("linear", summed), ("delta", corrected)):
        read = keys @ state                                                             # [T, P, d_v]: Sᵀk per pair
        right = ((read @ values.transpose(-1, -2)).argmax(-1) == torch.arange(pairs)).double()   # [T, P]
        shares[name] = (right.mean().item(), right[:, :GROUP].mean().item(), right[:, -GROUP:].mean().item())
    return shares


def _ask(memory_fn: Callable, pairs: int, which: str) -> str:
    """The answer to one question, asked twice (the same both times), insisting on a memory's name."""
    replies = [call_answer("check_memory_prediction", memory_fn, pairs, which, forbidden=MEMORY_RULES,
                           described=f"pairs={pairs}, which={which!r}") for _ in range(2)]
    for reply in replies:
        if reply not in MEMORIES:
            raise CheckFailed(NOT_A_MEMORY.format(what=repr(reply)[:80]))
    if replies[0] != replies[1]:
        raise CheckFailed(TWO_ANSWERS)
    return replies[0]


def check_memory_prediction(memory_fn: Callable[[int, str], str], *, seed: int = 0) -> bool:
    """Check ``fn(pairs, which) -> "linear" | "delta"``: the memory that recalls more of the ``which`` pairs
    (``"all"``, ``"oldest"``, ``"newest"``) of ``pairs`` stored, for every question of :data:`QUESTIONS`, asked in
    an order shuffled by ``seed``, each twice; the truth is :func:`recall_shares` with that seed.

    Raises:
        TypeError: ``memory_fn`` not callable, ``seed`` not an int.
        CheckFailed: naming an answer that is no memory, two answers to one question, the delta rule everywhere,
            linear attention everywhere, every answer reversed, linear attention failing past d pairs, the delta
            rule keeping its oldest pairs, or a wrong answer with the recall of both memories.

    Example (a wrong answer, and what it is told):
        >>> check_memory_prediction(lambda pairs, which: "delta")
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You pick the delta rule every time, as if a correction could ...
    """
    where = "check_memory_prediction"
    if not callable(memory_fn):
        raise TypeError(f"{where}: expected your function, got {type(memory_fn).__name__}")
    seed = _validate.integer(where, "seed", seed)
    shares = {pairs: recall_shares(pairs, seed=seed) for pairs in sorted({pairs for pairs, _ in QUESTIONS})}
    column = {"all": 0, "oldest": 1, "newest": 2}
    share = {(p, w): (shares[p]["linear"][column[w]], shares[p]["delta"][column[w]]) for p, w in QUESTIONS}
    truth = {question: MEMORIES[int(delta > linear)] for question, (linear, delta) in share.items()}
    order = torch.randperm(len(QUESTIONS), generator=torch.Generator().manual_seed(seed))
    answers = {QUESTIONS[int(i)]: _ask(memory_fn, *QUESTIONS[int(i)]) for i in order}
    if answers == truth:
        return True
    def said(message: str, pairs: int, which: str) -> str:
        linear, delta = share[pairs, which]
        return message.format(pairs=pairs, which=which, group=GROUP, linear=linear, delta=delta,
                              got=answers.get((pairs, which)))

    if set(answers.values()) == {"delta"}:
        raise CheckFailed(said(ALWAYS_DELTA, DIM, "all"))
    if set(answers.values()) == {"linear"}:
        raise CheckFailed(said(ALWAYS_LINEAR, 4 * DIM, "newest"))
    if all(answers[q] != truth[q] for q in QUESTIONS):
        raise CheckFailed(REVERSED)
    if all(answers[p, w] == ("linear" if p <= DIM else "delta") for p, w in QUESTIONS):
        raise CheckFailed(said(EXACT_UP_TO_D, 2 * DIM, "all"))
    oldest = [(p, w) for p, w in QUESTIONS if w == "oldest" and answers[p, w] != truth[p, w]]
    if oldest:
        raise CheckFailed(said(DELTA_KEEPS_OLDEST, *oldest[-1]))
    raise CheckFailed(said(WRONG_ONE, *next(q for q in QUESTIONS if answers[q] != truth[q])))
