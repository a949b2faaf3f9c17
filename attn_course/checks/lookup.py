"""Check chapter 01's exercises: attention from embeddings, the weights of identical keys, the map of plain
matrices (the fourth, rescaled weights: :mod:`attn_course.checks.rescaled_weights`). Inputs come from a
private generator: a check neither depends on nor changes the caller's random state."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import (
    CheckFailed,
    call_answer,
    call_student,
    check_shape,
    diagnose,
    output_of,
    same,
    watched,
)
from attn_course.checks.forbidden import forbid
from attn_course.core.attention import self_attention

__all__ = ["check_attention_from_embeddings", "check_identical_keys_prediction", "check_attention_map"]

NO_SCALING = ("Your weights are softmax(Q Kᵀ), without the scaling: divide the scores by √d_k "
              "(here √{d_k} = {sqrt_d_k:.3g}) before the softmax.")
SCALED_BY_D_K = "You divided the scores by d_k = {d_k}; divide by its square root, √d_k = {sqrt_d_k:.3g}."
SCALED_BY_E = ("You divided the scores by √E = √{e}, the width of the embeddings x. d_k is the width of a "
               "query after the projection, w_q.shape[1] = {d_k} here: divide by √{d_k}.")
SCALED_BY_N = ("You divided the scores by √{n_k}, the square root of the number of keys. d_k is the size of "
               "one key vector, the last dimension of keys ({d_k} here).")
OVER_QUERIES = ("Each column of your map sums to 1, not each row: your softmax normalises over the queries. "
                "Row i holds query i's weights over all the keys, and those must sum to 1.")
TRANSPOSED = ("Your map is transposed: entry [i, j] must be how well key j answers query i, the softmax "
              "over j of q_i · k_j. Yours is built from k_i · q_j, token i's key against the others' queries.")
KEYS_FROM_W_Q = ("Your keys were projected with w_q: your scores are Q Qᵀ. The keys are x @ w_k, "
                 "the queries x @ w_q.")
NOT_PROJECTED = ("Your scores compare the embeddings x with each other, not queries with keys: project first, "
                 "Q = x @ w_q and K = x @ w_k.")
OUTPUT_FROM_X = ("Your output has shape {shape}, the width E of the embeddings: you mixed the rows of x. "
                 "Mix the values, V = x @ w_v, whose width is d_v = {d_v}.")
OUTPUT_FROM_SCORES = ("Your output mixes the values with the scores, not with the weights: the scores are any "
                      "real numbers; the softmax turns each row into weights that sum to 1, and those weigh "
                      "the values.")
OUTPUT_TRANSPOSED = ("Your output uses the transposed weights: row i of the output must be Σ_j a_ij v_j, "
                     "query i's weights (row i of the map) times the values.")
NOT_A_PAIR = ("Your function returns one tensor of shape {shape}; return the pair (output, weights): "
              "output [N, d_v] and weights [N, N].")
ROWS_ARE_KEYS = ("Your map has shape {shape} = [N_k, N_q]: one row per key. The check passes N_q = {n_q} "
                 "queries and N_k = {n_k} keys, and the map needs one row per query, [N_q, N_k] = [{n_q}, {n_k}], "
                 "row i being where query i looks.")
ROWS_ARE_KEYS_RIGHT_VALUES = ("Your map holds the right weights, but transposed: shape {shape} = [N_k, N_q], "
                              "one row per key. Row i must be query i's weights, so the map is [N_q, N_k].")
NOT_FLOATING = "Your {what} has dtype {dtype}: weights are fractions between 0 and 1, so use a floating dtype."
ONE_NUMBER = ("Your prediction for n = {n} is a single number; return one weight per key, "
              "a tensor of shape [n] = [{n}].")
SUM_NOT_ONE = ("Your weights for n = {n} sum to {total:.4g}: one query's weights always sum to 1 (that is "
               "what the softmax is for), whatever the keys.")
ONE_KEY_WINS = ("Your prediction puts all the weight on one key. When all the keys are the same vector, "
                "what makes one of them win? Compare the scores q · k_j of one query.")
UNEQUAL = ("Your weights for n = {n} sum to 1 but are not all equal. Compare the scores q · k_j of one "
           "query when every k_j is the same vector.")


def _scaled_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def _embedding_inputs(n: int = 6, e: int = 10, d_k: int = 4, d_v: int = 3):
    """``x [n, e]``, ``w_q [e, d_k]``, ``w_k [e, d_k]``, ``w_v [e, d_v]``, widths that differ, scores of a few units."""
    generator = torch.Generator().manual_seed(2024)
    x = torch.randn(n, e, generator=generator)                                 # [N, E]
    w_q, w_k, w_v = (torch.randn(e, width, generator=generator) / math.sqrt(e) * 1.5
                     for width in (d_k, d_k, d_v))                             # [E, d_k], [E, d_k], [E, d_v]
    return x, w_q, w_k, w_v


#: What chapter 01's first exercise may not call: attention that is already written.
ATTENTION_FROM_EMBEDDINGS_RULES = forbid(
    "the exercise is to compute attention from its formula",
    "attn_course.core.attention.self_attention",
    "attn_course.core.attention.scaled_dot_product",
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.functional.multi_head_attention_forward",
    "attn_course.core.multihead.MultiHeadAttention",
)


def check_attention_from_embeddings(attention_fn: Callable) -> bool:
    """Check ``fn(x, w_q, w_k, w_v) -> (output, weights)``: self-attention from token embeddings.

    Called with ``x [6, 10]``, ``w_q, w_k [10, 4]`` and ``w_v [10, 3]``; must return ``(output [N, d_v],
    weights [N, N])`` with ``weights = softmax(Q Kᵀ / √d_k)`` and ``output = weights V``.

    Raises:
        TypeError: ``attention_fn`` is not callable.
        CheckFailed: naming the mistake the answer matches (a single tensor instead of the pair,
            the weights: no scaling, √E or d_k instead of √d_k, softmax over the queries, a
            transposed map, keys from ``w_q``, no projection; the output: the embeddings mixed
            instead of the values, values mixed with the scores or with the transposed
            weights), else the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> import torch.nn.functional as F
        >>> check_attention_from_embeddings(
        ...     lambda x, w_q, w_k, w_v: F.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_attention_from_embeddings: your answer calls ...
    """
    attention_fn = watched("check_attention_from_embeddings", attention_fn, ATTENTION_FROM_EMBEDDINGS_RULES)
    where = "check_attention_from_embeddings"
    x, w_q, w_k, w_v = _embedding_inputs()
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    expected_output, expected_weights = self_attention(q, k, v)
    result = call_answer(where, attention_fn, x, w_q, w_k, w_v)
    output = output_of(tuple(result) if isinstance(result, list) else result)
    if not isinstance(result, (tuple, list)):
        raise CheckFailed(NOT_A_PAIR.format(shape=list(output.shape)))
    if len(result) != 2 or not isinstance(result[1], torch.Tensor):
        raise CheckFailed(f"Your function returns a {type(result).__name__} of {len(result)} items; return the "
                          "pair (output, weights), two tensors.")
    d_k, e = q.shape[-1], x.shape[-1]
    facts = {"d_k": d_k, "sqrt_d_k": math.sqrt(d_k), "e": e}
    raw = q @ k.T                                                              # [N, N]
    diagnose(result[1], expected_weights, [
        (NO_SCALING.format(**facts), torch.softmax(raw, dim=-1)),
        (SCALED_BY_D_K.format(**facts), torch.softmax(raw / d_k, dim=-1)),
        (SCALED_BY_E.format(**facts), torch.softmax(raw / math.sqrt(e), dim=-1)),
        (OVER_QUERIES, torch.softmax(raw / math.sqrt(d_k), dim=0)),
        (TRANSPOSED, torch.softmax(raw.T / math.sqrt(d_k), dim=-1)),
        (KEYS_FROM_W_Q, torch.softmax(_scaled_scores(q, q), dim=-1)),
        (NOT_PROJECTED, torch.softmax(x @ x.T / math.sqrt(d_k), dim=-1)),
        (NOT_PROJECTED, torch.softmax(x @ x.T / math.sqrt(e), dim=-1)),
    ], ("query", "key"), "Your weights")
    if output.shape == (x.shape[0], x.shape[1]) and x.shape[1] != v.shape[1]:
        raise CheckFailed(OUTPUT_FROM_X.format(shape=list(output.shape), d_v=v.shape[1]))
    diagnose(output, expected_output, [
        (OUTPUT_FROM_SCORES, _scaled_scores(q, k) @ v),
        (OUTPUT_FROM_SCORES, (q @ k.T) @ v),
        (OUTPUT_TRANSPOSED, expected_weights.T @ v),
    ], ("token", "feature"), "Your output")
    return True


#: What chapter 01's prediction may not call: the statement asks for it without computing any attention.
IDENTICAL_KEYS_RULES = forbid(
    "the prediction is to be worked out, without computing any attention",
    "torch.softmax",
    "attn_course.core.attention.self_attention",
    "attn_course.core.attention.scaled_dot_product",
    "torch.nn.functional.scaled_dot_product_attention",
)


def check_identical_keys_prediction(predict_fn: Callable[[int], torch.Tensor]) -> bool:
    """Check ``fn(n) -> [n]``: the predicted weights of a query when all ``n`` keys are one vector, compared
    for ``n`` = 1, 4 and 7 with what real attention gives a random query against ``n`` copies of one key.

    Raises:
        TypeError: ``predict_fn`` is not callable.
        CheckFailed: naming the mistake (an integer dtype, a single number, weights that do not
            sum to 1, all the weight on one key, unequal weights), else the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_identical_keys_prediction(lambda n: torch.softmax(torch.zeros(n), dim=-1))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_identical_keys_prediction: your answer calls torch.softmax, ...
    """
    predict_fn = watched("check_identical_keys_prediction", predict_fn, IDENTICAL_KEYS_RULES)
    where = "check_identical_keys_prediction"
    generator = torch.Generator().manual_seed(2024)
    for n in (1, 4, 7):
        query = torch.randn(1, 8, generator=generator)                           # [1, d_k]
        keys = torch.randn(1, 8, generator=generator).expand(n, 8)              # [n, d_k], all the same
        values = torch.randn(n, 2, generator=generator)                         # [n, d_v]
        expected = self_attention(query, keys, values)[1][0]                     # [n]
        got = call_student(where, predict_fn, n)
        if not got.is_floating_point():
            raise CheckFailed(NOT_FLOATING.format(what="prediction", dtype=got.dtype))
        if got.dim() == 0 or (got.numel() == 1 and n > 1):
            raise CheckFailed(ONE_NUMBER.format(n=n))
        check_shape(got, expected, f"Your prediction for n = {n}")
        if same(got, expected):
            continue
        total = float(got.double().sum())
        if not math.isclose(total, 1.0, abs_tol=1e-4):
            raise CheckFailed(SUM_NOT_ONE.format(n=n, total=total))
        if float(got.max()) > 1 - 1e-4:
            raise CheckFailed(ONE_KEY_WINS)
        raise CheckFailed(UNEQUAL.format(n=n))
    return True


#: What chapter 01's find-the-bug exercise may not call: an attention map that is already right.
ATTENTION_MAP_RULES = forbid(
    "the exercise is to fix the classmate's map, not to call the course's attention",
    "attn_course.core.attention.self_attention",
    "attn_course.core.attention.scaled_dot_product",
    "attn_course.core.attention.classic_self_attention",
)


def check_attention_map(map_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(queries, keys) -> weights [N_q, N_k]``, the attention map of plain matrices, called with
    ``queries [5, 16]`` and ``keys [7, 16]`` (rows and columns cannot be confused unseen): row ``i`` must be
    ``softmax_j(q_i · k_j / √d_k)``. ``(weights, ...)`` is accepted.

    Raises:
        TypeError: ``map_fn`` is not callable.
        CheckFailed: naming the mistake (a map with one row per key, the right map transposed,
            a softmax over the queries, no scaling, a scaling by d_k or by the number of keys),
            else the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_attention_map(lambda q, k: torch.softmax(k @ q.T / q.shape[-1] ** 0.5, dim=-1))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your map has shape [7, 5] = [N_k, N_q]: one row per key. The check ...
    """
    map_fn = watched("check_attention_map", map_fn, ATTENTION_MAP_RULES)
    where = "check_attention_map"
    generator = torch.Generator().manual_seed(2024)
    queries = torch.randn(5, 16, generator=generator)                          # [N_q, d_k]
    keys = torch.randn(7, 16, generator=generator)                             # [N_k, d_k]
    _, expected = self_attention(queries, keys, torch.zeros(7, 1))             # [N_q, N_k]
    got = call_student(where, map_fn, queries, keys)
    n_q, n_k, d_k = queries.shape[0], keys.shape[0], queries.shape[1]
    if got.shape == (n_k, n_q):
        message = ROWS_ARE_KEYS_RIGHT_VALUES if same(got.T, expected) else ROWS_ARE_KEYS
        raise CheckFailed(message.format(shape=list(got.shape), n_q=n_q, n_k=n_k))
    raw = queries @ keys.T                                                     # [N_q, N_k]
    facts = {"d_k": d_k, "sqrt_d_k": math.sqrt(d_k), "n_k": n_k}
    diagnose(got, expected, [
        (OVER_QUERIES, torch.softmax(raw / math.sqrt(d_k), dim=0)),
        (NO_SCALING.format(**facts), torch.softmax(raw, dim=-1)),
        (SCALED_BY_D_K.format(**facts), torch.softmax(raw / d_k, dim=-1)),
        (SCALED_BY_N.format(**facts), torch.softmax(raw / math.sqrt(n_k), dim=-1)),
        (SCALED_BY_N.format(**facts), torch.softmax(raw / math.sqrt(n_q), dim=-1)),
    ], ("query", "key"), "Your attention map")
    return True
