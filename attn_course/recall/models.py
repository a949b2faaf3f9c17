"""A small model for associative recall whose layers differ in one thing only: how they mix tokens.

Each block is ``x + mixer(norm(x))`` (RMSNorm), and the mixer of a layer is one of :data:`MIXERS`, each a function
of the course applied to the same projections::

    q, k, v = split_heads(causal_conv(x W_QKV))        # [B, H, N, d] each; the same in every kind of layer
    "softmax":  softmax(q kᵀ / √d + causal) v           # scaled_dot_product (chapter 01), a KV cache
    "linear":   φ(q)ᵀ S_t / φ(q)ᵀ z_t,  φ = elu + 1     # linear_attention (chapter 09), a state S, z
    "delta":    S_t = α_t S + β_t k_t (v_t − α_t Sᵀ k_t)ᵀ,  o_t = S_tᵀ q_t
                                                        # gated_delta_rule (chapter 13), q and k of unit length,
                                                        # β_t = sigmoid(x W_β), log α_t = −e^A softplus(x W_α + b)
    out = merge_heads(o) W_O

**The short convolution.** Every layer, whatever its mixer, first runs a depthwise causal convolution over
the last ``conv_kernel`` tokens on each channel of ``q, k, v`` (as Gated DeltaNet and Mamba do; H3 and Based
call it a "shift"). Zoology found it is what lets a recurrent layer solve recall at all: a value token must
know which key came just before it, and a convolution of width 2 or more puts that key into the value
token's projections, so a single layer can write the pair into its state. Softmax layers can learn the same
from two layers of attention (an induction head), but giving every kind of layer the same convolution (and
no other position information: the convolution and the causal mask are enough) leaves the mixer as the only
difference between the models compared. ``conv_kernel=1`` switches it off.

**The delta rule's scale is 1**, not ``gated_delta_rule``'s default ``1/√d``: with unit queries and keys, a query
that matches a stored key reads back that key's value itself, as large as the values the other mixers return
(softmax and linear attention return weighted averages of values). With ``1/√d`` the outputs start four times
smaller here and the delta-rule models learned markedly slower (after 300 steps with 4 to 16 pairs, seed 0
answered 29% right at 4 pairs with ``1/√d`` and 44% with 1; seed 1 83% with 1).

**No MLP.** Recall is the mixers' work: a key's value is copied from the context, not computed, and the
unembedding reads it off the residual stream. A GELU MLP four times wide after each mixer (as chapter 12's
decoder has) took about a third of each training step on this course's 2-core CPU, steps the runs need more.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.core.attention import scaled_dot_product
from attn_course.core.masks import causal_mask
from attn_course.core.multihead import merge_heads, split_heads
from attn_course.core.norms import RMSNorm
from attn_course.variants.delta_rule import gated_delta_rule
from attn_course.variants.linear_attention import linear_attention

__all__ = ["MIXERS", "RecallModelConfig", "TokenMixer", "RecallBlock", "RecallModel"]

MIXERS = ("softmax", "linear", "delta")


@dataclass(frozen=True)
class RecallModelConfig:
    """The sizes of a :class:`RecallModel` and each layer's mixer.

    Attributes:
        vocab_size: token ids.
        mixers: one of :data:`MIXERS` per layer, first layer first (a list is kept as a tuple).
        d_model: ``E``.
        n_heads, head_dim: ``H`` and ``d`` of the queries, keys and values (``H · d`` need not equal ``E``).
        conv_kernel: tokens the short causal convolution spans (1: none).
        chunk_size: the chunk of the linear and delta-rule layers' chunked forms (the same numbers as their
            recurrences, to round-off).

    Raises:
        TypeError, ValueError: a size that is not a positive int, an unknown mixer, no layers.
    """

    vocab_size: int
    mixers: tuple[str, ...] = ("delta", "delta")
    d_model: int = 64
    n_heads: int = 2
    head_dim: int = 16
    conv_kernel: int = 4
    chunk_size: int = 32

    def __post_init__(self) -> None:
        where = "RecallModelConfig"
        _validate.integers(where, minimum=1, vocab_size=self.vocab_size, d_model=self.d_model, n_heads=self.n_heads,
                           head_dim=self.head_dim, conv_kernel=self.conv_kernel, chunk_size=self.chunk_size)
        mixers = tuple(_validate.labels(where, "mixers", self.mixers))
        if not mixers or not set(mixers) <= set(MIXERS):
            raise ValueError(f"{where}: mixers must be a non-empty sequence of {', '.join(map(repr, MIXERS))}, "
                             f"got {self.mixers!r}")
        object.__setattr__(self, "mixers", mixers)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class TokenMixer(nn.Module):
    """One layer's token mixing: projections, the short convolution, then ``kind``'s mixer (module docstring).

    Parameters: ``qkv`` ``[3·H·d, E]``, ``conv`` (depthwise, ``[3·H·d, 1, K]``, when ``K > 1``), ``out``
    ``[E, H·d]``; for ``"delta"`` also ``beta`` and ``decay`` ``[H, E]`` (with biases), ``A_log`` and
    ``dt_bias`` ``[H]``, initialised so that ``α ≈ 0.999`` (a slow decay, so that a key written early is
    still there at the end of 160 tokens; the model may learn to forget faster).

    Example:
        >>> mixer = TokenMixer("delta", RecallModelConfig(vocab_size=10))
        >>> mixer(torch.randn(2, 7, 64)).shape
        torch.Size([2, 7, 64])
    """

    def __init__(self, kind: str, config: RecallModelConfig) -> None:
        super().__init__()
        where = "TokenMixer"
        if kind not in MIXERS:
            raise ValueError(f"{where}: kind must be one of {', '.join(map(repr, MIXERS))}, got {kind!r}")
        self.kind, self.config = kind, _validate.instance(where, "config", config, RecallModelConfig)
        c, inner = config, config.n_heads * config.head_dim
        self.qkv = nn.Linear(c.d_model, 3 * inner, bias=False)
        self.conv = (nn.Conv1d(3 * inner, 3 * inner, c.conv_kernel, groups=3 * inner, bias=False)
                     if c.conv_kernel > 1 else None)
        if kind == "delta":
            self.beta = nn.Linear(c.d_model, c.n_heads)
            self.decay = nn.Linear(c.d_model, c.n_heads)
            self.A_log = nn.Parameter(torch.zeros(c.n_heads))
            self.dt_bias = nn.Parameter(torch.full((c.n_heads,), math.log(math.expm1(0.001))))  # softplus(b) = 0.001
        self.out = nn.Linear(inner, c.d_model, bias=False)

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k, v`` ``[B, H, N, d]`` for ``x [B, N, E]``: after the convolution, before any normalisation."""
        c = self.config
        mixed = self.qkv(_check_x("TokenMixer.projections", x, c.d_model))                     # [B, N, 3·H·d]
        if self.conv is not None:
            mixed = self.conv(F.pad(mixed.transpose(1, 2), (c.conv_kernel - 1, 0))).transpose(1, 2)  # causal
        return tuple(split_heads(t, c.n_heads) for t in mixed.chunk(3, dim=-1))               # [B, H, N, d] each

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The delta rule's ``(g, beta)`` ``[B, H, N]`` for ``x [B, N, E]``: log-decay ``≤ 0`` and step in (0, 1).

        Raises:
            ValueError: a mixer other than ``"delta"``, or ``x`` not ``[B, N, E]``.
        """
        if self.kind != "delta":
            raise ValueError(f"TokenMixer.gates: only a 'delta' mixer has gates, this one is {self.kind!r}")
        x = _check_x("TokenMixer.gates", x, self.config.d_model)
        g = -self.A_log.exp() * F.softplus(self.decay(x) + self.dt_bias)                       # [B, N, H]
        return g.transpose(1, 2), torch.sigmoid(self.beta(x)).transpose(1, 2)                 # [B, H, N] each

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, N, E]`` to ``[B, N, E]``, each position mixing itself and the positions before it.

        Raises:
            TypeError: ``x`` not floating. ValueError: ``x`` not ``[B, N, E]`` with ``N >= 1``.
        """
        q, k, v = self.projections(x)                                                          # [B, H, N, d]
        if self.kind == "softmax":
            out, _ = scaled_dot_product(q, k, v, causal_mask(q.shape[2], device=q.device))
        elif self.kind == "linear":
            out = linear_attention(q, k, v, causal=True, chunk_size=self.config.chunk_size)
        else:
            g, beta = self.gates(x)
            q, k = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)        # unit queries, keys
            out, _ = gated_delta_rule(q, k, v, g, beta, chunk_size=self.config.chunk_size, scale=1.0)
        return self.out(merge_heads(out))                                                      # [B, N, E]


def _check_x(where: str, x: object, width: int) -> torch.Tensor:
    x = _validate.floating_tensor(where, "x", x)
    if x.dim() != 3 or x.shape[-1] != width or x.shape[1] == 0:
        raise ValueError(f"{where}: x must be [B, N, E] with E = {width} and N >= 1, got shape "
                         f"{_validate.shape_str(x)}")
    return x


class RecallBlock(nn.Module):
    """``x + mixer(norm(x))``: a residual around one :class:`TokenMixer` (no MLP: module docstring)."""

    def __init__(self, kind: str, config: RecallModelConfig) -> None:
        super().__init__()
        self.mixer_norm = RMSNorm(config.d_model)
        self.mixer = TokenMixer(kind, config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(self.mixer_norm(x))


class RecallModel(nn.Module):
    """Embeddings, a :class:`RecallBlock` per entry of ``config.mixers``, a final RMSNorm, an unembedding.

    Example:
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> model = RecallModel(RecallModelConfig(vocab_size=10, mixers=("delta", "softmax")))
        >>> model(torch.tensor([[1, 2, 3, 4]])).shape, [block.mixer.kind for block in model.blocks]
        (torch.Size([1, 4, 10]), ['delta', 'softmax'])
    """

    def __init__(self, config: RecallModelConfig) -> None:
        super().__init__()
        self.config = _validate.instance("RecallModel", "config", config, RecallModelConfig)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(RecallBlock(kind, config) for kind in config.mixers)
        self.norm = RMSNorm(config.d_model)
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, N, V]`` for ids ``[B, N]``.

        Raises:
            TypeError: ``ids`` not an integer tensor. ValueError: ``ids`` not ``[B, N]`` or out of the vocabulary.
        """
        x = self.embed(_validate.token_ids("RecallModel", "ids", ids, self.config.vocab_size))   # [B, N, E]
        for block in self.blocks:
            x = block(x)
        return self.unembed(self.norm(x))                                                     # [B, N, V]
