"""Multi-head attention: several attentions side by side, each in its own subspace.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_O,   head_i = Attention(Q W_Q^i, K W_K^i, V W_V^i)

The H query projections are stored as one ``[E, E]`` linear layer and split into heads
by a reshape; the same for keys and values. With grouped-query attention
(``num_kv_heads < num_heads``) several query heads share one key/value head; with
``num_kv_heads = 1`` it is multi-query attention. A head size other than ``E / H`` (``head_dim``, as
Qwen3 and Gemma 3 have) makes the query projection ``[H·d, E]`` and the output one ``[E, H·d]``; with
``qk_norm`` each head's query and key are RMS-normalised by the projection itself
(:class:`~attn_course.core.qk_norm.HeadNormLinear`).
"""

from __future__ import annotations

import torch
from torch import nn

from attn_course import _validate
from attn_course.core.backends import check_backend_name, choose_attention_backend
from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import to_score_shape
from attn_course.core.qk_norm import HeadNormLinear

__all__ = ["MultiHeadAttention", "split_heads", "merge_heads", "check_model_input"]


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``[B, N, H·d]`` to ``[B, H, N, d]``: reshape to ``[B, N, H, d]``, then swap N and H.

    A direct ``view(B, H, N, d)`` would have the same shape but mix tokens into heads.

    Raises:
        TypeError, ValueError: ``x`` not a 3-D tensor, or a width not divisible by ``num_heads``.
    """
    where = "split_heads"
    _validate.tensor(where, "x", x)
    num_heads = _validate.integer(where, "num_heads", num_heads, minimum=1)
    if x.dim() != 3 or x.shape[-1] % num_heads:
        raise ValueError(
            f"{where}: x must be [B, N, E] with E divisible by num_heads={num_heads}, "
            f"got shape {_validate.shape_str(x)}"
        )
    return _split_heads(x, num_heads)


def _split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """:func:`split_heads` on a checked ``x``: reshape to ``[B, N, H, d]``, then swap N and H."""
    batch, tokens, width = x.shape
    return x.view(batch, tokens, num_heads, width // num_heads).transpose(1, 2)   # [B, H, N, d]


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, d]`` back to ``[B, N, H·d]``, the inverse of :func:`split_heads`.

    Raises:
        TypeError, ValueError: ``x`` not a 4-D tensor.
    """
    _validate.tensor("merge_heads", "x", x)
    if x.dim() != 4:
        raise ValueError(f"merge_heads: x must be [B, H, N, d], got shape {_validate.shape_str(x)}")
    return _merge_heads(x)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """:func:`merge_heads` on a checked ``x``."""
    batch, heads, tokens, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, tokens, heads * head_dim)              # [B, N, H·d]


class MultiHeadAttention(nn.Module):
    """Multi-head attention built on :func:`attn_course.self_attention`, batch first.

    Args:
        embed_dim: model width ``E``.
        num_heads: number of query heads ``H``; must divide ``E`` unless ``head_dim`` is given.
        num_kv_heads: number of key/value heads ``H_kv`` (default ``H``); must divide ``H``.
            ``1`` is multi-query attention, ``1 < H_kv < H`` grouped-query attention.
        head_dim: the head size ``d``; default ``E / H``.
        bias: whether the four projections have biases.
        qk_norm: RMS-normalise each head's query and key before RoPE (Qwen3): ``q_proj`` and ``k_proj``
            are then :class:`~attn_course.core.qk_norm.HeadNormLinear` s.
        qk_norm_eps: those norms' ``eps``.
        dropout: probability of dropping an attention weight while training.
        rope: rotate queries and keys by their positions (chapter 05): a
            :class:`~attn_course.positions.rope.RotaryEmbedding` (or any module with a ``head_dim`` of
            ``d`` and a ``rotate(x, positions) -> x`` on checked inputs); None (default) or False for
            none. Self-attention only.
        attention_backend: which attention computes the heads (:mod:`attn_course.core.backends`):
            ``"eager"`` (the course's own, with weights), ``"sdpa"`` (PyTorch's fused one),
            ``"flash"`` (chapter 07's Triton kernel, registered by ``import attn_course.flash``),
            or ``"auto"`` (default): the kernel on a CUDA GPU in float16/bfloat16 when the call
            asks for no weights, passes no ``mask`` (``is_causal`` is fine), has no dropout and a
            head size it supports, else eager. A backend named here must run: a call it cannot do
            is an error listing why.

    Raises:
        TypeError: non-int sizes, a non-number dropout, a non-bool ``qk_norm``, a ``rope`` that is no
            rotation, or a non-str backend.
        ValueError: ``E`` not divisible by ``H`` (without ``head_dim``), ``H`` not divisible by ``H_kv``,
            sizes below 1, dropout outside ``[0, 1)``, a ``qk_norm_eps`` that is not positive, a
            ``rope.head_dim`` other than ``d``, or a backend that is not registered.

    Example:
        >>> attention = MultiHeadAttention(embed_dim=16, num_heads=4)
        >>> x = torch.randn(2, 5, 16)                                   # [B, N, E]
        >>> output, weights = attention(x, is_causal=True)
        >>> output.shape, weights.shape
        (torch.Size([2, 5, 16]), torch.Size([2, 4, 5, 5]))
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        qk_norm: bool = False,
        qk_norm_eps: float = 1e-6,
        dropout: float = 0.0,
        rope: nn.Module | None = None,
        attention_backend: str = "auto",
    ) -> None:
        super().__init__()
        where = "MultiHeadAttention"
        embed_dim = _validate.integer(where, "embed_dim", embed_dim, minimum=1)
        num_heads = _validate.integer(where, "num_heads", num_heads, minimum=1)
        num_kv_heads = num_heads if num_kv_heads is None else _validate.integer(
            where, "num_kv_heads", num_kv_heads, minimum=1
        )
        if head_dim is not None:
            head_dim = _validate.integer(where, "head_dim", head_dim, minimum=1)
        elif embed_dim % num_heads:
            raise ValueError(
                f"{where}: embed_dim={embed_dim} must be divisible by num_heads={num_heads} "
                f"(each head gets embed_dim / num_heads features)"
            )
        if num_heads % num_kv_heads:
            raise ValueError(
                f"{where}: num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads} "
                f"(each key/value head serves the same number of query heads)"
            )
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads if head_dim is None else head_dim
        self.dropout = _validate.dropout(where, dropout)
        width, kv_width = num_heads * self.head_dim, num_kv_heads * self.head_dim
        if _validate.boolean(where, "qk_norm", qk_norm):
            eps = _validate.positive_finite(where, "qk_norm_eps", qk_norm_eps)
            self.q_proj = HeadNormLinear(embed_dim, num_heads, self.head_dim, bias=bias, eps=eps)
            self.k_proj = HeadNormLinear(embed_dim, num_kv_heads, self.head_dim, bias=bias, eps=eps)
        else:
            self.q_proj = nn.Linear(embed_dim, width, bias=bias)
            self.k_proj = nn.Linear(embed_dim, kv_width, bias=bias)
        self.v_proj = nn.Linear(embed_dim, kv_width, bias=bias)
        self.out_proj = nn.Linear(width, embed_dim, bias=bias)
        self.rope = _rotation(where, rope, self.head_dim, "E / H" if head_dim is None else "head_dim")
        self.attention_backend = check_backend_name(where, attention_backend)

    def extra_repr(self) -> str:
        backend = "" if self.attention_backend == "auto" else f", attention_backend={self.attention_backend!r}"
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}{backend}")

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None, *,
                mask: torch.Tensor | None = None, is_causal: bool = False, kv_cache: KVCache | None = None,
                need_weights: bool = True, positions: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``query`` to ``key``/``value`` (to ``query`` itself when they are None).

        Args:
            query: ``[B, N_q, E]``.
            key, value: ``[B, N_k, E]`` for cross-attention; both None for self-attention.
            mask: boolean (True = may attend) or additive float, ``[N_q, N_k]``, ``[B, N_q, N_k]``
                or ``[B, H, N_q, N_k]`` (any of B, H, N_q may be 1); with a cache ``N_k`` is
                ``kv_cache.attended_length(N_q)``, the keys it returns, the newest last.
            is_causal: add a causal mask; with a cache the new queries are the last positions
                (bottom-right aligned).
            kv_cache: a :class:`~attn_course.core.kv_cache.KVCache` (or a subclass) that stores the
                new keys and values and returns those to attend to (:meth:`~attn_course.core.kv_cache.KVCache.update`).
            need_weights: return the per-head weights (else None).
            positions: with ``rope``, the positions of the new tokens, ``[N_q]`` or ``[B, N_q]``
                (a left-padded batch); default ``0 .. N_q-1``, or where the cache puts them
                (:meth:`~attn_course.core.kv_cache.KVCache.new_positions`).

        Returns:
            ``(output [B, N_q, E], attention_weights [B, H, N_q, N_k] or None)``.

        Raises:
            TypeError, ValueError: inputs of the wrong kind or shape, only one of key and value,
                a mask that does not fit, positions without ``rope`` or for cross-attention, or a
                call that the chosen backend cannot do.

        Example:
            >>> from attn_course.positions.rope import RotaryEmbedding
            >>> attention = MultiHeadAttention(embed_dim=16, num_heads=2, rope=RotaryEmbedding(8))
            >>> x = torch.randn(2, 4, 16)                                      # [B, N, E]
            >>> positions = torch.tensor([[0, 0, 1, 2], [0, 1, 2, 3]])         # sequence 0 left-padded by 1
            >>> output, _ = attention(x, positions=positions)
            >>> output.shape
            torch.Size([2, 4, 16])
        """
        output, weights = self.attend_heads(query, key, value, mask=mask, is_causal=is_causal, kv_cache=kv_cache,
                                            need_weights=need_weights, positions=positions)   # [B, H, N_q, d]
        return self.out_proj(_merge_heads(output)), weights              # [B, N_q, E]

    def attend_heads(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None, *,
                     mask: torch.Tensor | None = None, is_causal: bool = False, kv_cache: KVCache | None = None,
                     need_weights: bool = True, positions: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`forward` up to the heads' outputs, before they are merged and projected by ``out_proj``.

        ``forward(...)`` is ``out_proj(merge_heads(z))`` of this ``z``; a model that needs each head's
        own contribution to the output (chapter 11's circuits) projects each head's slice of ``z``
        by its own columns of ``out_proj.weight``.

        Args:
            query, key, value, mask, is_causal, kv_cache, need_weights, positions: as in :meth:`forward`.

        Returns:
            ``(z [B, H, N_q, d], attention_weights [B, H, N_q, N_k] or None)``.

        Raises:
            TypeError, ValueError: as :meth:`forward`.

        Example:
            >>> attention = MultiHeadAttention(embed_dim=16, num_heads=4)
            >>> x = torch.randn(2, 5, 16)                                   # [B, N, E]
            >>> z, weights = attention.attend_heads(x, is_causal=True)
            >>> z.shape, torch.allclose(attention.out_proj(merge_heads(z)), attention(x, is_causal=True)[0])
            (torch.Size([2, 4, 5, 4]), True)
        """
        key, value, positions = self._check_call(query, key, value, kv_cache, positions)
        rope = self.rope if key is query else None                       # cross-attention is not rotated
        q = _split_heads(self.q_proj(query), self.num_heads)             # [B, H, N_q, d]
        k = _split_heads(self.k_proj(key), self.num_kv_heads)            # [B, H_kv, N_new, d]
        v = _split_heads(self.v_proj(value), self.num_kv_heads)          # [B, H_kv, N_new, d]
        if rope is not None:
            positions = self._new_positions(positions, kv_cache, q)      # [N_q] or [B, N_q]
            q = rope.rotate(q, positions)                                # [B, H, N_q, d]
        mask = self._score_mask(mask, query, kv_cache, k.shape[2])       # checked before the cache changes
        if kv_cache is not None:
            rotate = None if rope is None else rope.rotate
            k, v = kv_cache.update(k, v, positions=positions, rotate=rotate)   # [B, H_kv, N_k, d], rotated
        elif rope is not None:
            k = rope.rotate(k, positions)                                # [B, H_kv, N_k, d]
        return self._attend(q, k, v, mask, is_causal, need_weights)      # [B, H, N_q, d], weights

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                is_causal: bool, need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The heads' attention, by the backend chosen for this call (:mod:`attn_course.core.backends`)."""
        dropout = self.dropout if self.training else 0.0
        backend = choose_attention_backend(self.attention_backend, q, k, mask=mask, need_weights=need_weights,
                                           dropout=dropout, caller="MultiHeadAttention.forward")
        return backend.function(q, k, v, mask, is_causal=is_causal, dropout=dropout, need_weights=need_weights)

    def _check_call(self, query: object, key: object, value: object, kv_cache: object,
                    positions: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(key, value, positions)`` after checking :meth:`forward`'s inputs; ``key is query`` for self-attention."""
        where = "MultiHeadAttention.forward"
        query = check_model_input(self, query, caller=where, name="query")
        if (key is None) != (value is None):
            raise ValueError(f"{where}: give both key and value (cross-attention) or neither (self-attention)")
        key = query if key is None else check_model_input(self, key, caller=where, name="key")
        value = query if value is None else check_model_input(self, value, caller=where, name="value")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(
                f"{where}: key and value must be [B, N_k, E] with query's B, got query "
                f"{_validate.shape_str(query)}, key {_validate.shape_str(key)}, value {_validate.shape_str(value)}"
            )
        if kv_cache is not None and not isinstance(kv_cache, KVCache):
            raise TypeError(f"{where}: kv_cache must be a KVCache, got {type(kv_cache).__name__}")
        if positions is not None:
            positions = self._check_positions(where, positions, query, self_attending=key is query)
        return key, value, positions

    def _check_positions(self, where: str, positions: object, query: torch.Tensor,
                         self_attending: bool) -> torch.Tensor:
        """``positions`` as an integer ``[N_q]`` or ``[B, N_q]`` tensor on the query's device."""
        if self.rope is None:
            raise ValueError(f"{where}: positions only matter with rotary embeddings; build the module with rope=True")
        if not self_attending:
            raise ValueError(f"{where}: positions apply to self-attention; cross-attention is not rotated")
        positions = _validate.integer_tensor(where, "positions", positions)
        batch, tokens = query.shape[:2]
        if positions.shape not in ((tokens,), (batch, tokens)):
            raise ValueError(
                f"{where}: positions must be [N_q] = [{tokens}] or [B, N_q] = [{batch}, {tokens}] for query of "
                f"shape {_validate.shape_str(query)}, got shape {_validate.shape_str(positions)}"
            )
        return positions.to(query.device)

    @staticmethod
    def _new_positions(positions: torch.Tensor | None, kv_cache: KVCache | None, q: torch.Tensor) -> torch.Tensor:
        """The new tokens' RoPE positions: given, else ``0 .. N_q-1``; with a cache, the cache decides."""
        if kv_cache is not None:
            return kv_cache.new_positions(q.shape[2], given=positions, device=q.device)
        return torch.arange(q.shape[2], device=q.device) if positions is None else positions

    def _score_mask(self, mask: torch.Tensor | None, query: torch.Tensor, kv_cache: KVCache | None,
                    new_keys: int) -> torch.Tensor | None:
        """``mask`` as ``[B|1, H|1, N_q|1, N_k]`` over the keys the cache will return (all ``N_new`` without one)."""
        n_k = new_keys if kv_cache is None else kv_cache.attended_length(new_keys)
        return to_score_shape(mask, query.shape[0], self.num_heads, query.shape[1], n_k,
                              caller="MultiHeadAttention.forward")

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """Build a ``MultiHeadAttention`` with the weights of a ``torch.nn.MultiheadAttention``.

        The torch module must be ``batch_first=True``, with equal query/key/value widths and
        without ``add_bias_kv`` or ``add_zero_attn``. Note the mask conventions differ:
        torch's boolean ``attn_mask`` and ``key_padding_mask`` mark *blocked* positions with
        True, ours mark *allowed* ones.

        Raises:
            TypeError: not a ``torch.nn.MultiheadAttention``.
            ValueError: a configuration that has no counterpart here.
        """
        where = "MultiHeadAttention.from_torch"
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"{where}: module must be a torch.nn.MultiheadAttention, got {type(module).__name__}")
        if not module.batch_first:
            raise ValueError(f"{where}: module must be built with batch_first=True")
        if not module._qkv_same_embed_dim:
            raise ValueError(f"{where}: kdim and vdim must equal embed_dim")
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError(f"{where}: add_bias_kv and add_zero_attn are not supported")
        bias = module.in_proj_bias is not None
        ours = cls(module.embed_dim, module.num_heads, bias=bias, dropout=module.dropout)
        ours = ours.to(device=module.in_proj_weight.device, dtype=module.in_proj_weight.dtype)
        with torch.no_grad():
            for projection, weight in zip((ours.q_proj, ours.k_proj, ours.v_proj),
                                          module.in_proj_weight.chunk(3)):
                projection.weight.copy_(weight)
            ours.out_proj.weight.copy_(module.out_proj.weight)
            if bias:
                for projection, b in zip((ours.q_proj, ours.k_proj, ours.v_proj), module.in_proj_bias.chunk(3)):
                    projection.bias.copy_(b)
                ours.out_proj.bias.copy_(module.out_proj.bias)
        return ours.train(module.training)


def check_model_input(attention: MultiHeadAttention, x: object, *, caller: str, name: str = "x") -> torch.Tensor:
    """Check that ``x`` is a ``[B, N, E]`` tensor that ``attention`` can read: its width and dtype.

    Blocks built around a :class:`MultiHeadAttention` call this first, so that a wrong input is
    reported under the block's own name rather than deep inside the attention.

    Args:
        attention: the module that will read ``x``.
        x: the input, ``[B, N, E]`` with ``E = attention.embed_dim``.
        caller: the name that error messages start with (the public function that was called).
        name: the argument's name in error messages.

    Returns:
        ``x``, unchanged.

    Raises:
        TypeError: not a floating tensor, or a dtype other than the module's weights'.
        ValueError: not 3-D, or a last dimension other than ``embed_dim``.
    """
    x = _validate.floating_tensor(caller, name, x)
    parameter = attention.q_proj.weight
    if x.dtype != parameter.dtype:
        raise TypeError(
            f"{caller}: {name} has dtype {x.dtype} but the module's weights are {parameter.dtype}; "
            f"convert one of them (e.g. module.to({x.dtype}))"
        )
    if x.dim() != 3 or x.shape[-1] != attention.embed_dim:
        raise ValueError(
            f"{caller}: {name} must be [B, N, E] with E = embed_dim = {attention.embed_dim}, "
            f"got shape {_validate.shape_str(x)}"
        )
    return x



def _rotation(where: str, rope: object, head_dim: int, size: str) -> nn.Module | None:
    """``rope`` checked: None, or a rotation ``(x [..., N, d], positions) -> x`` for heads of size ``head_dim``."""
    if rope is None or rope is False:
        return None
    if not callable(getattr(rope, "rotate", None)) or not isinstance(getattr(rope, "head_dim", None), int):
        raise TypeError(
            f"{where}: rope must be None or a rotation with rotate(x, positions) and a head_dim, such as "
            f"attn_course.positions.rope.RotaryEmbedding({head_dim}) (the core builds none itself), "
            f"got {type(rope).__name__}"
        )
    if rope.head_dim != head_dim:
        raise ValueError(f"{where}: rope.head_dim={rope.head_dim} must equal {size} = {head_dim}")
    return rope
