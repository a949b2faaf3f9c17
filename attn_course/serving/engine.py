"""The engine loop: schedule a step, run the model on it over the paged cache, sample, repeat.

The model runs unchanged (:class:`~attn_course.serving.paged_cache.PagedKVCache` is a ``KVCache``). Each
step runs the step's prompt chunks together in one forward pass, then every decoding request together in
another. Rows of different lengths are padded on the left, queries and keys alike, so that the causal
mask, aligned bottom right, is right for every row; the attention mask hides the padded keys, and the
padded tokens' keys and values go to a slot of their own past the pool's blocks. With a draft model
(speculative decoding), a decoding step is ``k`` small passes of the draft, one per guessed token, then one
pass of the model over the last token and all ``k`` guesses.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from attn_course import _validate
from attn_course.models.llama import LlamaForCausalLM
from attn_course.serving.block_manager import BlockManager
from attn_course.serving.paged_cache import KVPool, PagedKVCache
from attn_course.serving.scheduler import Request, Scheduler
from attn_course.serving.speculative import verify_greedy, verify_sampled

__all__ = ["Engine", "StepRecord"]


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What one step did (``Engine(record_steps=True)``): the prompt chunks it ran ``{request: tokens}``, the
    requests that decoded, every running request's block table as the step ran, the requests left waiting, and
    the preemptions so far."""

    step: int
    prefills: dict[int, int]
    decodes: list[int]
    block_tables: dict[int, list[int]]
    waiting: list[int]
    preemptions: int


class Engine:
    """Generate for many requests at once from the course's Llama, on a paged KV cache.

    Args:
        model: a :class:`~attn_course.models.llama.LlamaForCausalLM` (e.g. from ``load_pretrained``), used in
            eval mode, its attention set to PyTorch's SDPA (``attention_backend="sdpa"``); a model with
            sliding-window layers is not supported yet.
        block_size: tokens per cache block.
        num_blocks: blocks in the pool (the cache holds ``num_blocks * block_size`` tokens of every layer).
        max_batch_size: requests running at once.
        draft: a smaller ``LlamaForCausalLM`` with the same vocabulary, for speculative decoding: it guesses
            ``num_speculative_tokens`` tokens, one at a time, and ``model`` checks them all in one pass. It
            keeps its own pool of the same blocks (each request's block table serves both).
        num_speculative_tokens: tokens the draft guesses per step (``>= 1`` with a draft, 0 without).
        prefix_caching: share the blocks of prompts' common prefixes.
        max_tokens_per_step: tokens one step computes, decodes and prompt chunks together: a smaller budget cuts
            long prompts into more chunks, so decodes wait less behind them, at the price of more forward passes
            (the benchmark's 32 requests: 61 passes at 2,048; at 256, 62 steps, of which steps 2 to 6 ran a pass
            for prompt chunks and one for decodes, 67 passes).
        record_steps: keep a :class:`StepRecord` of every step in ``step_records`` (for a picture of the pool).

    Raises:
        TypeError, ValueError: a model or draft that is not the course's Llama or has sliding windows, a draft
            with another vocabulary, a draft without ``num_speculative_tokens`` or the reverse, sizes that are
            not ints ``>= 1``.

    Example:
        >>> from attn_course.models.llama import LlamaConfig
        >>> config = LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                      num_attention_heads=2)
        >>> engine = Engine(LlamaForCausalLM(config), block_size=4, num_blocks=8, max_batch_size=2)
        >>> [len(tokens) for tokens in engine.generate([[1, 2, 3], [4]], max_new_tokens=[2, 5])]
        [2, 5]
    """

    def __init__(self, model: LlamaForCausalLM, *, block_size: int = 16, num_blocks: int, max_batch_size: int,
                 draft: LlamaForCausalLM | None = None, num_speculative_tokens: int = 0, prefix_caching: bool = True,
                 max_tokens_per_step: int = 2048, record_steps: bool = False) -> None:
        where = "Engine"
        self.model = _servable(where, "model", model)
        self.draft = None if draft is None else _servable(where, "draft", draft)
        num_speculative_tokens = _validate.integer(where, "num_speculative_tokens", num_speculative_tokens, minimum=0)
        if draft is not None and draft.config.vocab_size != model.config.vocab_size:
            raise ValueError(f"{where}: draft has a vocabulary of {draft.config.vocab_size} tokens, the model "
                             f"{model.config.vocab_size}: the draft must propose the model's tokens")
        if (draft is None) != (num_speculative_tokens == 0):
            raise ValueError(f"{where}: speculative decoding needs both a draft and num_speculative_tokens >= 1, "
                             f"got draft={type(draft).__name__} and num_speculative_tokens={num_speculative_tokens}")
        self.blocks = BlockManager(num_blocks, block_size, prefix_caching=prefix_caching)
        self.scheduler = Scheduler(self.blocks, max_batch_size=max_batch_size, max_tokens_per_step=max_tokens_per_step,
                                   num_speculative_tokens=num_speculative_tokens)
        self.pad_slot = num_blocks * block_size                  # where padding writes, and what it reads
        self.pool = _pool(self.model, self.pad_slot)
        self.draft_pool = None if self.draft is None else _pool(self.draft, self.pad_slot)
        self.record_steps = _validate.boolean(where, "record_steps", record_steps)
        self.step_records: list[StepRecord] = []
        self.steps = 0
        self.peak_blocks = 0                                     # most blocks held at once
        self.proposed_tokens = self.accepted_tokens = 0          # the draft's guesses, and those the model kept
        self._request_ids = itertools.count()

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int], *, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> list[list[int]]:
        """The new tokens of each request, in order.

        Args:
            prompts: each request's token ids (at least one each, within the vocabulary).
            max_new_tokens: tokens to generate, for every request or one number per request.
            temperature: 0 for greedy decoding; above 0, sampling from ``softmax(logits / temperature)``.
            generator: the random generator for sampling.

        Raises:
            TypeError, ValueError: prompts that are not lists of token ids in the vocabulary, an empty prompt,
                ``max_new_tokens`` not ints ``>= 1`` (or not one per prompt), a negative temperature, a
                request whose tokens would not fit in the whole pool.
        """
        requests = self._requests(prompts, max_new_tokens)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"Engine.generate: temperature must be a number >= 0, got {temperature!r}")
        if generator is not None:
            _validate.instance("Engine.generate", "generator", generator, torch.Generator)
        for model in (self.model, self.draft):
            if model is not None:
                model.eval()
        for request in requests:
            self.scheduler.add(request)
        while self.scheduler.waiting or self.scheduler.running:
            step = self.scheduler.schedule()
            self.steps += 1
            self.peak_blocks = max(self.peak_blocks, self.blocks.num_blocks - self.blocks.num_free_blocks)
            if self.record_steps:
                self.step_records.append(StepRecord(
                    self.steps, {request.request_id: count for request, count in step.prefills},
                    [request.request_id for request in step.decodes],
                    {request.request_id: list(self.blocks.block_table(request.request_id))
                     for request in self.scheduler.running},
                    [request.request_id for request in self.scheduler.waiting], self.scheduler.preemptions))
            if step.prefills:
                self._prefill(step.prefills, temperature, generator)
            if step.decodes and self.draft is None:
                rows = [(request, request.tokens, request.computed, len(request.tokens)) for request in step.decodes]
                for request, logits in zip(step.decodes, self._forward(self.model, self.pool, rows)[:, -1]):
                    request.computed += 1
                    request.output.append(_sample(logits, temperature, generator))
            elif step.decodes:
                self._speculate(step.decodes, temperature, generator)
            for request in [request for request, _ in step.prefills] + step.decodes:
                # Name the blocks both caches hold: a later request that finds them reads both.
                known = request.computed if self.draft is None else min(request.computed, request.draft_computed)
                self.blocks.cache_full_blocks(request.request_id, request.tokens[:known])
                if request.finished:
                    self.scheduler.finish(request)
        return [request.output for request in requests]

    @property
    def acceptance_rate(self) -> float:
        """The share of the draft's guesses the model kept, over every ``generate`` so far (NaN before any)."""
        return self.accepted_tokens / self.proposed_tokens if self.proposed_tokens else float("nan")

    def _requests(self, prompts: object, max_new_tokens: object) -> list[Request]:
        where = "Engine.generate"
        prompts = _validate.sequence(where, "prompts", prompts, of="prompts (lists of token ids)")
        vocab = self.model.config.vocab_size
        if isinstance(max_new_tokens, (list, tuple)):
            counts = _validate.integer_sequence(where, "max_new_tokens", max_new_tokens, minimum=1)
            if len(counts) != len(prompts):
                raise ValueError(f"{where}: max_new_tokens must give one count per prompt ({len(prompts)}), "
                                 f"got {len(counts)}")
        else:
            counts = [_validate.integer(where, "max_new_tokens", max_new_tokens, minimum=1)] * len(prompts)
        requests = []
        for index, (prompt, count) in enumerate(zip(prompts, counts)):
            prompt = _validate.integer_sequence(where, f"prompts[{index}]", prompt, minimum=0, nonempty=True)
            if max(prompt) >= vocab:
                raise ValueError(f"{where}: prompts[{index}] holds token {max(prompt)}, outside the vocabulary "
                                 f"0..{vocab - 1}")
            needed = self.blocks.blocks_for(len(prompt) + count)
            if needed > self.blocks.num_blocks:
                raise ValueError(f"{where}: prompts[{index}] needs {needed} blocks for {len(prompt)} + {count} "
                                 f"tokens, but the pool has only num_blocks={self.blocks.num_blocks}")
            requests.append(Request(next(self._request_ids), prompt, count))
        return requests

    def _prefill(self, chunks: list[tuple[Request, int]], temperature: float,
                 generator: torch.Generator | None) -> None:
        """Run each request's next ``count`` tokens (through the draft too, when there is one); a request whose
        chunk ends its tokens samples its next one (the rest of a longer prompt comes in later steps)."""
        rows = [(request, request.tokens, request.computed, request.computed + count) for request, count in chunks]
        logits = self._forward(self.model, self.pool, rows)[:, -1]
        if self.draft is not None:
            self._forward(self.draft, self.draft_pool, [(request, tokens, request.draft_computed, stop)
                                                        for request, tokens, _, stop in rows])
        for (request, tokens, _, stop), row in zip(rows, logits):
            request.computed = request.draft_computed = stop
            if stop == len(tokens):
                request.output.append(_sample(row, temperature, generator))

    def _speculate(self, requests: list[Request], temperature: float, generator: torch.Generator | None) -> None:
        """One speculative step for decoding requests: the draft guesses up to ``k`` tokens of each, one pass
        per guess; the model scores every guess in one pass; each request keeps the guesses the verification
        accepts, then one token of the model's own (:mod:`~attn_course.serving.speculative`)."""
        counts = [request.speculative_tokens(self.scheduler.num_speculative_tokens) for request in requests]
        guesses: list[list[int]] = [[] for _ in requests]
        draft_probabilities: list[list[torch.Tensor]] = [[] for _ in requests]
        for turn in range(max(counts)):
            active = [index for index, count in enumerate(counts) if count > turn]
            rows = [(requests[index], requests[index].tokens + guesses[index], requests[index].draft_computed,
                     len(requests[index].tokens) + turn) for index in active]
            drafted = self._forward(self.draft, self.draft_pool, rows)[:, -1]
            for index, (request, _, _, stop), logits in zip(active, rows, drafted):
                request.draft_computed = stop
                guesses[index].append(_sample(logits, temperature, generator))
                if temperature:
                    draft_probabilities[index].append(_distribution(logits, temperature))
        rows = [(request, request.tokens + guess, request.computed, len(request.tokens) + len(guess))
                for request, guess in zip(requests, guesses)]
        width = max(counts) + 1
        logits = self._forward(self.model, self.pool, rows, last=width)            # [B, width, V]
        for request, guess, probabilities, scores in zip(requests, guesses, draft_probabilities, logits):
            scores = scores[width - len(guess) - 1:]                                 # [k + 1, V], this row's
            if temperature == 0:
                kept = verify_greedy(guess, scores)
            else:
                target = _distribution(scores, temperature)
                kept = verify_sampled(guess, torch.stack(probabilities) if guess else target[:0], target,
                                      generator=generator)
            self.proposed_tokens += len(guess)
            self.accepted_tokens += len(kept) - 1
            # The cache now holds the last token and every guess, but only those kept are the request's: the
            # rest are overwritten by the next pass. The draft cached the guesses before the last one.
            request.computed = len(request.tokens) + len(kept) - 1
            request.draft_computed = min(request.draft_computed, request.computed)
            request.output += kept

    def _forward(self, model: LlamaForCausalLM, pool: KVPool, rows: list[tuple[Request, list[int], int, int]], *,
                 last: int = 1) -> torch.Tensor:
        """One forward pass of ``model`` over ``tokens[start:stop]`` of each row ``(request, tokens, start,
        stop)``, with the keys and values of ``tokens[:start]`` read from ``pool``, that model's: the logits after
        each row's last ``last`` tokens, ``[B, last, V]``. Rows are padded on the left to the longest chunk
        and the longest context."""
        new = max(stop - start for _, _, start, stop in rows)
        context = max(stop for _, _, _, stop in rows)
        ids, positions, read, written = [], [], [], []      # built as lists, one tensor each: rows are many
        for request, tokens, start, stop in rows:
            slots = self.blocks.slots(request.request_id, stop)
            padding = [self.pad_slot] * (new - (stop - start))
            ids.append([0] * len(padding) + tokens[start:stop])
            positions.append([0] * len(padding) + list(range(start, stop)))
            read.append([self.pad_slot] * (context - stop) + slots)                # [N_k]
            written.append(padding + slots[start:])                                # [N_new]
        ids, positions, read, written = (torch.tensor(table) for table in (ids, positions, read, written))
        real = (read != self.pad_slot).long()                                    # [B, N_k]
        caches = [PagedKVCache(pool, layer, written, read) for layer in range(len(pool.keys))]
        hidden = model.model(ids, real, positions=positions, kv_caches=caches).hidden_states     # [B, N_new, E]
        return model.lm_head(hidden[:, -last:])                 # only the logits sampled from: a prompt's are not


def _servable(where: str, name: str, model: object) -> LlamaForCausalLM:
    """``model``, checked, with its attention set to PyTorch's SDPA on every layer."""
    model = _validate.instance(where, name, model, LlamaForCausalLM)
    config = model.config
    if any(config.layer_window(index) is not None for index in range(config.num_hidden_layers)):
        raise ValueError(f"{where}: {name} has sliding-window layers, which this engine does not support yet")
    for block in model.model.blocks:
        block.attention.attention_backend = "sdpa"
    return model


def _pool(model: LlamaForCausalLM, pad_slot: int) -> KVPool:
    """A pool for ``model``'s keys and values with ``pad_slot + 1`` slots, the last (padding's) cleared: masked
    keys get zero weight, but zero times a NaN left in memory is NaN."""
    config = model.config
    pool = KVPool(config.num_hidden_layers, pad_slot + 1, config.num_key_value_heads, config.head_dim,
                  dtype=next(model.parameters()).dtype)
    pool.keys[:, pad_slot] = pool.values[:, pad_slot] = 0.0
    return pool


def _distribution(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax(logits / temperature)`` in float64: what sampling draws from, and what verification compares."""
    return torch.softmax(logits.double() / temperature, dim=-1)


def _sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """The greedy token, or one drawn from ``softmax(logits / temperature)``."""
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial(_distribution(logits, temperature), 1, generator=generator))
