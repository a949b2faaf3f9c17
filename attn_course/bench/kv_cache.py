"""``python -m attn_course.bench kv-cache``: generation with and without a KV cache.

Without a cache, every new token re-runs the model over the whole sequence so far; with
one, each step feeds only the newest token. The speed-up grows with the number of tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from attn_course import _validate
from attn_course.bench.timing import best_time, check_rows
from attn_course.language_model import LanguageModelConfig, TinyLanguageModel

__all__ = ["KvCacheRow", "kv_cache_speedup", "print_kv_cache"]

_NUM_HEADS = 4


@dataclasses.dataclass(frozen=True)
class KvCacheRow:
    """One row of :func:`kv_cache_speedup`: best times for one number of generated tokens.

    Attributes:
        new_tokens: how many tokens were generated after the prompt.
        seconds_without: best time without a cache, in seconds.
        seconds_with: best time with a :class:`~attn_course.kv_cache.KVCache`, in seconds.
        speedup: ``seconds_without / seconds_with``.
    """

    new_tokens: int
    seconds_without: float
    seconds_with: float
    speedup: float


def kv_cache_speedup(
    new_tokens: Sequence[int] = (32, 64, 128, 256),
    *,
    prompt_length: int = 32,
    embed_dim: int = 128,
    num_layers: int = 4,
    repeats: int = 1,
    seed: int = 0,
) -> list[KvCacheRow]:
    """Time generation with and without a :class:`~attn_course.kv_cache.KVCache`.

    Uses an untrained :class:`~attn_course.language_model.TinyLanguageModel` (speed does not
    depend on the weights) with 4 heads, samples from a generator seeded with ``seed``, and
    checks that both ways produce the same tokens. The caller's global RNG is left as it was.

    Args:
        new_tokens: numbers of tokens to generate, one row each.
        prompt_length: tokens before generation starts.
        embed_dim: model width, a multiple of 4 (the number of heads).
        num_layers: decoder blocks.
        repeats: take the best of this many runs.
        seed: seeds weights, prompt and sampling; ``>= 0``.

    Returns:
        One :class:`KvCacheRow` per entry of ``new_tokens``, in order.

    Raises:
        TypeError: a size that is not an int, or ``new_tokens`` not a sequence.
        ValueError: a size below 1, no ``new_tokens``, ``embed_dim`` not a multiple of 4,
            or a negative seed.
        RuntimeError: cached and uncached generation produce different tokens.

    Example:
        >>> rows = kv_cache_speedup((2,), prompt_length=2, embed_dim=8, num_layers=1)
        >>> rows[0].new_tokens, rows[0].speedup > 0
        (2, True)
    """
    where = "kv_cache_speedup"
    counts = _validate.integer_sequence(where, "new_tokens", new_tokens, minimum=1)
    if not counts:
        raise ValueError(f"{where}: new_tokens must not be empty")
    prompt_length = _validate.integer(where, "prompt_length", prompt_length, minimum=1)
    embed_dim = _validate.integer(where, "embed_dim", embed_dim, minimum=1)
    if embed_dim % _NUM_HEADS:
        raise ValueError(f"{where}: embed_dim must be a multiple of {_NUM_HEADS} (the heads), got {embed_dim}")
    num_layers = _validate.integer(where, "num_layers", num_layers, minimum=1)
    repeats = _validate.integer(where, "repeats", repeats, minimum=1)
    seed = _validate.integer(where, "seed", seed, minimum=0)
    config = LanguageModelConfig(vocab_size=64, max_length=prompt_length + max(counts), embed_dim=embed_dim,
                                 num_heads=_NUM_HEADS, num_layers=num_layers)
    with torch.random.fork_rng(devices=[]):   # seed the weights without reseeding the caller's RNG
        torch.manual_seed(seed)
        model = TinyLanguageModel(config).eval()
        prompt = torch.randint(0, config.vocab_size, (1, prompt_length))
    rows = []
    for count in counts:
        def run(use_cache: bool, count: int = count) -> torch.Tensor:
            # A fresh generator per run: both ways must draw the same samples to agree.
            return model.generate(prompt, count, use_cache=use_cache, generator=torch.Generator().manual_seed(seed))

        if not torch.equal(run(True), run(False)):
            raise RuntimeError(f"{where}: cached and uncached generation disagree at new_tokens={count}")
        without, with_cache = best_time(lambda: run(False), repeats), best_time(lambda: run(True), repeats)
        rows.append(KvCacheRow(new_tokens=count, seconds_without=without, seconds_with=with_cache,
                               speedup=without / with_cache))
    return rows


def print_kv_cache(rows: Sequence[KvCacheRow]) -> None:
    """Print the rows of :func:`kv_cache_speedup` as a table, one line per row.

    Args:
        rows: a non-empty sequence of :class:`KvCacheRow`.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`KvCacheRow`.
        ValueError: no rows.
    """
    rows = check_rows("print_kv_cache", rows, (KvCacheRow,))
    print(f"{'new tokens':>10} {'no cache (s)':>13} {'cache (s)':>10} {'speed-up':>9}")
    for row in rows:
        print(f"{row.new_tokens:>10} {row.seconds_without:>13.3f} {row.seconds_with:>10.3f} {row.speedup:>8.1f}x")
