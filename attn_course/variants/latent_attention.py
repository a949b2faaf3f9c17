"""Multi-head latent attention (MLA, DeepSeek-V2, arXiv 2405.04434 §2.1): cache one small latent per token.

Multi-head attention caches a key and a value per head and token (``2·H·d_h`` numbers per layer).
MLA caches instead one latent ``c_KV`` of ``d_c`` numbers per token, from which every head's key
and value are projected back up, plus one small rotary key ``k_R`` of ``d_R`` numbers shared by
all heads (the paper's equations 9-19, names as in the paper)::

    c_Q  = RMSNorm(W_DQ x)                       # [B, N, d_c']  optional query compression
    q_C  = W_UQ c_Q                              # [B, H, N, d_h] content part of each head's query
    q_R  = RoPE(W_QR c_Q)                        # [B, H, N, d_R] position part of each head's query
    c_KV = RMSNorm(W_DKV x)                      # [B, N, d_c]   the latent: cached
    k_R  = RoPE(W_KR x)                          # [B, N, d_R]   one rotary key for all heads: cached
    k_C, v = W_UK c_KV, W_UV c_KV                # [B, H, N, d_h], [B, H, N, d_v]
    o    = softmax([q_C; q_R]·[k_C; k_R]ᵀ · scale) v,   scale = t / sqrt(d_h + d_R)
    out  = W_O o

Why the rotary part is separate ("decoupled RoPE", §2.1.3): the content scores
``q_Cᵀ k_C = q_Cᵀ W_UK c_KV = (W_UKᵀ q_C)ᵀ c_KV`` let ``W_UK`` be multiplied into the query side,
so attention can run on the cached latent directly (:meth:`MultiHeadLatentAttention.forward` with
``absorbed=True``; ``W_UV`` likewise moves into ``W_O``). A rotation between ``q`` and ``W_UK`` would
depend on the position and forbid this, so position lives in the extra ``d_R`` features only.

Computed as Hugging Face ``transformers`` 5.24 (``modeling_deepseek_v2.py``) computes it, so that its
weights load by cutting their fused matrices apart
(:func:`attn_course.models.hugging_face.latent_attention.from_hugging_face_weights`, with the config read by
:func:`~attn_course.models.hugging_face.latent_attention.mla_config_from_hugging_face`):

- The two RMSNorms use ``eps = 1e-6`` whatever ``rms_norm_eps`` is (Hugging Face builds them without it).
- RoPE pairs *adjacent* features (``interleaved=True``): 5.24 rotates ``(x_0, x_1), (x_2, x_3), ...``
  as complex numbers, in place. DeepSeek's original ``modeling_deepseek.py`` first permutes the
  features to ``[x_0, x_2, ... | x_1, x_3, ...]`` and then rotates the halves: the same pairs, so the
  same scores, but its rotated keys come out in the permuted order.
- YaRN (DeepSeek-V2 §3.1.4 stretches 4K to 128K this way, ``s = 40``): the rotated features are
  multiplied by ``mscale(s, mscale) / mscale(s, mscale_all_dim)`` and the softmax scale by
  ``mscale(s, mscale_all_dim)²``, with ``mscale(s, m) = 0.1·m·ln s + 1`` (the paper's
  ``√t = 0.0707 ln s + 1`` is ``m = 0.707``). Other rotary scalings are refused.

What is cached, :class:`~attn_course.variants.latent_cache.LatentCache`, lives in
:mod:`attn_course.variants.latent_cache` (and is importable from here);
:mod:`attn_course.variants.kv_cache_size` counts what each kind of attention caches per token.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch
from torch import nn

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.core.multihead import merge_heads, split_heads
from attn_course.core.norms import RMSNorm
from attn_course.positions.rope import RotaryEmbedding
from attn_course.positions.rope_scaling import YaRNScaling
from attn_course.variants.latent_cache import LatentCache

__all__ = [
    "MLAConfig",
    "MultiHeadLatentAttention",
    "AbsorbedProjections",
]


@dataclasses.dataclass(frozen=True)
class MLAConfig:
    """The sizes of one multi-head latent attention layer (Hugging Face's field names).

    Args:
        hidden_size: ``E`` (the paper's ``d``), the model width.
        num_heads: ``H`` (``n_h``).
        kv_lora_rank: ``d_c``, the size of the cached latent ``c_KV``.
        qk_nope_head_dim: ``d_h``, the per-head size of the content part of queries and keys.
        qk_rope_head_dim: ``d_R`` (``d_h^R``), the per-head size of the rotary part; even.
        v_head_dim: ``d_v``, the per-head size of the values (``d_h`` in the paper).
        q_lora_rank: ``d_c'``, the size of the query latent ``c_Q``; None projects queries straight
            from ``x`` (DeepSeek-V2-Lite).
        rope_base: ``θ_i = base^(-2i/d_R)``.
        rope_scaling: None, or a :class:`~attn_course.positions.rope_scaling.YaRNScaling` for the rotary features.
        score_temperature: multiplies the softmax scale (DeepSeek's ``mscale(s, mscale_all_dim)²``
            under YaRN; 1 otherwise).
        attention_bias: biases on ``W_DQ``, ``W_DKV``, ``W_KR`` and ``W_O`` (as Hugging Face's
            ``attention_bias``); the up-projections never have one.
        norm_eps: the ``eps`` of the two latent RMSNorms.

    Raises:
        TypeError, ValueError: a size that is not a positive int, an odd ``qk_rope_head_dim``, a
            scaling that is not YaRN, or a temperature or eps that is not a positive finite number.

    Example:
        >>> config = MLAConfig(64, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
        >>> config.softmax_scale == 1 / math.sqrt(8 + 4)
        True
    """

    hidden_size: int
    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    rope_base: float = 10000.0
    rope_scaling: YaRNScaling | None = None
    score_temperature: float = 1.0
    attention_bias: bool = False
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        where = "MLAConfig"
        for name in ("hidden_size", "num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                     "v_head_dim"):
            object.__setattr__(self, name, _validate.integer(where, name, getattr(self, name), minimum=1))
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"{where}: qk_rope_head_dim must be even (RoPE turns features in pairs), "
                             f"got {self.qk_rope_head_dim}")
        if self.q_lora_rank is not None:
            object.__setattr__(self, "q_lora_rank", _validate.integer(where, "q_lora_rank", self.q_lora_rank,
                                                                      minimum=1))
        object.__setattr__(self, "rope_base", _validate.positive_finite(where, "rope_base", self.rope_base))
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, YaRNScaling):
            raise TypeError(f"{where}: rope_scaling must be None or a YaRNScaling (DeepSeek-V2 extends its "
                            f"context with YaRN), got {type(self.rope_scaling).__name__}")
        object.__setattr__(self, "score_temperature",
                           _validate.positive_finite(where, "score_temperature", self.score_temperature))
        object.__setattr__(self, "attention_bias", _validate.boolean(where, "attention_bias", self.attention_bias))
        object.__setattr__(self, "norm_eps", _validate.positive_finite(where, "norm_eps", self.norm_eps))

    @property
    def softmax_scale(self) -> float:
        """``t / sqrt(d_h + d_R)``: the paper's ``1/sqrt(d_h + d_h^R)`` (equation 18) times YaRN's ``t``."""
        return self.score_temperature / math.sqrt(self.qk_nope_head_dim + self.qk_rope_head_dim)


class AbsorbedProjections(NamedTuple):
    """The matrices of MLA's absorbed form (:meth:`MultiHeadLatentAttention.absorbed_projections`).

    ``query [H, d_c, d_in]``: per head ``W_UKᵀ W_UQ``, from the query input (``c_Q``, or ``x`` without
    query compression) straight to a query in latent space. ``output [E, H·d_c]``: per head
    ``W_O[:, head] W_UV``, from each head's latent-space output straight to the model width.
    """

    query: torch.Tensor
    output: torch.Tensor


class MultiHeadLatentAttention(nn.Module):
    """DeepSeek-V2's attention: causal, keys and values rebuilt from a cached latent per token.

    Submodules carry the paper's matrices: ``query_down`` (``W_DQ``, absent when ``q_lora_rank`` is
    None), ``query_norm``, ``query_up`` (``W_UQ``, or the content rows of ``W_Q``), ``query_rope``
    (``W_QR``), ``kv_down`` (``W_DKV``), ``kv_norm``, ``key_rope`` (``W_KR``), ``key_up`` (``W_UK``),
    ``value_up`` (``W_UV``), ``out_proj`` (``W_O``); ``rope`` is a
    :class:`~attn_course.positions.rope.RotaryEmbedding` over the ``d_R`` features, adjacent pairs. No dropout
    (an inference module) and no padding mask: every query sees the cached tokens and the new ones
    up to itself.

    Args:
        config: an :class:`MLAConfig`.

    Raises:
        TypeError: ``config`` not an :class:`MLAConfig`.

    Example:
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> config = MLAConfig(64, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
        ...                    v_head_dim=8, q_lora_rank=32)
        >>> mla = MultiHeadLatentAttention(config)
        >>> x = torch.randn(2, 5, 64)                                  # [B, N, E]
        >>> out, weights = mla(x)
        >>> out.shape, weights.shape
        (torch.Size([2, 5, 64]), torch.Size([2, 4, 5, 5]))
        >>> cache = LatentCache()
        >>> steps = [mla(x[:, :3], cache)[0]] + [mla(x[:, t:t + 1], cache)[0] for t in (3, 4)]
        >>> torch.allclose(torch.cat(steps, dim=1), out, atol=1e-6), cache.latent.shape
        (True, torch.Size([2, 5, 16]))
    """

    def __init__(self, config: MLAConfig) -> None:
        super().__init__()
        if not isinstance(config, MLAConfig):
            raise TypeError(f"MultiHeadLatentAttention: config must be an MLAConfig, got {type(config).__name__}")
        self.config = c = config
        heads, bias = c.num_heads, c.attention_bias
        query_in = c.hidden_size if c.q_lora_rank is None else c.q_lora_rank
        self.query_down = None if c.q_lora_rank is None else nn.Linear(c.hidden_size, c.q_lora_rank, bias=bias)
        self.query_norm = None if c.q_lora_rank is None else RMSNorm(c.q_lora_rank, eps=c.norm_eps)
        self.query_up = nn.Linear(query_in, heads * c.qk_nope_head_dim, bias=False)
        self.query_rope = nn.Linear(query_in, heads * c.qk_rope_head_dim, bias=False)
        self.kv_down = nn.Linear(c.hidden_size, c.kv_lora_rank, bias=bias)
        self.kv_norm = RMSNorm(c.kv_lora_rank, eps=c.norm_eps)
        self.key_rope = nn.Linear(c.hidden_size, c.qk_rope_head_dim, bias=bias)
        self.key_up = nn.Linear(c.kv_lora_rank, heads * c.qk_nope_head_dim, bias=False)
        self.value_up = nn.Linear(c.kv_lora_rank, heads * c.v_head_dim, bias=False)
        self.out_proj = nn.Linear(heads * c.v_head_dim, c.hidden_size, bias=bias)
        self.rope = RotaryEmbedding(c.qk_rope_head_dim, base=c.rope_base, interleaved=True, scaling=c.rope_scaling)

    def forward(self, x: torch.Tensor, cache: LatentCache | None = None, *, positions: torch.Tensor | None = None,
                absorbed: bool = False, key_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend causally over the cached tokens and ``x``; append ``x``'s latents to ``cache``.

        Args:
            x: ``[B, N, E]``, the new tokens.
            cache: a :class:`LatentCache` holding the tokens before ``x`` (it is appended to), or None.
            positions: the new tokens' positions for RoPE, ``[N]`` or ``[B, N]``; default
                ``len(cache) .. len(cache) + N - 1``.
            absorbed: run attention against the latent itself, with ``W_UK`` folded into the query
                projection and ``W_UV`` into the output projection (:meth:`absorbed_projections`),
                instead of rebuilding every head's keys and values. Same result, up to rounding.
            key_mask: ``[B, N, N_k]`` bool, the keys each query may read besides the causal mask (``True``:
                may): DeepSeek-V3.2's top-k selection (:mod:`~attn_course.variants.sparse_attention`).

        Returns:
            ``(output [B, N, E], attention_weights [B, H, N, N_k])`` with ``N_k = len(cache)`` after
            the append (``N`` without a cache).

        Raises:
            TypeError: ``x`` not a floating tensor, ``cache`` not a :class:`LatentCache`, ``absorbed``
                not a bool, or positions not an integer tensor.
            ValueError: ``x`` not ``[B, N, E]``, or positions of the wrong shape.
        """
        where = "MultiHeadLatentAttention.forward"
        c = self.config
        x = _validate.floating_tensor(where, "x", x)
        if x.dim() != 3 or x.shape[-1] != c.hidden_size or x.shape[1] == 0:
            raise ValueError(f"{where}: x must be [B, N, E] with E = {c.hidden_size} and N >= 1, "
                             f"got shape {_validate.shape_str(x)}")
        if cache is not None and not isinstance(cache, LatentCache):
            raise TypeError(f"{where}: cache must be a LatentCache or None, got {type(cache).__name__}")
        _validate.boolean(where, "absorbed", absorbed)
        past, tokens = (len(cache) if cache is not None else 0), x.shape[1]
        if positions is None:
            positions = torch.arange(past, past + tokens, device=x.device)

        # Queries: content part and rotary part for every head.
        query_in = x if self.query_down is None else self.query_norm(self.query_down(x))   # [B, N, d_in]
        q_rope = self.rope(split_heads(self.query_rope(query_in), c.num_heads), positions)  # [B, H, N, d_R]

        # The latent and the one rotary key: all that is cached.
        latent = self.kv_norm(self.kv_down(x))                                   # [B, N, d_c]
        rope_key = self.rope(self.key_rope(x), positions)                        # [B, N, d_R]
        if cache is not None:
            latent, rope_key = cache.append(latent, rope_key)                    # [B, N_k, d_c], [B, N_k, d_R]
        mask = causal_mask(tokens, latent.shape[1], device=x.device)             # [N, N_k]
        if key_mask is not None:
            if key_mask.dtype != torch.bool or key_mask.shape != (x.shape[0], *mask.shape):
                raise ValueError(f"{where}: key_mask must be a bool [B, N, N_k] = [{x.shape[0]}, {tokens}, "
                                 f"{mask.shape[1]}] tensor, got {key_mask.dtype} {_validate.shape_str(key_mask)}")
            mask = (mask & key_mask)[:, None]                                    # [B, 1, N, N_k]

        if absorbed:
            return self._attend_to_latent(query_in, q_rope, latent, rope_key, mask)
        q_content = split_heads(self.query_up(query_in), c.num_heads)            # [B, H, N, d_h]
        k_content = split_heads(self.key_up(latent), c.num_heads)                # [B, H, N_k, d_h]
        values = split_heads(self.value_up(latent), c.num_heads)                 # [B, H, N_k, d_v]
        k_rope = rope_key[:, None].expand(-1, c.num_heads, -1, -1)               # [B, H, N_k, d_R] shared
        q = torch.cat((q_content, q_rope), dim=-1)                               # [B, H, N, d_h + d_R]
        k = torch.cat((k_content, k_rope), dim=-1)                               # [B, H, N_k, d_h + d_R]
        heads_out, weights = self_attention(q, k, values, mask, scale=c.softmax_scale)   # [B, H, N, d_v]
        return self.out_proj(merge_heads(heads_out)), weights                    # [B, N, E]

    def absorbed_projections(self) -> AbsorbedProjections:
        """``W_UK`` multiplied into the query projection and ``W_UV`` into the output projection.

        ``q_Cᵀ k_C = (W_UQ c_Q)ᵀ (W_UK c_KV) = ((W_UKᵀ W_UQ) c_Q)ᵀ c_KV`` per head, and
        ``W_O [W_UV c; ...]`` is ``(W_O W_UV)`` applied to the per-head latent mixes ``c``; the products
        are computed here from the current weights (cheap, and never stale after training).

        Returns:
            :class:`AbsorbedProjections` ``(query [H, d_c, d_in], output [E, H·d_c])``.

        Example:
            >>> mla = MultiHeadLatentAttention(MLAConfig(64, 4, kv_lora_rank=16, qk_nope_head_dim=8,
            ...                                          qk_rope_head_dim=4, v_head_dim=8))
            >>> [tuple(w.shape) for w in mla.absorbed_projections()]
            [(4, 16, 64), (64, 64)]
        """
        c = self.config
        w_uq = self.query_up.weight.view(c.num_heads, c.qk_nope_head_dim, -1)             # [H, d_h, d_in]
        w_uk = self.key_up.weight.view(c.num_heads, c.qk_nope_head_dim, c.kv_lora_rank)   # [H, d_h, d_c]
        w_uv = self.value_up.weight.view(c.num_heads, c.v_head_dim, c.kv_lora_rank)       # [H, d_v, d_c]
        w_o = self.out_proj.weight.view(c.hidden_size, c.num_heads, c.v_head_dim)         # [E, H, d_v]
        query = torch.einsum("hkc,hki->hci", w_uk, w_uq)                                   # [H, d_c, d_in]
        output = torch.einsum("ehv,hvc->ehc", w_o, w_uv).reshape(c.hidden_size, -1)       # [E, H·d_c]
        return AbsorbedProjections(query, output)

    def _attend_to_latent(self, query_in: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor,
                          rope_key: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The absorbed form: multi-query attention whose one key is ``[c_KV; k_R]`` and value ``c_KV``."""
        c = self.config
        absorbed = self.absorbed_projections()
        q_latent = torch.einsum("bni,hci->bhnc", query_in, absorbed.query)        # [B, H, N, d_c]
        q = torch.cat((q_latent, q_rope), dim=-1)                                 # [B, H, N, d_c + d_R]
        k = torch.cat((latent, rope_key), dim=-1)[:, None]                        # [B, 1, N_k, d_c + d_R]
        # The scale stays 1/sqrt(d_h + d_R): the scores are the same numbers, computed differently.
        mixed, weights = self_attention(q, k, latent[:, None], mask, scale=c.softmax_scale)   # [B, H, N, d_c]
        out = nn.functional.linear(merge_heads(mixed), absorbed.output, self.out_proj.bias)  # [B, N, E]
        return out, weights
