"""Generation with and without a KV cache (chapter 04; ``python -m benchmarks kv-cache``).

Without a cache every new token re-runs the model over the whole sequence so far; with one, each step feeds
only the newest token. The speed-up grows far more slowly than the token positions the cache saves:
:func:`decode_step_times` shows why (on a small model most of a step's time is a fixed cost per step).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode

from attn_course import _validate
from attn_course._threads import one_thread
from attn_course.core.kv_cache import KVCache
from attn_course.measure.timing import best_time
from attn_course.models.tiny_language_model import LanguageModelConfig, TinyLanguageModel

__all__ = ["DecodeStepRow", "KvCacheRow", "decode_step_times", "kv_cache_speedup", "median_time",
           "positions_processed"]

_NUM_HEADS = 4


@dataclasses.dataclass(frozen=True)
class KvCacheRow:
    """One row of :func:`kv_cache_speedup`: for ``new_tokens`` generated after the prompt, the token positions
    pushed through the model (:func:`positions_processed`) and the best seconds, without and with a cache, and
    ``speedup = seconds_without / seconds_with``."""

    new_tokens: int
    positions_without: int
    positions_with: int
    seconds_without: float
    seconds_with: float
    speedup: float


def _untrained_model(where: str, length: int, tokens: int, embed_dim: object, num_layers: object, repeats: object,
                     seed: object) -> tuple[TinyLanguageModel, torch.Tensor, int, int]:
    """The options checked; the untrained model (4 heads, 64 token ids, ``length`` positions) and ``[1, tokens]``
    random ids, seeded without reseeding the caller's RNG; ``repeats`` and ``seed``."""
    embed_dim, num_layers, repeats = _validate.integers(where, minimum=1, embed_dim=embed_dim, num_layers=num_layers,
                                                        repeats=repeats)
    if embed_dim % _NUM_HEADS:
        raise ValueError(f"{where}: embed_dim must be a multiple of {_NUM_HEADS} (the heads), got {embed_dim}")
    seed = _validate.integer(where, "seed", seed, minimum=0)
    config = LanguageModelConfig(vocab_size=64, max_length=length, embed_dim=embed_dim, num_heads=_NUM_HEADS,
                                 num_layers=num_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyLanguageModel(config).eval()
        ids = torch.randint(0, config.vocab_size, (1, tokens))
    return model, ids, repeats, seed


def positions_processed(prompt_length: int, new_tokens: int) -> tuple[int, int]:
    """Token positions the model processes to generate ``T = new_tokens`` after a prompt of ``P`` tokens
    (the whole text within the context window), ``(without_cache, with_cache)``.

    Without a cache, the step that samples new token ``t`` (``t = 0 .. T-1``) runs the model over all ``P + t``
    tokens so far. With one, the first step runs over the prompt and each later step over the one token
    sampled before it; the last sampled token is never fed.

    Raises:
        TypeError, ValueError: a size that is not an int ``>= 1``.

    Example:
        >>> positions_processed(3, 4)       # without: 3 + 4 + 5 + 6; with: 3 + 1 + 1 + 1
        (18, 6)
    """
    prompt_length, new_tokens = _validate.integers("positions_processed", minimum=1, prompt_length=prompt_length,
                                                   new_tokens=new_tokens)
    without = sum(prompt_length + step for step in range(new_tokens))
    return without, prompt_length + new_tokens - 1


def kv_cache_speedup(
    new_tokens: Sequence[int] = (32, 64, 128, 256),
    *,
    prompt_length: int = 32,
    embed_dim: int = 128,
    num_layers: int = 4,
    repeats: int = 5,
    seed: int = 0,
) -> list[KvCacheRow]:
    """Time generation with and without a :class:`~attn_course.core.kv_cache.KVCache`.

    An untrained ``TinyLanguageModel`` (speed does not depend on the weights) with 4 heads samples from a
    generator seeded with ``seed``; both ways must produce the same tokens. Each way runs once untimed first (the
    first call of a shape pays for allocations and lazy set-up), then ``repeats`` timed runs. The caller's RNG is
    left as it was.

    Args:
        new_tokens: numbers of tokens to generate, one row each.
        prompt_length: tokens before generation starts.
        embed_dim: model width, a multiple of 4 (the number of heads).
        num_layers: decoder blocks.
        repeats: take the best of this many runs, after the untimed one.
        seed: seeds weights, prompt and sampling; ``>= 0``.

    Returns:
        One :class:`KvCacheRow` per entry of ``new_tokens``, in order.

    Raises:
        TypeError: a size that is not an int, or ``new_tokens`` not a sequence.
        ValueError: a size below 1, no ``new_tokens``, ``embed_dim`` not a multiple of 4,
            or a negative seed.
        RuntimeError: cached and uncached generation produce different tokens.

    Example:
        >>> rows = kv_cache_speedup((2,), prompt_length=2, embed_dim=8, num_layers=1, repeats=1)
        >>> rows[0].new_tokens, rows[0].speedup > 0
        (2, True)
    """
    where = "kv_cache_speedup"
    counts = _validate.integer_sequence(where, "new_tokens", new_tokens, minimum=1, nonempty=True)
    prompt_length = _validate.integer(where, "prompt_length", prompt_length, minimum=1)
    model, prompt, repeats, seed = _untrained_model(where, prompt_length + max(counts), prompt_length, embed_dim,
                                                    num_layers, repeats, seed)
    rows = []
    for count in counts:
        best, outputs = {}, {}
        for use_cache in (False, True):
            def generate(generator, use_cache=use_cache, count=count, outputs=outputs):
                outputs[use_cache] = model.generate(prompt, count, use_cache=use_cache, generator=generator)

            # A fresh generator per run (made untimed): both ways must draw the same samples to agree.
            def fresh() -> torch.Generator:
                return torch.Generator().manual_seed(seed)

            generate(fresh())                                   # the untimed warm-up
            best[use_cache] = best_time(generate, repeats, setup=fresh)
        if not torch.equal(outputs[True], outputs[False]):      # the timed runs themselves are compared
            raise RuntimeError(f"{where}: cached and uncached generation disagree at new_tokens={count}")
        without, with_cache = best[False], best[True]
        positions_without, positions_with = positions_processed(prompt_length, count)
        rows.append(KvCacheRow(new_tokens=count, positions_without=positions_without, positions_with=positions_with,
                               seconds_without=without, seconds_with=with_cache, speedup=without / with_cache))
    return rows


@dataclasses.dataclass(frozen=True)
class DecodeStepRow:
    """One row of :func:`decode_step_times`: one generation step attending to ``length`` tokens (the new one
    included), its median seconds with a cache (the newest token alone, over ``length - 1`` cached keys and its
    own) and without (a pass over all ``length``), and ``torch_calls``, the calls from Python into PyTorch
    during the cached step (functions, tensor methods, attribute reads such as ``.shape``)."""

    length: int
    seconds_cached: float
    seconds_uncached: float
    torch_calls: int


class _CountCalls(TorchFunctionMode):
    """Counts every call into PyTorch Python makes while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def median_time(fn: Callable[..., object], repeats: int, *,
                setup: Callable[[], object] | None = None) -> float:
    """The median time of one call of ``fn``, in seconds, over ``repeats`` calls each timed by
    :func:`~attn_course.measure.timing.best_time` (``fn()``, or ``fn(setup())`` with ``setup`` untimed), after
    one untimed call (the first call of a shape pays for allocations and lazy set-up). The median, not the
    minimum: a plot of several lengths then shows the typical step, not the luckiest one.

    Raises:
        TypeError: ``fn`` or ``setup`` not callable, ``repeats`` not an int.
        ValueError: ``repeats`` below 1.

    Example:
        >>> calls = []
        >>> median_time(calls.append, 3, setup=lambda: "fresh") > 0, calls     # the warm-up, then 3 timed
        (True, ['fresh', 'fresh', 'fresh', 'fresh'])
    """
    if not callable(fn):
        raise TypeError(f"median_time: fn must be callable, got {type(fn).__name__}")
    if setup is not None and not callable(setup):
        raise TypeError(f"median_time: setup must be callable or None, got {type(setup).__name__}")
    repeats = _validate.integer("median_time", "repeats", repeats, minimum=1)
    fn() if setup is None else fn(setup())                      # the untimed warm-up
    return statistics.median(best_time(fn, 1, setup=setup) for _ in range(repeats))


def decode_step_times(
    lengths: Sequence[int] = (16, 64, 256),
    *,
    embed_dim: int = 128,
    num_layers: int = 4,
    repeats: int = 20,
    seed: int = 0,
) -> list[DecodeStepRow]:
    """Time one generation step, with and without a cache, at several context lengths.

    The untrained model of :func:`kv_cache_speedup`, one CPU thread as in ``TinyLanguageModel.generate``.
    Before each timed cached step the cache is filled with ``length - 1`` tokens, untimed. The caller's RNG is
    left as it was.

    Args:
        lengths: context lengths, the new token included, one row each (at least 2: a cached step needs one
            cached token).
        embed_dim, num_layers, seed: as :func:`kv_cache_speedup`.
        repeats: report the median of this many timings of each step, after an untimed one (:func:`median_time`).

    Returns:
        One :class:`DecodeStepRow` per entry of ``lengths``, in order.

    Raises:
        TypeError: a size that is not an int, or ``lengths`` not a sequence.
        ValueError: a length below 2, no lengths, ``embed_dim`` not a multiple of 4, a size
            below 1, or a negative seed.
        RuntimeError: the cached step's logits differ from the uncached step's.

    Example:
        >>> rows = decode_step_times((2, 5), embed_dim=8, num_layers=1, repeats=1)
        >>> [row.length for row in rows], rows[0].torch_calls == rows[1].torch_calls
        ([2, 5], True)
    """
    where = "decode_step_times"
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=2, nonempty=True)
    model, text, repeats, seed = _untrained_model(where, max(lengths), max(lengths), embed_dim, num_layers, repeats,
                                                  seed)
    rows = []
    with torch.no_grad(), one_thread():
        for length in lengths:
            ids = text[:, :length]                                              # [1, N]

            def filled_caches(ids: torch.Tensor = ids) -> list[KVCache]:
                caches = [KVCache(max_length=max(lengths)) for _ in model.blocks]
                model(ids[:, :-1], kv_caches=caches)                            # the cached tokens
                return caches

            # One cached step, on caches filled afresh (untimed) before each call: a step appends to them.
            cached = median_time(lambda caches, ids=ids: model(ids[:, -1:], kv_caches=caches), repeats,
                                 setup=filled_caches)
            uncached = median_time(lambda ids=ids: model(ids), repeats)         # one uncached step
            caches, counter = filled_caches(), _CountCalls()
            with counter:
                step_logits = model(ids[:, -1:], kv_caches=caches)[:, -1]
            if not torch.allclose(step_logits, model(ids)[:, -1], atol=1e-5, rtol=1e-4):
                raise RuntimeError(f"{where}: the cached step disagrees with the uncached one at length {length}")
            rows.append(DecodeStepRow(length=length, seconds_cached=cached, seconds_uncached=uncached,
                                      torch_calls=counter.calls))
    return rows
