"""Transformer blocks: attention plus a position-wise feed-forward network, with residuals.

A block keeps the width ``E`` of its input, so blocks stack. Each sub-layer is wrapped
as ``x + sublayer(norm(x))`` (pre-LayerNorm, GPT-2 and most modern models) or
``norm(x + sublayer(x))`` (post-LayerNorm, the original Transformer and BERT).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import key_padding_to_boolean, restrict_mask, to_score_shape
from attn_course.core.multihead import MultiHeadAttention, check_model_input

__all__ = ["FeedForward", "ResidualBlock", "EncoderBlock", "DecoderBlock"]

_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}


class FeedForward(nn.Module):
    """Position-wise feed-forward network: ``Linear(E, F) → activation → Linear(F, E)``.

    The same two-layer MLP is applied to every token on its own; this is where a block
    transforms what attention gathered.

    Args:
        embed_dim: ``E``.
        hidden_dim: ``F``, typically ``4 · E``.
        activation: ``"gelu"`` (exact, as in BERT and GPT-2) or ``"relu"`` (the original).
        dropout: dropout after the second layer while training.

    Raises:
        TypeError, ValueError: sizes that are not positive ints, an unknown activation, or a
            dropout outside ``[0, 1)``.
    """

    def __init__(self, embed_dim: int, hidden_dim: int, *, activation: str = "gelu", dropout: float = 0.0):
        super().__init__()
        where = "FeedForward"
        embed_dim = _validate.integer(where, "embed_dim", embed_dim, minimum=1)
        hidden_dim = _validate.integer(where, "hidden_dim", hidden_dim, minimum=1)
        if activation not in _ACTIVATIONS:
            raise ValueError(f"{where}: activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.dropout = _validate.dropout(where, dropout)
        self.activation = activation
        self.up = nn.Linear(embed_dim, hidden_dim)
        self.down = nn.Linear(hidden_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., E]`` to ``[..., E]``."""
        hidden = _ACTIVATIONS[self.activation](self.up(x))              # [..., F]
        return F.dropout(self.down(hidden), self.dropout, self.training)  # [..., E]


class ResidualBlock(nn.Module):
    """What every block shares: a sub-layer wrapped with dropout, a residual and a LayerNorm.

    Subclasses set ``norm_first`` (pre- or post-LayerNorm) and ``dropout`` and call
    :meth:`residual` once per sub-layer.
    """

    norm_first: bool
    dropout: float

    def residual(self, x: torch.Tensor, sublayer, norm: nn.LayerNorm) -> torch.Tensor:
        """``x + sublayer(norm(x))`` (pre-LN) or ``norm(x + sublayer(x))`` (post-LN), ``[B, N, E]``."""
        if self.norm_first:
            return x + F.dropout(sublayer(norm(x)), self.dropout, self.training)
        return norm(x + F.dropout(sublayer(x), self.dropout, self.training))

    def attention_residual(self, x: torch.Tensor, attention: MultiHeadAttention, norm: nn.LayerNorm,
                           **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`residual` around an attention, keeping its weights: ``(x [B, N, E], weights or None)``."""
        attended, weights = attention(norm(x) if self.norm_first else x, **kwargs)   # [B, N, E]
        attended = F.dropout(attended, self.dropout, self.training)
        return (x + attended if self.norm_first else norm(x + attended)), weights


class EncoderBlock(ResidualBlock):
    """Bidirectional self-attention, then a feed-forward network: one layer of BERT.

    Every token attends to every other (no causal mask), except to keys hidden by a mask.
    With ``norm_first=False`` (the default, as in the original Transformer and BERT) each
    sub-layer is ``x = norm(x + sublayer(x))``; ``norm_first=True`` selects pre-LayerNorm,
    ``x = x + sublayer(norm(x))``.

    Args:
        embed_dim: ``E``.
        num_heads: ``H``; must divide ``E``.
        ffn_dim: hidden width ``F`` of the feed-forward network (default ``4 · E``).
        activation: of the feed-forward network, ``"gelu"`` (exact, as in BERT) or ``"relu"``.
        norm_first: pre-LayerNorm instead of post-LayerNorm.
        norm_eps: the LayerNorms' ``eps`` (torch's default ``1e-5``; BERT uses ``1e-12``).
        dropout: dropout on the sub-layer outputs while training.
        attention_dropout: dropout on the attention weights while training (default ``dropout``).

    Raises:
        TypeError, ValueError: sizes that are not positive ints, ``E`` not divisible by ``H``,
            an unknown activation, dropouts outside ``[0, 1)`` or a ``norm_eps`` that is not
            a positive number.

    Example:
        >>> block = EncoderBlock(embed_dim=32, num_heads=4)
        >>> x = torch.randn(2, 7, 32)                                    # [B, N, E]
        >>> real = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])            # [B, N], 0 = padding
        >>> y, weights = block(x, key_padding_mask=real, need_weights=True)
        >>> y.shape, weights.shape
        (torch.Size([2, 7, 32]), torch.Size([2, 4, 7, 7]))
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        ffn_dim: int | None = None,
        activation: str = "gelu",
        norm_first: bool = False,
        norm_eps: float = 1e-5,
        dropout: float = 0.0,
        attention_dropout: float | None = None,
    ) -> None:
        super().__init__()
        where = "EncoderBlock"
        embed_dim = _validate.integer(where, "embed_dim", embed_dim, minimum=1)
        ffn_dim = 4 * embed_dim if ffn_dim is None else _validate.integer(where, "ffn_dim", ffn_dim, minimum=1)
        norm_eps = _validate.positive_finite(where, "norm_eps", norm_eps)
        self.dropout = _validate.dropout(where, dropout)
        attention_dropout = self.dropout if attention_dropout is None else attention_dropout
        self.norm_first = _validate.boolean(where, "norm_first", norm_first)
        self.self_attention = MultiHeadAttention(embed_dim, num_heads, dropout=attention_dropout)
        self.norm_self = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.feed_forward = FeedForward(embed_dim, ffn_dim, activation=activation)  # dropout: in residual
        self.norm_ffn = nn.LayerNorm(embed_dim, eps=norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the block.

        Args:
            x: ``[B, N, E]``.
            mask: boolean (True = may attend) or additive float mask, ``[N, N]``,
                ``[B, N, N]``, ``[B, 1, N]`` or ``[B, H, N, N]``, as in
                :class:`~attn_course.core.multihead.MultiHeadAttention`.
            key_padding_mask: ``[B, N]``, 1/True for a real token and 0/False for padding
                (Hugging Face's ``attention_mask``). Padding is hidden as a *key*; a padded
                query still gets an output, which the caller ignores. A sequence with no real
                token gets all-zero attention weights, never NaN.
            need_weights: return the attention weights per head.

        Returns:
            ``(x [B, N, E], weights [B, H, N, N] or None)``.

        Raises:
            TypeError, ValueError: ``x`` or a mask of the wrong kind or shape, or a
                ``key_padding_mask`` holding values other than 0 and 1.
        """
        where = "EncoderBlock.forward"
        x = check_model_input(self.self_attention, x, caller=where)
        batch, tokens, _ = x.shape
        heads = self.self_attention.num_heads
        mask = to_score_shape(mask, batch, heads, tokens, tokens, caller=where)        # [B|1, H|1, N|1, N]
        if key_padding_mask is not None:
            real = key_padding_to_boolean(key_padding_mask, batch, tokens, device=x.device, caller=where)
            mask = restrict_mask(mask, real[:, None, None, :])                        # keys: [B, 1, 1, N]
        x, weights = self.attention_residual(x, self.self_attention, self.norm_self, mask=mask,
                                             need_weights=need_weights)                 # [B, N, E]
        x = self.residual(x, self.feed_forward, self.norm_ffn)          # [B, N, E]
        return x, weights


class DecoderBlock(ResidualBlock):
    """Causal self-attention (and optionally cross-attention), then a feed-forward network.

    Args:
        embed_dim: ``E``.
        num_heads: ``H``.
        ffn_dim: hidden width of the feed-forward network (default ``4 · E``).
        num_kv_heads: key/value heads for grouped-query attention (default ``H``).
        cross_attention: add a cross-attention sub-layer that reads an encoder's output.
        norm_first: pre-LayerNorm (default) or post-LayerNorm.
        dropout: dropout on attention weights and sub-layer outputs while training.

    Raises:
        TypeError, ValueError: sizes that are not positive ints, ``E`` not divisible by ``H`` or
            ``H`` by ``H_kv``, a non-bool ``cross_attention``, or a dropout outside ``[0, 1)``.

    Example:
        >>> block = DecoderBlock(embed_dim=32, num_heads=4)
        >>> block(torch.randn(2, 7, 32))[0].shape
        torch.Size([2, 7, 32])
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        ffn_dim: int | None = None,
        num_kv_heads: int | None = None,
        cross_attention: bool = False,
        norm_first: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        where = "DecoderBlock"
        embed_dim = _validate.integer(where, "embed_dim", embed_dim, minimum=1)
        ffn_dim = 4 * embed_dim if ffn_dim is None else _validate.integer(where, "ffn_dim", ffn_dim, minimum=1)
        _validate.boolean(where, "cross_attention", cross_attention)
        self.dropout = _validate.dropout(where, dropout)
        self.norm_first = _validate.boolean(where, "norm_first", norm_first)
        self.self_attention = MultiHeadAttention(embed_dim, num_heads, num_kv_heads=num_kv_heads, dropout=dropout)
        self.norm_self = nn.LayerNorm(embed_dim)
        self.cross_attention = MultiHeadAttention(embed_dim, num_heads, dropout=dropout) if cross_attention else None
        self.norm_cross = nn.LayerNorm(embed_dim) if cross_attention else None
        self.feed_forward = FeedForward(embed_dim, ffn_dim)  # dropout: in residual
        self.norm_ffn = nn.LayerNorm(embed_dim)

    def forward(
        self,
        x: torch.Tensor,
        *,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the block.

        Args:
            x: ``[B, N, E]`` the decoder's tokens (with a cache: only the new ones).
            memory: ``[B, M, E]`` encoder output, required when the block has cross-attention.
            mask: extra mask for self-attention (the causal mask is always applied).
            memory_mask: mask for cross-attention, e.g. the encoder's padding.
            kv_cache: a :class:`~attn_course.core.kv_cache.KVCache` for this block's self-attention.
            need_weights: return the self-attention weights ``[B, H, N, N_k]``.

        Returns:
            ``(x [B, N, E], self-attention weights or None)``.

        Raises:
            TypeError, ValueError: ``x`` or ``memory`` of the wrong kind or shape; ``memory``
                missing for a cross-attention block, or given to one without.
        """
        where = "DecoderBlock.forward"
        x = check_model_input(self.self_attention, x, caller=where)
        if memory is not None:
            memory = check_model_input(self.self_attention, memory, caller=where, name="memory")
        if (memory is None) != (self.cross_attention is None):
            raise ValueError(
                f"{where}: memory is required exactly when the block has cross-attention "
                f"(cross_attention={self.cross_attention is not None}, memory given: {memory is not None})"
            )
        x, weights = self.attention_residual(x, self.self_attention, self.norm_self, mask=mask, is_causal=True,
                                             kv_cache=kv_cache, need_weights=need_weights)   # [B, N, E]
        if self.cross_attention is not None:
            x, _ = self.attention_residual(x, self.cross_attention, self.norm_cross, key=memory, value=memory,
                                           mask=memory_mask, need_weights=False)             # [B, N, E]
        x = self.residual(x, self.feed_forward, self.norm_ffn)                              # [B, N, E]
        return x, weights

