"""Which attention computes ``softmax(Q Kᵀ/√d) V`` inside :class:`~attn_course.core.multihead.MultiHeadAttention`.

A small registry, as Hugging Face picks its kernel from ``ALL_ATTENTION_FUNCTIONS``: the core
registers its own eager attention (``"eager"``, :func:`~attn_course.core.attention.eager_attention`)
and PyTorch's fused one
(``"sdpa"``, :func:`sdpa_attention`); a later chapter adds its kernel with
:func:`register_attention_backend` (chapter 07's Triton FlashAttention registers ``"flash"`` when
``attn_course.flash`` is imported), so the core never imports what comes after it.

Every backend takes the heads as the module splits them and returns the heads it computed::

    backend(q [B, H, N_q, d], k [B, H_kv, N_k, d], v [B, H_kv, N_k, d], mask, *,
            is_causal, dropout, need_weights) -> (output [B, H, N_q, d], weights [B, H, N_q, N_k] or None)

``mask`` is None or ``[B|1, H|1, N_q|1, N_k]``, boolean (True = may attend) or additive;
``is_causal`` is the bottom-right causal mask (the new queries are the last of the ``N_k``
positions); ``dropout`` the probability of dropping a weight (0 outside training).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from attn_course.core.attention import eager_attention
from attn_course.core.masks import causal_mask, restrict_mask

__all__ = ["AttentionBackend", "register_attention_backend", "attention_backend", "attention_backends",
           "choose_attention_backend", "check_backend_name", "sdpa_attention"]

#: Extra advice in the error for an unregistered name: the import that registers it.
_REGISTERED_BY = {"flash": "import attn_course.flash"}


class AttentionBackend(NamedTuple):
    """One registered attention.

    Attributes:
        name: the name ``MultiHeadAttention(attention_backend=...)`` selects it by.
        function: ``(q, k, v, mask, *, is_causal, dropout, need_weights) -> (output, weights or None)``.
        blockers: ``(q, k, *, mask, need_weights, dropout) -> list[str]``, what in this call the
            backend cannot do (empty: it can run).
        automatic: ``(q) -> bool``, whether ``"auto"`` prefers it for these queries (when nothing
            blocks it); None: ``"auto"`` never picks it.
    """

    name: str
    function: Callable
    blockers: Callable
    automatic: Callable | None


def _no_blockers(q, k, *, mask, need_weights, dropout) -> list[str]:
    return []


_BACKENDS: dict[str, AttentionBackend] = {}


def register_attention_backend(name: str, function: Callable, *, blockers: Callable | None = None,
                               automatic: Callable | None = None) -> AttentionBackend:
    """Add (or replace) an attention that :class:`~attn_course.core.multihead.MultiHeadAttention` can run.

    Args:
        name: the name to select it by, ``attention_backend=name`` (not ``"auto"``).
        function: ``(q [B, H, N_q, d], k [B, H_kv, N_k, d], v [B, H_kv, N_k, d], mask, *, is_causal,
            dropout, need_weights) -> (output [B, H, N_q, d], weights [B, H, N_q, N_k] or None)``.
        blockers: ``(q, k, *, mask, need_weights, dropout) -> list[str]``, the reasons this call
            cannot run on it (default: none); a forced backend with reasons raises them.
        automatic: ``(q) -> bool``: ``"auto"`` picks this backend for such queries when nothing
            blocks it (default None: only when asked for by name).

    Returns:
        The :class:`AttentionBackend` registered.

    Raises:
        TypeError: a name that is not a str, or arguments that are not callable.
        ValueError: an empty name, or ``"auto"``.

    Example:
        >>> def doubled(q, k, v, mask=None, **kwargs):
        ...     output, weights = eager_attention(q, k, v, mask, **kwargs)
        ...     return 2 * output, weights
        >>> register_attention_backend("doubled", doubled).name
        'doubled'
    """
    where = "register_attention_backend"
    if not isinstance(name, str):
        raise TypeError(f"{where}: name must be a str, got {type(name).__name__}")
    if not name or name == "auto":
        raise ValueError(f"{where}: name must be a non-empty name other than 'auto', got {name!r}")
    for label, value, optional in (("function", function, False), ("blockers", blockers, True),
                                   ("automatic", automatic, True)):
        if not callable(value) and not (optional and value is None):
            raise TypeError(f"{where}: {label} must be callable{' or None' if optional else ''}, "
                            f"got {type(value).__name__}")
    backend = AttentionBackend(name, function, blockers or _no_blockers, automatic)
    _BACKENDS[name] = backend
    return backend


def attention_backends() -> tuple[str, ...]:
    """The registered names, in registration order (``"eager"`` and ``"sdpa"`` first)."""
    return tuple(_BACKENDS)


def attention_backend(name: str) -> AttentionBackend:
    """The backend registered as ``name``.

    Raises:
        TypeError: ``name`` not a str.
        ValueError: nothing registered under that name; the message says how to register it.

    Example:
        >>> attention_backend("eager").function is eager_attention
        True
    """
    if not isinstance(name, str):
        raise TypeError(f"attention_backend: name must be a str, got {type(name).__name__}")
    if name not in _BACKENDS:
        how = _REGISTERED_BY.get(name)
        how = f"{how} registers it" if how else "register it with attn_course.core.backends.register_attention_backend"
        raise ValueError(f"attention_backend: no attention backend {name!r} is registered ({how}); "
                         f"registered: {list(_BACKENDS)}")
    return _BACKENDS[name]


def choose_attention_backend(name: str, q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None,
                             need_weights: bool, dropout: float, caller: str) -> AttentionBackend:
    """The backend that runs this call: ``name``'s, or for ``"auto"`` the first automatic one that can.

    ``"auto"`` takes, in registration order, the first backend whose ``automatic(q)`` holds and which
    nothing in the call blocks (the Triton kernel on a CUDA GPU in half precision, once
    ``attn_course.flash`` is imported), else ``"eager"``. A backend asked for by name must run: what
    blocks it is an error.

    Args:
        name: ``"auto"`` or a registered name.
        q, k: ``[B, H, N_q, d]`` queries and ``[B, H_kv, N_k, d]`` keys of the call.
        mask: the call's own mask (None when it passes only ``is_causal``).
        need_weights, dropout: what the call asks for.
        caller: the name that error messages start with.

    Returns:
        The :class:`AttentionBackend`.

    Raises:
        ValueError: an unregistered name, or a named backend that this call's inputs block.

    Example:
        >>> q = torch.randn(1, 2, 3, 4)
        >>> choose_attention_backend("auto", q, q, mask=None, need_weights=True, dropout=0.0, caller="demo").name
        'eager'
    """
    options = dict(mask=mask, need_weights=need_weights, dropout=dropout)
    if name == "auto":
        for backend in _BACKENDS.values():
            if backend.automatic is not None and backend.automatic(q) and not backend.blockers(q, k, **options):
                return backend
        return _BACKENDS["eager"]
    backend = attention_backend(name)
    blockers = backend.blockers(q, k, **options)
    if blockers:
        raise ValueError(f"{caller}: attention_backend={name!r}, but this call has " + "; ".join(blockers))
    return backend


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                   is_causal: bool = False, dropout: float = 0.0,
                   need_weights: bool = False) -> tuple[torch.Tensor, None]:
    """PyTorch's fused ``F.scaled_dot_product_attention``, grouped-query heads read in place.

    The arguments are :func:`eager_attention`'s; SDPA never forms the weights (``need_weights``
    blocks it). Its own ``is_causal`` aligns the first query with the first key, so the
    bottom-right causal mask is passed as a mask. A query whose every key is masked gets a zero
    output, as from :func:`eager_attention` (SDPA's CPU path zeroes such rows with its
    ``_safe_softmax`` since PyTorch 2.5; earlier releases gave NaN).

    Returns:
        ``(output [B, H, N_q, d], None)``.

    Example:
        >>> q = torch.randn(1, 2, 3, 8)
        >>> torch.allclose(sdpa_attention(q, q, q, is_causal=True)[0], eager_attention(q, q, q, is_causal=True)[0],
        ...                atol=1e-6)
        True
        >>> nothing_allowed = torch.zeros(3, 3, dtype=torch.bool)
        >>> sdpa_attention(q, q, q, nothing_allowed)[0].abs().max().item()
        0.0
    """
    if is_causal:
        mask = restrict_mask(mask, causal_mask(q.shape[2], k.shape[2], device=q.device))   # bottom-right
    if mask is not None and mask.is_floating_point():
        mask = mask.to(q.dtype)
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                            enable_gqa=k.shape[1] != q.shape[1])          # [B, H, N_q, d]
    return output, None


def _sdpa_blockers(q, k, *, mask, need_weights, dropout) -> list[str]:
    return ["need_weights=True (SDPA never forms the weights)"] if need_weights else []


def check_backend_name(where: str, name: object) -> str:
    """``name`` if it is ``"auto"`` or a registered backend's name, else an error that says how to register it."""
    if not isinstance(name, str):
        raise TypeError(f"{where}: attention_backend must be a str ('auto' or one of {list(_BACKENDS)}), "
                        f"got {type(name).__name__}")
    if name != "auto":
        try:
            attention_backend(name)
        except ValueError as error:
            raise ValueError(f"{where}: {str(error).removeprefix('attention_backend: ')}") from None
    return name


register_attention_backend("eager", eager_attention)
register_attention_backend("sdpa", sdpa_attention, blockers=_sdpa_blockers)
