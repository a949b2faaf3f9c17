"""A Llama-style decoder built from the course's own pieces.

    x = embedding[input_ids]                                            # [B, N, E]
    for each block:                                                     # pre-norm, residuals
        x = x + Attention(RMSNorm(x))      # grouped-query, causal, RoPE on q and k, no biases
        x = x + SwiGLU(RMSNorm(x))
    logits = lm_head(RMSNorm(x))                                        # [B, N, V]

The attention is :class:`~attn_course.core.multihead.MultiHeadAttention` (chapter 03) with
``num_kv_heads`` key/value heads, ``bias=False`` and a :class:`~attn_course.positions.rope.RotaryEmbedding`
(chapter 05); decoding keeps one :class:`~attn_course.core.kv_cache.KVCache` per block (chapter 04).
A left-padded batch is handled as Hugging Face does: the padding is hidden as a key, and each
sequence's real tokens get the positions ``0, 1, 2, ...`` (:func:`positions_from_attention_mask`).

Mistral is this decoder with ``config.sliding_window = W``: every block adds
:func:`~attn_course.variants.masks.sliding_window_mask` to its causal mask, and :meth:`LlamaForCausalLM.generate`
decodes with one :class:`~attn_course.variants.sliding_window.RollingKVCache` per block, which holds only
the last ``W - 1`` tokens (Hugging Face's ``DynamicCache`` keeps the same for Mistral). The window
is counted over the indices of the (padded) sequence, as Hugging Face counts it. Qwen3 slides on the
layers its ``config.layer_types`` marks: those blocks mask and cache as Mistral's, the others as Llama's.
Its QK-norm and head size live in the attention (:class:`~attn_course.models.llama.block.LlamaDecoderBlock`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from attn_course import _validate
from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import key_padding_to_boolean
from attn_course.core.norms import RMSNorm
from attn_course.models.llama.block import LlamaDecoderBlock, positions_from_attention_mask, rotary_embedding
from attn_course.models.llama.config import LlamaConfig
from attn_course.variants.sliding_window import RollingKVCache

__all__ = ["LlamaModel", "LlamaForCausalLM", "LlamaOutput", "CausalLMOutput", "GreedyOutput"]


class LlamaOutput(NamedTuple):
    """What :class:`LlamaModel` returns.

    Attributes:
        hidden_states: ``[B, N, E]``, after the final RMSNorm (Hugging Face's ``last_hidden_state``).
        all_hidden_states: with ``output_hidden_states``, ``L + 1`` tensors ``[B, N, E]``: the
            embeddings, then each block's output (before the final norm); else None. (Hugging
            Face's ``hidden_states`` tuple, except that its last entry is after the final norm.)
        attentions: with ``output_attentions``, ``L`` tensors ``[B, H, N, N_k]``; else None.
    """

    hidden_states: torch.Tensor
    all_hidden_states: tuple[torch.Tensor, ...] | None
    attentions: tuple[torch.Tensor, ...] | None


class CausalLMOutput(NamedTuple):
    """What :class:`LlamaForCausalLM` returns: the logits and :class:`LlamaOutput`'s fields.

    Attributes:
        logits: ``[B, N, V]``; position ``i`` scores the token that follows token ``i``.
        hidden_states, all_hidden_states, attentions: as in :class:`LlamaOutput`.
    """

    logits: torch.Tensor
    hidden_states: torch.Tensor
    all_hidden_states: tuple[torch.Tensor, ...] | None
    attentions: tuple[torch.Tensor, ...] | None


class GreedyOutput(NamedTuple):
    """What :meth:`LlamaForCausalLM.generate` returns (Hugging Face's field names).

    Attributes:
        sequences: ``[B, N + T]``, the prompt followed by the ``T`` new tokens.
        logits: ``[B, T, V]``, the logits each new token was chosen from.
    """

    sequences: torch.Tensor
    logits: torch.Tensor


class LlamaModel(nn.Module):
    """Token embedding, ``L`` :class:`LlamaDecoderBlock` s and a final RMSNorm.

    Args:
        config: the sizes (:class:`~attn_course.models.llama.LlamaConfig`).

    Raises:
        TypeError: ``config`` not a :class:`LlamaConfig`.

    Example:
        >>> config = LlamaConfig(vocab_size=10, hidden_size=16, intermediate_size=32,
        ...                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        >>> LlamaModel(config)(torch.tensor([[1, 2, 3]])).hidden_states.shape
        torch.Size([1, 3, 16])
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        _validate.instance("LlamaModel", "config", config, LlamaConfig)
        self.config = config
        rope = rotary_embedding(config)                                     # no weights: one for all blocks
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(LlamaDecoderBlock(config, rope, layer_index=index)
                                    for index in range(config.num_hidden_layers))
        self.final_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        kv_caches: list[KVCache] | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> LlamaOutput:
        """Hidden states of every token.

        Args:
            input_ids: ``[B, N]`` token ids (with caches: only the new tokens).
            attention_mask: ``[B, len(cache) + N]``, 1 for a real token and 0 for padding, over every
                token seen and the new ones, as in Hugging Face (a rolling cache reads only the
                columns of the keys it still holds). Padding is hidden as a key; outputs at padded
                places are finite but meaningless.
            positions: RoPE positions of the new tokens, ``[N]`` or ``[B, N]`` integers. Default:
                from ``attention_mask`` by :func:`positions_from_attention_mask` (each sequence's
                real tokens at ``0, 1, ...``), else ``len(cache) .. len(cache) + N - 1``.
            kv_caches: one :class:`~attn_course.core.kv_cache.KVCache` per block, all of one length;
                the new keys and values are appended. A block with a window ``W`` (its
                ``sliding_window``) may have a :class:`~attn_course.variants.sliding_window.RollingKVCache`
                of a window ``>= W``.
            output_hidden_states: also return the embeddings and every block's output.
            output_attentions: also return every block's attention weights.

        Returns:
            :class:`LlamaOutput`.

        Raises:
            TypeError: ids, mask or positions that are not tensors of the right kind, caches that
                are not ``KVCache``, flags that are not bool.
            ValueError: shapes that do not fit, ids out of ``0..V-1``, the wrong number of caches,
                caches of different lengths, or caches that forgot keys the attention still needs (a
                rolling cache on a block without a sliding window, or with a smaller one).

        Example:
            >>> config = LlamaConfig(vocab_size=10, hidden_size=16, intermediate_size=32,
            ...                      num_hidden_layers=2, num_attention_heads=4)
            >>> out = LlamaModel(config)(torch.tensor([[0, 5, 6], [4, 5, 6]]), torch.tensor([[0, 1, 1], [1, 1, 1]]),
            ...                          output_hidden_states=True, output_attentions=True)
            >>> len(out.all_hidden_states), out.attentions[0].shape
            (3, torch.Size([2, 4, 3, 3]))
        """
        where = "LlamaModel.forward"
        config = self.config
        output_hidden_states = _validate.boolean(where, "output_hidden_states", output_hidden_states)
        output_attentions = _validate.boolean(where, "output_attentions", output_attentions)
        input_ids = _validate.integer_tensor(where, "input_ids", input_ids)
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"{where}: input_ids must be [B, N] with N >= 1, got shape "
                             f"{_validate.shape_str(input_ids)}")
        if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= config.vocab_size):
            raise ValueError(f"{where}: input_ids must lie in 0..{config.vocab_size - 1}, got values from "
                             f"{int(input_ids.min())} to {int(input_ids.max())}")
        batch, tokens = input_ids.shape
        cached, attended = self._check_caches(where, kv_caches, tokens)                 # attended: per block
        real = None
        if attention_mask is not None:
            attention_mask = _validate.tensor(where, "attention_mask", attention_mask)
            if attention_mask.shape != (batch, cached + tokens):
                raise ValueError(f"{where}: attention_mask must be [B, N_k] = [{batch}, {cached + tokens}] "
                                 f"(cached tokens {cached} + new tokens {tokens}), got shape "
                                 f"{_validate.shape_str(attention_mask)}")
            real = key_padding_to_boolean(attention_mask, batch, cached + tokens, device=input_ids.device,
                                          caller=where, name="attention_mask")          # [B, N_k]
        if positions is None:
            if real is not None:
                positions = positions_from_attention_mask(real)[:, cached:]            # [B, N]
            else:
                positions = torch.arange(cached, cached + tokens, device=input_ids.device)   # [N]
        else:
            positions = _validate.integer_tensor(where, "positions", positions)
            if positions.shape not in ((tokens,), (batch, tokens)):
                raise ValueError(f"{where}: positions must be [N] = [{tokens}] or [B, N] = [{batch}, {tokens}], "
                                 f"got shape {_validate.shape_str(positions)}")
        # A rolling cache returns only its last keys: the padding mask's last N_k columns, block by block.
        key_masks = [None if real is None else real[:, None, cached + tokens - n_k:] for n_k in attended]  # [B, 1, N_k]

        x = self.embedding(input_ids)                                                  # [B, N, E]
        all_hidden_states, attentions = [x], []
        for index, block in enumerate(self.blocks):
            x, weights = block(x, mask=key_masks[index], positions=positions,
                               kv_cache=None if kv_caches is None else kv_caches[index],
                               need_weights=output_attentions)                         # [B, N, E]
            all_hidden_states.append(x)
            attentions.append(weights)                                                 # [B, H, N, N_k]
        return LlamaOutput(
            hidden_states=self.final_norm(x),                                      # [B, N, E]
            all_hidden_states=tuple(all_hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )

    def _check_caches(self, where: str, kv_caches: object, tokens: int) -> tuple[int, list[int]]:
        """``(tokens seen, keys each block attends to)`` (``(0, [tokens, ...])`` without caches), after checking
        the caches."""
        if kv_caches is None:
            return 0, [tokens] * len(self.blocks)
        if isinstance(kv_caches, KVCache) or not isinstance(kv_caches, (list, tuple)) \
                or not all(isinstance(cache, KVCache) for cache in kv_caches):
            raise TypeError(f"{where}: kv_caches must be a list of KVCache, one per block, "
                            f"got {type(kv_caches).__name__}")
        if len(kv_caches) != len(self.blocks):
            raise ValueError(f"{where}: kv_caches must hold one KVCache per block ({len(self.blocks)}), "
                             f"got {len(kv_caches)}")
        lengths = sorted({len(cache) for cache in kv_caches})
        if len(lengths) > 1:
            raise ValueError(f"{where}: the caches must all hold the same number of tokens, got lengths {lengths}")
        seen, attended = lengths[0], []
        for index, (block, cache) in enumerate(zip(self.blocks, kv_caches)):
            window = block.sliding_window
            # The first new query (position `seen`) reads back to `seen - (W - 1)`, or to 0 without a window.
            needed = tokens + (seen if window is None else min(seen, window - 1))
            attended.append(cache.attended_length(tokens))
            if attended[-1] < needed:
                what = "no sliding window" if window is None else f"sliding_window={window}"
                raise ValueError(f"{where}: {cache!r} (block {index}) returns {attended[-1]} keys for {tokens} new "
                                 f"token(s), but with {what} the attention reads {needed}; use a KVCache, or a "
                                 "RollingKVCache whose window is at least the block's sliding_window")
        return seen, attended


class LlamaForCausalLM(nn.Module):
    """:class:`LlamaModel` and a linear LM head (no bias) that scores the next token.

    Args:
        config: the sizes; with ``tie_word_embeddings`` the head's weight *is* the embedding matrix.

    Raises:
        TypeError: ``config`` not a :class:`LlamaConfig`.

    Example:
        >>> config = LlamaConfig(vocab_size=10, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        ...                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
        >>> model = LlamaForCausalLM(config)
        >>> model.lm_head.weight is model.model.embedding.weight
        True
        >>> model(torch.tensor([[1, 2, 3]])).logits.shape
        torch.Size([1, 3, 10])
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        _validate.instance("LlamaForCausalLM", "config", config, LlamaConfig)
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embedding.weight                          # [V, E], one tensor

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **options: Any) -> CausalLMOutput:
        """Next-token logits for every position.

        Args:
            input_ids, attention_mask: as :meth:`LlamaModel.forward`.
            **options: ``positions``, ``kv_caches``, ``output_hidden_states``, ``output_attentions``, as
                :meth:`LlamaModel.forward`.

        Returns:
            :class:`CausalLMOutput` with ``logits [B, N, V]``.

        Raises:
            TypeError, ValueError: as :meth:`LlamaModel.forward`.
        """
        out = self.model(input_ids, attention_mask, **options)
        logits = self.lm_head(out.hidden_states)                                   # [B, N, V]
        return CausalLMOutput(logits, *out)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        attention_mask: torch.Tensor | None = None,
    ) -> GreedyOutput:
        """Greedy decoding: add the most likely token ``max_new_tokens`` times, with a KV cache.

        The prompt runs once through the model, filling one :class:`~attn_course.core.kv_cache.KVCache`
        per block (for a block with a window ``W``, a
        :class:`~attn_course.variants.sliding_window.RollingKVCache` that holds only the last ``W - 1``
        tokens, as Hugging Face's Mistral and Qwen3 do); every later step feeds only the newest token, at
        the position after its sequence's last one. No end-of-sequence handling: exactly ``max_new_tokens`` tokens are
        added to every sequence (Hugging Face's ``generate(do_sample=False)`` with no
        ``eos_token_id``). Dropout applies if the model is in training mode: call ``eval()`` first.

        Args:
            input_ids: ``[B, N]`` prompt ids, left-padded when the prompts differ in length.
            max_new_tokens: ``T``, how many tokens to add (0 returns the prompt).
            attention_mask: ``[B, N]``, 0 at the padding (default: no padding).

        Returns:
            :class:`GreedyOutput`: ``sequences [B, N + T]`` and the ``logits [B, T, V]`` each new
            token was chosen from.

        Raises:
            TypeError, ValueError: as :meth:`LlamaModel.forward`, or a ``max_new_tokens`` that is
                not an int ``>= 0``.

        Example:
            >>> config = LlamaConfig(vocab_size=10, hidden_size=16, intermediate_size=32,
            ...                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
            >>> model = LlamaForCausalLM(config).eval()
            >>> out = model.generate(torch.tensor([[0, 3, 4], [2, 3, 4]]), 5,
            ...                      attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]))
            >>> out.sequences.shape, out.logits.shape
            (torch.Size([2, 8]), torch.Size([2, 5, 10]))
        """
        where = "LlamaForCausalLM.generate"
        max_new_tokens = _validate.integer(where, "max_new_tokens", max_new_tokens, minimum=0)
        input_ids = _validate.integer_tensor(where, "input_ids", input_ids)
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"{where}: input_ids must be [B, N] with N >= 1, got shape "
                             f"{_validate.shape_str(input_ids)}")
        batch, prompt_length = input_ids.shape
        if attention_mask is None:
            real = torch.ones(batch, prompt_length, dtype=torch.bool, device=input_ids.device)
        else:
            real = key_padding_to_boolean(attention_mask, batch, prompt_length, device=input_ids.device,
                                          caller=where, name="attention_mask")          # [B, N]
        caches = [KVCache(max_length=prompt_length + max_new_tokens) if block.sliding_window is None
                  else RollingKVCache(block.sliding_window) for block in self.model.blocks]
        positions = positions_from_attention_mask(real)                                  # [B, N]
        sequences, new_ids, step_logits = input_ids, input_ids, []
        for _ in range(max_new_tokens):
            logits = self(new_ids, real, positions=positions, kv_caches=caches).logits[:, -1]   # [B, V]
            step_logits.append(logits)
            new_ids = logits.argmax(dim=-1, keepdim=True)                                # [B, 1]
            sequences = torch.cat([sequences, new_ids], dim=1)                          # [B, N + t]
            real = torch.cat([real, real.new_ones(batch, 1)], dim=1)                    # [B, N_k + 1]
            positions = positions[:, -1:] + 1                                            # [B, 1]
        logits = (torch.stack(step_logits, dim=1) if step_logits
                  else input_ids.new_zeros(batch, 0, self.config.vocab_size, dtype=self.lm_head.weight.dtype))
        return GreedyOutput(sequences=sequences, logits=logits)                          # [B, N+T], [B, T, V]
