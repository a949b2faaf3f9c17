"""How far back a stack of full and sliding-window layers lets the last token read.

A sliding layer with window ``W`` lets a query see itself and the ``W − 1`` tokens before it; what those
tokens saw in the layer below rides along in their residual stream. Through ``L`` sliding layers the
last token can so draw on ``L · (W − 1)`` tokens back, and one full layer anywhere in the stack on all of
them. :func:`reach_by_depth` computes this from the masks themselves, as reachability: token ``j`` reaches
query ``i`` after layers ``1 .. l`` if a path ``j → … → i`` goes through one allowed key per layer, which
is the boolean product ``M_l · … · M_1`` of the layers' masks.
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.core.masks import causal_mask
from attn_course.variants.layout_cache_size import LAYER_KINDS
from attn_course.variants.masks import sliding_window_mask

__all__ = ["reach_by_depth"]


def reach_by_depth(kinds: list[str], window: int, tokens: int) -> list[int]:
    """For each depth ``l = 1 .. L``: how many tokens before the last one can reach it through layers ``1 .. l``.

    Args:
        kinds: each layer's kind, bottom first: ``"full_attention"`` or ``"sliding_attention"``.
        window: ``W``, the keys a sliding layer's query sees, itself included.
        tokens: ``N``, the length of the sequence (at most 4,096: the masks are ``[N, N]``).

    Returns:
        ``L`` counts, each at most ``N − 1``.

    Raises:
        ValueError: an unknown or linear layer kind, ``window`` or ``tokens`` out of range.

    Example:
        >>> reach_by_depth(["sliding_attention"] * 3, window=4, tokens=32)        # 3 back per layer
        [3, 6, 9]
        >>> reach_by_depth(["sliding_attention", "full_attention", "sliding_attention"], window=4, tokens=32)
        [3, 31, 31]
    """
    where = "reach_by_depth"
    kinds = _validate.sequence(where, "kinds", kinds, of="layer kinds")
    for kind in kinds:
        if kind not in LAYER_KINDS[:2]:
            raise ValueError(f"{where}: kinds must hold 'full_attention' or 'sliding_attention', got {kind!r}")
    window = _validate.integer(where, "window", window, minimum=1)
    tokens = _validate.integer(where, "tokens", tokens, minimum=1)
    if tokens > 4096:
        raise ValueError(f"{where}: tokens must be at most 4096 (the masks are [N, N]), got {tokens}")
    full, sliding = causal_mask(tokens), sliding_window_mask(tokens, window=window)
    reach = torch.eye(tokens, dtype=torch.bool)                       # [N, N]: after no layer, each token itself
    counts = []
    for kind in kinds:
        mask = (full if kind == "full_attention" else sliding).float()
        reach = (mask @ reach.float()) > 0                            # a path through one allowed key more
        counts.append(int(reach[-1].sum()) - 1)                       # the last query's reach, itself excluded
    return counts
