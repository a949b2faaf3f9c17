"""Reading what the heads compute, through the model's hook points (PyTorch forward hooks, removed afterwards).

- :func:`record` any hook point of every layer (``"pattern"``, ``"z"``, ``"result"``, ``"resid_pre"``, ``"attn_out"``);
- :func:`record_patterns`: every layer's attention weights ``[B, H, N, N]``;
- :func:`record_head_outputs`: every head's output written to the residual stream ``[B, H, N, E]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from attn_course import _validate
from attn_course.models.attention_only import AttentionOnlyTransformer

__all__ = ["HOOK_POINTS", "record", "record_patterns", "record_head_outputs", "check_model", "check_head",
           "hook_point", "hooked"]

HOOK_POINTS = ("resid_pre", "pattern", "z", "result", "attn_out")


def check_model(where: str, model: object) -> AttentionOnlyTransformer:
    """``model`` if it is an :class:`~attn_course.models.attention_only.AttentionOnlyTransformer`, else a TypeError."""
    if not isinstance(model, AttentionOnlyTransformer):
        raise TypeError(f"{where}: model must be an AttentionOnlyTransformer, got {type(model).__name__}")
    return model


def check_head(where: str, model: AttentionOnlyTransformer, layer: object, head: object) -> tuple[int, int]:
    """``(layer, head)`` as ints if ``model`` has that head, else a clear TypeError or ValueError."""
    layer = _validate.integer(where, "layer", layer, minimum=0)
    head = _validate.integer(where, "head", head, minimum=0)
    if layer >= model.config.n_layers or head >= model.config.n_heads:
        raise ValueError(f"{where}: (layer, head) must be in 0 .. {model.config.n_layers - 1} and "
                         f"0 .. {model.config.n_heads - 1}, got ({layer}, {head})")
    return layer, head


def hook_point(where: str, model: AttentionOnlyTransformer, layer: object, name: object) -> nn.Module:
    """The ``nn.Identity`` hook point ``name`` (one of :data:`HOOK_POINTS`) of layer ``layer``."""
    layer = _validate.integer(where, "layer", layer, minimum=0)
    if layer >= model.config.n_layers:
        raise ValueError(f"{where}: layer must be in 0 .. {model.config.n_layers - 1}, got {layer}")
    if not isinstance(name, str) or name not in HOOK_POINTS:
        raise ValueError(f"{where}: name must be one of {HOOK_POINTS}, got {name!r}")
    return getattr(model.layers[layer], f"hook_{name}")


@contextlib.contextmanager
def hooked(hooks: list[tuple[nn.Module, object]]) -> Iterator[None]:
    """Forward hooks ``(module, hook)`` registered inside the block and removed when it ends, even on an error."""
    handles = []
    try:
        for module, hook in hooks:
            handles.append(module.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


def record(model: AttentionOnlyTransformer, tokens: torch.Tensor, name: str = "pattern") -> dict[int, torch.Tensor]:
    """Run ``model`` on ``tokens`` (no gradients) and keep hook point ``name`` of every layer.

    Args:
        model: an :class:`~attn_course.models.attention_only.AttentionOnlyTransformer`.
        tokens: ``[B, N]`` ids.
        name: one of :data:`HOOK_POINTS`: ``"pattern"`` ``[B, H, N, N]``, ``"z"`` ``[B, H, N, d]``,
            ``"result"`` ``[B, H, N, E]``, ``"resid_pre"`` or ``"attn_out"`` ``[B, N, E]``.

    Returns:
        ``{layer: tensor}`` for every layer, detached.

    Raises:
        TypeError: ``model`` not an AttentionOnlyTransformer, ``tokens`` not an integer tensor.
        ValueError: tokens the model cannot read, or an unknown ``name``.

    Example:
        >>> from attn_course.models.attention_only import AttentionOnlyTransformer
        >>> model = AttentionOnlyTransformer(10, n_heads=2, d_model=8, max_len=6)
        >>> record(model, torch.randint(10, (3, 6)), "z")[1].shape
        torch.Size([3, 2, 6, 4])
    """
    where = "record"
    model = check_model(where, model)
    tokens = model.check_tokens(where, tokens)
    points = [hook_point(where, model, layer, name) for layer in range(model.config.n_layers)]
    kept: dict[int, torch.Tensor] = {}

    def keeper(layer: int):
        def hook(module, inputs, output):
            kept[layer] = output.detach().clone()
        return hook

    with hooked([(point, keeper(layer)) for layer, point in enumerate(points)]), torch.no_grad():
        model(tokens)
    return kept


def record_patterns(model: AttentionOnlyTransformer, tokens: torch.Tensor) -> dict[int, torch.Tensor]:
    """Every layer's attention weights on ``tokens``: ``{layer: [B, H, N, N]}`` (see :func:`record`).

    Example:
        >>> from attn_course.models.attention_only import AttentionOnlyTransformer
        >>> model = AttentionOnlyTransformer(10, n_heads=2, d_model=8, max_len=6)
        >>> patterns = record_patterns(model, torch.randint(10, (3, 6)))
        >>> sorted(patterns), patterns[0].shape
        ([0, 1], torch.Size([3, 2, 6, 6]))
    """
    return record(model, tokens, "pattern")


def record_head_outputs(model: AttentionOnlyTransformer, tokens: torch.Tensor) -> dict[int, torch.Tensor]:
    """Every head's output written to the residual stream: ``{layer: [B, H, N, E]}`` (see :func:`record`).

    Summed over heads, plus the output bias if any, it is what the layer adds to the stream.
    """
    return record(model, tokens, "result")
