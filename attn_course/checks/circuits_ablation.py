"""Check chapter 11's prediction: which head's ablation hurts most, predicted from the heads' scores alone.

The check measures, on the chapter's cached models (seeds 0, 1 and 6: a previous-token route, a duplicate-token
route, and both grown, the previous-token head the one the model relies on), every head's three scores on the
data they were trained on and how much zeroing it raises the loss on the repeat; and again on each model with
one harmless layer-0 head made dead (its queries, keys and output zeroed: it attends uniformly and writes
nothing). The heads are shown to the answer shuffled within each layer, scores and losses alike: a prediction
has to follow from the scores, and a rule that fits one model (the strongest previous-token head, or
duplicate-token head, or the layer-0 head with the lowest induction score, which a head focused on one key has
on seeds 0 and 1) fails on another.
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
from attn_course.circuits.losses import span_loss
from attn_course.circuits.recording import record_patterns
from attn_course.circuits.scores import duplicate_token_score, induction_score, previous_token_score
from attn_course.circuits.trained import load_trained, trained_seeds
from attn_course.circuits.training import InductionSetup

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
#: The models the check asks about: the cached seeds of the two routes, and one that grew both.
MODELS = (0, 1, 6)

NOT_A_HEAD = "Your prediction should be (layer, head), two ints, got {what}."
NO_SUCH_HEAD = "There is no layer {layer}, head {head}: the model has {layers} layers of {heads} heads, counted from 0."
TWO_ANSWERS = ("Your function gave two different answers for the same scores: it guesses or measures instead of "
               "predicting. Return what follows from the scores.")
FIXED_HEAD = ("You name layer {layer}, head {head} whatever the scores. The check shuffles the heads within each "
              "layer (their order means nothing), so that position holds a different head each time: predict from "
              "the scores which head it is.")
SWAPPED = "You return (head, layer); the check wants (layer, head)."
WRONG = ("On seed {seed}'s model{dead}, you named layer {layer}, head {head} (previous-token {prev:.2f}, "
         "duplicate-token {dup:.2f}, induction {ind:.2f}): zeroing it raised the loss on the repeat by "
         "{rise:.2f} nats. Zeroing layer {best_layer}, head {best_head} (previous-token {best_prev:.2f}, "
         "duplicate-token {best_dup:.2f}, induction {best_ind:.2f}) raised it by {best_rise:.2f}.")
DEAD = " with one layer-0 head made dead (queries, keys and output zeroed)"
TOP_INDUCTION = (" You picked the head that copies best. How many heads of its layer copy too, and what do all of "
                 "them need, at the earlier copy, to find it?")
DEAD_PICKED = (" That head is the dead one: it attends evenly and writes nothing, so removing it changes nothing. "
               "Which scores say what a layer-0 head does for layer 1?")
LOWEST_INDUCTION = (" You picked layer 0's lowest induction score. A head that attends sharply to one key has little "
                    "weight left for i − P + 1, whichever key that is: a low induction score does not say what a "
                    "layer-0 head does for layer 1.")
ONE_ROUTE = (" You looked at one of layer 0's scores only, and this model has no {kind} head (at most {best:.2f}): "
             "how else can a layer-1 head find the earlier copy of the current token?")


@functools.cache
def ablation_effects(seed: int, dead_head: int | None = None) -> tuple[torch.Tensor, ...]:
    """``(previous-token, duplicate-token and induction scores, loss rises)``, each ``[L, H]``, of the cached model
    of ``seed``, with layer-0 head ``dead_head`` (if given) made dead: its query, key and output weights zeroed.
    The course's scores averaged over 48 sequences of the data it was trained on (a segment said twice at a
    random place), and how much zeroing each head raises the loss of the repeat's predictable tokens (nats).
    Computed once per model."""
    model = load_trained(seed)
    layers, heads = model.config.n_layers, model.config.n_heads
    if dead_head is not None:
        attention = model.layers[0].attention
        rows = slice(dead_head * attention.head_dim, (dead_head + 1) * attention.head_dim)
        with torch.no_grad():
            attention.q_proj.weight[rows] = 0.0                      # equal logits: uniform causal attention
            attention.k_proj.weight[rows] = 0.0
            attention.out_proj.weight[:, rows] = 0.0                 # and nothing written to the stream
    batch = InductionSetup().repeats(48, torch.Generator().manual_seed(2024 + seed))   # the data it was trained on
    tokens, span = batch.tokens, batch.predictable
    with one_thread():
        patterns = record_patterns(model, tokens)                                  # {layer: [B, H, N, N]}
    scores = [torch.stack([score(patterns[layer]).mean(0) for layer in range(layers)]).float()     # [L, H] each
              for score in (previous_token_score,
                            lambda p: duplicate_token_score(p, batch.periods, batch.second_copy),
                            lambda p: induction_score(p, batch.periods, batch.second_copy))]
    rises = torch.zeros(layers, heads, dtype=torch.float64)
    with one_thread():                                          # small runs: a second thread mostly waits
        intact = span_loss(model, tokens, span)
        for layer in range(layers):
            for head in range(heads):
                with ablate_head(model, layer, head):
                    rises[layer, head] = span_loss(model, tokens, span) - intact
    return (*scores, rises)


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


def check_ablation_prediction(predict_fn: Callable, *, seed: int = 0, shuffles: int = 3,
                              models: tuple[int, ...] = MODELS) -> bool:
    """Check ``fn(previous_token_scores, duplicate_token_scores, induction_scores) -> (layer, head)``, each score
    ``[L, H]``: the head whose zero ablation raises the loss on the repeat the most, predicted from the
    scores alone.

    The cached model of each seed in ``models`` is shown as trained and with one harmless layer-0 head made
    dead (picked by ``seed``), each ``shuffles`` times (its own order, then heads shuffled within each layer by
    ``seed``) and each time asked twice; the head named must cost at least :data:`NEAR_WORST` of the worst
    head's cost.

    Raises:
        TypeError: ``predict_fn`` not callable. FileNotFoundError: the cached models are missing.
        CheckFailed: naming an answer that is not ``(layer, head)``, a head that does not exist, two
            answers for one question, one head whatever the scores, ``(head, layer)``, or the head
            named with what its ablation cost against the worst head's.

    Example (a wrong answer, and what it is told):
        >>> check_ablation_prediction(lambda previous, duplicate, induction: (1, 0))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You name layer 1, head 0 whatever the scores. The check shuffles ...
    """
    where = "check_ablation_prediction"
    if not callable(predict_fn):
        raise TypeError(f"{where}: expected your function, got {type(predict_fn).__name__}")
    if not set(models) <= set(trained_seeds()) or not models:   # nothing to measure against: never pass by default
        raise FileNotFoundError(f"{where}: the package's cached models {models} are missing "
                                f"(attn_course/circuits/trained/ holds {trained_seeds()})")
    shuffler = torch.Generator().manual_seed(seed)
    answers, wrong = set(), None
    for model_seed in models:
        intact_rises = ablation_effects(model_seed)[-1]
        harmless = [head for head in range(intact_rises.shape[1]) if intact_rises[0, head] < 0.1 * intact_rises.max()]
        dead = harmless[int(torch.randint(len(harmless), (), generator=shuffler))]
        for dead_head in (None, dead):
            measured = ablation_effects(model_seed, dead_head)                 # prev, dup, induction, rises
            layers, heads = measured[-1].shape
            for shuffle in range(shuffles):
                order = torch.stack([torch.arange(heads) if shuffle == 0 else
                                     torch.randperm(heads, generator=shuffler) for _ in range(layers)])   # [L, H]
                shown = [values.gather(1, order) for values in measured]          # head h shows order[l, h]
                replies = [_as_head(call_answer(where, predict_fn, *shown[:3], forbidden=ABLATION_RULES,
                                                described="previous-token, duplicate-token and induction "
                                                          "scores [L, H]"))
                           for _ in range(2)]
                if replies[0] != replies[1]:
                    raise CheckFailed(TWO_ANSWERS)
                layer, head = replies[0]
                answers.add((layer, head))
                cost = shown[-1]
                if not (0 <= layer < layers and 0 <= head < heads):
                    if 0 <= head < layers and 0 <= layer < heads and cost[head, layer] >= NEAR_WORST * cost.max():
                        raise CheckFailed(SWAPPED)
                    raise CheckFailed(NO_SUCH_HEAD.format(layer=layer, head=head, layers=layers, heads=heads))
                if cost[layer, head] < NEAR_WORST * cost.max() and wrong is None:
                    shown_dead = None if dead_head is None else int((order[0] == dead_head).nonzero())
                    wrong = (model_seed, shown_dead, shown, layer, head)
    if wrong is None:
        return True
    model_seed, shown_dead, (prev, dup, ind, cost), layer, head = wrong
    if len(answers) == 1:
        raise CheckFailed(FIXED_HEAD.format(layer=layer, head=head))
    if head < cost.shape[0] and layer < cost.shape[1] and cost[head, layer] >= NEAR_WORST * cost.max():
        raise CheckFailed(SWAPPED)
    best_layer, best_head = divmod(int(cost.argmax()), cost.shape[1])
    message = WRONG.format(seed=model_seed, dead="" if shown_dead is None else DEAD, layer=layer, head=head,
                           prev=prev[layer, head], dup=dup[layer, head], ind=ind[layer, head], rise=cost[layer, head],
                           best_layer=best_layer, best_head=best_head, best_prev=prev[best_layer, best_head],
                           best_dup=dup[best_layer, best_head], best_ind=ind[best_layer, best_head],
                           best_rise=cost[best_layer, best_head])
    if (layer, head) == divmod(int(ind.argmax()), ind.shape[1]):
        message += TOP_INDUCTION
    elif layer == 0 and head == shown_dead:
        message += DEAD_PICKED
    elif layer == 0 and head == int(ind[0].argmin()):
        message += LOWEST_INDUCTION
    else:
        for kind, score in (("previous-token", prev[0]), ("duplicate-token", dup[0])):
            if layer == 0 and head == int(score.argmax()) and score.max() < 0.3:
                message += ONE_ROUTE.format(kind=kind, best=score.max())
    raise CheckFailed(message)
