"""A small pre-norm decoder whose attention layers carry the choices of today's open models as switches.

Each block is ``x + attention(norm(x))`` then ``x + mlp(norm(x))`` (RMSNorm, a GELU MLP four times wide), the
attention a :class:`~attn_course.models.decoder_attention.DecoderAttention` with RoPE and, when asked,
QK-norm (Qwen3), a learned sink logit per head (gpt-oss) or an output gate (Qwen3-Next). With every switch
off it is a plain Llama-style decoder, so that training it with and without one switch isolates that choice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from attn_course import _validate
from attn_course.core.norms import RMSNorm
from attn_course.models.decoder_attention import DecoderAttention, DecoderAttentionConfig

__all__ = ["SmallDecoderConfig", "SmallDecoder", "Recording"]


@dataclass(frozen=True)
class SmallDecoderConfig:
    """The sizes of a :class:`SmallDecoder` and its attention's switches.

    Attributes:
        vocab_size: tokens, the start token included.
        d_model, n_layers, n_heads: ``E``, layers, heads (``d = E / H`` each).
        qk_norm: RMSNorm on each head's queries and keys, before RoPE.
        sinks: a learned sink logit per head in the softmax's denominator.
        output_gate: each head's output times ``sigmoid(x W_G)``, before the output projection.
    """

    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    qk_norm: bool = False
    sinks: bool = False
    output_gate: bool = False

    def __post_init__(self) -> None:
        where = "SmallDecoderConfig"
        _validate.integers(where, minimum=1, vocab_size=self.vocab_size, d_model=self.d_model,
                           n_layers=self.n_layers, n_heads=self.n_heads)
        for name in ("qk_norm", "sinks", "output_gate"):
            _validate.boolean(where, name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"{where}: d_model={self.d_model} must be divisible by n_heads={self.n_heads}")

    def attention(self) -> DecoderAttentionConfig:
        """The :class:`~attn_course.models.decoder_attention.DecoderAttentionConfig` of every layer."""
        return DecoderAttentionConfig(self.d_model, self.n_heads, self.n_heads, self.d_model // self.n_heads,
                                      qk_norm="rms" if self.qk_norm else None, sinks=self.sinks,
                                      output_gate=self.output_gate)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Recording:
    """What :meth:`SmallDecoder.forward` records with ``record=True``, one entry per layer.

    Attributes:
        weights: ``[B, H, N, N]`` attention weights of the real keys (with sinks, rows sum to less than one).
        logits: ``[B, H, N, N]`` scores before the softmax, ``-inf`` above the diagonal.
        residuals: ``[B, N, E]`` the residual stream after the layer.
    """

    weights: list[torch.Tensor]
    logits: list[torch.Tensor]
    residuals: list[torch.Tensor]


class DecoderBlock(nn.Module):
    """``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: SmallDecoderConfig) -> None:
        super().__init__()
        width = config.d_model
        self.attention_norm = RMSNorm(width)
        self.attention = DecoderAttention(config.attention())
        self.mlp_norm = RMSNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attended, weights = self.attention(self.attention_norm(x))
        x = x + attended
        return x + self.mlp(self.mlp_norm(x)), weights


class SmallDecoder(nn.Module):
    """A small decoder language model: embeddings, :class:`DecoderBlock` layers, a final RMSNorm, an unembedding.

    Example:
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> model = SmallDecoder(SmallDecoderConfig(vocab_size=10, sinks=True))
        >>> logits, recording = model(torch.tensor([[9, 1, 2, 3]]), record=True)
        >>> logits.shape, len(recording.weights), recording.weights[0].shape
        (torch.Size([1, 4, 10]), 2, torch.Size([1, 4, 4, 4]))
    """

    def __init__(self, config: SmallDecoderConfig) -> None:
        super().__init__()
        self.config = _validate.instance("SmallDecoder", "config", config, SmallDecoderConfig)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(DecoderBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model)
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor, *, record: bool = False) -> torch.Tensor | tuple[torch.Tensor, Recording]:
        """Logits ``[B, N, V]`` for ids ``[B, N]``; with ``record``, also a :class:`Recording` of every layer.

        Raises:
            TypeError: ``ids`` not an integer tensor. ValueError: ``ids`` not ``[B, N]`` or out of the vocabulary.
        """
        ids = _validate.token_ids("SmallDecoder", "ids", ids, self.config.vocab_size)
        x = self.embed(ids)                                                        # [B, N, E]
        recording = Recording([], [], [])
        for block in self.blocks:
            if record:
                recording.logits.append(block.attention.logits(block.attention_norm(x)))
            x, weights = block(x)
            if record:
                recording.weights.append(weights)
                recording.residuals.append(x)
        logits = self.unembed(self.norm(x))
        return (logits, recording) if record else logits
