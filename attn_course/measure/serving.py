"""Serving on this CPU (``python -m benchmarks serving``): the course's engine against Hugging Face's own.

One random Llama, saved to a folder by ``transformers`` and loaded by the course; the same requests (prompts of
3 to 64 tokens, 4 to 64 new tokens each), greedy, float32:

* ``engine``: :class:`~attn_course.serving.Engine`, every request at once (continuous batching, paged cache);
* ``hf static batch``: ``generate`` on the whole batch, left-padded, with its KV cache, run to the longest
  request (the tokens past a request's own count are computed and thrown away);
* ``hf generate_batch``: Hugging Face's continuous batching (``generate_batch``, transformers 5.x), every
  request run to the longest count (it takes one ``max_new_tokens``).

Useful tokens are each request's own count; every method's tokens are compared with the engine's. The
memory rows: the engine's blocks at their peak against contiguous caches (one per request, reserving its
prompt and the longest answer allowed; and the static batch's, every row as long as the longest prompt plus
the longest answer), and the prefix cache's hit rate when every request starts with the same 48-token system
prompt: the share of prompt tokens found cached, the first request computing it alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import random
import tempfile
import warnings

import torch

from attn_course import _validate
from attn_course._threads import threads as threads_of_torch
from attn_course.core.kv_cache import KVCache
from attn_course.measure.timing import best_time
from attn_course.models.llama import LlamaForCausalLM, load_pretrained
from attn_course.serving import Engine

__all__ = ["DecodeStepRow", "ServingMemory", "ServingRow", "SpeculativeRow", "decode_step_rows", "measure_serving",
           "serving_requests", "speculative_rows"]


@dataclasses.dataclass(frozen=True)
class ServingRow:
    """One method: useful tokens, the best of its timed runs, and how many requests got the engine's tokens."""

    method: str
    requests: int
    useful_tokens: int
    seconds: float
    tokens_per_second: float
    same_as_engine: int


@dataclasses.dataclass(frozen=True)
class ServingMemory:
    """The engine's cache at its peak against contiguous caches, and the prefix cache's hit rate with a shared
    system prompt of ``system_prompt`` tokens."""

    block_size: int
    peak_blocks: int
    peak_tokens: int
    contiguous_per_request_tokens: int
    static_batch_tokens: int
    system_prompt: int
    prefix_hit_rate: float


@dataclasses.dataclass(frozen=True)
class DecodeStepRow:
    """One batch size: the best time of one decoding step (every sequence adds one token) and the tokens per second."""

    batch_size: int
    seconds: float
    tokens_per_second: float


def decode_step_rows(model: LlamaForCausalLM, batch_sizes: tuple[int, ...] = (1, 4, 16, 64), *, context: int = 64,
                     repeats: int = 5, threads: int = 2) -> list[DecodeStepRow]:
    """Time one decoding step of ``model`` for each batch size: ``B`` sequences of ``context`` cached tokens each
    feed one new token through the model, with their KV caches (the caches grow by one token per timed call).

    Args:
        model: the course's Llama.
        batch_sizes: sequences decoding together.
        context: tokens already in each sequence's cache.
        repeats: timed steps per batch size (the best counts).
        threads: torch's CPU threads while measuring.

    Raises:
        TypeError, ValueError: a model that is not the course's Llama, sizes that are not ints ``>= 1``.

    Example:
        >>> from attn_course.models.llama import LlamaConfig
        >>> tiny = LlamaForCausalLM(LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=16,
        ...                                     num_hidden_layers=1, num_attention_heads=2))
        >>> [row.batch_size for row in decode_step_rows(tiny, (1, 2), context=3, repeats=1)]
        [1, 2]
    """
    where = "decode_step_rows"
    model = _validate.instance(where, "model", model, LlamaForCausalLM)
    batch_sizes = _validate.integer_sequence(where, "batch_sizes", batch_sizes, minimum=1, nonempty=True)
    context, repeats, threads = _validate.integers(where, minimum=1, context=context, repeats=repeats, threads=threads)
    generator = torch.Generator().manual_seed(0)
    rows = []
    with threads_of_torch(threads), torch.no_grad():
        model.eval()
        for batch in batch_sizes:
            caches = [KVCache() for _ in model.model.blocks]
            prompt = torch.randint(model.config.vocab_size, (batch, context), generator=generator)
            model(prompt, kv_caches=caches)                                      # fill the caches
            token = torch.randint(model.config.vocab_size, (batch, 1), generator=generator)
            seconds = best_time(functools.partial(model, token, kv_caches=caches), repeats)
            rows.append(DecodeStepRow(batch, seconds, batch / seconds))
    return rows


@dataclasses.dataclass(frozen=True)
class SpeculativeRow:
    """One batch of requests, sampled without a draft (``draft`` None) or with one: the share of the draft's
    guesses kept, the best time, and the speed-up over no draft."""

    requests: int
    draft: str | None
    guesses_kept: float | None
    seconds: float
    speedup: float


def speculative_rows(model: LlamaForCausalLM, drafts: dict[str, LlamaForCausalLM], batches: list[list[list[int]]],
                     *, new_tokens: int = 40, num_speculative_tokens: int = 3, temperature: float = 1.0,
                     repeats: int = 3, seed: int = 0) -> list[SpeculativeRow]:
    """Time the engine on each batch of prompts, without a draft and with each of ``drafts``, sampling
    ``new_tokens`` tokens per request (seeded: every run of a batch draws the same random numbers).

    Args:
        model: the course's Llama.
        drafts: ``{name: draft model}``.
        batches: lists of prompts (token ids), each served in one ``generate``.
        new_tokens, num_speculative_tokens, temperature: as the engine takes them.
        repeats: timed runs of each (the best counts).
        seed: the sampling generator's seed.

    Raises:
        TypeError, ValueError: as :class:`~attn_course.serving.Engine` and its ``generate`` raise them.

    Example:
        >>> from attn_course.models.llama import LlamaConfig
        >>> tiny = LlamaForCausalLM(LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=16,
        ...                                     num_hidden_layers=1, num_attention_heads=2))
        >>> rows = speculative_rows(tiny, {"itself": tiny}, [[[1, 2]]], new_tokens=3, repeats=1)
        >>> [(row.draft, row.guesses_kept) for row in rows]
        [(None, None), ('itself', 1.0)]
    """
    def run(prompts: list[list[int]], draft: LlamaForCausalLM | None) -> Engine:
        speculative = {"draft": draft, "num_speculative_tokens": num_speculative_tokens} if draft is not None else {}
        engine = Engine(model, block_size=16, num_blocks=_blocks_needed(prompts, [new_tokens] * len(prompts), 16),
                        max_batch_size=len(prompts), **speculative)
        engine.generate(prompts, new_tokens, temperature=temperature, generator=torch.Generator().manual_seed(seed))
        return engine

    rows = []
    for prompts in batches:
        alone = best_time(functools.partial(run, prompts, None), repeats)
        rows.append(SpeculativeRow(len(prompts), None, None, alone, 1.0))
        for name, draft in drafts.items():
            kept = run(prompts, draft).acceptance_rate
            seconds = best_time(functools.partial(run, prompts, draft), repeats)
            rows.append(SpeculativeRow(len(prompts), name, kept, seconds, alone / seconds))
    return rows


def serving_requests(count: int, vocab_size: int, *, seed: int = 0, prompt_lengths: tuple[int, int] = (3, 64),
                     new_tokens: tuple[int, int] = (4, 64),
                     system_prompt: int = 0) -> tuple[list[list[int]], list[int]]:
    """``count`` random prompts (token ids ``1 .. vocab_size - 1``; 0 is the padding) and their new-token counts,
    lengths drawn uniformly within the bounds; every prompt starts with the same ``system_prompt`` tokens.

    Example:
        >>> prompts, counts = serving_requests(3, 10, prompt_lengths=(2, 4), new_tokens=(1, 2))
        >>> [2 <= len(prompt) <= 4 for prompt in prompts], all(1 <= count <= 2 for count in counts)
        ([True, True, True], True)
    """
    where = "serving_requests"
    count, vocab_size = _validate.integers(where, minimum=1, count=count, vocab_size=vocab_size)
    system_prompt = _validate.integer(where, "system_prompt", system_prompt, minimum=0)
    rng = random.Random(_validate.integer(where, "seed", seed, minimum=0))
    shared = [rng.randrange(1, vocab_size) for _ in range(system_prompt)]
    prompts = [shared + [rng.randrange(1, vocab_size) for _ in range(rng.randint(*prompt_lengths))]
               for _ in range(count)]
    return prompts, [rng.randint(*new_tokens) for _ in range(count)]


def measure_serving(*, requests: int = 32, hidden_size: int = 96, num_layers: int = 4, vocab_size: int = 512,
                    block_size: int = 16, repeats: int = 2, threads: int = 2, generate_batch: bool = True,
                    seed: int = 0) -> tuple[list[ServingRow], ServingMemory]:
    """Time the engine, Hugging Face's static batch and (if ``generate_batch``) its continuous batching.

    Args:
        requests: requests in the workload (:func:`serving_requests`).
        hidden_size, num_layers, vocab_size: the random Llama's sizes (4 query heads, 2 key/value heads,
            a feed-forward of ``8/3`` the width).
        block_size: the engine's block size; the pool holds every request's tokens at once.
        repeats: timed runs of the engine and the static batch (the best counts); ``generate_batch`` runs once.
        threads: torch's CPU threads while measuring.
        generate_batch: also time Hugging Face's ``generate_batch`` (slow on a CPU: minutes for 32 requests).
        seed: the weights' and the workload's seed.

    Returns:
        ``(rows, memory)``.

    Raises:
        TypeError, ValueError: sizes that are not ints ``>= 1`` (``hidden_size`` a multiple of 4), a
            ``generate_batch`` that is not a bool.
    """
    where = "measure_serving"
    requests, hidden_size, num_layers, vocab_size, block_size, repeats, threads = _validate.integers(
        where, minimum=1, requests=requests, hidden_size=hidden_size, num_layers=num_layers, vocab_size=vocab_size,
        block_size=block_size, repeats=repeats, threads=threads)
    generate_batch = _validate.boolean(where, "generate_batch", generate_batch)
    if hidden_size % 4:
        raise ValueError(f"{where}: hidden_size must be a multiple of 4 (the heads), got {hidden_size}")
    import transformers

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_validate.integer(where, "seed", seed, minimum=0))
        config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                                          intermediate_size=hidden_size * 8 // 3, num_hidden_layers=num_layers,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                          bos_token_id=None, eos_token_id=None, pad_token_id=0)
        reference = transformers.LlamaForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        # Quietly: "Writing model shards" is a progress bar, a widget in a notebook, which stderr does not catch.
        shown = transformers.utils.logging.is_progress_bar_enabled()
        transformers.utils.logging.disable_progress_bar()
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                reference.save_pretrained(folder)
        finally:
            if shown:
                transformers.utils.logging.enable_progress_bar()
        ours = load_pretrained(folder)
    prompts, counts = serving_requests(requests, vocab_size, seed=seed)
    useful = sum(counts)
    blocks_needed = _blocks_needed(prompts, counts, block_size)
    rows = []
    with threads_of_torch(threads), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engines = []

        def engine_run() -> list[list[int]]:
            engines.append(Engine(ours, block_size=block_size, num_blocks=blocks_needed, max_batch_size=requests))
            return engines[-1].generate(prompts, counts)

        seconds, served = _timed(engine_run, repeats)
        rows.append(ServingRow("engine", requests, useful, seconds, useful / seconds, requests))

        longest = max(map(len, prompts))
        ids = torch.zeros(requests, longest, dtype=torch.long)
        mask = torch.zeros(requests, longest, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, longest - len(prompt):], mask[row, longest - len(prompt):] = torch.tensor(prompt), 1

        def static_run() -> list[list[int]]:
            out = reference.generate(ids, attention_mask=mask, max_new_tokens=max(counts), min_new_tokens=max(counts),
                                     do_sample=False)
            return [out[row, longest:longest + count].tolist() for row, count in enumerate(counts)]

        seconds, tokens = _timed(static_run, repeats)
        rows.append(ServingRow("hf static batch", requests, useful, seconds, useful / seconds,
                               sum(a == b for a, b in zip(tokens, served))))
        if generate_batch:
            settings = transformers.GenerationConfig(max_new_tokens=max(counts), do_sample=False, eos_token_id=None,
                                                     pad_token_id=0)

            def continuous_run() -> list[list[int]]:
                quiet = logging.getLogger("ContinuousBatchingLogger")      # "eos_token_id not set": as meant
                level = quiet.level
                quiet.setLevel(logging.ERROR)
                try:
                    out = reference.generate_batch(prompts, generation_config=settings, warmup=False)
                finally:
                    quiet.setLevel(level)
                by_prompt = {tuple(result.prompt_ids): result.generated_tokens for result in out.values()}
                return [list(by_prompt[tuple(prompt)][:count]) for prompt, count in zip(prompts, counts)]

            seconds, tokens = _timed(continuous_run, 1)
            rows.append(ServingRow("hf generate_batch", requests, useful, seconds, useful / seconds,
                                   sum(a == b for a, b in zip(tokens, served))))

        shared_prompts, _ = serving_requests(requests, vocab_size, seed=seed + 1, system_prompt=48)
        # The first request alone computes the system prompt; the rest, together, find its blocks cached.
        sharing = Engine(ours, block_size=block_size, num_blocks=blocks_needed + 4 * requests, max_batch_size=requests)
        sharing.generate(shared_prompts[:1], counts[:1])
        sharing.generate(shared_prompts[1:], counts[1:])
    memory = ServingMemory(
        block_size=block_size, peak_blocks=engines[-1].peak_blocks, peak_tokens=engines[-1].peak_blocks * block_size,
        contiguous_per_request_tokens=sum(len(prompt) + max(counts) for prompt in prompts),
        static_batch_tokens=requests * (longest + max(counts)), system_prompt=48,
        prefix_hit_rate=sharing.blocks.cached_tokens / sharing.blocks.prompt_tokens)
    return rows, memory


def _blocks_needed(prompts: list[list[int]], counts: list[int], block_size: int) -> int:
    """Blocks for every request's prompt and new tokens at once: a pool in which nothing waits."""
    return sum(-(-(len(prompt) + count) // block_size) for prompt, count in zip(prompts, counts))


def _timed(run, repeats: int) -> tuple[float, list[list[int]]]:
    """:func:`~attn_course.measure.timing.best_time` of ``run`` over ``repeats`` calls, and what it returned."""
    returned = []
    return best_time(lambda: returned.append(run()), repeats), returned[-1]
