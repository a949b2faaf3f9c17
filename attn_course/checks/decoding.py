"""Check cached decoding: positions that continue the cached text, queries aligned after the
cached keys (chapter 04's exercises 3 and 4, :func:`check_decode_logits` and
:func:`check_cached_attention_step`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attn_course._threads import one_thread
from attn_course.checks.diagnosis import (
    ATOL,
    CheckFailed,
    call_answer,
    same,
    watched,
)
from attn_course.checks.forbidden import Forbidden
from attn_course.core.attention import self_attention
from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import causal_mask
from attn_course.models.tiny_language_model import LanguageModelConfig, TinyLanguageModel

__all__ = ["check_decode_logits", "check_cached_attention_step", "TOP_LEFT"]

#: A causal mask aligned to the top-left (chapter 04's mask exercise and the cached step both name it).
TOP_LEFT = ("Your mask is aligned to the top-left: query 0 sees only key 0, as torch.ones(n_q, n_k).tril() "
            "and scaled_dot_product_attention(is_causal=True) assume. Here the queries are the last n_q of n_k "
            "positions, so query i sits at position n_k - n_q + i and may see every key up to that one.")


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
