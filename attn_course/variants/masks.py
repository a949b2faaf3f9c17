"""The masks of chapter 09's variants, in the core's convention (boolean, ``True`` = "may attend").

- :func:`sliding_window_mask`: each query sees only its last ``window`` keys (Longformer, Mistral);
- :func:`attention_sink_mask`: a sliding window that keeps the first few tokens too (StreamingLLM);
- :func:`document_mask`: attention only within each document of a packed sequence.

Each is the causal mask of :mod:`attn_course.core.masks` restricted further.
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.core.masks import causal_mask

__all__ = ["sliding_window_mask", "attention_sink_mask", "document_mask"]


def sliding_window_mask(
    n_q: int,
    n_k: int | None = None,
    *,
    window: int,
    offset: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Causal mask that also forgets the distant past: each query sees its last ``window`` keys.

    Query ``i`` (absolute position ``offset + i``) may attend key ``j`` when
    ``offset + i - window < j <= offset + i``. Used by Longformer-style local attention
    and Mistral; memory per query is ``window`` instead of ``N``.

    Args:
        n_q, n_k, offset, device: as in :func:`causal_mask`.
        window: how many keys each query sees, itself included (``>= 1``).

    Returns:
        ``[N_q, N_k]`` boolean tensor.

    Raises:
        TypeError: non-int sizes.
        ValueError: sizes or window below 1.

    Example:
        >>> sliding_window_mask(4, window=2).int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    where = "sliding_window_mask"
    window = _validate.integer(where, "window", window, minimum=1)
    n_q = _validate.integer(where, "n_q", n_q, minimum=1)
    n_k = n_q if n_k is None else _validate.integer(where, "n_k", n_k, minimum=1)
    offset = n_k - n_q if offset is None else _validate.integer(where, "offset", offset)
    causal = causal_mask(n_q, n_k, offset=offset, device=device)
    query_position = torch.arange(n_q, device=device).unsqueeze(1) + offset  # [N_q, 1]
    key_position = torch.arange(n_k, device=device).unsqueeze(0)             # [1, N_k]
    return causal & (key_position > query_position - window)


def attention_sink_mask(
    n_q: int,
    n_k: int | None = None,
    *,
    window: int,
    sinks: int,
    offset: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A sliding window that always keeps the first ``sinks`` tokens too (StreamingLLM's cache).

    Xiao et al. (2023, "Efficient streaming language models with attention sinks") found that
    models put large attention weights on the first few tokens whatever they are, so a window
    that evicts them degrades sharply; keeping them ("sinks") next to the recent window does not.
    Query ``i`` (position ``offset + i``) may attend key ``j`` when ``j <= offset + i`` and either
    ``j < sinks`` or ``j > offset + i - window``.

    Args:
        n_q, n_k, offset, device: as in :func:`causal_mask`.
        window: recent keys each query sees, itself included (``>= 1``).
        sinks: first keys every query also sees (``0 <= sinks <= window``; 0 is a plain window).

    Returns:
        ``[N_q, N_k]`` boolean tensor.

    Raises:
        TypeError: non-int sizes.
        ValueError: sizes or window below 1, ``sinks`` below 0 or above ``window``.

    Example:
        >>> attention_sink_mask(6, window=2, sinks=1).int()
        tensor([[1, 0, 0, 0, 0, 0],
                [1, 1, 0, 0, 0, 0],
                [1, 1, 1, 0, 0, 0],
                [1, 0, 1, 1, 0, 0],
                [1, 0, 0, 1, 1, 0],
                [1, 0, 0, 0, 1, 1]], dtype=torch.int32)
    """
    where = "attention_sink_mask"
    window = _validate.integer(where, "window", window, minimum=1)
    sinks = _validate.integer(where, "sinks", sinks, minimum=0)
    if sinks > window:
        raise ValueError(f"{where}: sinks must be at most window (a cache holds the sinks next to the recent "
                         f"window), got sinks={sinks}, window={window}")
    n_q = _validate.integer(where, "n_q", n_q, minimum=1)
    n_k = n_q if n_k is None else _validate.integer(where, "n_k", n_k, minimum=1)
    recent = sliding_window_mask(n_q, n_k, window=window, offset=offset, device=device)
    causal = causal_mask(n_q, n_k, offset=offset, device=device)
    first = torch.arange(n_k, device=device).unsqueeze(0) < sinks                    # [1, N_k]
    return recent | (causal & first)


def document_mask(document_ids: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    """Attention only within each document of a packed sequence.

    Training packs several short documents into one sequence to waste no padding; a token must
    then not attend to the other documents. ``document_ids[..., i]`` names the document of
    token ``i``; token ``i`` may attend token ``j`` when both belong to the same document (and,
    with ``causal``, ``j <= i``).

    Args:
        document_ids: integer ``[N]`` or ``[B, N]``.
        causal: also hide later tokens.

    Returns:
        ``[N, N]`` or ``[B, N, N]`` boolean (``[B, 1, N, N]`` broadcasts over heads after ``unsqueeze(1)``).

    Raises:
        TypeError: ``document_ids`` not an integer tensor, ``causal`` not a bool.
        ValueError: ``document_ids`` not 1-D or 2-D.

    Example:
        >>> document_mask(torch.tensor([0, 0, 1, 1, 1]), causal=True).int()
        tensor([[1, 0, 0, 0, 0],
                [1, 1, 0, 0, 0],
                [0, 0, 1, 0, 0],
                [0, 0, 1, 1, 0],
                [0, 0, 1, 1, 1]], dtype=torch.int32)
    """
    where = "document_mask"
    document_ids = _validate.integer_tensor(where, "document_ids", document_ids)
    _validate.boolean(where, "causal", causal)
    if document_ids.dim() not in (1, 2) or document_ids.shape[-1] == 0:
        raise ValueError(f"{where}: document_ids must be [N] or [B, N] with N >= 1, got "
                         f"{_validate.shape_str(document_ids)}")
    same = document_ids.unsqueeze(-1) == document_ids.unsqueeze(-2)                 # [..., N, N]
    if causal:
        same = same & causal_mask(document_ids.shape[-1], device=document_ids.device)
    return same
