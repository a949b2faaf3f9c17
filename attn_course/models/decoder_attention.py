"""The attention layer of the open decoder models of 2025–26 (chapter 12), one module with their options.

Llama, Mistral, Qwen3, Gemma 3, gpt-oss and Qwen3-Next's softmax layers all compute, for ``x [B, N, E]``::

    q, k, v = x W_Q, x W_K, x W_V                  # [B, H, N, d], [B, H_kv, N, d], [B, H_kv, N, d]
    q, k    = norm(q), norm(k)                      # QK-norm, per head (Qwen3, Gemma 3, Qwen3-Next)
    q, k    = RoPE(q), RoPE(k)                      # all or the first features of each head (Qwen3-Next)
    s       = q kᵀ · scale + window mask            # causal; sliding layers see their last `window` keys
    p       = softmax([s | sink])[:, :N]            # a learned logit per head in the denominator (gpt-oss)
    o       = (p v) ⊙ sigmoid(x W_G)                # an output gate per head and feature (Qwen3-Next)
    out     = o W_O

and differ only in which of these lines they keep: :class:`DecoderAttentionConfig` says which.
Grouped-query heads (``H_kv < H``) share each key/value head among ``H / H_kv`` query heads.

A learned sink is computed as what it is, a key every query sees, whose score is the head's sink logit
``s_h`` and whose value is zero: it takes its share of the softmax's denominator and adds nothing to the
output, so the weights of the real keys sum to less than one. The attention itself is the course's
:func:`~attn_course.core.attention.self_attention`. Hugging Face's modules are read into this one by
:func:`attn_course.models.hugging_face.convert_layer`.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask, to_additive
from attn_course.core.multihead import merge_heads, split_heads
from attn_course.core.norms import GemmaRMSNorm, RMSNorm
from attn_course.core.qk_norm import HeadNormLinear
from attn_course.positions.rope import RotaryEmbedding
from attn_course.positions.rope_scaling import SCALINGS, LinearScaling, Llama3Scaling, NTKScaling, YaRNScaling
from attn_course.variants.masks import sliding_window_mask

__all__ = ["QK_NORMS", "DecoderAttentionConfig", "DecoderAttention"]

#: The QK-norms: none, Llama's RMSNorm (Qwen3), or Gemma's with a weight of ``1 + w`` (Gemma 3, Qwen3-Next).
QK_NORMS = {None: None, "rms": RMSNorm, "gemma": GemmaRMSNorm}


@dataclasses.dataclass(frozen=True)
class DecoderAttentionConfig:
    """The sizes and options of one decoder attention layer.

    Args:
        hidden_size: ``E``, the model width.
        num_heads: ``H``, query heads.
        num_kv_heads: ``H_kv``, key/value heads; must divide ``H``.
        head_dim: ``d``; ``H · d`` need not equal ``E`` (Gemma 3, Qwen3).
        scale: multiplies the scores; default ``1 / sqrt(d)`` (Gemma 3: ``query_pre_attn_scalar ** -0.5``).
        window: keys each query sees, itself included (a sliding layer), or None for all earlier keys.
        qk_norm: a key of :data:`QK_NORMS`: None, ``"rms"`` or ``"gemma"``.
        norm_eps: the QK-norm's ``eps``.
        sinks: a learned sink logit per query head (gpt-oss).
        output_gate: gate the heads' outputs by ``sigmoid(x W_G)`` before ``o_proj`` (Qwen3-Next).
        bias: biases on the four projections (and the gate's).
        rope_base: RoPE's base ``θ``.
        rope_scaling: a :mod:`~attn_course.positions.rope_scaling` method, or None.
        rotary_fraction: the fraction of each head's features that RoPE rotates (the first ones).

    Raises:
        TypeError: a field of the wrong kind.
        ValueError: sizes below 1, ``H`` not divisible by ``H_kv``, an unknown ``qk_norm``, or a rotary
            fraction that rotates no or an odd number of features.

    Example:
        >>> config = DecoderAttentionConfig(64, 4, 2, 16, window=8, qk_norm="rms")
        >>> config.groups, round(config.softmax_scale, 4)
        (2, 0.25)
    """

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float | None = None
    window: int | None = None
    qk_norm: str | None = None
    norm_eps: float = 1e-6
    sinks: bool = False
    output_gate: bool = False
    bias: bool = False
    rope_base: float = 10000.0
    rope_scaling: LinearScaling | NTKScaling | YaRNScaling | Llama3Scaling | None = None
    rotary_fraction: float = 1.0

    def __post_init__(self) -> None:
        where = "DecoderAttentionConfig"
        sizes = _validate.integers(where, minimum=1, hidden_size=self.hidden_size, num_heads=self.num_heads,
                                   num_kv_heads=self.num_kv_heads, head_dim=self.head_dim)
        checked = dict(zip(("hidden_size", "num_heads", "num_kv_heads", "head_dim"), sizes))
        if checked["num_heads"] % checked["num_kv_heads"]:
            raise ValueError(f"{where}: num_heads={self.num_heads} must be divisible by num_kv_heads="
                             f"{self.num_kv_heads} (each key/value head serves the same number of query heads)")
        if self.scale is not None:
            checked["scale"] = _validate.positive_finite(where, "scale", self.scale)
        if self.window is not None:
            checked["window"] = _validate.integer(where, "window", self.window, minimum=1)
        if self.qk_norm not in QK_NORMS:
            raise ValueError(f"{where}: qk_norm must be one of {', '.join(map(repr, QK_NORMS))}, got {self.qk_norm!r}")
        checked["norm_eps"] = _validate.positive_finite(where, "norm_eps", self.norm_eps)
        for name in ("sinks", "output_gate", "bias"):
            _validate.boolean(where, name, getattr(self, name))
        checked["rope_base"] = _validate.positive_finite(where, "rope_base", self.rope_base)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, SCALINGS):
            raise TypeError(f"{where}: rope_scaling must be None or one of "
                            f"{', '.join(s.__name__ for s in SCALINGS)}, got {type(self.rope_scaling).__name__}")
        fraction = _validate.positive_finite(where, "rotary_fraction", self.rotary_fraction)
        rotated = int(checked["head_dim"] * fraction)
        if fraction > 1 or rotated < 2 or rotated % 2:
            raise ValueError(f"{where}: rotary_fraction must be in (0, 1] and rotate an even number of the "
                             f"head's features, got {fraction:g} · {self.head_dim} = {rotated}")
        checked["rotary_fraction"] = fraction
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def groups(self) -> int:
        """``G = H / H_kv``, the query heads that share one key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def softmax_scale(self) -> float:
        """What multiplies the scores: ``scale``, or ``1 / sqrt(d)``."""
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)


class DecoderAttention(nn.Module):
    """Causal self-attention of a modern decoder layer: GQA, QK-norm, RoPE, a window, sinks, an output gate.

    Parameters carry Hugging Face's names: ``q_proj`` ``[H·d, E]``, ``k_proj`` and ``v_proj`` ``[H_kv·d, E]``,
    ``o_proj`` ``[E, H·d]``, with ``gate_proj`` ``[H·d, E]`` (``output_gate``), ``sinks`` ``[H]`` (``sinks``;
    zero at initialisation), and with ``qk_norm`` the projections of queries and keys are
    :class:`~attn_course.core.qk_norm.HeadNormLinear`, their norms ``q_proj.norm`` and ``k_proj.norm`` ``[d]``
    (Hugging Face's ``q_norm`` and ``k_norm``). ``rope`` is a half-split
    :class:`~attn_course.positions.rope.RotaryEmbedding`. No dropout: a layer to read and check.

    Args:
        config: a :class:`DecoderAttentionConfig`.

    Raises:
        TypeError: ``config`` not a :class:`DecoderAttentionConfig`.

    Example:
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> config = DecoderAttentionConfig(64, 4, 2, 16, window=3, sinks=True, output_gate=True)
        >>> attention = DecoderAttention(config)
        >>> out, weights = attention(torch.randn(2, 5, 64))                 # x [B, N, E]
        >>> out.shape, weights.shape
        (torch.Size([2, 5, 64]), torch.Size([2, 4, 5, 5]))
        >>> bool((weights.sum(-1) < 1).all())                               # the sink takes a share
        True
    """

    def __init__(self, config: DecoderAttentionConfig) -> None:
        super().__init__()
        self.config = c = _validate.instance("DecoderAttention", "config", config, DecoderAttentionConfig)
        norm = QK_NORMS[c.qk_norm]
        if norm is None:
            self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.bias)
            self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.bias)
        else:                                                          # QK-norm: each head normalised, before RoPE
            self.q_proj = HeadNormLinear(c.hidden_size, c.num_heads, c.head_dim, bias=c.bias, eps=c.norm_eps, norm=norm)
            self.k_proj = HeadNormLinear(c.hidden_size, c.num_kv_heads, c.head_dim, bias=c.bias, eps=c.norm_eps,
                                         norm=norm)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.bias)
        self.gate_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.bias) if c.output_gate else None
        self.sinks = nn.Parameter(torch.zeros(c.num_heads)) if c.sinks else None
        self.rope = RotaryEmbedding(c.head_dim, base=c.rope_base, scaling=c.rope_scaling,
                                    rotary_fraction=c.rotary_fraction)

    def extra_repr(self) -> str:
        c = self.config
        return (f"heads={c.num_heads}, kv_heads={c.num_kv_heads}, head_dim={c.head_dim}, "
                f"scale={c.softmax_scale:.4g}, window={c.window}, sinks={c.sinks}, output_gate={c.output_gate}")

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend causally over positions ``0 .. N-1`` of ``x``.

        Args:
            x: ``[B, N, E]``, in the dtype of the module's weights.

        Returns:
            ``(output [B, N, E], attention_weights [B, H, N, N])``: the weights of the real keys only (with
            sinks, each row sums to less than one).

        Raises:
            TypeError: ``x`` not a floating tensor, or of another dtype than the weights.
            ValueError: ``x`` not ``[B, N, E]`` with ``N >= 1``.

        Example:
            >>> attention = DecoderAttention(DecoderAttentionConfig(32, 4, 4, 8, qk_norm="gemma"))
            >>> x = torch.randn(1, 6, 32)
            >>> out, _ = attention(x)
            >>> torch.allclose(attention(x[:, :4])[0], out[:, :4], atol=1e-6)   # causal: the future is unseen
            True
        """
        c = self.config
        x = self._check_input(x)
        tokens = x.shape[1]                                                       # N
        positions = torch.arange(tokens, device=x.device)                         # [N]

        # Project and split into heads (with QK-norm, q_proj and k_proj normalise each head, before RoPE).
        q = split_heads(self.q_proj(x), c.num_heads)                              # [B, H, N, d]
        k = split_heads(self.k_proj(x), c.num_kv_heads)                           # [B, H_kv, N, d]
        v = split_heads(self.v_proj(x), c.num_kv_heads)                           # [B, H_kv, N, d]

        # Rotate: position enters the scores only through the offset between query and key.
        q, k = self.rope.rotate(q, positions), self.rope.rotate(k, positions)    # [B, H|H_kv, N, d]

        # Group the query heads by the key/value head they share, so that k and v broadcast.
        q = q.unflatten(1, (c.num_kv_heads, c.groups))                            # [B, H_kv, G, N, d]
        k, v = k.unsqueeze(2), v.unsqueeze(2)                                     # [B, H_kv, 1, N, d]
        mask = self._mask(tokens, x.device)                                       # [N, N] boolean
        if self.sinks is not None:
            k, v, mask = self._with_sink_key(k, v, mask)                          # N + 1 keys, additive mask
        heads, weights = self_attention(q, k, v, mask, scale=c.softmax_scale)     # [B, H_kv, G, N, d]
        heads, weights = heads.flatten(1, 2), weights.flatten(1, 2)[..., :tokens]  # [B, H, N, d], [B, H, N, N]

        # Merge the heads, gate them (Qwen3-Next), project back to the model width.
        merged = merge_heads(heads)                                               # [B, N, H·d]
        if self.gate_proj is not None:
            merged = merged * torch.sigmoid(self.gate_proj(x))                    # [B, N, H·d]
        return self.o_proj(merged), weights                                       # [B, N, E]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The scores ``q kᵀ · scale`` of the real keys, before the softmax: what QK-norm keeps bounded.

        Args:
            x: ``[B, N, E]``, as for :meth:`forward`.

        Returns:
            ``[B, H, N, N]``, ``-inf`` where the mask hides a key (the sink logit is not among them).
        """
        c = self.config
        x = self._check_input(x)
        positions = torch.arange(x.shape[1], device=x.device)                     # [N]
        q = self.rope.rotate(split_heads(self.q_proj(x), c.num_heads), positions)  # [B, H, N, d]
        k = self.rope.rotate(split_heads(self.k_proj(x), c.num_kv_heads), positions)  # [B, H_kv, N, d]
        k = k.repeat_interleave(c.groups, dim=1)                                  # [B, H, N, d]
        scores = q @ k.transpose(-2, -1) * c.softmax_scale                        # [B, H, N, N]
        return scores.masked_fill(~self._mask(x.shape[1], x.device), float("-inf"))

    def _mask(self, tokens: int, device: torch.device) -> torch.Tensor:
        """``[N, N]``: causal, and within the last ``window`` keys on a sliding layer."""
        window = self.config.window
        if window is None:
            return causal_mask(tokens, device=device)
        return sliding_window_mask(tokens, window=window, device=device)

    def _with_sink_key(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append the sink as a key of zeros (score ``0``) and value zero, its logit ``s_h`` added by the mask.

        Returns ``k, v [B, H_kv, 1, N + 1, d]`` and the additive mask ``[H_kv, G, N, N + 1]``.
        """
        c, tokens = self.config, mask.shape[0]
        zero = k.new_zeros(*k.shape[:3], 1, k.shape[-1])                          # [B, H_kv, 1, 1, d]
        k, v = torch.cat((k, zero), dim=3), torch.cat((v, zero), dim=3)           # [B, H_kv, 1, N + 1, d]
        additive = to_additive(mask, k.dtype).expand(c.num_kv_heads, c.groups, tokens, tokens)
        sink = self.sinks.to(k.dtype).view(c.num_kv_heads, c.groups, 1, 1)      # [H_kv, G, 1, 1], s_h
        sink_column = sink.expand(-1, -1, tokens, 1)                              # [H_kv, G, N, 1]
        return k, v, torch.cat((additive, sink_column), dim=-1)                   # [H_kv, G, N, N + 1]

    def _check_input(self, x: object) -> torch.Tensor:
        """``x`` as a ``[B, N, E]`` floating tensor in the weights' dtype, ``N >= 1``."""
        where = "DecoderAttention.forward"
        x = _validate.floating_tensor(where, "x", x)
        if x.dim() != 3 or x.shape[-1] != self.config.hidden_size or x.shape[1] == 0:
            raise ValueError(f"{where}: x must be [B, N, E] with E = hidden_size = {self.config.hidden_size} "
                             f"and N >= 1, got shape {_validate.shape_str(x)}")
        if x.dtype != self.q_proj.weight.dtype:
            raise TypeError(f"{where}: x has dtype {x.dtype} but the module's weights are "
                            f"{self.q_proj.weight.dtype}; convert one of them (e.g. module.to({x.dtype}))")
        return x
