"""Check causal attention and cached decoding: no leak of the future, the diagonal kept, the
queries aligned after the cached keys, positions that continue the cached text.

Chapter 04's exercises: :func:`check_causal_mask`, :func:`check_positions_without_cache`,
:func:`check_decode_logits` and :func:`check_cached_attention_step`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import torch

from attn_course._threads import one_thread
from attn_course.checks.attention import attention_inputs
from attn_course.checks.diagnosis import (
    ATOL,
    CheckFailed,
    call_answer,
    call_student,
    check_shape,
    diagnose,
    same,
    watched,
)
from attn_course.checks.forbidden import Forbidden
from attn_course.core.attention import self_attention
from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import causal_mask
from attn_course.models.tiny_language_model import LanguageModelConfig, TinyLanguageModel

__all__ = [
    "check_causal_attention",
    "check_causal_mask",
    "check_positions_without_cache",
    "check_decode_logits",
    "check_cached_attention_step",
]


SEES_THE_FUTURE = ("Your attention leaks the future: query i can see keys after i (the upper triangle). "
                   "Keep the lower triangle, diagonal included: causal_mask(n) or torch.tril.")
NO_CAUSAL_MASK = ("Your attention is not causal: every query sees every key, so changing a later token "
                  "changes earlier outputs. Mask the scores with causal_mask(n) before the softmax.")
MISSES_ITSELF = ("Your causal mask also hides the diagonal: a token must be able to attend to itself "
                 "(key j = query i). Use torch.tril (diagonal included), not a strict triangle.")


def check_causal_attention(attention_fn: Callable) -> bool:
    """Check ``fn(q, k, v) -> output`` that must attend causally (``N_q = N_k``).

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: naming a leak of the future, a missing mask, a hidden diagonal, or the
            first entry that differs.
    """
    q, k, v, _ = attention_inputs(batched=True)
    k, v = k[..., :5, :], v[..., :5, :]                                  # N_q = N_k = 5
    lower = torch.ones(5, 5, dtype=torch.bool).tril()
    expected, _ = self_attention(q, k, v, lower)
    got = call_student("check_causal_attention", attention_fn, q, k, v)
    check_shape(got, expected, "Your output")
    if not same(got, expected):
        strict_lower = lower.tril(-1)
        strict_lower[0, 0] = True                                       # the first row would be empty
        mistakes = [
            (SEES_THE_FUTURE, self_attention(q, k, v, lower.T)[0]),
            (SEES_THE_FUTURE, self_attention(q, k, v, ~lower.tril(-1))[0]),
            (NO_CAUSAL_MASK, self_attention(q, k, v)[0]),
            (MISSES_ITSELF, self_attention(q, k, v, strict_lower)[0]),
            (MISSES_ITSELF, self_attention(q, k, v, lower.tril(-1))[0]),
        ]
        diagnose(got, expected, mistakes, ("batch", "head", "query", "feature"), "Your output")
    return True


# --- chapter 04's exercises ---------------------------------------------------------------------

MASK_NOT_BOOL = ("Your mask has dtype {dtype}; return a boolean mask (torch.bool): a comparison such as "
                 "key_position <= query_position gives one, and masked_fill reads True and False, not 0 and 1.")
MASK_SHAPE = ("Your mask for n_q={n_q}, n_k={n_k} has shape {shape}, but it needs one row per query and one "
              "column per key: [{n_q}, {n_k}].")
TOP_LEFT = ("Your mask is aligned to the top-left: query 0 sees only key 0, as torch.ones(n_q, n_k).tril() "
            "and scaled_dot_product_attention(is_causal=True) assume. Here the queries are the last n_q of n_k "
            "positions, so query i sits at position n_k - n_q + i and may see every key up to that one.")
MASK_MISSES_ITSELF = ("Your mask hides the diagonal: query i may also attend to the key at its own position "
                      "(j = n_k - n_q + i). Use <=, not <.")
MASK_INVERTED = ("Your mask is inverted: True must mean 'may attend' (the past and the query's own position), "
                 "False the future.")


#: What chapter 04's mask exercise may not call: the masks the course already builds.
CAUSAL_MASK_RULES = (
    Forbidden("attn_course.core.masks.causal_mask",
              "the exercise is to build the causal mask yourself"),
    Forbidden("attn_course.variants.masks.sliding_window_mask",
              "the exercise is to build the causal mask yourself"),
    Forbidden("attn_course.variants.masks.attention_sink_mask",
              "the exercise is to build the causal mask yourself"),
    Forbidden("torch.nn.modules.transformer.Transformer.generate_square_subsequent_mask",
              "the exercise is to build the causal mask yourself"),
)


def check_causal_mask(mask_fn: Callable[[int, int], torch.Tensor],
                      sizes: Sequence[tuple[int, int]] = ((4, 4), (2, 5), (1, 6), (3, 7))) -> bool:
    """Check ``fn(n_q, n_k) -> [n_q, n_k]`` boolean causal mask for the last ``n_q`` of ``n_k`` positions.

    Args:
        mask_fn: the student's function.
        sizes: ``(n_q, n_k)`` pairs to try, each with ``1 <= n_q <= n_k``.

    Returns:
        ``True`` when every mask equals :func:`~attn_course.core.masks.causal_mask`.

    Raises:
        CheckFailed: naming a non-boolean mask, a wrong shape, a top-left alignment, a hidden
            diagonal, an inverted mask, or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_causal_mask(lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).tril())
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your mask is aligned to the top-left: query 0 sees only key 0, as ...
    """
    mask_fn = watched("check_causal_mask", mask_fn, CAUSAL_MASK_RULES)
    for n_q, n_k in sizes:
        got = call_answer("check_causal_mask", mask_fn, n_q, n_k, described=f"n_q={n_q}, n_k={n_k}")
        if not isinstance(got, torch.Tensor):
            raise CheckFailed(f"Your function should return a torch.Tensor, but it returned {type(got).__name__}.")
        if got.shape != (n_q, n_k):
            raise CheckFailed(MASK_SHAPE.format(n_q=n_q, n_k=n_k, shape=list(got.shape)))
        query_position = torch.arange(n_q).unsqueeze(1) + (n_k - n_q)        # [N_q, 1]
        key_position = torch.arange(n_k).unsqueeze(0)                        # [1, N_k]
        expected = key_position <= query_position                            # [N_q, N_k]
        pattern = got != 0 if got.dtype != torch.bool else got
        if torch.equal(pattern, expected) and got.dtype != torch.bool:
            raise CheckFailed(MASK_NOT_BOOL.format(dtype=got.dtype))
        if not torch.equal(pattern, expected):
            strict = key_position < query_position
            for message, wrong in [(TOP_LEFT, torch.ones(n_q, n_k, dtype=torch.bool).tril()),
                                   (MASK_MISSES_ITSELF, strict), (MASK_INVERTED, ~expected), (MASK_INVERTED, ~strict)]:
                if torch.equal(pattern, wrong):
                    raise CheckFailed(message)
            i, j = (int(index) for index in (pattern != expected).nonzero()[0])
            raise CheckFailed(f"Your mask for n_q={n_q}, n_k={n_k} is wrong at query {i}, key {j}: expected "
                              f"{bool(expected[i, j])}, got {bool(pattern[i, j])}. Query {i} sits at position "
                              f"{n_k - n_q + i}.")
        if got.dtype != torch.bool:
            raise CheckFailed(MASK_NOT_BOOL.format(dtype=got.dtype))
    return True


COUNT_NOT_INT = ("Your count is a {kind}, not a Python int{detail}. Counting positions gives a whole number: "
                 "keep to integers (// instead of /) and return an int.")
ONE_STEP_TOO_MANY = ("Your count is one position too many per step: the first step (t = 0) runs over the "
                     "prompt alone, P positions, and the step for new token t over P + t.")
FORGOT_THE_PROMPT = ("Your count leaves out the prompt: without a cache every step re-reads the P prompt "
                     "tokens too, so each of the T steps adds P.")
PROMPT_ONCE = ("You counted the prompt once, but without a cache every one of the T steps re-reads it: "
               "the prompt contributes T · P positions.")
WITH_A_CACHE = ("That is the count with a cache (the prompt once, then one token per step); without a "
                "cache the step for new token t runs over all P + t tokens.")
EVERY_STEP_FULL = ("You counted every step as long as the last one; the sequence grows, so the step for new "
                   "token t runs over P + t tokens, fewer early on.")


def check_positions_without_cache(count_fn: Callable[[int, int], int],
                                  cases: Sequence[tuple[int, int]] = ((16, 100), (1, 1), (5, 3), (32, 256))) -> bool:
    """Check ``fn(P, T) -> int``: token positions processed without a cache (``sum(P + t for t < T)``).

    Args:
        count_fn: the student's function.
        cases: ``(P, T)`` pairs to try, each ``>= 1``.

    Returns:
        ``True`` when every count is right.

    Raises:
        CheckFailed: naming a count that is not an int, one step too many, a forgotten
            prompt, the prompt counted once, the count with a cache, every step counted
            full, or the case that is wrong.

    Example (a wrong answer, and what it is told):
        >>> check_positions_without_cache(lambda P, T: T * P)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your count for P=16, T=100 is 1600; it should be 6550. The step ...
    """
    for prompt, new in cases:
        got = call_answer("check_positions_without_cache", count_fn, prompt, new, described=f"P={prompt}, T={new}")
        if isinstance(got, torch.Tensor):
            raise CheckFailed(COUNT_NOT_INT.format(kind="tensor", detail=" (return int(...) or build the "
                                                   "formula from the ints P and T)"))
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            raise CheckFailed(COUNT_NOT_INT.format(kind=type(got).__name__, detail=f" ({got!r})"))
        expected = sum(prompt + step for step in range(new))
        if got != expected:
            mistakes = [
                (ONE_STEP_TOO_MANY, sum(prompt + step + 1 for step in range(new))),
                (FORGOT_THE_PROMPT, sum(step for step in range(new))),
                (FORGOT_THE_PROMPT, sum(step + 1 for step in range(new))),
                (PROMPT_ONCE, prompt + sum(step for step in range(new))),
                (WITH_A_CACHE, prompt + new - 1),
                (EVERY_STEP_FULL, new * (prompt + new - 1)),
                (EVERY_STEP_FULL, new * (prompt + new)),
            ]
            for message, wrong in mistakes:
                if got == wrong and wrong != expected:
                    raise CheckFailed(message)
            raise CheckFailed(f"Your count for P={prompt}, T={new} is {got}; it should be {expected}. The step "
                              "for new token t (t = 0 .. T-1) runs over the P + t tokens so far.")
    return True


RESTARTS_AT_ZERO = ("Your positions restart at 0 with every call: the new tokens are embedded as if they opened "
                    "the text. They come after the len(caches[0]) tokens already cached, so their positions are "
                    "len(caches[0]), len(caches[0]) + 1, ...")
ONE_POSITION_LATE = ("Your positions are one too far: the first new token sits at position len(caches[0]) (the "
                     "number of tokens cached before it), not one after.")
IGNORES_THE_CACHE = ("Your function ignores the cache: the new tokens attend only to each other. Pass each "
                     "block its cache (block(x, kv_cache=cache)), so that they also see the cached keys and values.")
LOGITS_SHAPE = "Your logits for {n} new tokens have shape {shape}; expected [B, N_new, V] = {expected}."


def _decode_model(seed: int) -> tuple[TinyLanguageModel, torch.Tensor]:
    """A small random language model (2 blocks, window 12) and a batch of 2 sequences of 12 ids."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = LanguageModelConfig(vocab_size=11, max_length=12, embed_dim=16, num_heads=2, num_layers=2)
        model = TinyLanguageModel(config).eval()
        ids = torch.randint(0, config.vocab_size, (2, 12))
    return model, ids


def _reference_decode(model: TinyLanguageModel, new_ids: torch.Tensor, caches: list[KVCache] | None,
                      start: int) -> torch.Tensor:
    """The model's forward by hand, new tokens at positions ``start ..``; None: no cache."""
    positions = torch.arange(start, start + new_ids.shape[1])
    x = model.token_embedding(new_ids) + model.position_embedding(positions)   # [B, N_new, E]
    for index, block in enumerate(model.blocks):
        x, _ = block(x, kv_cache=None if caches is None else caches[index])
    return model.head(model.final_norm(x))                                      # [B, N_new, V]


#: What chapter 04's find-the-bug exercise may not call: the model's own forward, which decodes right.
DECODE_RULES = (
    Forbidden("attn_course.models.tiny_language_model.TinyLanguageModel.forward",
              "the exercise is to fix the classmate's function, not to call the model's forward, "
              "which gets the positions right"),
)


def check_decode_logits(decode_fn: Callable, *, seed: int = 0, chunks: Sequence[int] = (4, 1, 1, 2, 1)) -> bool:
    """Check ``fn(model, new_ids, caches) -> logits``: a cached forward pass of a ``TinyLanguageModel``.

    A sequence is fed in chunks (a prompt, then a token or two at a time) through the student's
    function with fresh caches, one :class:`~attn_course.core.kv_cache.KVCache` per block; the
    logits of all chunks together must equal one pass of the model over the whole sequence.

    Args:
        decode_fn: the student's function: ``new_ids [B, N_new]`` and the caches in,
            ``[B, N_new, V]`` logits out (the caches are appended to on the way).
        seed: seeds the model's weights and the ids.
        chunks: sizes of the pieces fed one after the other; their sum is at most 11.

    Returns:
        ``True`` when every chunk's logits match.

    Raises:
        CheckFailed: naming positions that restart at 0, positions one too far, a function that
            ignores the cache, a wrong shape, or the first position that differs.

    Example (a wrong answer, and what it is told):
        >>> check_decode_logits(lambda model, new_ids, caches: model(new_ids, kv_caches=caches))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_decode_logits: your answer calls TinyLanguageModel.forward, ...
    """
    decode_fn = watched("check_decode_logits", decode_fn, DECODE_RULES)
    model, ids = _decode_model(seed)
    ids = ids[:, :sum(chunks)]
    # What each known mistake would give, chunk by chunk: (its caches, where its positions start).
    mistakes = [
        (RESTARTS_AT_ZERO, lambda start: 0, True),
        (ONE_POSITION_LATE, lambda start: start + 1, True),
        (IGNORES_THE_CACHE, lambda start: start, False),
        (IGNORES_THE_CACHE, lambda start: 0, False),             # positions read from the empty cache
    ]
    with torch.no_grad(), one_thread():                  # tiny matrices: threads only add overhead
        expected = model(ids)                                                # [B, N, V]
        caches = [KVCache() for _ in model.blocks]
        mistaken_caches = [[KVCache() for _ in model.blocks] if cached else None for _, _, cached in mistakes]
        yours, theirs = [], [[] for _ in mistakes]
        start = 0
        for size in chunks:
            new_ids = ids[:, start:start + size]
            described = f"the model, new_ids of shape {list(new_ids.shape)} and caches holding {len(caches[0])} tokens"
            got = call_answer("check_decode_logits", decode_fn, model, new_ids, caches, described=described)
            if isinstance(got, tuple):
                got = got[0]
            if not isinstance(got, torch.Tensor):
                raise CheckFailed(f"Your function should return a torch.Tensor, but it returned {type(got).__name__}.")
            wanted = [ids.shape[0], size, expected.shape[-1]]
            if list(got.shape) != wanted:
                raise CheckFailed(LOGITS_SHAPE.format(n=size, shape=list(got.shape), expected=wanted))
            yours.append(got)
            for index, (_, first_position, _) in enumerate(mistakes):
                position = first_position(start)
                if position + size <= model.config.max_length:
                    theirs[index].append(_reference_decode(model, new_ids, mistaken_caches[index], position))
            start += size
    got = torch.cat(yours, dim=1)                                            # [B, N, V]
    if same(got, expected):
        return True
    for (message, _, _), pieces in zip(mistakes, theirs):
        if len(pieces) == len(chunks) and same(got, torch.cat(pieces, dim=1)):
            raise CheckFailed(message)
    if len(caches[0]) == 0:
        raise CheckFailed(IGNORES_THE_CACHE)
    bad = (~torch.isclose(got, expected, atol=ATOL, rtol=1e-4)).nonzero()[0]
    position = int(bad[1])
    raise CheckFailed(f"Your logits differ from one pass over the whole sequence, first at position {position} "
                      f"(fed in chunks of {list(chunks)}). The new tokens must be embedded at their positions in "
                      "the text and attend to the cached tokens through the caches.")


STEP_RESULT = ("Your function should return three tensors, (output, keys, values), but it returned {what}.")
STEP_SHAPE = "Your {what} after {past} cached and {new} new tokens has shape {shape}; expected {expected}."
KEYS_NEW_FIRST = ("Your keys (or values) put the new tokens before the cached ones: return "
                  "torch.cat([past_keys, k], dim=-2), so position i of the cache stays token i.")
KEYS_NOT_KEPT = ("Your keys (or values) are not the cached ones followed by the new ones: return "
                 "torch.cat([past_keys, k], dim=-2) (and the same for the values).")
STEP_NO_MASK = ("Your step uses no causal mask: with one new token that is right, but when several new tokens "
                "arrive together, each sees the ones after it. Mask with causal_mask(n_new, n_past + n_new).")
STEP_NO_SCALING = ("You forgot the scaling: divide the scores by √d (d = q.shape[-1]) before the softmax, as "
                   "full attention does.")
STEP_IGNORES_PAST = ("Your step attends only to the new keys: the cached keys and values are the whole point. "
                     "Attend to torch.cat([past_keys, k]) and torch.cat([past_values, v]).")


def _attention_step(q, k, v, past_k, past_v, *, mask: str = "bottom-right", past: bool = True,
                    scale: float | None = None):
    keys, values = torch.cat([past_k, k], dim=-2), torch.cat([past_v, v], dim=-2)
    attend_keys, attend_values = (keys, values) if past else (k, v)
    n_q, n_k = q.shape[-2], attend_keys.shape[-2]
    masks = {"bottom-right": causal_mask(n_q, n_k), "top-left": torch.ones(n_q, n_k, dtype=torch.bool).tril(),
             "none": None}
    return self_attention(q, attend_keys, attend_values, masks[mask], scale=scale)[0], keys, values


def check_cached_attention_step(step_fn: Callable, *, seed: int = 0, chunks: Sequence[int] = (3, 1, 2, 1, 2)) -> bool:
    """Check ``fn(q, k, v, past_keys, past_values) -> (output, keys, values)``, one cached decoding step.

    ``q, k, v`` are ``[B, H, N_new, d]`` for the new tokens, ``past_keys``/``past_values``
    ``[B, H, N_past, d]`` (``N_past`` may be 0). A sequence is fed in ``chunks``, each step given
    the keys and values the student's previous step returned; the outputs of all steps together
    must equal causal attention over the whole sequence, token for token.

    Args:
        step_fn: the student's function.
        seed: seeds the random queries, keys and values.
        chunks: sizes of the pieces fed one after the other.

    Returns:
        ``True`` when every step's output and cache are right.

    Raises:
        CheckFailed: naming a result that is not three tensors, a wrong shape, keys in the
            wrong order or not kept, a top-left mask, no mask, attention to the new keys only,
            no scaling, or the first token whose output differs.

    Example (a wrong answer, and what it is told):
        >>> check_cached_attention_step(lambda q, k, v, past_keys, past_values: (self_attention(q, k, v)[0], k, v))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your keys after 3 cached and 1 new tokens has shape [2, 2, 1, 8]; ...
    """
    generator = torch.Generator().manual_seed(seed)
    batch, heads, n, d = 2, 2, sum(chunks), 8
    q, k, v = (torch.randn(batch, heads, n, d, generator=generator) for _ in range(3))  # [B, H, N, d]
    expected, _ = self_attention(q, k, v, causal_mask(n))                            # [B, H, N, d]
    variants = {STEP_NO_MASK: {"mask": "none"}, TOP_LEFT: {"mask": "top-left"}, STEP_IGNORES_PAST: {"past": False},
                STEP_NO_SCALING: {"scale": 1.0}}
    outputs = {name: [] for name in ["yours", *variants]}
    past = {name: (k[..., :0, :], v[..., :0, :]) for name in ["yours", *variants]}
    start = 0
    for size in chunks:
        piece = [t[..., start:start + size, :] for t in (q, k, v)]
        past_k, past_v = past["yours"]
        described = (f"q, k, v of shape {list(piece[0].shape)} and past_keys, past_values of shape "
                     f"{list(past_k.shape)}")
        result = call_answer("check_cached_attention_step", step_fn, *[t.clone() for t in piece], past_k.clone(),
                       past_v.clone(), described=described)
        if not isinstance(result, (tuple, list)) or len(result) != 3 or not all(
                isinstance(t, torch.Tensor) for t in result):
            what = (f"a {type(result).__name__} of length {len(result)}" if isinstance(result, (tuple, list))
                    else f"a {type(result).__name__}")
            raise CheckFailed(STEP_RESULT.format(what=what))
        output, keys, values = result
        for name, tensor, shape in [("output", output, [batch, heads, size, d]),
                                    ("keys", keys, [batch, heads, start + size, d]),
                                    ("values", values, [batch, heads, start + size, d])]:
            if list(tensor.shape) != shape:
                raise CheckFailed(STEP_SHAPE.format(what=name, past=start, new=size, shape=list(tensor.shape),
                                                    expected=shape))
        for mine, cached, new in [(keys, past_k, piece[1]), (values, past_v, piece[2])]:
            if not same(mine, torch.cat([cached, new], dim=-2)):
                if same(mine, torch.cat([new, cached], dim=-2)):
                    raise CheckFailed(KEYS_NEW_FIRST)
                raise CheckFailed(KEYS_NOT_KEPT)
        outputs["yours"].append(output)
        past["yours"] = (keys, values)
        for name, options in variants.items():
            out, *cache = _attention_step(*piece, *past[name], **options)
            outputs[name].append(out)
            past[name] = tuple(cache)
        start += size
    got = torch.cat(outputs.pop("yours"), dim=-2)                                    # [B, H, N, d]
    if same(got, expected):
        return True
    for message, pieces in outputs.items():
        if same(got, torch.cat(pieces, dim=-2)):
            raise CheckFailed(message)
    token = int((~torch.isclose(got, expected, atol=ATOL, rtol=1e-4)).nonzero()[0][2])
    raise CheckFailed(f"Your outputs differ from causal attention over the whole sequence, first at token {token} "
                      f"(fed in chunks of {list(chunks)}). Each new query attends to every cached key and to the "
                      "new keys up to its own position, with the usual 1/√d scaling.")
