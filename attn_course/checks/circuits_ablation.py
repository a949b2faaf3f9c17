"""Check chapter 11's prediction: which head's ablation hurts most, predicted from the heads' scores alone.

The check measures, on the chapter's cached model (seed 0), every head's scores on repeated random tokens and
how much zeroing it raises the loss on the repeated half. A model's heads have no order, so the model is shown
to the answer with its heads shuffled within each layer, scores and losses alike: a prediction has to follow
from the scores.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable

import torch

from attn_course._threads import one_thread
from attn_course.checks.diagnosis import CheckFailed, call_answer
from attn_course.checks.forbidden import RANDOM, Forbidden, forbid
from attn_course.circuits.ablation import ablate_head
from attn_course.circuits.losses import repeated_span, span_loss
from attn_course.circuits.recording import record_patterns
from attn_course.circuits.scores import induction_score, previous_token_score
from attn_course.circuits.trained import load_trained, trained_seeds
from attn_course.data.repeated_tokens import repeated_random_tokens

__all__ = ["check_ablation_prediction", "ablation_effects"]

_PREDICT = "a prediction follows from the scores alone: run no model, ablate nothing, draw no random numbers"
#: What the prediction may not do: measure what it predicts.
ABLATION_RULES = (Forbidden(RANDOM, _PREDICT),
                  *forbid(_PREDICT, "attn_course.circuits.ablation.ablate_head",
                          "attn_course.circuits.ablation.patch_head",
                          "attn_course.models.attention_only.AttentionOnlyTransformer",
                          "attn_course.circuits.trained.load_trained", "attn_course.circuits.trained.load_model",
                          "attn_course.circuits.training.train_induction_model"))
#: A head counts as "hurting most" when its ablation costs at least this share of the worst one's.
NEAR_WORST = 0.9

NOT_A_HEAD = "Your prediction should be (layer, head), two ints, got {what}."
NO_SUCH_HEAD = "There is no layer {layer}, head {head}: the model has {layers} layers of {heads} heads, counted from 0."
TWO_ANSWERS = ("Your function gave two different answers for the same scores: it guesses or measures instead of "
               "predicting. Return what follows from the scores.")
FIXED_HEAD = ("You name layer {layer}, head {head} whatever the scores. The check shuffles the heads within each "
              "layer (their order means nothing), so that position holds a different head each time: predict from "
              "the scores which head it is.")
SWAPPED = "You return (head, layer); the check wants (layer, head)."
WRONG = ("You named layer {layer}, head {head} (previous-token score {prev:.2f}, induction score {ind:.2f}): "
         "zeroing it raised the loss on the repeated half by {rise:.2f} nats. Zeroing layer {best_layer}, "
         "head {best_head} (previous-token score {best_prev:.2f}, induction score {best_ind:.2f}) raised it by "
         "{best_rise:.2f}.")
TOP_INDUCTION = (" You picked the head that copies best. How many heads of its layer copy too, and what do all of "
                 "them need, at the earlier copy, to find it?")


@functools.cache
def ablation_effects(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(previous-token scores, induction scores, loss rises)``, each ``[L, H]``, of the cached model of ``seed``:
    the course's scores averaged over 64 sequences of 20 random tokens repeated, and how much zeroing each head
    raises the loss of the repeated half (nats). Computed once per seed."""
    model = load_trained(seed)
    layers, heads, half = model.config.n_layers, model.config.n_heads, model.config.max_len // 2
    draws = torch.Generator().manual_seed(2024 + seed)
    tokens = repeated_random_tokens(64, half, model.config.vocab_size, generator=draws)          # [64, 2L]
    with one_thread():
        patterns = record_patterns(model, tokens)                                  # {layer: [B, H, N, N]}
    previous = torch.stack([previous_token_score(patterns[layer]).mean(0) for layer in range(layers)])        # [L, H]
    induction = torch.stack([induction_score(patterns[layer], half).mean(0) for layer in range(layers)])
    span = repeated_span(half)
    rises = torch.zeros(layers, heads, dtype=torch.float64)
    with one_thread():                                          # small runs: a second thread mostly waits
        intact = span_loss(model, tokens, span)
        for layer in range(layers):
            for head in range(heads):
                with ablate_head(model, layer, head):
                    rises[layer, head] = span_loss(model, tokens, span) - intact
    return previous.float(), induction.float(), rises


def _as_head(answer: object) -> tuple[int, int]:
    if isinstance(answer, torch.Tensor) and answer.numel() == 2 and not answer.is_floating_point() \
            and answer.dtype != torch.bool:
        answer = answer.flatten().tolist()
    if isinstance(answer, (tuple, list)) and len(answer) == 2:
        items = [item.item() if isinstance(item, torch.Tensor) and item.numel() == 1 else item for item in answer]
        if all(isinstance(item, numbers.Integral) and not isinstance(item, bool) for item in items):
            return int(items[0]), int(items[1])
    what = f"a tensor of shape {list(answer.shape)}" if isinstance(answer, torch.Tensor) else repr(answer)[:80]
    raise CheckFailed(NOT_A_HEAD.format(what=what))


def check_ablation_prediction(predict_fn: Callable, *, seed: int = 0, shuffles: int = 4,
                              models: tuple[int, ...] = (0,)) -> bool:
    """Check ``fn(previous_token_scores [L, H], induction_scores [L, H]) -> (layer, head)``: the head whose zero
    ablation raises the loss on the repeated half the most, predicted from the scores alone.

    The cached model of each seed in ``models`` is shown ``shuffles`` times (its own order, then heads
    shuffled within each layer by ``seed``), each asked twice; the head named must cost at least
    :data:`NEAR_WORST` of the worst head's cost.

    Raises:
        TypeError: ``predict_fn`` not callable. FileNotFoundError: the cached models are missing.
        CheckFailed: naming an answer that is not ``(layer, head)``, a head that does not exist, two
            answers for one question, one head whatever the scores, ``(head, layer)``, or the head
            named with what its ablation cost against the worst head's.

    Example (a wrong answer, and what it is told):
        >>> check_ablation_prediction(lambda previous, induction: (1, 0))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You name layer 1, head 0 whatever the scores. The check shuffles ...
    """
    where = "check_ablation_prediction"
    if not callable(predict_fn):
        raise TypeError(f"{where}: expected your function, got {type(predict_fn).__name__}")
    seeds = [model_seed for model_seed in models if model_seed in trained_seeds()]
    if not seeds or len(seeds) != len(models):   # nothing to measure against: never pass by default
        raise FileNotFoundError(f"{where}: the package's cached models {models} are missing "
                                f"(attn_course/circuits/trained/ holds {trained_seeds()})")
    shuffler = torch.Generator().manual_seed(seed)
    answers, wrong = set(), None
    for model_seed in seeds:
        previous, induction, rises = ablation_effects(model_seed)
        layers, heads = rises.shape
        for shuffle in range(shuffles):
            order = torch.stack([torch.arange(heads) if shuffle == 0 else torch.randperm(heads, generator=shuffler)
                                 for _ in range(layers)])                                          # [L, H]
            shown = [values.gather(1, order) for values in (previous, induction, rises)]   # h shows order[l, h]
            replies = [_as_head(call_answer(where, predict_fn, shown[0], shown[1],
                                            forbidden=ABLATION_RULES,
                                            described="previous-token and induction scores [L, H]"))
                       for _ in range(2)]
            if replies[0] != replies[1]:
                raise CheckFailed(TWO_ANSWERS)
            layer, head = replies[0]
            answers.add((layer, head))
            cost = shown[2]
            if not (0 <= layer < layers and 0 <= head < heads):
                if 0 <= head < layers and 0 <= layer < heads and cost[head, layer] >= NEAR_WORST * cost.max():
                    raise CheckFailed(SWAPPED)
                raise CheckFailed(NO_SUCH_HEAD.format(layer=layer, head=head, layers=layers, heads=heads))
            if cost[layer, head] < NEAR_WORST * cost.max() and wrong is None:
                wrong = (shown, layer, head)
    if wrong is None:
        return True
    (prev, ind, cost), layer, head = wrong
    if len(answers) == 1:
        raise CheckFailed(FIXED_HEAD.format(layer=layer, head=head))
    if head < cost.shape[0] and layer < cost.shape[1] and cost[head, layer] >= NEAR_WORST * cost.max():
        raise CheckFailed(SWAPPED)
    best_layer, best_head = divmod(int(cost.argmax()), cost.shape[1])
    message = WRONG.format(layer=layer, head=head, prev=prev[layer, head], ind=ind[layer, head], rise=cost[layer, head],
                           best_layer=best_layer, best_head=best_head, best_prev=prev[best_layer, best_head],
                           best_ind=ind[best_layer, best_head], best_rise=cost[best_layer, best_head])
    if (layer, head) == divmod(int(ind.argmax()), ind.shape[1]):
        message += TOP_INDUCTION
    raise CheckFailed(message)
