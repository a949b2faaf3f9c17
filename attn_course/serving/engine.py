"""The engine loop: schedule a step, run the model on it over the paged cache, sample, repeat.

The model runs unchanged (:class:`~attn_course.serving.paged_cache.PagedKVCache` is a ``KVCache``): each
prompt chunk is one forward pass of one sequence; every decoding request together is one more, its
sequences of different lengths padded to the longest, the padding hidden by the attention mask.
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
            eval mode; a model with sliding-window layers is not supported yet.
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
        self.pool = KVPool(config.num_hidden_layers, num_blocks * block_size, config.num_key_value_heads,
                           config.head_dim, dtype=parameter.dtype)
        self.steps = 0
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
            ran = [(request, self._prefill(request, count)) for request, count in step.prefills]
            if step.decodes:
                ran += zip(step.decodes, self._decode(step.decodes))
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

    def _slots(self, request: Request, stop: int, start: int = 0) -> torch.Tensor:
        """The cache slots of ``request``'s tokens ``start .. stop - 1``."""
        table = torch.tensor(self.blocks.block_table(request.request_id))
        size = self.blocks.block_size
        return (table[:, None] * size + torch.arange(size)).flatten()[start:stop]

    def _caches(self, written: torch.Tensor, read: torch.Tensor) -> list[PagedKVCache]:
        return [PagedKVCache(self.pool, layer, written, read) for layer in range(len(self.pool.keys))]

    def _prefill(self, request: Request, count: int) -> torch.Tensor | None:
        """Run ``count`` of ``request``'s uncomputed tokens; the next token's logits if they were its last."""
        start, stop = request.computed, request.computed + count
        read = self._slots(request, stop)[None]                                  # [1, N_k]
        logits = self.model(torch.tensor([request.tokens[start:stop]]), positions=torch.arange(start, stop),
                            kv_caches=self._caches(read[:, start:], read)).logits  # [1, n, V]
        request.computed = stop
        return logits[0, -1] if stop == len(request.tokens) else None

    def _decode(self, requests: list[Request]) -> torch.Tensor:
        """One token for each of ``requests``, together: the next tokens' logits, ``[B, V]``."""
        lengths = torch.tensor([len(request.tokens) for request in requests])   # [B], the new token included
        longest = int(lengths.max())
        read = torch.zeros(len(requests), longest, dtype=torch.long)            # padded with slot 0, masked
        for row, request in enumerate(requests):
            read[row, :lengths[row]] = self._slots(request, int(lengths[row]))
        written = read.gather(1, (lengths - 1)[:, None])                        # [B, 1]
        real = torch.arange(longest)[None] < lengths[:, None]                   # [B, N_k]
        last = torch.tensor([[request.tokens[-1]] for request in requests])     # [B, 1]
        logits = self.model(last, real.long(), positions=(lengths - 1)[:, None],
                            kv_caches=self._caches(written, read)).logits       # [B, 1, V]
        for request in requests:
            request.computed += 1
        return logits[:, -1]


def _sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """The greedy token, or one drawn from ``softmax(logits / temperature)``."""
    if temperature == 0:
        return int(logits.argmax())
    probabilities = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))
