"""An attention-only transformer (chapter 11): embed, layers of attention writing into a residual stream, unembed.

No MLP, as the two-layer models of Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits",
so that everything a layer-1 head reads is the embedding plus what the layer-0 heads wrote.
Each layer is the course's :class:`~attn_course.core.multihead.MultiHeadAttention` (causal, eager, so it
returns its weights); the heads' outputs ``z`` are projected by each head's own columns of ``out_proj``,
so that each head's contribution to the residual stream is a tensor of its own.

Hook points (``nn.Identity`` modules; a PyTorch forward hook on one reads its value, and one that returns a
tensor replaces it), named as in TransformerLens:

- ``model.hook_embed`` ``[B, N, E]`` (token embedding), ``model.hook_pos_embed`` ``[B, N, E]`` (learned positions);
- per layer ``model.layers[l]``: ``hook_resid_pre`` ``[B, N, E]``, ``hook_pattern`` ``[B, H, N, N]`` (the
  attention weights; a hook that returns other weights makes the heads mix the values with those:
  ``z = pattern @ v``, ``v`` from the module's own ``v_proj``), ``hook_z`` ``[B, H, N, d]``,
  ``hook_result`` ``[B, H, N, E]`` (each head's output written to the residual stream, ``b_O`` not included:
  replace one head's slice to ablate or patch it), ``hook_attn_out`` ``[B, N, E]``;
- ``model.hook_resid_final`` ``[B, N, E]``, before the final LayerNorm (if any) and the unembedding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attn_course import _validate
from attn_course.core.multihead import MultiHeadAttention, split_heads
from attn_course.positions.rope import RotaryEmbedding

__all__ = ["AttentionOnlyConfig", "AttentionOnlyLayer", "AttentionOnlyTransformer"]

POSITIONS = ("learned", "rotary")


@dataclass(frozen=True)
class AttentionOnlyConfig:
    """The sizes of an :class:`AttentionOnlyTransformer` (its constructor's arguments, checked there)."""

    vocab_size: int
    n_layers: int
    n_heads: int
    d_model: int
    max_len: int
    positions: str = "learned"
    layer_norm: bool = False
    bias: bool = False

    def as_dict(self) -> dict:
        """The fields as a plain dict (JSON-ready): ``AttentionOnlyTransformer(**config.as_dict())``."""
        return dict(self.__dict__)


class AttentionOnlyLayer(nn.Module):
    """One layer: (optional LayerNorm), causal multi-head attention, each head's output added to the stream.

    Args:
        d_model: ``E``.
        n_heads: ``H``, dividing ``E``.
        rotary: rotate queries and keys (RoPE, :class:`~attn_course.positions.rope.RotaryEmbedding`).
        layer_norm: a LayerNorm before the attention (pre-LN).
        bias: biases on the four projections.
    """

    def __init__(self, d_model: int, n_heads: int, *, rotary: bool, layer_norm: bool, bias: bool) -> None:
        super().__init__()
        head_dim = d_model // n_heads
        self.attention = MultiHeadAttention(d_model, n_heads, bias=bias, attention_backend="eager",
                                            rope=RotaryEmbedding(head_dim) if rotary else None)
        self.ln = nn.LayerNorm(d_model) if layer_norm else nn.Identity()
        self.hook_resid_pre, self.hook_pattern, self.hook_z = nn.Identity(), nn.Identity(), nn.Identity()
        self.hook_result, self.hook_attn_out = nn.Identity(), nn.Identity()

    def forward(self, resid: torch.Tensor) -> torch.Tensor:
        """``resid [B, N, E]`` plus what this layer's heads write: ``[B, N, E]``."""
        resid = self.hook_resid_pre(resid)                                        # [B, N, E]
        attention = self.attention
        normed = self.ln(resid)                                                   # [B, N, E]
        z, pattern = attention.attend_heads(normed, is_causal=True)               # [B, H, N, d], [B, H, N, N]
        replaced = self.hook_pattern(pattern)
        if replaced is not pattern:                                               # a hook gave other weights
            z = replaced @ split_heads(attention.v_proj(normed), attention.num_heads)   # [B, H, N, d]
        z = self.hook_z(z)                                                        # [B, H, N, d]
        w_o = attention.out_proj.weight.view(attention.embed_dim, attention.num_heads, attention.head_dim)
        result = self.hook_result(torch.einsum("bhnd,ehd->bhne", z, w_o))         # [B, H, N, E]
        attn_out = result.sum(dim=1)                                              # [B, N, E]
        if attention.out_proj.bias is not None:
            attn_out = attn_out + attention.out_proj.bias
        return resid + self.hook_attn_out(attn_out)                               # [B, N, E]


class AttentionOnlyTransformer(nn.Module):
    """A decoder of attention layers only: ``logits = W_U · (W_E[t] + W_pos + Σ_layers Σ_heads head output)``.

    Args:
        vocab_size: ``V``, at least 2.
        n_layers: number of attention layers, at least 1 (default 2).
        n_heads: ``H`` per layer, dividing ``d_model``.
        d_model: ``E``, the width of the residual stream.
        max_len: the longest sequence ``N`` (the learned position table's size; checked for rotary too).
        positions: ``"learned"`` (a table added to the embedding) or ``"rotary"`` (RoPE inside each attention).
        layer_norm: a LayerNorm before each attention and before the unembedding (default False: the
            circuits read exactly as products of weight matrices).
        bias: biases on the attention projections and the unembedding (default False, for the same reason).

    Raises:
        TypeError: sizes that are not ints, ``positions`` not a str, flags not bools.
        ValueError: sizes too small, ``d_model`` not divisible by ``n_heads`` (or an odd head size with
            rotary positions), ``positions`` not one of ``"learned"``, ``"rotary"``.

    Example:
        >>> model = AttentionOnlyTransformer(10, n_heads=2, d_model=16, max_len=8)
        >>> model(torch.randint(10, (3, 8))).shape                           # [B, N, V]
        torch.Size([3, 8, 10])
        >>> model.W_Q(1).shape, model.W_O(1).shape                             # [H, E, d], [H, d, E]
        (torch.Size([2, 16, 8]), torch.Size([2, 8, 16]))
    """

    def __init__(self, vocab_size: int, *, n_layers: int = 2, n_heads: int, d_model: int, max_len: int,
                 positions: str = "learned", layer_norm: bool = False, bias: bool = False) -> None:
        super().__init__()
        where = "AttentionOnlyTransformer"
        vocab_size = _validate.integer(where, "vocab_size", vocab_size, minimum=2)
        n_layers = _validate.integer(where, "n_layers", n_layers, minimum=1)
        n_heads = _validate.integer(where, "n_heads", n_heads, minimum=1)
        d_model = _validate.integer(where, "d_model", d_model, minimum=1)
        max_len = _validate.integer(where, "max_len", max_len, minimum=1)
        layer_norm = _validate.boolean(where, "layer_norm", layer_norm)
        bias = _validate.boolean(where, "bias", bias)
        if not isinstance(positions, str):
            raise TypeError(f"{where}: positions must be a str, one of {POSITIONS}, got {type(positions).__name__}")
        if positions not in POSITIONS:
            raise ValueError(f"{where}: positions must be one of {POSITIONS}, got {positions!r}")
        if d_model % n_heads:
            raise ValueError(f"{where}: d_model={d_model} must be divisible by n_heads={n_heads}")
        if positions == "rotary" and (d_model // n_heads) % 2:
            raise ValueError(f"{where}: rotary positions need an even head size, got d_model / n_heads = "
                             f"{d_model // n_heads}")
        self.config = AttentionOnlyConfig(vocab_size, n_layers, n_heads, d_model, max_len, positions, layer_norm, bias)
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model) if positions == "learned" else None
        self.layers = nn.ModuleList(
            AttentionOnlyLayer(d_model, n_heads, rotary=positions == "rotary", layer_norm=layer_norm, bias=bias)
            for _ in range(n_layers))
        self.ln_final = nn.LayerNorm(d_model) if layer_norm else nn.Identity()
        self.unembed = nn.Linear(d_model, vocab_size, bias=bias)
        self.hook_embed, self.hook_pos_embed, self.hook_resid_final = nn.Identity(), nn.Identity(), nn.Identity()

    def extra_repr(self) -> str:
        c = self.config
        return (f"vocab_size={c.vocab_size}, n_layers={c.n_layers}, n_heads={c.n_heads}, d_model={c.d_model}, "
                f"max_len={c.max_len}, positions={c.positions!r}, layer_norm={c.layer_norm}, bias={c.bias}")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits.

        Args:
            tokens: ``[B, N]`` integer ids in ``0 .. V − 1``, ``1 ≤ N ≤ max_len``.

        Returns:
            ``[B, N, V]`` logits; position ``i`` predicts token ``i + 1``.

        Raises:
            TypeError: ``tokens`` not an integer tensor.
            ValueError: not 2-D, empty, longer than ``max_len``, or ids outside the vocabulary.
        """
        tokens = self.check_tokens("AttentionOnlyTransformer.forward", tokens)
        resid = self.hook_embed(self.embed(tokens))                                # [B, N, E]
        if self.pos_embed is not None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)       # [N]
            resid = resid + self.hook_pos_embed(self.pos_embed(positions).expand_as(resid))   # [B, N, E]
        for layer in self.layers:
            resid = layer(resid)                                                   # [B, N, E]
        resid = self.hook_resid_final(resid)
        return self.unembed(self.ln_final(resid))                                  # [B, N, V]

    def check_tokens(self, where: str, tokens: object) -> torch.Tensor:
        """``tokens`` if it is a ``[B, N]`` integer tensor of ids this model reads, else a clear error."""
        tokens = _validate.integer_tensor(where, "tokens", tokens)
        c = self.config
        if tokens.dim() != 2 or not 1 <= tokens.shape[1] <= c.max_len or tokens.shape[0] < 1:
            raise ValueError(f"{where}: tokens must be [B, N] with B >= 1 and 1 <= N <= max_len={c.max_len}, "
                             f"got shape {_validate.shape_str(tokens)}")
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            raise ValueError(f"{where}: tokens must be ids in 0 .. {c.vocab_size - 1}, got values from "
                             f"{int(tokens.min())} to {int(tokens.max())}")
        return tokens

    # The weights, in TransformerLens's orientation (row vectors: x @ W), detached views.
    def _layer(self, where: str, layer: object) -> MultiHeadAttention:
        layer = _validate.integer(where, "layer", layer, minimum=0)
        if layer >= self.config.n_layers:
            raise ValueError(f"{where}: layer must be in 0 .. {self.config.n_layers - 1}, got {layer}")
        return self.layers[layer].attention

    def _in_projection(self, where: str, layer: object, name: str) -> torch.Tensor:
        attention = self._layer(where, layer)
        weight = getattr(attention, name).weight.detach()                      # [H·d, E]
        return weight.view(attention.num_heads, attention.head_dim, attention.embed_dim).transpose(1, 2)   # [H, E, d]

    def W_Q(self, layer: int) -> torch.Tensor:  # noqa: N802 (the papers' names)
        """Layer ``layer``'s query weights ``[H, E, d]``: head ``h``'s queries are ``x @ W_Q[h]`` (before RoPE)."""
        return self._in_projection("AttentionOnlyTransformer.W_Q", layer, "q_proj")

    def W_K(self, layer: int) -> torch.Tensor:  # noqa: N802
        """Layer ``layer``'s key weights ``[H, E, d]``: head ``h``'s keys are ``x @ W_K[h]`` (before RoPE)."""
        return self._in_projection("AttentionOnlyTransformer.W_K", layer, "k_proj")

    def W_V(self, layer: int) -> torch.Tensor:  # noqa: N802
        """Layer ``layer``'s value weights ``[H, E, d]``: head ``h``'s values are ``x @ W_V[h]``."""
        return self._in_projection("AttentionOnlyTransformer.W_V", layer, "v_proj")

    def W_O(self, layer: int) -> torch.Tensor:  # noqa: N802
        """Layer ``layer``'s output weights ``[H, d, E]``: head ``h`` writes ``z_h @ W_O[h]`` to the stream."""
        attention = self._layer("AttentionOnlyTransformer.W_O", layer)
        weight = attention.out_proj.weight.detach()                             # [E, H·d]
        return weight.T.reshape(attention.num_heads, attention.head_dim, attention.embed_dim)   # [H, d, E]

    @property
    def W_E(self) -> torch.Tensor:  # noqa: N802
        """The token embedding ``[V, E]``: token ``t`` enters the stream as ``W_E[t]``."""
        return self.embed.weight.detach()

    @property
    def W_pos(self) -> torch.Tensor | None:  # noqa: N802
        """The learned position table ``[max_len, E]``, or None with rotary positions."""
        return None if self.pos_embed is None else self.pos_embed.weight.detach()

    @property
    def W_U(self) -> torch.Tensor:  # noqa: N802
        """The unembedding ``[E, V]``: the logits are ``resid @ W_U`` (plus ``unembed.bias`` if any)."""
        return self.unembed.weight.detach().T
