"""Check chapter 04's prediction of a key/value cache's memory: the bytes it stores and the bytes it allocates
(a :class:`~attn_course.core.kv_cache.KVCache` sizes its buffers by its first append and doubles its capacity
when an append does not fit)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer, name_mistake, number, watched
from attn_course.checks.forbidden import Forbidden
from attn_course.core.kv_cache import KVCache

__all__ = ["check_kv_cache_bytes", "filled_cache"]

ONLY_KEYS = ("You counted only the keys (or only the values): the cache holds both, each "
             "[B, H_kv, tokens, d], so every count has a factor 2.")
BITS_NOT_BYTES = ("You counted bits, not bytes: a {dtype} number takes torch.finfo(dtype).bits // 8 = "
                  "{size} bytes.")
FOUR_BYTES = "You assumed 4 bytes per number, but a {dtype} number takes {size} bytes."
SWAPPED = ("You returned (allocated, stored): the first number is the bytes of the tokens stored "
           "(len(cache)), the second the bytes allocated (capacity).")
NO_ROOM_AHEAD = (
    "Your allocated bytes equal the stored bytes, but the cache allocates ahead: when an append does not "
    "fit, it doubles its capacity. After {history}, it stores {stored} tokens in room for {capacity}."
)
POWER_OF_TWO = (
    "You rounded the capacity up to a power of two. The cache starts with room for exactly the prompt "
    "and doubles from there: after {history}, its capacity is {capacity}, not {power}."
)
DOUBLED_ALWAYS = (
    "You doubled the capacity even where nothing outgrew it: with no new tokens after the prompt, the "
    "cache has room for the prompt only."
)
STORED_WRONG = ("Your stored bytes are not right for batch={batch}, num_kv_heads={kv_heads}, head_dim={d}, "
                "{dtype}, {prompt} + {new} tokens: expected {expected}, got {got}. Count B · H_kv · tokens · d "
                "numbers for the keys, as many for the values, and the bytes of one number.")
ALLOCATED_WRONG = ("Your allocated bytes are not right for batch={batch}, num_kv_heads={kv_heads}, head_dim={d}, "
                   "{dtype}, {prompt} + {new} tokens: expected {expected}, got {got}. The cache starts with room "
                   "for the prompt and doubles its capacity whenever an append does not fit.")


def filled_cache(batch: int, kv_heads: int, head_dim: int, dtype: torch.dtype, prompt: int, new: int) -> KVCache:
    """A fresh ``KVCache()`` after a prompt of ``prompt`` tokens, then ``new`` tokens one at a time."""
    cache = KVCache()
    block = torch.zeros(batch, kv_heads, prompt, head_dim, dtype=dtype)   # [B, H_kv, N, d]
    cache.append(block, block)
    one = torch.zeros(batch, kv_heads, 1, head_dim, dtype=dtype)          # [B, H_kv, 1, d]
    for _ in range(new):
        cache.append(one, one)
    return cache


def _answer(fn: Callable, args: tuple) -> tuple[float, float]:
    result = call_answer("check_kv_cache_bytes", fn, *args)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise CheckFailed("Your function should return two numbers, (stored_bytes, allocated_bytes), but it "
                          f"returned {type(result).__name__}"
                          + (f" of length {len(result)}." if isinstance(result, (tuple, list)) else "."))
    return tuple(float(number(value, f"Your {name} should be a number, but it is a {{type}}."))
                 for value, name in zip(result, ("stored byte count", "allocated byte count")))


_PREDICT = "a prediction follows from the rule alone: build no cache and no tensor to measure"
#: What chapter 04's cache-size prediction may not do: build what it predicts.
KV_BYTES_RULES = (Forbidden("attn_course.core.kv_cache.KVCache.__init__", _PREDICT),
                  *(Forbidden(f"torch.{name}", _PREDICT)
                    for name in ("empty", "zeros", "ones", "full", "randn", "rand")))


def check_kv_cache_bytes(bytes_fn: Callable) -> bool:
    """Check ``fn(batch, num_kv_heads, head_dim, dtype, prompt_tokens, new_tokens) -> (stored, allocated)``.

    Compared with a real :class:`~attn_course.core.kv_cache.KVCache` after a prompt appended at once and
    ``new_tokens`` one at a time: ``stored`` is the bytes of the ``len(cache)`` tokens' keys and values,
    ``allocated`` is ``cache.memory_bytes``. Several sizes and dtypes, always a prompt of one token or more.

    Raises:
        CheckFailed: naming the mistake: only keys counted, bits for bytes, 4 bytes for every
            dtype, the two numbers swapped, no room allocated ahead, a power-of-two capacity, a
            capacity doubled without need; else the case and the number that is wrong.

    Example (a wrong answer, which forgets that the cache allocates ahead):
        >>> def predict(batch, num_kv_heads, head_dim, dtype, prompt_tokens, new_tokens):
        ...     per_token = 2 * batch * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8
        ...     stored = per_token * (prompt_tokens + new_tokens)
        ...     return stored, stored
        >>> check_kv_cache_bytes(predict)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your allocated bytes equal the stored bytes, but the cache ...
    """
    bytes_fn = watched("check_kv_cache_bytes", bytes_fn, KV_BYTES_RULES)
    cases = [(2, 4, 16, torch.float16, 10, 0), (1, 2, 8, torch.bfloat16, 5, 7), (3, 1, 4, torch.float32, 3, 14),
             (1, 8, 64, torch.float32, 6, 6), (2, 2, 32, torch.float16, 12, 1)]
    for batch, kv_heads, d, dtype, prompt, new in cases:
        cache = filled_cache(batch, kv_heads, d, dtype, prompt, new)
        size = torch.finfo(dtype).bits // 8
        per_token = 2 * batch * kv_heads * d * size                         # keys and values
        stored, allocated = per_token * len(cache), cache.memory_bytes
        got = _answer(bytes_fn, (batch, kv_heads, d, dtype, prompt, new))
        if got == (stored, allocated):
            continue
        power = 1 << (len(cache) - 1).bit_length()
        history = (f"a prompt of {prompt} tokens and {new} more, one at a time" if new
                   else f"a prompt of {prompt} tokens and nothing more")
        facts = {"dtype": str(dtype).replace("torch.", ""), "size": size, "history": history,
                 "stored": len(cache), "capacity": cache.capacity, "power": power}
        mistakes = [
            (ONLY_KEYS, (stored / 2, allocated / 2)),
            (BITS_NOT_BYTES, (stored * 8, allocated * 8)),
            (FOUR_BYTES, (stored / size * 4, allocated / size * 4)),
            (SWAPPED, (allocated, stored)),
            (NO_ROOM_AHEAD, (stored, stored)),
            (POWER_OF_TWO, (stored, per_token * power)),
            (DOUBLED_ALWAYS, (stored, 2 * allocated)),
        ]
        name_mistake(got, [(message.format(**facts), wrong) for message, wrong in mistakes])
        details = {"batch": batch, "kv_heads": kv_heads, "d": d, "dtype": facts["dtype"], "prompt": prompt,
                   "new": new}
        if got[0] != stored:
            raise CheckFailed(STORED_WRONG.format(expected=stored, got=f"{got[0]:g}", **details))
        raise CheckFailed(ALLOCATED_WRONG.format(expected=allocated, got=f"{got[1]:g}", **details))
    return True
