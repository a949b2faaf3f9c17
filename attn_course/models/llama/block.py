"""One Llama block: RMSNorm, attention with RoPE (grouped-query, causal, the sliding window if any, Qwen3's
QK-norm if the config asks), residual; RMSNorm, SwiGLU, residual; and the positions and rotary embedding it is given.

:class:`LlamaDecoderBlock` is what :class:`~attn_course.models.llama.model.LlamaModel` stacks;
:func:`rotary_embedding` builds the one RoPE every block of a model shares, and
:func:`positions_from_attention_mask` numbers each sequence's real tokens from 0 in a left-padded batch.
"""

from __future__ import annotations

import torch
from torch import nn

from attn_course import _validate
from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import key_padding_to_boolean, restrict_mask
from attn_course.core.multihead import MultiHeadAttention, check_model_input
from attn_course.core.norms import RMSNorm
from attn_course.models.llama.config import LlamaConfig
from attn_course.models.llama.feed_forward import SwiGLU
from attn_course.positions.rope import RotaryEmbedding
from attn_course.variants.masks import sliding_window_mask

__all__ = ["LlamaDecoderBlock", "positions_from_attention_mask", "rotary_embedding"]


def positions_from_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """The RoPE position of every token of a padded batch: its index among the real tokens.

    Hugging Face's ``generate`` computes ``position_ids`` this way (``cumsum(mask) - 1``, with
    padding set to 0); its ``forward`` does not (it uses ``0 .. N-1`` unless given
    ``position_ids``). With left padding, each sequence's first real token is at position 0,
    exactly as if it had been run alone.

    Args:
        attention_mask: ``[B, N]``, 1 (or True) for a real token, 0 for padding.

    Returns:
        ``[B, N]`` long positions; 0 at padded places.

    Raises:
        TypeError: not a tensor.
        ValueError: not 2-D, or values other than 0 and 1.

    Example:
        >>> positions_from_attention_mask(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))
        tensor([[0, 0, 0, 1],
                [0, 1, 2, 3]])
    """
    where = "positions_from_attention_mask"
    _validate.tensor(where, "attention_mask", attention_mask)
    if attention_mask.dim() != 2:
        raise ValueError(f"{where}: attention_mask must be [B, N], got shape {_validate.shape_str(attention_mask)}")
    real = key_padding_to_boolean(attention_mask, *attention_mask.shape, caller=where, name="attention_mask")
    positions = real.long().cumsum(dim=-1) - 1                                 # [B, N]
    return positions.masked_fill(~real, 0)


class LlamaDecoderBlock(nn.Module):
    """One pre-norm Llama block: RMSNorm, attention, residual; RMSNorm, SwiGLU, residual.

    The attention is the core's :class:`~attn_course.core.multihead.MultiHeadAttention` with the config's
    head size, biases and QK-norm (Qwen3: ``attention.q_proj`` and ``attention.k_proj`` normalise each head).

    Args:
        config: the sizes (:class:`~attn_course.models.llama.LlamaConfig`).
        rope: the rotary embedding to use (shared by every block of a model; it holds no
            weights); default one built from ``config``.
        layer_index: which layer of the model this block is; it picks the window,
            :meth:`config.layer_window(layer_index) <attn_course.models.llama.LlamaConfig.layer_window>`.

    Raises:
        TypeError: ``config`` not a :class:`LlamaConfig`, ``rope`` not a RotaryEmbedding, ``layer_index``
            not an int.
        ValueError: a ``rope`` whose ``head_dim`` is not ``config.head_dim``, a ``layer_index`` outside the
            config's layers.

    Example:
        >>> config = LlamaConfig(vocab_size=10, hidden_size=16, intermediate_size=32,
        ...                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
        >>> block = LlamaDecoderBlock(config)
        >>> block(torch.randn(2, 5, 16))[0].shape
        torch.Size([2, 5, 16])
    """

    def __init__(self, config: LlamaConfig, rope: RotaryEmbedding | None = None, *, layer_index: int = 0) -> None:
        super().__init__()
        where = "LlamaDecoderBlock"
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"{where}: config must be a LlamaConfig, got {type(config).__name__}")
        if rope is None:
            rope = rotary_embedding(config)
        elif not isinstance(rope, RotaryEmbedding):
            raise TypeError(f"{where}: rope must be a RotaryEmbedding or None, got {type(rope).__name__}")
        layer_index = _validate.integer(where, "layer_index", layer_index, minimum=0)
        if layer_index >= config.num_hidden_layers:
            raise ValueError(f"{where}: layer_index must be < num_hidden_layers={config.num_hidden_layers}, "
                             f"got {layer_index}")
        self.attention_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.attention = MultiHeadAttention(
            config.hidden_size, config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim, bias=config.attention_bias, qk_norm=config.qk_norm,
            qk_norm_eps=config.rms_norm_eps, dropout=config.attention_dropout, rope=rope,
        )
        self.feed_forward_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.feed_forward = SwiGLU(config.hidden_size, config.intermediate_size)
        self.sliding_window = config.layer_window(layer_index)              # None: every earlier token

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the block (the causal mask is always applied, and the sliding window if the config has one).

        Args:
            x: ``[B, N, E]`` (with a cache: only the new tokens).
            mask: extra boolean mask, e.g. the key padding as ``[B, 1, N_k]`` (True = may attend),
                over the keys the cache returns (``N_k = kv_cache.attended_length(N)``).
            positions: RoPE positions of the new tokens, ``[N]`` or ``[B, N]``; default
                ``len(kv_cache) ..`` (``0 .. N-1`` without a cache).
            kv_cache: this block's :class:`~attn_course.core.kv_cache.KVCache` (or
                :class:`~attn_course.variants.sliding_window.RollingKVCache`).
            need_weights: also return the attention weights.

        Returns:
            ``(x [B, N, E], attention weights [B, H, N, N_k] or None)``.

        Raises:
            TypeError, ValueError: ``x`` of the wrong kind or shape; otherwise as
                :meth:`MultiHeadAttention.forward <attn_course.core.multihead.MultiHeadAttention.forward>`.
        """
        x = check_model_input(self.attention, x, caller="LlamaDecoderBlock.forward")
        if self.sliding_window is not None:
            # Query i sees key j when i - W < j <= i (the window counts the query itself): Hugging
            # Face's sliding_window_overlay, kv_idx > q_idx - sliding_window (transformers 5.24,
            # masking_utils.py). The keys the cache returns end with the new tokens, so the window
            # is bottom-right aligned over them.
            n, n_k = x.shape[1], x.shape[1] if kv_cache is None else kv_cache.attended_length(x.shape[1])
            window = sliding_window_mask(n, n_k, window=self.sliding_window, device=x.device)  # [N, N_k]
            mask = restrict_mask(mask, window)                             # [B|1, N|1, N_k]
        attended, weights = self.attention(                               # RoPE rotates q and k inside
            self.attention_norm(x), mask=mask, is_causal=True, kv_cache=kv_cache,
            positions=positions, need_weights=need_weights,
        )
        x = x + attended                                                   # [B, N, E]
        x = x + self.feed_forward(self.feed_forward_norm(x))               # [B, N, E]
        return x, weights


def rotary_embedding(config: LlamaConfig) -> RotaryEmbedding:
    """The :class:`~attn_course.positions.rope.RotaryEmbedding` of a Llama with this config.

    Pairing: Hugging Face's Llama rotates feature ``i`` with feature ``i + d/2`` (``rotate_half``),
    which is the course's ``interleaved=False``, so the checkpoints' q/k projection rows are used
    as they are. (Meta's original checkpoints pair ``2i`` with ``2i + 1``; Hugging Face's
    conversion script permutes the q/k rows once so that the half split gives the same scores.
    Loading such an original checkpoint would need ``interleaved=True`` instead, or that permutation.)

    Precision: the angles ``m · θ_i`` are computed in float64 and rounded once, where Hugging Face
    computes ``θ_i`` and the angles in float32; at the positions of the tests the two rotations
    differ by about 1e-7.

    Raises:
        TypeError: ``config`` not a :class:`LlamaConfig`.

    Example:
        >>> rope = rotary_embedding(LlamaConfig(vocab_size=10, hidden_size=16, intermediate_size=32,
        ...                                     num_hidden_layers=1, num_attention_heads=2))
        >>> rope.head_dim, rope.interleaved
        (8, False)
    """
    _validate.instance("rotary_embedding", "config", config, LlamaConfig)
    return RotaryEmbedding(config.head_dim, base=config.rope_theta, interleaved=False, scaling=config.rope_scaling)
