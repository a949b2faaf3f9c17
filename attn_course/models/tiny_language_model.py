"""A tiny character-level causal language model, trained on CPU in under a minute.

Chapter 04 trains it on the nursery rhymes shipped in ``attn_course/data`` (holding the last
tenth out to measure what it learned) and lets it write new ones, one character at a time,
with and without a key/value cache.

The model has learned position embeddings, one per position of its context window
(``LanguageModelConfig.max_length``). Training uses windows of exactly that length, so every
position is trained; generation keeps the last ``max_length`` tokens as its context (as
nanoGPT does: ``idx[:, -block_size:]``), so no position beyond the trained ones is ever used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attn_course import _validate
from attn_course._threads import one_thread
from attn_course.core.kv_cache import KVCache
from attn_course.core.transformer import DecoderBlock

__all__ = ["LanguageModelConfig", "TinyLanguageModel", "check_ids_and_caches"]


def check_ids_and_caches(where: str, ids: object, kv_caches: object, *, vocab_size: int,
                         num_blocks: int) -> tuple[torch.Tensor, int]:
    """Check a character model's input: ``ids [B, N]`` of ids below ``vocab_size``, and one cache per block.

    Shared by the course's small causal models (this module's and :mod:`attn_course.models.position_model`'s),
    so they reject bad input with the same words.

    Args:
        where: the caller's name, for the messages.
        ids: ``[B, N]`` integer token ids, ``N >= 1``.
        kv_caches: None, or a list of :class:`~attn_course.core.kv_cache.KVCache`, one per block.
        vocab_size, num_blocks: the model's.

    Returns:
        ``(ids, start)``: the ids, and the position of the first of them (``len`` of the caches, or 0).

    Raises:
        TypeError, ValueError: ids that are not a 2-D integer tensor of ids below ``vocab_size``,
            caches that are not a list of KVCache, one per block.
    """
    ids = _validate.integer_tensor(where, "ids", ids)
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"{where}: ids must be [B, N] with N >= 1, got shape {_validate.shape_str(ids)}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{where}: ids must lie in 0..{vocab_size - 1}, "
                         f"got values from {int(ids.min())} to {int(ids.max())}")
    if kv_caches is None:
        return ids, 0
    if isinstance(kv_caches, KVCache) or not isinstance(kv_caches, (list, tuple)) \
            or not all(isinstance(c, KVCache) for c in kv_caches):
        raise TypeError(f"{where}: kv_caches must be a list of KVCache, one per block")
    if len(kv_caches) != num_blocks:
        raise ValueError(f"{where}: need one KVCache per block ({num_blocks}), got {len(kv_caches)}")
    return ids, len(kv_caches[0])


@dataclass(frozen=True)
class LanguageModelConfig:
    """Sizes of a :class:`TinyLanguageModel`.

    Args:
        vocab_size: number of token ids ``V``.
        max_length: the context window: the number of learned position embeddings, hence the
            longest input of one forward pass. :func:`train_language_model` trains on windows of
            exactly this length, and :meth:`TinyLanguageModel.generate` keeps the last
            ``max_length`` tokens as context.
        embed_dim: model width ``E``.
        num_heads: ``H``; must divide ``E``.
        num_layers: number of decoder blocks.
        dropout: dropout while training, in ``[0, 1)``.

    Raises:
        TypeError, ValueError: sizes that are not positive ints, ``E`` not divisible by ``H``,
            or a dropout outside ``[0, 1)``.
    """

    vocab_size: int
    max_length: int = 128
    embed_dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    dropout: float = 0.0

    def __post_init__(self) -> None:
        where = "LanguageModelConfig"
        for field in ("vocab_size", "max_length", "embed_dim", "num_heads", "num_layers"):
            _validate.integer(where, field, getattr(self, field), minimum=1)
        if self.embed_dim % self.num_heads:
            raise ValueError(f"{where}: embed_dim={self.embed_dim} must be divisible by num_heads={self.num_heads}")
        _validate.dropout(where, self.dropout)


class TinyLanguageModel(nn.Module):
    """Token and position embeddings, a stack of causal decoder blocks, and a linear head.

    Example:
        >>> model = TinyLanguageModel(LanguageModelConfig(vocab_size=10))
        >>> model(torch.zeros(2, 5, dtype=torch.long)).shape
        torch.Size([2, 5, 10])
    """

    def __init__(self, config: LanguageModelConfig) -> None:
        super().__init__()
        _validate.instance("TinyLanguageModel", "config", config, LanguageModelConfig)
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.embed_dim)
        self.position_embedding = nn.Embedding(config.max_length, config.embed_dim)
        self.blocks = nn.ModuleList(
            DecoderBlock(config.embed_dim, config.num_heads, dropout=config.dropout) for _ in range(config.num_layers)
        )
        self.final_norm = nn.LayerNorm(config.embed_dim)
        self.head = nn.Linear(config.embed_dim, config.vocab_size)

    def forward(self, ids: torch.Tensor, *, kv_caches: list[KVCache] | None = None) -> torch.Tensor:
        """Next-token logits for every position.

        Args:
            ids: ``[B, N]`` token ids. With caches, only the new tokens.
            kv_caches: one :class:`KVCache` per block, or None to process ``ids`` alone.

        Returns:
            ``[B, N, vocab_size]`` logits; position ``i`` predicts token ``i + 1``.

        Raises:
            TypeError, ValueError: ids that are not a 2-D integer tensor, a sequence longer
                than ``max_length``, or the wrong number of caches.
        """
        where = "TinyLanguageModel.forward"
        ids, start = check_ids_and_caches(where, ids, kv_caches, vocab_size=self.config.vocab_size,
                                          num_blocks=len(self.blocks))
        end = start + ids.shape[1]
        if end > self.config.max_length:
            raise ValueError(f"{where}: positions up to {end} exceed max_length={self.config.max_length}")
        positions = torch.arange(start, end, device=ids.device)
        x = self.token_embedding(ids) + self.position_embedding(positions)      # [B, N, E]
        for index, block in enumerate(self.blocks):
            x, _ = block(x, kv_cache=None if kv_caches is None else kv_caches[index])
        return self.head(self.final_norm(x))                                     # [B, N, V]

    @torch.no_grad()
    @one_thread()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        use_cache: bool = True,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after ``prompt``, one at a time.

        The model only knows ``max_length`` positions, so its context is the last ``max_length``
        tokens: once the text is longer, the window slides and the oldest token drops out (as
        in nanoGPT, ``idx[:, -block_size:]``). No position beyond the trained ones is used.

        Without a cache, every step re-runs the model over the whole context. With one, each
        step feeds only the newest token and attends to the cached keys and values, as long as
        the context starts at the text's first token. Once the window slides, every token moves
        to a new position, and with learned position embeddings that changes every key and
        value in every layer: the cache no longer holds the right ones, so each step recomputes
        the cropped context in full, exactly as without a cache. Both ways produce the same
        tokens for the same generator state.

        Args:
            prompt: ``[N]`` or ``[B, N]`` token ids, at least one; a prompt longer than
                ``max_length`` is cropped to its last ``max_length`` tokens as context.
            max_new_tokens: how many tokens to add.
            use_cache: decode with :class:`KVCache` while the context fits the window.
            temperature: divides the logits (lower = more predictable).
            generator: random generator for reproducible samples.

        Returns:
            ``[B, N + max_new_tokens]`` (or ``[N + max_new_tokens]`` for a 1-D prompt): the whole
            prompt followed by the new tokens.

        Raises:
            TypeError, ValueError: a prompt that is not a 1-D or 2-D integer tensor or is empty,
                a bad ``temperature``, or a non-bool ``use_cache``.

        Example:
            >>> model = TinyLanguageModel(LanguageModelConfig(vocab_size=5, max_length=4)).eval()
            >>> model.generate(torch.tensor([1, 2]), 6, generator=torch.Generator().manual_seed(0)).shape
            torch.Size([8])
        """
        where = "TinyLanguageModel.generate"
        prompt = _validate.integer_tensor(where, "prompt", prompt)
        if prompt.dim() not in (1, 2) or prompt.shape[-1] < 1:
            raise ValueError(f"{where}: prompt must be [N] or [B, N] with N >= 1, got shape "
                             f"{_validate.shape_str(prompt)}")
        use_cache = _validate.boolean(where, "use_cache", use_cache)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"{where}: generator must be a torch.Generator, got {type(generator).__name__}")
        single = prompt.dim() == 1
        ids = prompt[None] if single else prompt
        max_new_tokens = _validate.integer(where, "max_new_tokens", max_new_tokens, minimum=0)
        temperature = _validate.positive_finite(where, "temperature", temperature)
        window = self.config.max_length
        caches = None
        for _ in range(max_new_tokens):
            context = ids[:, -window:]                                          # [B, <= window]
            if not use_cache or ids.shape[1] > window:
                logits = self(context)[:, -1]                                   # the whole context
            elif caches is None:
                caches = [KVCache(max_length=window) for _ in self.blocks]
                logits = self(context, kv_caches=caches)[:, -1]                 # prefill the cache
            else:
                logits = self(ids[:, -1:], kv_caches=caches)[:, -1]             # only the newest token
            probabilities = torch.softmax(logits / temperature, dim=-1)          # [B, V]
            next_id = torch.multinomial(probabilities, 1, generator=generator)  # [B, 1]
            ids = torch.cat([ids, next_id], dim=1)
        return ids[0] if single else ids


