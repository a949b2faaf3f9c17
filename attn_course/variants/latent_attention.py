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

Layout as Hugging Face ``transformers`` 5.24 (``modeling_deepseek_v2.py``) stores it, so that
:func:`from_hugging_face_weights` only has to cut their fused matrices apart:

- ``q_proj`` / ``q_b_proj`` give each head ``[q_C (d_h) | q_R (d_R)]`` one head after another;
  ``kv_a_proj_with_mqa`` gives ``[c_KV before its norm (d_c) | k_R (d_R)]``; ``kv_b_proj`` gives each
  head ``[k_C (d_h) | v (d_v)]``. The two RMSNorms use ``eps = 1e-6`` whatever ``rms_norm_eps`` is
  (Hugging Face builds them without it).
- RoPE pairs *adjacent* features (``interleaved=True``): 5.24 rotates ``(x_0, x_1), (x_2, x_3), ...``
  as complex numbers, in place. DeepSeek's original ``modeling_deepseek.py`` first permutes the
  features to ``[x_0, x_2, ... | x_1, x_3, ...]`` and then rotates the halves: the same pairs, so the
  same scores, but its rotated keys come out in the permuted order.
- YaRN (DeepSeek-V2 §3.1.4 stretches 4K to 128K this way, ``s = 40``): the rotated features are
  multiplied by ``mscale(s, mscale) / mscale(s, mscale_all_dim)`` and the softmax scale by
  ``mscale(s, mscale_all_dim)²``, with ``mscale(s, m) = 0.1·m·ln s + 1`` (the paper's
  ``√t = 0.0707 ln s + 1`` is ``m = 0.707``). Other rotary scalings are refused.

:mod:`attn_course.variants.kv_cache_size` counts what each kind of attention caches per token.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import causal_mask
from attn_course.core.multihead import merge_heads, split_heads
from attn_course.core.norms import RMSNorm
from attn_course.models.llama.config import rope_from_hugging_face, rope_parameters
from attn_course.positions.rope import RotaryEmbedding, YaRNScaling

__all__ = [
    "MLAConfig",
    "MultiHeadLatentAttention",
    "LatentCache",
    "AbsorbedProjections",
    "from_hugging_face_weights",
]

#: The rotary types a DeepSeek-V2 config may name here (``rope_parameters.rope_type``).
ROPE_TYPES = ("default", "yarn")


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
        rope_scaling: None, or a :class:`~attn_course.positions.rope.YaRNScaling` for the rotary features.
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

    @classmethod
    def from_hugging_face(cls, values: Mapping[str, Any] | Any) -> MLAConfig:
        """Read a DeepSeek-V2 ``config.json`` (or a ``transformers`` ``DeepseekV2Config``).

        Args:
            values: the parsed JSON, or a config object with ``to_dict()``. Read: ``hidden_size``,
                ``num_attention_heads``, ``kv_lora_rank``, ``q_lora_rank`` (may be null),
                ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim`` (all required),
                ``attention_bias``, ``num_key_value_heads`` (must equal the heads: MLA has no
                grouping), and the rotary settings, ``rope_parameters`` (transformers 5) or
                ``rope_theta`` + ``rope_scaling``.

        Returns:
            the :class:`MLAConfig`.

        Raises:
            TypeError: ``values`` neither a mapping nor a config object.
            ValueError: a missing field, grouped key/value heads, or a rotary type other than
                ``"default"`` and ``"yarn"``; the field is named.

        Example:
            >>> config = MLAConfig.from_hugging_face({
            ...     "hidden_size": 5120, "num_attention_heads": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
            ...     "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            ...     "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32,
            ...     "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
            ...     "original_max_position_embeddings": 4096}})
            >>> round(config.score_temperature, 4), config.rope_scaling.attention_factor
            (1.5896, 1.0)
        """
        where = "MLAConfig.from_hugging_face"
        values = _validate.config_mapping(where, "values", values)
        required = ("hidden_size", "num_attention_heads", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                    "qk_rope_head_dim", "v_head_dim")
        missing = [name for name in required if name not in values]
        if missing:
            raise ValueError(f"{where}: the config lacks {', '.join(missing)} (is it a DeepSeek-V2 config?)")
        heads = values["num_attention_heads"]
        kv_heads = values.get("num_key_value_heads")
        if kv_heads is not None and kv_heads != heads:
            raise ValueError(f"{where}: num_key_value_heads={kv_heads} differs from num_attention_heads={heads}; "
                             "MLA projects a key and a value for every head from the latent")
        field, parameters, rope_type = rope_parameters(values, where=where)
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"{where}: {field} rope_type={rope_type!r} is not supported; DeepSeek-V2's "
                             f"attention reads {' and '.join(repr(t) for t in ROPE_TYPES)}")
        base, scaling = rope_from_hugging_face(values, source="the DeepSeek-V2 config")
        temperature = 1.0
        mscale_all_dim = parameters.get("mscale_all_dim")
        if rope_type == "yarn" and mscale_all_dim:
            # Hugging Face's yarn_apply_mscale: the softmax scale grows with the context stretch.
            factor = scaling.factor
            temperature = (1.0 if factor <= 1 else 0.1 * mscale_all_dim * math.log(factor) + 1.0) ** 2
        return cls(values["hidden_size"], heads, kv_lora_rank=values["kv_lora_rank"],
                   qk_nope_head_dim=values["qk_nope_head_dim"], qk_rope_head_dim=values["qk_rope_head_dim"],
                   v_head_dim=values["v_head_dim"], q_lora_rank=values["q_lora_rank"], rope_base=base,
                   rope_scaling=scaling, score_temperature=temperature,
                   attention_bias=values.get("attention_bias", False))


class LatentCache:
    """What MLA keeps per token: the latent ``c_KV [B, N, d_c]`` and the rotary key ``k_R [B, N, d_R]``.

    Nothing per head is stored: that is the point of MLA. The two tensors live in a
    :class:`~attn_course.core.kv_cache.KVCache` as one-"head" keys and values (so they grow the same way,
    doubling), and come back without that head axis.

    Args:
        max_length: optional capacity to allocate at the first append.

    Raises:
        TypeError, ValueError: ``max_length`` not a positive int.

    Example:
        >>> cache = LatentCache()
        >>> latent, rope_key = cache.append(torch.zeros(1, 3, 16), torch.zeros(1, 3, 4))
        >>> latent, rope_key = cache.append(torch.ones(1, 1, 16), torch.ones(1, 1, 4))
        >>> len(cache), latent.shape, rope_key.shape, cache.stored_bytes
        (4, torch.Size([1, 4, 16]), torch.Size([1, 4, 4]), 320)
    """

    def __init__(self, max_length: int | None = None) -> None:
        self._store = KVCache(max_length)            # keys: c_KV [B, 1, ·, d_c]; values: k_R [B, 1, ·, d_R]

    def __len__(self) -> int:
        return len(self._store)

    @property
    def latent(self) -> torch.Tensor:
        """The cached ``c_KV``, ``[B, N, d_c]`` (a view)."""
        return self._store.keys[:, 0]

    @property
    def rope_key(self) -> torch.Tensor:
        """The cached rotated ``k_R``, ``[B, N, d_R]`` (a view)."""
        return self._store.values[:, 0]

    @property
    def stored_bytes(self) -> int:
        """Bytes of what the cache holds now (``length`` tokens): ``B · N · (d_c + d_R) · bytes per element``."""
        if len(self) == 0:
            return 0
        return self.latent.nbytes + self.rope_key.nbytes

    @property
    def memory_bytes(self) -> int:
        """Bytes allocated (the capacity, which may exceed what is filled)."""
        return self._store.memory_bytes

    def append(self, latent: torch.Tensor, rope_key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' latents and rotary keys; return everything cached.

        Args:
            latent: ``c_KV [B, N_new, d_c]``.
            rope_key: ``k_R [B, N_new, d_R]``, already rotated to its position.

        Returns:
            ``(latent [B, N, d_c], rope_key [B, N, d_R])`` of every cached token.

        Raises:
            TypeError, ValueError: inputs that are not 3-D floating tensors with the same ``B`` and
                ``N_new`` on one dtype and device, or that do not match what is already cached.
        """
        where = "LatentCache.append"
        latent = _validate.floating_tensor(where, "latent", latent)
        rope_key = _validate.floating_tensor(where, "rope_key", rope_key)
        if latent.dim() != 3 or rope_key.dim() != 3 or latent.shape[:2] != rope_key.shape[:2]:
            raise ValueError(f"{where}: latent must be [B, N_new, d_c] and rope_key [B, N_new, d_R] with the same "
                             f"B and N_new, got {_validate.shape_str(latent)} and {_validate.shape_str(rope_key)}")
        _validate.same_dtype_and_device(where, latent=latent, rope_key=rope_key)
        self._store.append(latent[:, None], rope_key[:, None])           # [B, 1, N_new, ·]
        return self.latent, self.rope_key

    def reset(self) -> None:
        """Forget every cached token."""
        self._store.reset()


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
                absorbed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend causally over the cached tokens and ``x``; append ``x``'s latents to ``cache``.

        Args:
            x: ``[B, N, E]``, the new tokens.
            cache: a :class:`LatentCache` holding the tokens before ``x`` (it is appended to), or None.
            positions: the new tokens' positions for RoPE, ``[N]`` or ``[B, N]``; default
                ``len(cache) .. len(cache) + N - 1``.
            absorbed: run attention against the latent itself, with ``W_UK`` folded into the query
                projection and ``W_UV`` into the output projection (:meth:`absorbed_projections`),
                instead of rebuilding every head's keys and values. Same result, up to rounding.

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


def _expected_hugging_face_shapes(config: MLAConfig) -> dict[str, tuple[int, ...]]:
    c, heads = config, config.num_heads
    query_rows = heads * (c.qk_nope_head_dim + c.qk_rope_head_dim)
    shapes: dict[str, tuple[int, ...]] = {}
    if c.q_lora_rank is None:
        shapes["q_proj.weight"] = (query_rows, c.hidden_size)
    else:
        shapes["q_a_proj.weight"] = (c.q_lora_rank, c.hidden_size)
        if c.attention_bias:
            shapes["q_a_proj.bias"] = (c.q_lora_rank,)
        shapes["q_a_layernorm.weight"] = (c.q_lora_rank,)
        shapes["q_b_proj.weight"] = (query_rows, c.q_lora_rank)
    shapes["kv_a_proj_with_mqa.weight"] = (c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size)
    if c.attention_bias:
        shapes["kv_a_proj_with_mqa.bias"] = (c.kv_lora_rank + c.qk_rope_head_dim,)
    shapes["kv_a_layernorm.weight"] = (c.kv_lora_rank,)
    shapes["kv_b_proj.weight"] = (heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)
    shapes["o_proj.weight"] = (c.hidden_size, heads * c.v_head_dim)
    if c.attention_bias:
        shapes["o_proj.bias"] = (c.hidden_size,)
    return shapes


def from_hugging_face_weights(state: Mapping[str, torch.Tensor], config: MLAConfig, *,
                              prefix: str = "") -> dict[str, torch.Tensor]:
    """Hugging Face ``DeepseekV2Attention`` weights as a :class:`MultiHeadLatentAttention` state dict.

    Every expected name is looked up and its shape checked first, and all problems are listed
    together; then the fused matrices are cut apart: ``q_proj``/``q_b_proj`` per head into
    ``query_up`` (first ``d_h`` rows) and ``query_rope`` (last ``d_R``), ``kv_a_proj_with_mqa`` into
    ``kv_down`` (first ``d_c`` rows) and ``key_rope``, ``kv_b_proj`` per head into ``key_up`` and
    ``value_up``.

    Args:
        state: ``{name: tensor}``, e.g. ``DeepseekV2Attention.state_dict()`` or a whole model's.
        config: the layer's :class:`MLAConfig`.
        prefix: what precedes the attention's names in ``state`` (``"model.layers.0.self_attn."``);
            names outside it are ignored, unknown names inside it are errors.

    Returns:
        ``{our name: tensor}`` for ``MultiHeadLatentAttention(config).load_state_dict``.

    Raises:
        TypeError: ``state`` not a mapping, ``config`` not an :class:`MLAConfig`, ``prefix`` not a str.
        ValueError: missing, unexpected or wrongly shaped weights, all of them named.

    Example:
        >>> config = MLAConfig(8, 2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2)
        >>> theirs = {"q_proj.weight": torch.zeros(8, 8), "kv_a_proj_with_mqa.weight": torch.zeros(6, 8),
        ...           "kv_a_layernorm.weight": torch.ones(4), "kv_b_proj.weight": torch.zeros(8, 4),
        ...           "o_proj.weight": torch.zeros(8, 4)}
        >>> sorted(from_hugging_face_weights(theirs, config))[:3]
        ['key_rope.weight', 'key_up.weight', 'kv_down.weight']
        >>> from_hugging_face_weights({**theirs, "o_proj.weight": torch.zeros(8, 5)}, config)
        Traceback (most recent call last):
        ...
        ValueError: from_hugging_face_weights: ... wrong shape(s): o_proj.weight [8, 5] (expected [8, 4])
    """
    where = "from_hugging_face_weights"
    if not isinstance(state, Mapping):
        raise TypeError(f"{where}: state must be a mapping of names to tensors, got {type(state).__name__}")
    if not isinstance(config, MLAConfig):
        raise TypeError(f"{where}: config must be an MLAConfig, got {type(config).__name__}")
    if not isinstance(prefix, str):
        raise TypeError(f"{where}: prefix must be a str, got {type(prefix).__name__}")
    ours = {name[len(prefix):]: value for name, value in state.items() if name.startswith(prefix)}
    expected = _expected_hugging_face_shapes(config)
    missing = [name for name in expected if name not in ours]
    unexpected = sorted(set(ours) - set(expected))
    wrong = []
    for name, shape in expected.items():
        if name in ours:
            _validate.tensor(where, f"state[{prefix + name!r}]", ours[name])
            if tuple(ours[name].shape) != shape:
                wrong.append(f"{prefix}{name} {list(ours[name].shape)} (expected {list(shape)})")
    problems = []
    if missing:
        problems.append("missing weight(s): " + ", ".join(prefix + name for name in missing))
    if unexpected:
        problems.append("unexpected weight(s): " + ", ".join(prefix + name for name in unexpected))
    if wrong:
        problems.append("wrong shape(s): " + ", ".join(wrong))
    if problems:
        raise ValueError(f"{where}: the weights do not fit this MLAConfig: " + "; ".join(problems))

    c, heads = config, config.num_heads
    weights: dict[str, torch.Tensor] = {}
    if c.q_lora_rank is None:
        query = ours["q_proj.weight"]
    else:
        query = ours["q_b_proj.weight"]
        weights["query_down.weight"] = ours["q_a_proj.weight"]
        if c.attention_bias:
            weights["query_down.bias"] = ours["q_a_proj.bias"]
        weights["query_norm.weight"] = ours["q_a_layernorm.weight"]
    per_head = query.reshape(heads, c.qk_nope_head_dim + c.qk_rope_head_dim, -1)          # [H, d_h + d_R, d_in]
    weights["query_up.weight"] = per_head[:, : c.qk_nope_head_dim].reshape(-1, query.shape[1])
    weights["query_rope.weight"] = per_head[:, c.qk_nope_head_dim:].reshape(-1, query.shape[1])
    down = ours["kv_a_proj_with_mqa.weight"]                                                  # [d_c + d_R, E]
    weights["kv_down.weight"], weights["key_rope.weight"] = down[: c.kv_lora_rank], down[c.kv_lora_rank:]
    if c.attention_bias:
        bias = ours["kv_a_proj_with_mqa.bias"]
        weights["kv_down.bias"], weights["key_rope.bias"] = bias[: c.kv_lora_rank], bias[c.kv_lora_rank:]
    weights["kv_norm.weight"] = ours["kv_a_layernorm.weight"]
    up = ours["kv_b_proj.weight"].reshape(heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
    weights["key_up.weight"] = up[:, : c.qk_nope_head_dim].reshape(-1, c.kv_lora_rank)      # [H·d_h, d_c]
    weights["value_up.weight"] = up[:, c.qk_nope_head_dim:].reshape(-1, c.kv_lora_rank)     # [H·d_v, d_c]
    weights["out_proj.weight"] = ours["o_proj.weight"]
    if c.attention_bias:
        weights["out_proj.bias"] = ours["o_proj.bias"]
    return {name: tensor.clone() for name, tensor in weights.items()}
