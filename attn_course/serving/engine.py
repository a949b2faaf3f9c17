"""The engine loop: schedule a step, run the model on it over the paged cache, sample, repeat.

The model runs unchanged (:class:`~attn_course.serving.paged_cache.PagedKVCache` is a ``KVCache``). Each
step is at most two forward passes: the step's prompt chunks together, then every decoding request
together. Rows of different lengths are padded on the left, queries and keys alike, so that the causal
mask, aligned bottom right, is right for every row; the attention mask hides the padded keys, and the
padded tokens' keys and values go to a slot of their own past the pool's blocks.
"""

from __future__ import annotations

import itertools

import torch

from attn_course import _validate
from attn_course.models.llama import LlamaForCausalLM
from attn_course.serving.block_manager import BlockManager
from attn_course.serving.paged_cache import KVPool, PagedKVCache
from attn_course.serving.scheduler import Request, Scheduler

__all__ = ["Engine"]


class Engine:
    """Generate for many requests at once from the course's Llama, on a paged KV cache.

    Args:
        model: a :class:`~attn_course.models.llama.LlamaForCausalLM` (e.g. from ``load_pretrained``), used in
            eval mode, its attention set to PyTorch's SDPA (``attention_backend="sdpa"``); a model with
            sliding-window layers is not supported yet.
        block_size: tokens per cache block.
        num_blocks: blocks in the pool (the cache holds ``num_blocks * block_size`` tokens of every layer).
        max_batch_size: requests running at once.
        prefix_caching: share the blocks of prompts' common prefixes.
        max_tokens_per_step: tokens one step computes, decodes and prompt chunks together.

    Raises:
        TypeError, ValueError: a model that is not the course's Llama or has sliding windows, sizes that are
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
                 prefix_caching: bool = True, max_tokens_per_step: int = 256) -> None:
        where = "Engine"
        self.model = _validate.instance(where, "model", model, LlamaForCausalLM)
        config = model.config
        if any(config.layer_window(index) is not None for index in range(config.num_hidden_layers)):
            raise ValueError(f"{where}: model has sliding-window layers, which this engine does not support yet")
        self.blocks = BlockManager(num_blocks, block_size, prefix_caching=prefix_caching)
        self.scheduler = Scheduler(self.blocks, max_batch_size=max_batch_size, max_tokens_per_step=max_tokens_per_step)
        parameter = next(model.parameters())
        self.pad_slot = num_blocks * block_size                  # where padding writes, and what it reads
        self.pool = KVPool(config.num_hidden_layers, self.pad_slot + 1, config.num_key_value_heads,
                           config.head_dim, dtype=parameter.dtype)
        # Masked keys get zero weight, but zero times a NaN left in memory is NaN: the pad slot is read, so cleared.
        self.pool.keys[:, self.pad_slot] = self.pool.values[:, self.pad_slot] = 0.0
        for block in model.model.blocks:
            block.attention.attention_backend = "sdpa"           # PyTorch's fused attention, on every layer
        self.steps = 0
        self.peak_blocks = 0                                         # most blocks held at once
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
        self.model.eval()
        for request in requests:
            self.scheduler.add(request)
        while self.scheduler.waiting or self.scheduler.running:
            step = self.scheduler.schedule()
            self.steps += 1
            self.peak_blocks = max(self.peak_blocks, self.blocks.num_blocks - self.blocks.num_free_blocks)
            ran = []
            if step.prefills:
                ran += zip([request for request, _ in step.prefills], self._prefill(step.prefills))
            if step.decodes:
                ran += zip(step.decodes, self._forward([(request, 1) for request in step.decodes]))
            for request, logits in ran:
                if logits is not None:
                    request.output.append(_sample(logits, temperature, generator))
                self.blocks.cache_full_blocks(request.request_id, request.tokens[:request.computed])
                if request.finished:
                    self.scheduler.finish(request)
        return [request.output for request in requests]

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

    def _caches(self, written: torch.Tensor, read: torch.Tensor) -> list[PagedKVCache]:
        return [PagedKVCache(self.pool, layer, written, read) for layer in range(len(self.pool.keys))]

    def _prefill(self, chunks: list[tuple[Request, int]]) -> list[torch.Tensor | None]:
        """Run each request's next ``count`` tokens; for a request whose chunk ends its tokens, the next
        token's logits, else None (the rest of its prompt comes in later steps)."""
        ends = [request.computed + count == len(request.tokens) for request, count in chunks]
        return [row if end else None for row, end in zip(self._forward(chunks), ends)]

    def _forward(self, chunks: list[tuple[Request, int]]) -> torch.Tensor:
        """One forward pass over ``count`` uncomputed tokens of each request: the logits after each row's
        last token, ``[B, V]``. Rows are padded on the left to the longest chunk and the longest context."""
        new = max(count for _, count in chunks)
        context = max(request.computed + count for request, count in chunks)
        ids = torch.zeros(len(chunks), new, dtype=torch.long)
        positions = torch.zeros(len(chunks), new, dtype=torch.long)
        read = torch.full((len(chunks), context), self.pad_slot)                # [B, N_k]
        written = torch.full((len(chunks), new), self.pad_slot)                 # [B, N_new]
        for row, (request, count) in enumerate(chunks):
            start, stop = request.computed, request.computed + count
            slots = torch.tensor(self.blocks.slots(request.request_id, stop))
            ids[row, new - count:] = torch.tensor(request.tokens[start:stop])
            positions[row, new - count:] = torch.arange(start, stop)
            read[row, context - stop:] = slots
            written[row, new - count:] = slots[start:]
            request.computed = stop
        real = (read != self.pad_slot).long()                                    # [B, N_k]
        logits = self.model(ids, real, positions=positions, kv_caches=self._caches(written, read)).logits
        return logits[:, -1]                                                     # [B, V]


def _sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """The greedy token, or one drawn from ``softmax(logits / temperature)``."""
    if temperature == 0:
        return int(logits.argmax())
    probabilities = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))
