"""Gated DeltaNet, the linear-attention layer of Qwen3-Next (three layers in four), around the gated delta rule.

For ``x [B, N, E]`` the layer computes (Yang et al., Gated Delta Networks, 2024; Qwen3-Next's layout)::

    q, k, v    = x W_Q, x W_K, x W_V                # [B, N, h_k·d_k], [B, N, h_k·d_k], [B, N, h_v·d_v]
    q, k, v    = silu(causal_conv([q | k | v]))     # a depthwise convolution over the last K tokens
    q, k       = q / |q|, k / |k|                   # per head: unit keys, so a delta step is a projection
    β_t        = sigmoid(x W_b)                      # [B, N, h_v]: how strongly each token writes
    g_t        = −exp(A_log) · softplus(x W_a + dt_bias)   # [B, N, h_v]: the log of each token's decay
    o, S       = gated_delta_rule(q, k, v, g, β)    # each key head serves h_v / h_k value heads
    o          = RMSNorm(o) ⊙ silu(x W_z)            # per value head, then gated by the input
    out        = o W_O

The state ``S`` ``[B, h_v, d_k, d_v]`` and the convolution's last ``K − 1`` inputs are all a decoding layer
keeps, whatever ``N`` (:mod:`~attn_course.variants.layout_cache_size` counts them).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.core.multihead import merge_heads
from attn_course.variants.delta_rule import gated_delta_rule

__all__ = ["GatedDeltaNetConfig", "GatedDeltaNet"]


@dataclasses.dataclass(frozen=True)
class GatedDeltaNetConfig:
    """The sizes of a :class:`GatedDeltaNet` layer.

    Args:
        hidden_size: ``E``.
        num_key_heads, num_value_heads: ``h_k`` and ``h_v``; ``h_k`` divides ``h_v``.
        key_head_dim, value_head_dim: ``d_k`` and ``d_v``.
        conv_kernel: ``K``, the tokens the causal convolution spans.
        norm_eps: the output RMSNorm's ``eps``.
        chunk_size: the chunk of :func:`~attn_course.variants.delta_rule.gated_delta_rule`, or None for the
            recurrence (the same numbers, to round-off).

    Raises:
        TypeError, ValueError: sizes that are not positive ints, ``h_k`` not dividing ``h_v``.
    """

    hidden_size: int
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4
    norm_eps: float = 1e-6
    chunk_size: int | None = 64

    def __post_init__(self) -> None:
        where = "GatedDeltaNetConfig"
        _validate.integers(where, minimum=1, hidden_size=self.hidden_size, num_key_heads=self.num_key_heads,
                           num_value_heads=self.num_value_heads, key_head_dim=self.key_head_dim,
                           value_head_dim=self.value_head_dim, conv_kernel=self.conv_kernel)
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(f"{where}: num_value_heads={self.num_value_heads} must be divisible by num_key_heads="
                             f"{self.num_key_heads} (each key head serves the same number of value heads)")
        _validate.positive_finite(where, "norm_eps", self.norm_eps)
        if self.chunk_size is not None:
            _validate.integer(where, "chunk_size", self.chunk_size, minimum=1)

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim


class GatedDeltaNet(nn.Module):
    """A Gated DeltaNet layer (the module docstring's lines), with Hugging Face's fused projections cut apart.

    Parameters: ``q_proj``, ``k_proj`` ``[h_k·d_k, E]``, ``v_proj``, ``z_proj`` ``[h_v·d_v, E]``, ``b_proj``,
    ``a_proj`` ``[h_v, E]``, ``conv`` (depthwise, ``[2·h_k·d_k + h_v·d_v, 1, K]``, no bias), ``A_log`` and
    ``dt_bias`` ``[h_v]``, ``norm_weight`` ``[d_v]``, ``o_proj`` ``[E, h_v·d_v]``.

    Example:
        >>> layer = GatedDeltaNet(GatedDeltaNetConfig(32, 2, 4, 8, 8))
        >>> out, state = layer(torch.randn(1, 5, 32))
        >>> out.shape, state.shape
        (torch.Size([1, 5, 32]), torch.Size([1, 4, 8, 8]))
    """

    def __init__(self, config: GatedDeltaNetConfig) -> None:
        super().__init__()
        self.config = c = _validate.instance("GatedDeltaNet", "config", config, GatedDeltaNetConfig)
        self.q_proj = nn.Linear(c.hidden_size, c.key_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.key_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.value_dim, bias=False)
        self.z_proj = nn.Linear(c.hidden_size, c.value_dim, bias=False)
        self.b_proj = nn.Linear(c.hidden_size, c.num_value_heads, bias=False)
        self.a_proj = nn.Linear(c.hidden_size, c.num_value_heads, bias=False)
        channels = 2 * c.key_dim + c.value_dim
        self.conv = nn.Conv1d(channels, channels, c.conv_kernel, groups=channels, bias=False)
        self.A_log = nn.Parameter(torch.zeros(c.num_value_heads))
        self.dt_bias = nn.Parameter(torch.ones(c.num_value_heads))
        self.norm_weight = nn.Parameter(torch.ones(c.value_head_dim))
        self.o_proj = nn.Linear(c.value_dim, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(output [B, N, E], state [B, h_v, d_k, d_v])`` for ``x [B, N, E]``, from a zero state.

        Raises:
            TypeError: ``x`` not floating, or not in the weights' dtype. ValueError: not ``[B, N, E]``, ``N >= 1``.
        """
        c, where = self.config, "GatedDeltaNet.forward"
        x = _validate.floating_tensor(where, "x", x)
        if x.dim() != 3 or x.shape[-1] != c.hidden_size or x.shape[1] == 0:
            raise ValueError(f"{where}: x must be [B, N, E] with E = {c.hidden_size} and N >= 1, got shape "
                             f"{_validate.shape_str(x)}")
        if x.dtype != self.o_proj.weight.dtype:
            raise TypeError(f"{where}: x has dtype {x.dtype} but the weights are {self.o_proj.weight.dtype}")
        groups = c.num_value_heads // c.num_key_heads

        # Project, then mix each channel with the K - 1 tokens before it (causal: pad on the left only).
        mixed = torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1).transpose(1, 2)   # [B, C, N]
        mixed = F.silu(self.conv(F.pad(mixed, (c.conv_kernel - 1, 0)))).transpose(1, 2)             # [B, N, C]
        q, k, v = mixed.split((c.key_dim, c.key_dim, c.value_dim), dim=-1)

        # Heads: unit queries and keys, each key head shared by `groups` value heads.
        def heads(t, count, dim):
            return t.unflatten(-1, (count, dim)).transpose(1, 2)                                     # [B, h, N, d]
        q, k = (heads(t, c.num_key_heads, c.key_head_dim) for t in (q, k))
        q, k = ((t * torch.rsqrt(t.pow(2).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(groups, dim=1)
                for t in (q, k))                                                                     # [B, h_v, N, d_k]
        v = heads(v, c.num_value_heads, c.value_head_dim)                                            # [B, h_v, N, d_v]

        # How strongly each token writes, and how much of the state it keeps.
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)                                         # [B, h_v, N]
        g = (-self.A_log.exp() * F.softplus(self.a_proj(x) + self.dt_bias)).transpose(1, 2)          # [B, h_v, N]
        out, state = gated_delta_rule(q, k, v, g, beta, chunk_size=c.chunk_size)                    # [B, h_v, N, d_v]

        # Normalise each value head, gate it by the input, project back.
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + c.norm_eps) * self.norm_weight
        out = out * F.silu(heads(self.z_proj(x), c.num_value_heads, c.value_head_dim))
        return self.o_proj(merge_heads(out)), state
