"""Multi-head attention: several attentions side by side, each in its own subspace.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_O,   head_i = Attention(Q W_Q^i, K W_K^i, V W_V^i)

The H query projections are stored as one ``[E, E]`` linear layer and split into heads
by a reshape; the same for keys and values. With grouped-query attention
(``num_kv_heads < num_heads``) several query heads share one key/value head; with
``num_kv_heads = 1`` it is multi-query attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import causal_mask, restrict_mask, to_score_shape
from attn_course.positions.rope import RotaryEmbedding

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
    batch, tokens, width = x.shape
    return x.view(batch, tokens, num_heads, width // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, d]`` back to ``[B, N, H·d]``, the inverse of :func:`split_heads`.

    Raises:
        TypeError, ValueError: ``x`` not a 4-D tensor.
    """
    _validate.tensor("merge_heads", "x", x)
    if x.dim() != 4:
        raise ValueError(f"merge_heads: x must be [B, H, N, d], got shape {_validate.shape_str(x)}")
    batch, heads, tokens, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, tokens, heads * head_dim)


class MultiHeadAttention(nn.Module):
    """Multi-head attention built on :func:`attn_course.self_attention`, batch first.

    Args:
        embed_dim: model width ``E``.
        num_heads: number of query heads ``H``; must divide ``E``. Head size ``d = E / H``.
        num_kv_heads: number of key/value heads ``H_kv`` (default ``H``); must divide ``H``.
            ``1`` is multi-query attention, ``1 < H_kv < H`` grouped-query attention.
        bias: whether the four projections have biases.
        dropout: probability of dropping an attention weight while training.
        rope: rotate queries and keys by their positions (chapter 05): ``True`` for a
            :class:`~attn_course.positions.rope.RotaryEmbedding` with the defaults, or your own
            instance (its ``head_dim`` must be ``E / H``). Applies to self-attention; with
            a cache, new tokens get the positions after the cached ones (or those passed
            as ``positions`` to :meth:`forward`).
        flash_kernel: compute the attention with the Triton FlashAttention kernel
            (:func:`~attn_course.flash.flash_attention`, chapter 06), which reads grouped-query
            K/V heads in place and, for up to 16 new tokens, decodes by splitting the cache.
            ``None`` (default): on a CUDA GPU, in float16 or bfloat16, when the call asks for no
            weights (``need_weights=False``), passes no ``mask`` (``is_causal`` is fine) and no
            dropout applies, with ``E / H`` in 16, 32, 64, 128. ``True``: under the same
            conditions on any device (on a CPU the kernel runs in Triton's interpreter: slow),
            and an error when a call does not meet them. ``False``: never.

    Raises:
        TypeError: non-int sizes or a non-number dropout.
        ValueError: ``E`` not divisible by ``H``, ``H`` not divisible by ``H_kv``, sizes
            below 1, or dropout outside ``[0, 1)``.

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
        bias: bool = True,
        dropout: float = 0.0,
        rope: bool | RotaryEmbedding = False,
        flash_kernel: bool | None = None,
    ) -> None:
        super().__init__()
        where = "MultiHeadAttention"
        embed_dim = _validate.integer(where, "embed_dim", embed_dim, minimum=1)
        num_heads = _validate.integer(where, "num_heads", num_heads, minimum=1)
        num_kv_heads = num_heads if num_kv_heads is None else _validate.integer(
            where, "num_kv_heads", num_kv_heads, minimum=1
        )
        if embed_dim % num_heads:
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
        self.head_dim = embed_dim // num_heads
        self.dropout = _validate.dropout(where, dropout)
        kv_width = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, kv_width, bias=bias)
        self.v_proj = nn.Linear(embed_dim, kv_width, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        if isinstance(rope, RotaryEmbedding):
            if rope.head_dim != self.head_dim:
                raise ValueError(f"{where}: rope.head_dim={rope.head_dim} must equal E / H = {self.head_dim}")
            self.rope = rope
        elif isinstance(rope, bool):
            if rope and self.head_dim % 2:
                raise ValueError(
                    f"{where}: rope needs an even head size, but embed_dim / num_heads = "
                    f"{embed_dim} / {num_heads} = {self.head_dim}"
                )
            self.rope = RotaryEmbedding(self.head_dim) if rope else None
        else:
            raise TypeError(f"{where}: rope must be a bool or a RotaryEmbedding, got {type(rope).__name__}")
        self.flash_kernel = None if flash_kernel is None else _validate.boolean(where, "flash_kernel", flash_kernel)

    def extra_repr(self) -> str:
        flash = "" if self.flash_kernel is None else f", flash_kernel={self.flash_kernel}"
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}{flash}")

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        kv_cache: KVCache | None = None,
        need_weights: bool = True,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``query`` to ``key``/``value`` (to ``query`` itself when they are None).

        Args:
            query: ``[B, N_q, E]``.
            key, value: ``[B, N_k, E]`` for cross-attention; both None for self-attention.
            mask: boolean (True = may attend) or additive float, one of ``[N_q, N_k]``,
                ``[B, N_q, N_k]`` (``[B, 1, N_k]`` from :func:`~attn_course.core.masks.padding_mask`)
                or ``[B, H, N_q, N_k]`` (any of B, H, N_q may be 1). With a cache, ``N_k``
                counts the keys it returns, ``kv_cache.attended_length(N_q)``: the cached tokens
                and the new ones (a :class:`~attn_course.variants.sliding_window.RollingKVCache` returns
                only those it still holds), the newest last.
            is_causal: add a causal mask; with a cache, the new queries come after the
                cached tokens (bottom-right aligned, so it also fits the keys a rolling cache
                returns; its window is a ``mask``, see :meth:`RollingKVCache.window_mask
                <attn_course.variants.sliding_window.RollingKVCache.window_mask>`).
            kv_cache: a :class:`~attn_course.core.kv_cache.KVCache` (or a subclass); the new keys and
                values are appended to it and the queries attend to the keys it returns. A cache
                with ``positions_in_cache`` (:class:`~attn_course.variants.attention_sinks.SinkKVCache`)
                holds keys before RoPE: the new queries, and the keys it returns, are rotated by
                the positions it assigns inside the cache (StreamingLLM), not by ``positions``.
            need_weights: return the per-head weights (else None).
            positions: with ``rope``, the integer positions of the new tokens, ``[N_q]`` for the
                whole batch or ``[B, N_q]`` one row per sequence (a left-padded batch: each
                sequence's real tokens at ``0, 1, ...``, with ``mask`` hiding the padding). Default
                ``len(kv_cache), len(kv_cache) + 1, ...`` (``0 .. N_q-1`` without a cache). With a
                ``positions_in_cache`` cache only that default is accepted (and then replaced by
                the cache's own positions), so a model that always passes it still works.

        Returns:
            ``(output [B, N_q, E], attention_weights [B, H, N_q, N_k] or None)``.

        Raises:
            TypeError, ValueError: inputs of the wrong kind or shape, only one of key and
                value, a mask that does not fit, or positions that are not ``[N_q]``/``[B, N_q]``
                integers or are given without ``rope`` or for cross-attention (or, with a
                ``positions_in_cache`` cache, other than the default).

        Example:
            >>> attention = MultiHeadAttention(embed_dim=16, num_heads=2, rope=True)
            >>> x = torch.randn(2, 4, 16)                                      # [B, N, E]
            >>> positions = torch.tensor([[0, 0, 1, 2], [0, 1, 2, 3]])         # sequence 0 left-padded by 1
            >>> output, _ = attention(x, positions=positions)
            >>> output.shape
            torch.Size([2, 4, 16])
        """
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
        self_attending = key is query
        if positions is not None:
            positions = self._check_positions(where, positions, query, self_attending)

        mask_given = mask is not None
        q = split_heads(self.q_proj(query), self.num_heads)           # [B, H, N_q, d]
        k = split_heads(self.k_proj(key), self.num_kv_heads)          # [B, H_kv, N_new, d]
        v = split_heads(self.v_proj(value), self.num_kv_heads)        # [B, H_kv, N_new, d]
        in_cache = None       # set when the cache numbers positions itself (attention sinks, chapter 08)
        rotate = self.rope is not None and self_attending
        if rotate and not (kv_cache is not None and kv_cache.positions_in_cache):
            if positions is None:
                start = 0 if kv_cache is None else len(kv_cache)        # new tokens follow the cache
                positions = torch.arange(start, start + q.shape[2], device=q.device)   # [N_q]
            q, k = self.rope(q, positions), self.rope(k, positions)     # positions [N_q] or [B, N_q]
        elif rotate:
            # StreamingLLM: the cache holds un-rotated keys and numbers its tokens 0..N_k-1 itself;
            # rotate the queries now and the keys it returns after the append.
            self._check_default_positions(where, positions, kv_cache, q.shape[2])
            in_cache = kv_cache.cache_positions(q.shape[2], device=q.device)   # [N_q], [N_k]
            q = self.rope(q, in_cache.queries)                                  # [B, H, N_q, d]
        # len(kv_cache) is the next position; the keys attended to may be fewer (a rolling cache).
        n_q, n_k = q.shape[2], k.shape[2] if kv_cache is None else kv_cache.attended_length(k.shape[2])
        # Check the mask before touching the cache, so a rejected call leaves it as it was.
        mask = to_score_shape(mask, query.shape[0], self.num_heads, n_q, n_k, caller=where)  # [B|1, H|1, N_q|1, N_k]
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)                              # [B, H_kv, N_k, d]
            if in_cache is not None:
                k = self.rope(k, in_cache.keys)                         # [B, H_kv, N_k, d], rotated
        if is_causal:
            causal = causal_mask(n_q, n_k, device=query.device)          # queries are the newest
            mask = restrict_mask(mask, causal)

        if self._uses_flash_kernel(where, q, mask_given, need_weights):
            from attn_course.flash.triton_attention import flash_attention

            # The kernel reads key/value head h // G for query head h itself, and is_causal is
            # its bottom-right causal mask (the new queries are the last of the N_k positions).
            output = flash_attention(q, k, v, causal=is_causal)                # [B, H, N_q, d]
            return self.out_proj(merge_heads(output)), None

        # Grouped-query attention: view the H query heads as H_kv groups of G, so that each
        # key/value head broadcasts over its group instead of being copied G times.
        groups = self.num_heads // self.num_kv_heads
        q = q.unflatten(1, (self.num_kv_heads, groups))                  # [B, H_kv, G, N_q, d]
        k, v = k.unsqueeze(2), v.unsqueeze(2)                            # [B, H_kv, 1, N_k, d]
        if mask is not None and mask.dim() == 4:
            mask = _group_mask(mask, self.num_kv_heads, groups)          # [B|1, H_kv|1, G|1, N_q, N_k]
        output, weights = self_attention(q, k, v, mask)                   # [B, H_kv, G, N_q, d]
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, p=self.dropout)                  # as torch: weights as used
            output = weights @ v
        output = output.flatten(1, 2)                                    # [B, H, N_q, d]
        output = self.out_proj(merge_heads(output))                      # [B, N_q, E]
        return output, (weights.flatten(1, 2) if need_weights else None)

    def _uses_flash_kernel(self, where: str, q: torch.Tensor, mask_given: bool, need_weights: bool) -> bool:
        """Whether this call runs :func:`~attn_course.flash.flash_attention` (see ``flash_kernel``)."""
        if self.flash_kernel is False:
            return False
        from attn_course.flash.triton_attention import GPU_DTYPES, INTERPRETER_DTYPES, SUPPORTED_HEAD_DIMS

        dtypes = GPU_DTYPES if q.is_cuda else INTERPRETER_DTYPES
        blockers = [reason for reason, blocked in (
            ("need_weights=True (the kernel never forms the weights)", need_weights),
            ("a mask (only is_causal is supported)", mask_given),
            ("dropout while training", self.training and self.dropout > 0),
            (f"head size E / H = {self.head_dim}, not one of {SUPPORTED_HEAD_DIMS}",
             self.head_dim not in SUPPORTED_HEAD_DIMS),
            (f"dtype {q.dtype}, not one of {[str(d) for d in dtypes]}", q.dtype not in dtypes),
        ) if blocked]
        if self.flash_kernel is None:
            return q.is_cuda and not blockers
        if blockers:
            raise ValueError(f"{where}: flash_kernel=True, but this call has " + "; ".join(blockers))
        return True

    @staticmethod
    def _check_default_positions(where: str, positions: torch.Tensor | None, kv_cache: KVCache,
                                 tokens: int) -> None:
        """With a ``positions_in_cache`` cache, ``positions`` must be None or the default ``len(cache)..``."""
        if positions is None:
            return
        default = torch.arange(len(kv_cache), len(kv_cache) + tokens, device=positions.device)   # [N_q]
        if not bool((positions == default).all()):
            raise ValueError(
                f"{where}: positions cannot be given with {kv_cache!r}, which assigns RoPE positions inside "
                f"the cache (positions_in_cache); leave positions None (only the default "
                f"{len(kv_cache)}..{len(kv_cache) + tokens - 1} is accepted), got {positions.tolist()}"
            )

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


def _group_mask(mask: torch.Tensor, kv_heads: int, groups: int) -> torch.Tensor:
    """``[B, H|1, N_q, N_k]`` to ``[B, H_kv|1, G|1, N_q, N_k]`` matching grouped queries."""
    if mask.shape[1] == 1:
        return mask.unsqueeze(2)
    return mask.unflatten(1, (kv_heads, groups))
