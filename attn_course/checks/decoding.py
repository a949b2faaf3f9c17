"""Check cached decoding: positions that continue the cached text, queries aligned after the
cached keys, a left-padded batch whose padding no query sees (chapter 04's exercises 3 and 4,
:func:`check_decode_logits` and :func:`check_cached_attention_step`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attn_course._threads import one_thread
from attn_course.checks.diagnosis import ATOL, CheckFailed, call_answer, check_shape, name_mistake, same, watched
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
    """Check ``fn(model, new_ids [B, N_new], caches) -> logits [B, N_new, V]``: a cached forward pass of a
    ``TinyLanguageModel`` (seeded by ``seed``). A sequence is fed in ``chunks`` (their sum at most 11) with
    fresh caches, one :class:`~attn_course.core.kv_cache.KVCache` per block; the logits of all chunks
    together must equal one pass of the model over the whole sequence.

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
    check_shape(got, expected, "Your logits")                                # a plain tensor, a floating dtype
    if same(got, expected):
        return True
    name_mistake(got, [(message, torch.cat(pieces, dim=1)) for (message, _, _), pieces in zip(mistakes, theirs)
                       if len(pieces) == len(chunks)], same)
    if len(caches[0]) == 0:
        raise CheckFailed(IGNORES_THE_CACHE)
    bad = (~torch.isclose(got, expected, atol=ATOL, rtol=1e-4)).nonzero()[0]
    position = int(bad[1])
    raise CheckFailed(f"Your logits differ from one pass over the whole sequence, first at position {position} "
                      f"(fed in chunks of {list(chunks)}). The new tokens must be embedded at their positions in "
                      "the text and attend to the cached tokens through the caches.")


STEP_RESULT = ("Your function should return three tensors, (output, keys, values), but it returned {what}.")
STEP_SHAPE = "Your {what} after {past} cached and {new} new slots has shape {shape}; expected {expected}."
KEYS_NEW_FIRST = ("Your keys (or values) put the new tokens before the cached ones: return "
                  "torch.cat([past_keys, k], dim=-2): the slots stay in order, the padding on the left.")
KEYS_NOT_KEPT = ("Your keys (or values) are not the cached slots followed by the new ones, padding included: return "
                 "torch.cat([past_keys, k], dim=-2) (and the same for the values), and mask the padding instead.")
STEP_NO_MASK = ("Your step uses no causal mask: with one new token that is right, but when several new slots "
                "arrive together (the prompts), each sees the ones after it. Combine the padding with "
                "causal_mask(n_new, n_past + n_new).")
STEP_NO_SCALING = ("You forgot the scaling: divide the scores by √d (d = q.shape[-1]) before the softmax, as "
                   "full attention does.")
STEP_IGNORES_PAST = ("Your step attends only to the new keys: the cached keys and values are the whole point. "
                     "Attend to torch.cat([past_keys, k]) and torch.cat([past_values, v]).")
NO_PADDING_MASK = ("Your step attends to the padding: the slots before a sequence's first token hold numbers that "
                   "are no token's, and no query may see them. Sequence b's tokens are its last lengths[b] slots; "
                   "hide the others as keys.")
FIRST_TOKEN_AS_PADDING = ("Your padding mask takes each sequence's first token for padding: its tokens are the "
                          "last lengths[b] of the N slots, slot >= N - lengths[b]; with > the first of them is "
                          "left out.")
PADDED_ON_THE_RIGHT = ("Your padding mask assumes the padding comes after the tokens, as padding_mask does (True for "
                       "the first lengths[b] slots). This batch is padded on the left: sequence b's tokens are its "
                       "last lengths[b] slots, so slot j holds a token when j >= N_past + n - lengths[b].")
ONE_PADDING_FOR_ALL = ("Your padding is the same for every sequence of the batch, as if each had as many tokens as "
                       "{which}: each sequence has its own, the first N_past + n - lengths[b] slots of sequence b. "
                       "Build the mask per sequence, [B, 1, N_past + n], from lengths[:, None].")
MIXED_POSITIONS = ("Your causal mask compares a query's position within its own sequence (counted from its first "
                   "token, lengths[b] - n + i) with a key's slot in the padded batch. Count both the same way: with "
                   "left padding, new query i sits in slot N_past + i in every sequence, and may see the keys in "
                   "the slots up to its own.")
PADDED_ROWS = ("Your outputs for the tokens are right, but the rows of the padded query slots are {what}, not zeros. "
               "Hiding the padding as keys is not the whole rule: a padded query may see only padding, so its whole "
               "row is masked, and such a row must give zeros (section 3), as self_attention returns it; {cause}")


def _padded_step(q, k, v, past_k, past_v, lengths, *, causal: str = "bottom-right", padding: str = "left",
                 past: bool = True, scale: float | None = None):
    """One cached step over a left-padded batch, or one of the known mistakes (the options)."""
    keys, values = torch.cat([past_k, k], dim=-2), torch.cat([past_v, v], dim=-2)     # [B, H, N_k, d]
    batch, n_q, n_k = q.shape[0], q.shape[-2], keys.shape[-2]
    slot = torch.arange(n_k)                                                       # [N_k]
    one_length = {"first": lengths[0], "fewest": lengths.min(), "most": lengths.max()}
    if padding == "left":
        real = slot >= n_k - lengths[:, None]                                      # [B, N_k]: the last lengths[b]
    elif padding == "one short":                                                   # > where >= belongs
        real = slot > n_k - lengths[:, None]
    elif padding == "right":
        real = slot < lengths[:, None]
    elif padding == "none":
        real = torch.ones(batch, n_k, dtype=torch.bool)
    else:
        real = (slot >= n_k - one_length[padding]).expand(batch, n_k)
    query_slot = torch.arange(n_q)[:, None] + (n_k - n_q)                         # [N_q, 1]
    if causal == "bottom-right":
        allowed = (slot <= query_slot).expand(batch, n_q, n_k)
    elif causal == "top-left":
        allowed = (slot <= torch.arange(n_q)[:, None]).expand(batch, n_q, n_k)
    elif causal == "mixed":                      # query counted from its sequence's first token, key by slot
        allowed = slot <= (lengths[:, None, None] - n_q + torch.arange(n_q)[:, None])    # [B, N_q, N_k]
    else:
        allowed = torch.ones(batch, n_q, n_k, dtype=torch.bool)
    mask = (allowed & real[:, None, :])[:, None]                                   # [B, 1, N_q, N_k]
    attend_k, attend_v = (keys, values) if past else (k, v)
    mask = mask if past else mask[..., -n_q:]
    return self_attention(q, attend_k, attend_v, mask, scale=scale)[0], keys, values


def _padded_batch(seed: int, prompt_lengths: Sequence[int], chunks: Sequence[int]):
    """Queries, keys and values of a left-padded batch ``[B, H, S, d]``, the padding filled with
    large random numbers, and the reference: causal attention over each sequence's tokens alone,
    zeros in the padded rows."""
    generator = torch.Generator().manual_seed(seed)
    batch, heads, d = len(prompt_lengths), 2, 8
    prompt_slots = max(prompt_lengths)
    slots = prompt_slots + sum(chunks)
    q, k, v = (torch.randn(batch, heads, slots, d, generator=generator) for _ in range(3))   # [B, H, S, d]
    expected = torch.zeros(batch, heads, slots, d)
    for b, length in enumerate(prompt_lengths):
        pad = prompt_slots - length
        for t in (q, k, v):                                                        # padding: no token's numbers
            t[b, :, :pad] = 3 + 4 * torch.randn(heads, pad, d, generator=generator)
        tokens = slots - pad
        expected[b, :, pad:] = self_attention(q[b, :, pad:], k[b, :, pad:], v[b, :, pad:], causal_mask(tokens))[0]
    return q, k, v, expected


def check_cached_attention_step(step_fn: Callable, *, seed: int = 0, prompt_lengths: Sequence[int] = (3, 5, 1),
                                chunks: Sequence[int] = (1, 2, 1)) -> bool:
    """Check ``fn(q, k, v, past_keys, past_values, lengths) -> (output, keys, values)``: one cached
    decoding step for a left-padded batch of sequences of different lengths.

    ``q, k, v`` are the new slots ``[B, H, n, d]``, ``past_keys``/``past_values`` the ``N_past`` slots before
    them, ``lengths [B]`` how many of each sequence's ``N_past + n`` slots (the last ones) hold its tokens.
    First the prompts (``prompt_lengths``, padded on the left with large random numbers), then ``chunks``
    new tokens per sequence, each step given the keys and values the previous step returned. Each token's
    output must be causal attention over its own sequence alone; a padded query slot's, zeros.

    Raises:
        CheckFailed: naming a result that is not three tensors, a wrong shape, keys in the wrong
            order or not kept; a step that attends to the padding, pads on the right, takes a
            sequence's first token for padding, takes one
            padding for the whole batch, counts query positions within the sequence but keys by
            slot, leaves the padded rows not zero (a padding mask on the key side only, without
            the rule for empty rows), a top-left mask, no causal mask, attention to the new keys
            only, no scaling; or the first token whose output differs.

    Example (a wrong answer, which ignores the padding, and what it is told):
        >>> def step(q, k, v, past_keys, past_values, lengths):
        ...     keys, values = torch.cat([past_keys, k], dim=-2), torch.cat([past_values, v], dim=-2)
        ...     return self_attention(q, keys, values, causal_mask(q.shape[-2], keys.shape[-2]))[0], keys, values
        >>> check_cached_attention_step(step)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your step attends to the padding: ...
    """
    prompt_lengths = [int(n) for n in prompt_lengths]
    if not prompt_lengths or min(prompt_lengths) < 1 or not all(int(c) >= 1 for c in chunks):
        raise ValueError("check_cached_attention_step: prompt_lengths and chunks must be non-empty ints >= 1, "
                         f"got {prompt_lengths} and {list(chunks)}")
    q, k, v, expected = _padded_batch(seed, prompt_lengths, chunks)
    batch, heads, slots, d = q.shape
    prompt_slots = max(prompt_lengths)
    variants = [                                  # (message, the mistake), the first that matches is named
        (NO_PADDING_MASK, {"padding": "none"}),
        (PADDED_ON_THE_RIGHT, {"padding": "right"}),
        (FIRST_TOKEN_AS_PADDING, {"padding": "one short"}),
        *[(ONE_PADDING_FOR_ALL.format(which=which), {"padding": key})
          for key, which in [("first", "the first one"), ("fewest", "the shortest"), ("most", "the longest")]],
        (MIXED_POSITIONS, {"causal": "mixed"}),
        (TOP_LEFT, {"causal": "top-left"}),
        (TOP_LEFT, {"causal": "top-left", "padding": "none"}),     # scaled_dot_product_attention(is_causal=True)
        (STEP_NO_MASK, {"causal": "none"}),
        (STEP_IGNORES_PAST, {"past": False}),
        (STEP_NO_SCALING, {"scale": 1.0}),
    ]
    names = ["yours", *range(len(variants))]
    outputs = {name: [] for name in names}
    past = {name: (k[..., :0, :], v[..., :0, :]) for name in names}
    lengths = torch.tensor(prompt_lengths)                                         # [B]: after the prompts
    start = 0
    for step, size in enumerate([prompt_slots, *chunks]):
        if step:
            lengths = lengths + size                                               # every sequence's new tokens
        piece = [t[..., start:start + size, :] for t in (q, k, v)]                 # [B, H, n, d]
        past_k, past_v = past["yours"]
        described = (f"q, k, v of shape {list(piece[0].shape)}, past_keys, past_values of shape "
                     f"{list(past_k.shape)} and lengths {lengths.tolist()}")
        result = call_answer("check_cached_attention_step", step_fn, *[t.clone() for t in piece], past_k.clone(),
                             past_v.clone(), lengths.clone(), described=described)
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
        for name, (_, options) in enumerate(variants):
            out, *cache = _padded_step(*piece, *past[name], lengths, **options)
            outputs[name].append(out)
            past[name] = tuple(cache)
        start += size
    got = torch.cat(outputs.pop("yours"), dim=-2)                                  # [B, H, S, d]
    check_shape(got, expected, "Your outputs")                                     # a plain tensor, a floating dtype
    if same(got, expected):
        return True
    pads = prompt_slots - torch.tensor(prompt_lengths)                             # [B]
    real_rows = torch.arange(slots) >= pads[:, None]                               # [B, S]

    def tokens_of(t: torch.Tensor) -> torch.Tensor:                               # the real rows: [tokens, H, d]
        return t.transpose(1, 2)[real_rows]

    if same(tokens_of(got), tokens_of(expected)):
        nan = bool(got.isnan().any())
        raise CheckFailed(PADDED_ROWS.format(
            what="NaN" if nan else "averages of values",
            cause=("a softmax over a row of -inf alone gives 0/0." if nan else
                   "a -1e9 fill makes such a row uniform, an average of the values it should not see.")))
    finite = torch.nan_to_num(got, nan=0.0)            # an empty row's NaN, from a softmax written by hand
    name_mistake(tokens_of(finite), [(message, tokens_of(torch.cat(outputs[name], dim=-2)))
                                     for name, (message, _) in enumerate(variants)], same)
    b, slot = (int(i) for i in (~torch.isclose(got, expected, atol=ATOL, rtol=1e-4)).any(-1).any(1).nonzero()[0])
    raise CheckFailed(f"Your outputs differ from causal attention over each sequence alone, first at sequence {b}, "
                      f"slot {slot} (prompts of {prompt_lengths} tokens left-padded to {prompt_slots} slots, then "
                      f"{list(chunks)} new tokens per step). Each new query attends to its own sequence's cached "
                      "tokens and to the new ones up to its own slot, never to padding, with the usual 1/√d scaling.")
