"""Check chapter 11's forward-pass exercise: the attention-only model written from its weights, one head's output
left out of the residual stream (zero ablation).

The weights come from the cached seed-0 model, on repeated random tokens, and from small random models of
other sizes (one layer, three) drawn by a private generator. The reference is the forward pass written out
here in float64, not :mod:`attn_course.circuits` or the model, which the answer may not call (the tests hold
it to the model under :func:`~attn_course.circuits.ablation.ablate_head`). The exercises that read the weights
(K-composition, the copying score) are checked in :mod:`attn_course.checks.circuits_weights`, the ablation
prediction in :mod:`attn_course.checks.circuits_ablation`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course.checks.compare import FLOATING, matches
from attn_course.checks.diagnosis import CheckFailed, call_answer, check_shape, name_mistake, watched
from attn_course.checks.forbidden import forbid
from attn_course.circuits.trained import load_trained
from attn_course.models.attention_only import AttentionOnlyTransformer

__all__ = ["check_logits_without_head", "cached_model", "WEIGHT_NAMES"]

_BY_HAND = "the exercise is to write the model's forward pass from its weights yourself"
#: What the forward-pass exercise may not call: the model, its attention, its ablation, its recordings, its cache.
FORWARD_RULES = forbid(_BY_HAND,
                       "attn_course.models.attention_only.AttentionOnlyTransformer",
                       "attn_course.models.attention_only.AttentionOnlyLayer",
                       "attn_course.core.multihead.MultiHeadAttention",
                       "attn_course.circuits.ablation.ablate_head", "attn_course.circuits.ablation.patch_head",
                       "attn_course.circuits.recording.record", "attn_course.circuits.recording.record_patterns",
                       "attn_course.circuits.recording.record_head_outputs",
                       "attn_course.circuits.trained.load_trained", "attn_course.circuits.trained.load_model",
                       "attn_course.circuits.trained.load_rhymes_model")
#: The weights the answer is given, in this order: ``W_E [V, E]``, ``W_pos [N_max, E]``, ``W_Q``, ``W_K``,
#: ``W_V [L, H, E, d]``, ``W_O [L, H, d, E]``, ``W_U [E, V]``.
WEIGHT_NAMES = ("W_E", "W_pos", "W_Q", "W_K", "W_V", "W_O", "W_U")
#: How close float32 logits must come to the float64 reference (logits of the cached model reach about 10).
ATOL, RTOL = 2e-4, 1e-4

INTACT = ("Your logits are the intact model's: no head was left out. Leave head {head}'s output, "
          "z @ W_O[{layer}, {head}], out of what layer {layer} adds to the stream.")
EVERY_LAYER = ("You left out head {head} of every layer; only layer {layer}'s goes. The other layers keep all "
               "their heads.")
WRONG_LAYER = ("You left out head {head} of layer {other}, not of layer {layer}: layers count from 0 in the order "
               "they run (layer 0 reads the embeddings), along dim 0 of W_Q.")
WRONG_HEAD = ("You left out head {other} of layer {layer}, not head {head}: heads count from 0 along dim 1 of "
              "W_Q [L, H, E, d].")
WHOLE_LAYER = ("You left out all of layer {layer}: only its head {head} goes; its other heads still add their "
               "outputs.")
ONLY_HEAD = ("Your layer {layer} adds head {head}'s output alone: that is the one head to leave out, and the "
             "others to keep.")
DIRECT_ONLY = ("You took head {head}'s output away from the final stream only, its direct path to the logits: "
               "the layers after layer {layer} still read what it wrote. Leave it out where it is written, so "
               "that no later layer sees it.")
UNIFORM = ("Your head {layer}.{head} still writes: zeroing its queries or keys only makes it attend evenly, and "
           "it adds the average of its values. Zero ablation leaves its output, z @ W_O[{layer}, {head}], out of "
           "the sum.")
NO_LAYERS = ("Your logits read the embeddings straight off, (W_E[tokens] + W_pos[:N]) @ W_U: no layer added "
             "anything. Each layer adds the sum of its heads' outputs to the stream.")
FEWER_LAYERS = ("Your forward pass runs {ran} of the {layers} layers: loop over every layer of W_Q (dim 0), "
                "however many there are.")
NO_POSITIONS = ("Your stream starts from the token embeddings alone: add the learned positions, "
                "W_E[tokens] + W_pos[:N].")
NO_MASK = ("Your attention is not causal: query i may only read keys j ≤ i. Fill the scores above the diagonal "
           "with −inf before the softmax.")
MASK_AFTER = ("You zeroed the future's weights after the softmax, so a row no longer sums to 1: fill those "
              "scores with −inf before it instead.")
NO_SCALE = "Your scores are q·k without the 1/√d: divide by √d, d = {d} (the head's size, W_Q.shape[-1])."
SCALE_E = "You divided the scores by √E = √{E}, the stream's width: the scale is √d, d = {d}, the head's size."
QUERY_SOFTMAX = ("Your softmax runs over the queries (dim −2): each query's weights over the keys sum to 1, so "
                 "normalise each row, over the last dim.")
NO_RESIDUAL = ("Each of your layers replaces the stream with its heads' sum; it adds to it: "
               "stream + Σ_h head h's output.")
DIFFERS = ("Your logits differ from the reference ({case}, head {head} of layer {layer} left out). The first entry "
           "that differs is at [sequence {b}, position {n}, token {v}]: expected {expected:.4f}, got {got:.4f}.")


def cached_model() -> AttentionOnlyTransformer:
    """The cached seed-0 model (:func:`~attn_course.circuits.trained.load_trained`), loaded without drawing from
    the caller's random generator (building a model initialises its weights before the cached ones replace them).
    """
    with torch.random.fork_rng(devices=[]):
        return load_trained(0)


def _logits(w: dict[str, torch.Tensor], tokens: torch.Tensor, drop: frozenset = frozenset(), *,
            layers: int | None = None, positions: bool = True, causal: bool = True, scale: str = "d",
            query_softmax: bool = False, mask_after: bool = False, residual: bool = True,
            uniform: frozenset = frozenset(), direct: frozenset = frozenset()) -> torch.Tensor:
    """Logits ``[B, N, V]`` of the float64 weights ``w`` on ``tokens [B, N]``, the heads ``drop`` ({(layer, head)})
    left out; the keywords make the known mistakes (``scale`` "d", "E" or "none"; ``uniform``: heads whose scores are
    zeroed; ``direct``: heads taken away from the final stream only)."""
    n = tokens.shape[1]
    stream = w["W_E"][tokens] + (w["W_pos"][:n] if positions else 0.0)                # [B, N, E]
    future = torch.ones(n, n, dtype=torch.bool).triu(1)                                # [N, N], key after query
    taken = 0.0
    for layer in range(w["W_Q"].shape[0] if layers is None else layers):
        # queries, keys and values of every head
        q, k, v = (torch.einsum("bne,hed->bhnd", stream, w[name][layer]) for name in ("W_Q", "W_K", "W_V"))
        # scores, causal mask, softmax over the keys
        divisor = {"d": math.sqrt(q.shape[-1]), "E": math.sqrt(stream.shape[-1]), "none": 1.0}[scale]
        scores = q @ k.transpose(-2, -1) / divisor                                    # [B, H, N, N]
        for _, head in (pair for pair in uniform if pair[0] == layer):
            scores[:, head] = 0.0
        if causal and not mask_after:
            scores = scores.masked_fill(future, -math.inf)
        pattern = torch.softmax(scores, dim=-2 if query_softmax else -1)
        if mask_after:
            pattern = pattern.masked_fill(future, 0.0)
        # each head's output, and the sum of those kept added to the stream
        out = torch.einsum("bhnd,hde->bhne", pattern @ v, w["W_O"][layer])            # [B, H, N, E]
        kept = [head for head in range(out.shape[1]) if (layer, head) not in drop]
        written = out[:, kept].sum(dim=1)                                              # [B, N, E]
        for _, head in (pair for pair in direct if pair[0] == layer):
            taken = taken + out[:, head]
        stream = stream + written if residual else written
    return (stream - taken) @ w["W_U"]                                                 # [B, N, V]


def _mistakes(w: dict[str, torch.Tensor], tokens: torch.Tensor, layer: int,
              head: int) -> list[tuple[str, torch.Tensor]]:
    """``(message, the logits that mistake gives)`` for the head ``head`` of ``layer``."""
    layers, heads, width, d = w["W_Q"].shape
    at = {"layer": layer, "head": head}
    right = frozenset({(layer, head)})
    mistakes = [(INTACT.format(**at), _logits(w, tokens)),
                (EVERY_LAYER.format(**at), _logits(w, tokens, frozenset((other, head) for other in range(layers)))),
                *((WRONG_LAYER.format(other=other, **at), _logits(w, tokens, frozenset({(other, head)})))
                  for other in range(layers) if other != layer),
                (WHOLE_LAYER.format(**at), _logits(w, tokens, frozenset((layer, other) for other in range(heads)))),
                (ONLY_HEAD.format(**at), _logits(w, tokens, frozenset((layer, o) for o in range(heads) if o != head))),
                *((WRONG_HEAD.format(other=other, **at), _logits(w, tokens, frozenset({(layer, other)})))
                  for other in range(heads) if other != head),
                (DIRECT_ONLY.format(**at), _logits(w, tokens, direct=right)),
                (UNIFORM.format(**at), _logits(w, tokens, uniform=right)),
                (NO_LAYERS, _logits(w, tokens, right, layers=0)),
                *((FEWER_LAYERS.format(ran=ran, layers=layers), _logits(w, tokens, right, layers=ran))
                  for ran in range(1, layers)),
                (NO_POSITIONS, _logits(w, tokens, right, positions=False)),
                (NO_MASK, _logits(w, tokens, right, causal=False)),
                (MASK_AFTER, _logits(w, tokens, right, mask_after=True)),
                (NO_SCALE.format(d=d), _logits(w, tokens, right, scale="none")),
                (QUERY_SOFTMAX, _logits(w, tokens, right, query_softmax=True)),
                (NO_RESIDUAL, _logits(w, tokens, right, residual=False))]
    if width != d:
        mistakes.append((SCALE_E.format(E=width, d=d), _logits(w, tokens, right, scale="E")))
    return mistakes


def _close(got: torch.Tensor, wrong: torch.Tensor) -> bool:
    return matches(got, wrong, atol=ATOL, rtol=RTOL, dtype=FLOATING)


def _cached_case(generator: torch.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The cached seed-0 model's weights (float32), and a batch of 3 random sequences, each repeated once,
    shorter than its position table."""
    model = cached_model()
    stacked = {name: torch.stack([getattr(model, name)(layer) for layer in range(model.config.n_layers)])
               for name in ("W_Q", "W_K", "W_V", "W_O")}                                # [L, H, E, d], W_O [L, H, d, E]
    weights = {"W_E": model.W_E, "W_pos": model.W_pos, **stacked, "W_U": model.W_U}
    half = (model.config.max_len - 10) // 2
    tokens = torch.randint(model.config.vocab_size, (3, half), generator=generator).repeat(1, 2)   # [3, 2·half]
    return {name: weights[name].detach().clone() for name in WEIGHT_NAMES}, tokens


def _random_case(sizes: tuple[int, ...], generator: torch.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A random model's weights (float32) of ``sizes = (L, H, E, V, N_max, B, N)``, and random tokens ``[B, N]``."""
    layers, heads, width, vocab, n_max, batch, n = sizes
    d = width // heads

    def draw(*shape: int, std: float) -> torch.Tensor:
        return std * torch.randn(*shape, generator=generator)

    weights = {"W_E": draw(vocab, width, std=1.0), "W_pos": draw(n_max, width, std=1.0),
               **{name: draw(layers, heads, width, d, std=1.5 / math.sqrt(width)) for name in ("W_Q", "W_K", "W_V")},
               "W_O": draw(layers, heads, d, width, std=1 / math.sqrt(d)), "W_U": draw(width, vocab, std=1.0)}
    return weights, torch.randint(vocab, (batch, n), generator=generator)


#: The random models, (L, H, E, V, N_max, B, N): three layers (a loop written for two misses one), and one.
RANDOM_SIZES = ((3, 2, 12, 11, 9, 2, 7), (1, 3, 9, 7, 6, 2, 6))


def _cases(generator: torch.Generator):
    """(what the weights are, weights, tokens, layer, head): the cached model with a layer-0 head left out and
    with a layer-1 head, then each random model with a head of its middle layer."""
    weights, tokens = _cached_case(generator)
    heads = weights["W_Q"].shape[1]
    for layer in (0, 1):
        head = int(torch.randint(heads, (), generator=generator))
        yield "the cached seed-0 model", weights, tokens, layer, head
    for sizes in RANDOM_SIZES:
        weights, tokens = _random_case(sizes, generator)
        head = int(torch.randint(sizes[1], (), generator=generator))
        yield f"a random model of {sizes[0]} layer{'s' * (sizes[0] > 1)}", weights, tokens, sizes[0] // 2, head


def _differs(got: torch.Tensor, expected: torch.Tensor, case: str, layer: int, head: int) -> str:
    bad = ~torch.isclose(torch.nan_to_num(got.detach().double(), nan=math.inf), expected, atol=ATOL, rtol=RTOL)
    b, n, v = (int(i) for i in bad.nonzero()[0])
    return DIFFERS.format(case=case, layer=layer, head=head, b=b, n=n, v=v, expected=expected[b, n, v].item(),
                          got=got[b, n, v].item())


def check_logits_without_head(logits_fn: Callable, *, seed: int = 0) -> bool:
    """Check ``fn(weights, tokens [B, N], layer, head) -> logits [B, N, V]``: the attention-only model's forward pass
    written from ``weights`` (a dict of :data:`WEIGHT_NAMES`), head ``head`` of layer ``layer`` left out of the
    residual stream. The stream starts as ``W_E[tokens] + W_pos[:N]``; each layer adds the sum of its heads'
    outputs, ``softmax(q kᵀ / √d, causal) v @ W_O[layer, h]`` with ``q = stream @ W_Q[layer, h]``; the logits are
    ``stream @ W_U``. Tried on the cached seed-0 model (a layer-0 head, then a layer-1 head) on repeated random
    tokens, and on random models of three layers and of one.

    Raises:
        TypeError: ``logits_fn`` not callable.
        CheckFailed: naming no head left out, the head of every layer, of another layer or another head of the
            layer, the whole layer, the head alone kept, the head taken from the final stream only, a head made
            to attend evenly, no layers or too few, no positions, no causal mask or one after the softmax, no
            1/√d or 1/√E, a softmax over the queries, no residual stream, a forbidden call, or the first logit
            that differs.

    Example (a wrong answer, and what it is told):
        >>> check_logits_without_head(lambda weights, tokens, layer, head:
        ...                           (weights["W_E"][tokens] + weights["W_pos"][:tokens.shape[1]]) @ weights["W_U"])
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your logits read the embeddings straight off, ...
    """
    where = "check_logits_without_head"
    logits_fn = watched(where, logits_fn, FORWARD_RULES)
    generator = torch.Generator().manual_seed(seed)
    for case, weights, tokens, layer, head in _cases(generator):
        w = {name: weights[name].double() for name in WEIGHT_NAMES}
        expected = _logits(w, tokens, frozenset({(layer, head)}))                          # [B, N, V], float64
        described = (f"weights {{{', '.join(f'{name}: {list(weights[name].shape)}' for name in WEIGHT_NAMES)}}} "
                     f"({weights['W_E'].dtype}), tokens of shape {list(tokens.shape)}, layer={layer}, head={head}")
        fresh = {name: weights[name].clone() for name in WEIGHT_NAMES}        # what it does to them stays there
        got = call_answer(where, logits_fn, fresh, tokens, layer, head, described=described)
        check_shape(got, expected, "Your logits tensor")
        if _close(got, expected):
            continue
        name_mistake(torch.nan_to_num(got.detach(), nan=0.0), _mistakes(w, tokens, layer, head), _close)
        raise CheckFailed(_differs(got, expected, case, layer, head))
    return True
