"""The head view: every attention head of a model in one interactive picture (:func:`head_view`).

The selected head is drawn as two columns of tokens, queries left and keys right, a line from each query to
each key as thick and dark as its weight; hovering (or focusing, or clicking to pin) a query shows its row with
the weights written, a key its column; an overview has one small map per head, a click draws it large.

An `anywidget <https://anywidget.dev>`_ widget whose JavaScript and CSS lie in this package (``js/``): the
browser receives them from the kernel with the weights and fetches nothing. Where no widget manager runs (a
static website, a notebook exported to HTML), the output's ``text/html`` carries the same script, the weights
and a stand-in for the widget model (:meth:`HeadView.static_html`), just as interactive. (JupyterLab removes
scripts from a notebook it does not trust; a sentence says so instead.) Front ends: JupyterLab 4 (tested by
tests/course/test_browser.py) and Notebook 7 (7.6.5, checked by hand) draw it with nothing fetched; anywidget
names VS Code and Colab too, where ``google.colab.output.enable_custom_widget_manager()`` (which anywidget calls)
loads the widget manager from the web, by Colab's design. The traits ``layer``, ``head`` and ``token`` (the
pinned query, ``-1`` for none) are synced both ways.
"""

from __future__ import annotations

import hashlib
import html
import importlib.resources
import json
from collections.abc import Sequence

import anywidget
import torch
import traitlets

from attn_course import _validate

__all__ = ["HeadView", "head_view"]

_SCRIPT = importlib.resources.files("attn_course.teaching").joinpath("js/head_view.js").read_text(encoding="utf-8")
_STYLE = importlib.resources.files("attn_course.teaching").joinpath("js/head_view.css").read_text(encoding="utf-8")
_EXPORT = "export default { render };"
# Beyond these the page gets slow (N^2 lines per head, a thumbnail per head): slice the input.
MAX_TOKENS = 128
MAX_WEIGHTS = 2_000_000
# Weights are sent with 4 decimals (the page shows 3): enough to read, a third of the bytes.
DECIMALS = 4


def _count(number: int, noun: str, plural: str | None = None) -> str:
    """``1 layer``, ``6 layers``, ``10 queries``."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def _as_layers(where: str, attentions: object, sequence: int) -> torch.Tensor:
    """Any supported form of attention maps as one ``[L, H, N_q, N_k]`` float64 tensor."""
    if not isinstance(attentions, torch.Tensor) and hasattr(attentions, "attentions"):
        attentions = attentions.attentions   # a BertOutput, or a Hugging Face ModelOutput
        if attentions is None:
            raise ValueError(f"{where}: the model output has no attentions; "
                             "run the model with output_attentions=True")
    if isinstance(attentions, torch.Tensor):
        maps = _validate.floating_tensor(where, "attentions", attentions)
        if maps.dim() not in (2, 3, 4):
            raise ValueError(f"{where}: attentions must be [N_q, N_k], [H, N_q, N_k] or [L, H, N_q, N_k], "
                             f"got shape {_validate.shape_str(maps)}")
        maps = maps.reshape((1,) * (4 - maps.dim()) + tuple(maps.shape))
    else:
        layers = _validate.sequence(where, "attentions", attentions, of="tensors (one per layer)")
        if not layers:
            raise ValueError(f"{where}: attentions is empty; expected one tensor per layer")
        picked = []
        for index, layer in enumerate(layers):
            layer = _validate.floating_tensor(where, f"attentions[{index}]", layer)
            if layer.dim() == 4:                  # [B, H, N_q, N_k]: one sequence of the batch
                if not 0 <= sequence < layer.shape[0]:
                    raise ValueError(f"{where}: sequence must be in [0, {layer.shape[0]}) for a batch of "
                                     f"{layer.shape[0]}, got {sequence}")
                layer = layer[sequence]
            if layer.dim() != 3:
                raise ValueError(f"{where}: attentions[{index}] must be [B, H, N_q, N_k] or [H, N_q, N_k], "
                                 f"got shape {_validate.shape_str(layer)}")
            if picked and layer.shape != picked[0].shape:
                raise ValueError(f"{where}: attentions[{index}] has shape {_validate.shape_str(layer)}, "
                                 f"but attentions[0] has {_validate.shape_str(picked[0])}")
            picked.append(layer)
        maps = torch.stack(picked)
    maps = maps.detach().to("cpu", torch.float64)
    if not torch.isfinite(maps).all():
        raise ValueError(f"{where}: attentions must be finite, got NaN or inf")
    if maps.min() < -1e-6 or maps.max() > 1 + 1e-4:
        raise ValueError(f"{where}: attentions must be attention weights in [0, 1], got values in "
                         f"[{float(maps.min()):.3g}, {float(maps.max()):.3g}] (pass the softmax, not the scores)")
    return maps


class HeadView(anywidget.AnyWidget):
    """The widget behind :func:`head_view`; its state is plain JSON, set by :func:`head_view`."""

    _esm = _SCRIPT
    _css = _STYLE
    tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)        # [N_q]
    key_tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)    # [N_k]
    weights = traitlets.List().tag(sync=True)                          # [L][H][N_q][N_k]
    layer = traitlets.Int(0).tag(sync=True)
    head = traitlets.Int(0).tag(sync=True)
    token = traitlets.Int(-1).tag(sync=True)                           # pinned query, -1: none
    title = traitlets.Unicode("").tag(sync=True)

    @property
    def num_layers(self) -> int:
        return len(self.weights)

    @property
    def num_heads(self) -> int:
        return len(self.weights[0]) if self.weights else 0

    @traitlets.validate("layer")
    def _check_layer(self, proposal):
        return self._in_range("layer", proposal["value"], self.num_layers)

    @traitlets.validate("head")
    def _check_head(self, proposal):
        return self._in_range("head", proposal["value"], self.num_heads)

    @traitlets.validate("token")
    def _check_token(self, proposal):
        if proposal["value"] == -1:
            return -1
        return self._in_range("token", proposal["value"], len(self.tokens))

    def _in_range(self, name: str, value: int, count: int) -> int:
        if self.weights and not 0 <= value < count:
            raise ValueError(f"HeadView: {name} must be in [0, {count}), got {value}")
        return value

    def weight(self, query: int, key: int, *, layer: int | None = None, head: int | None = None) -> float:
        """The weight the page shows for ``query`` -> ``key`` (default: the selected head)."""
        def index(name: str, value: object, count: int) -> int:
            return self._in_range(name, _validate.integer("HeadView.weight", name, value), count)

        layer = self.layer if layer is None else index("layer", layer, self.num_layers)
        head = self.head if head is None else index("head", head, self.num_heads)
        query, key = index("query", query, len(self.tokens)), index("key", key, len(self.key_tokens))
        return self.weights[layer][head][query][key]

    def state(self) -> dict:
        """What the page needs: tokens, weights and the selection, as JSON-ready values."""
        return {name: getattr(self, name)
                for name in ("tokens", "key_tokens", "weights", "layer", "head", "token", "title")}

    def static_html(self) -> str:
        """The view as one self-contained HTML fragment: the package's script and style, the
        current state, and a stand-in for the widget model. Interactive in any browser, with no
        widget manager, no kernel and no network; this is the output's ``text/html``."""
        # "<" escaped, so that a token such as "</script>" cannot end the script early.
        state = json.dumps(self.state(), separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
        # Named after its content: the same view gives the same HTML, run after run.
        name = "attn-head-view-" + hashlib.sha256(state.encode()).hexdigest()[:12]
        script = _SCRIPT.replace(_EXPORT, "")
        # Shown where the script does not run (JupyterLab strips scripts from the outputs of a
        # notebook it does not trust): a sentence rather than a blank; the script replaces it.
        placeholder = (f"Head view: {_count(self.num_layers, 'layer')} x {_count(self.num_heads, 'head')} over "
                       f"{_count(len(self.tokens), 'token')}. "
                       "It is drawn by a script that has not run here: run the cell, or trust the notebook.")
        return (f'<div id="{name}"><p class="attn-head-view-placeholder">{html.escape(placeholder)}</p></div>\n'
                f'<style>{_STYLE}</style>\n<script>\n(function () {{\n{script}\n'
                f'render({{ model: staticModel({state}), el: document.getElementById("{name}") }});\n}})();\n</script>')

    def __repr__(self) -> str:
        return (f"HeadView({_count(self.num_layers, 'layer')} x {_count(self.num_heads, 'head')}, "
                f"{_count(len(self.tokens), 'query', 'queries')} x {_count(len(self.key_tokens), 'key')}; "
                f"layer {self.layer}, head {self.head})")

    def _repr_mimebundle_(self, **kwargs):
        data, metadata = super()._repr_mimebundle_(**kwargs)
        data["text/html"] = self.static_html()
        return data, metadata


def head_view(attentions: object, tokens: Sequence[str], *, key_tokens: Sequence[str] | None = None, layer: int = 0,
              head: int = 0, sequence: int = 0, title: str = "") -> HeadView:
    """Show every attention head of a model, and one head's weights token by token.

    Args:
        attentions: a sequence of one ``[B, H, N_q, N_k]`` (or ``[H, N_q, N_k]``) tensor per layer
            (``BertModel``'s ``attentions``, Hugging Face's with ``output_attentions=True``, or the model's
            output itself), or one tensor ``[L, H, N_q, N_k]``, ``[H, N_q, N_k]`` or ``[N_q, N_k]``;
            ``N_q, N_k <= 128`` and at most 2,000,000 weights in all (slice longer inputs).
        tokens, key_tokens: the ``N_q`` query tokens; the ``N_k`` key tokens for cross-attention (default
            ``tokens``).
        layer, head: the head drawn large at first.
        sequence: which sequence of a batch (the ``B`` dimension) to show.
        title: a line shown above the view.

    Returns:
        A :class:`HeadView`; display it as the last line of a cell. Its ``layer``, ``head`` and ``token``
        follow the page, and :meth:`HeadView.weight` gives the weight the page shows.

    Raises:
        TypeError: attentions not tensors (or not floating), tokens not strings.
        ValueError: a shape that is none of the above, weights outside [0, 1] or not finite, labels that do
            not match the maps, or a layer, head or sequence out of range.

    Example:
        >>> from attn_course.models.bert import load_pretrained
        >>> model, tokenizer = load_pretrained()
        >>> batch = tokenizer("The bank of the river was muddy.")
        >>> view = head_view(model(batch.input_ids).attentions, batch.tokens[0], layer=0, head=4)
        >>> view.num_layers, view.num_heads
        (6, 12)
    """
    where = "head_view"
    sequence = _validate.integer(where, "sequence", sequence, minimum=0)
    maps = _as_layers(where, attentions, sequence)                     # [L, H, N_q, N_k]
    num_layers, num_heads, num_queries, num_keys = maps.shape
    tokens = _validate.labels(where, "tokens", tokens, expected=num_queries)
    key_tokens = tokens if key_tokens is None else _validate.labels(where, "key_tokens", key_tokens, expected=num_keys)
    if key_tokens is tokens and num_keys != num_queries:
        raise ValueError(f"{where}: the maps have {num_queries} queries but {num_keys} keys; "
                         "pass key_tokens for cross-attention")
    if max(num_queries, num_keys) > MAX_TOKENS or maps.numel() > MAX_WEIGHTS:
        raise ValueError(f"{where}: at most {MAX_TOKENS} tokens and {MAX_WEIGHTS:,} weights, got "
                         f"{num_queries} x {num_keys} tokens and {maps.numel():,} weights; slice the maps first")
    layer, head = _validate.integers(where, minimum=0, layer=layer, head=head)
    if layer >= num_layers or head >= num_heads:
        raise ValueError(f"{where}: layer must be in [0, {num_layers}) and head in [0, {num_heads}), "
                         f"got layer {layer}, head {head}")
    if not isinstance(title, str):
        raise TypeError(f"{where}: title must be a str, got {type(title).__name__}")
    scale = 10 ** DECIMALS
    rounded = (maps * scale).round() / scale
    view = HeadView(tokens=list(tokens), key_tokens=list(key_tokens), weights=rounded.tolist(), title=title)
    view.layer, view.head = layer, head
    return view
