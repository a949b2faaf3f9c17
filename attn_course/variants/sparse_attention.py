"""DeepSeek-V3.2's sparse attention: a small "lightning indexer" scores every earlier token, each query reads its top k.

Latent attention (:mod:`~attn_course.variants.latent_attention`) still scores every earlier key. DeepSeek-V3.2
(DeepSeek-AI, 2025) puts a cheap scorer in front of it. For query token ``s`` and key token ``t ≤ s``::

    I[s, t] = Σ_h  w[s, h] · relu(q_I[s, h] · k_I[t] / √d_I)        (h over the indexer's H_I heads)

with ``q_I`` from the query's low-rank input (the latent attention's ``q_a``), one key ``k_I`` per token
(LayerNorm of ``x W_K``; no value), RoPE on the first ``d_R`` features of both (halves, not neighbours), and
per-head weights ``w[s] = x_s W_w / √H_I``. Each query then attends, in the full latent attention, only to the
``k`` tokens with the largest ``I[s, ·]`` among ``t ≤ s``: the attention's cost per query stops growing with
the context once it passes ``k``, while the indexer's grows with a handful of small heads and no softmax.

:class:`LightningIndexer` computes ``I`` and the selection; :class:`SparseLatentAttention` is the layer.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.core.masks import causal_mask
from attn_course.positions.rope import RotaryEmbedding
from attn_course.positions.rope_scaling import YaRNScaling
from attn_course.variants.latent_attention import MLAConfig, MultiHeadLatentAttention

__all__ = ["IndexerConfig", "LightningIndexer", "top_k_keys", "SparseLatentAttention"]


@dataclasses.dataclass(frozen=True)
class IndexerConfig:
    """The sizes of a :class:`LightningIndexer` (Hugging Face's ``index_*`` fields).

    Args:
        hidden_size: ``E``.
        query_input: the width of the query's low-rank input (``q_lora_rank``).
        num_heads, head_dim: ``H_I`` and ``d_I``.
        rope_dim: ``d_R``, the leading features RoPE turns; even, at most ``d_I``.
        top_k: keys each query keeps.
        rope_base, rope_scaling: as the latent attention's.
    """

    hidden_size: int
    query_input: int
    num_heads: int
    head_dim: int
    rope_dim: int
    top_k: int
    rope_base: float = 10000.0
    rope_scaling: YaRNScaling | None = None

    def __post_init__(self) -> None:
        where = "IndexerConfig"
        _validate.integers(where, minimum=1, hidden_size=self.hidden_size, query_input=self.query_input,
                           num_heads=self.num_heads, head_dim=self.head_dim, rope_dim=self.rope_dim, top_k=self.top_k)
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ValueError(f"{where}: rope_dim must be even and at most head_dim={self.head_dim}, "
                             f"got {self.rope_dim}")


def top_k_keys(scores: torch.Tensor, k: int) -> torch.Tensor:
    """``[B, N, N]`` bool: for each query, its ``k`` highest-scoring keys among itself and the tokens before it.

    Future keys are never chosen, even for a query with fewer than ``k`` tokens behind it (it keeps them all).

    Example:
        >>> scores = torch.tensor([[[5.0, 9, 9], [1, 2, 9], [3, 1, 2]]])
        >>> top_k_keys(scores, 2).int()
        tensor([[[1, 0, 0],
                 [1, 1, 0],
                 [1, 0, 1]]], dtype=torch.int32)
    """
    scores = _validate.floating_tensor("top_k_keys", "scores", scores)
    k = _validate.integer("top_k_keys", "k", k, minimum=1)
    causal = causal_mask(scores.shape[-2], scores.shape[-1], device=scores.device)
    chosen = scores.masked_fill(~causal, float("-inf")).topk(min(k, scores.shape[-1]), dim=-1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, chosen, True) & causal


class LightningIndexer(nn.Module):
    """The indexer's scores ``I [B, N, N]`` (module docstring); parameters ``query_up`` ``[H_I·d_I, q_in]``,
    ``key_proj`` ``[d_I, E]``, ``key_norm`` (LayerNorm), ``head_weights`` ``[H_I, E]``."""

    def __init__(self, config: IndexerConfig) -> None:
        super().__init__()
        self.config = c = _validate.instance("LightningIndexer", "config", config, IndexerConfig)
        self.query_up = nn.Linear(c.query_input, c.num_heads * c.head_dim, bias=False)
        self.key_proj = nn.Linear(c.hidden_size, c.head_dim, bias=False)
        self.key_norm = nn.LayerNorm(c.head_dim, eps=1e-6)
        self.head_weights = nn.Linear(c.hidden_size, c.num_heads, bias=False)
        self.rope = RotaryEmbedding(c.rope_dim, base=c.rope_base, scaling=c.rope_scaling)

    def forward(self, x: torch.Tensor, query_input: torch.Tensor) -> torch.Tensor:
        """``I [B, N, N]`` for ``x [B, N, E]`` and the latent attention's query input ``[B, N, q_in]``;
        ``-inf`` above the diagonal."""
        c, (batch, tokens, _) = self.config, x.shape
        positions = torch.arange(tokens, device=x.device)
        q = self.query_up(query_input).view(batch, tokens, c.num_heads, c.head_dim).transpose(1, 2)  # [B, H_I, N, d_I]
        k = self.key_norm(self.key_proj(x))[:, None]                                       # [B, 1, N, d_I]: one key
        q, k = (torch.cat((self.rope(t[..., :c.rope_dim], positions), t[..., c.rope_dim:]), dim=-1) for t in (q, k))
        per_head = F.relu(q @ k.transpose(-1, -2) * c.head_dim ** -0.5)                    # [B, H_I, N, N]
        weights = self.head_weights(x) * c.num_heads ** -0.5                               # [B, N, H_I]
        scores = torch.einsum("bnh,bhnt->bnt", weights, per_head)                          # [B, N, N]
        return scores.masked_fill(~causal_mask(tokens, device=x.device), float("-inf"))


class SparseLatentAttention(nn.Module):
    """DeepSeek-V3.2's attention: latent attention (``attention``) over the keys the ``indexer`` picks.

    Example:
        >>> mla = MLAConfig(64, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
        ...                 q_lora_rank=32)
        >>> layer = SparseLatentAttention(mla, IndexerConfig(64, 32, num_heads=2, head_dim=8, rope_dim=4, top_k=3))
        >>> out, weights = layer(torch.randn(1, 6, 64))
        >>> out.shape, int((weights[0, 0] > 0).sum(-1).max())                 # no query reads more than 3 keys
        (torch.Size([1, 6, 64]), 3)
    """

    def __init__(self, attention: MLAConfig, indexer: IndexerConfig) -> None:
        super().__init__()
        where = "SparseLatentAttention"
        attention = _validate.instance(where, "attention", attention, MLAConfig)
        indexer = _validate.instance(where, "indexer", indexer, IndexerConfig)
        if attention.q_lora_rank is None or attention.q_lora_rank != indexer.query_input:
            raise ValueError(f"{where}: the indexer reads the attention's low-rank query input: q_lora_rank="
                             f"{attention.q_lora_rank} must equal the indexer's query_input={indexer.query_input}")
        self.attention = MultiHeadLatentAttention(attention)
        self.indexer = LightningIndexer(indexer)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(output [B, N, E], attention_weights [B, H, N, N])``, causal over positions ``0 .. N-1``."""
        a = self.attention
        query_input = a.query_norm(a.query_down(x))                                        # [B, N, q_lora_rank]
        chosen = top_k_keys(self.indexer(x, query_input), self.indexer.config.top_k)       # [B, N, N]
        return a(x, key_mask=chosen)
