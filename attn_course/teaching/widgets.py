"""Interactive widgets for the chapters (ipywidgets 8): the scaling walkthrough and the query explorer.

Every callback updates widget state (values, HTML readouts, a PNG chart), never ``print``s into an ``Output``;
so the widgets work the same in JupyterLab, in a saved notebook, and under plain pytest, where a test can set
``scale_slider.value`` and read ``weights``.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

from attn_course import _validate
from attn_course.data.toy_sentence import ToySentence, bank_sentence
from attn_course.teaching.plots import figure_png, weight_bars

__all__ = ["ScalingWalkthrough", "QueryExplorer", "scaling_walkthrough", "query_explorer"]

SCALING_HINT = (
    "τ is the number the raw scores are divided by (√d_k in the formula). A lower τ "
    "amplifies the differences between the scores (a sharper, more one-hot distribution, "
    "whose gradients vanish); a higher τ smooths them out (towards uniform, where the "
    "query can no longer focus)."
)


def _token_options(tokens: Sequence[str]) -> list[tuple[str, int]]:
    """Selector options ``(label, index)``; repeated tokens get their position."""
    repeated = {token for token in tokens if list(tokens).count(token) > 1}
    return [
        (f"{token} ({index})" if token in repeated else token, index)
        for index, token in enumerate(tokens)
    ]


def _weights_table(tokens: Sequence[str], weights: torch.Tensor) -> str:
    """One row of tokens over one row of weights, shaded by weight."""
    cells_token, cells_weight = [], []
    for token, weight in zip(tokens, weights.tolist()):
        shade = f"background: rgba(31, 119, 180, {min(max(weight, 0.0), 1.0):.3f})"
        cells_token.append(f'<td style="{shade}; padding: 2px 6px">{html.escape(token)}</td>')
        cells_weight.append(f'<td class="weight" style="padding: 2px 6px">{weight:.3f}</td>')
    return (
        '<table class="attention-weights" style="border-collapse: collapse">'
        f"<tr>{''.join(cells_token)}</tr><tr>{''.join(cells_weight)}</tr></table>"
    )


def _bar_chart_png(tokens: Sequence[str], weights: torch.Tensor, highlight: int, title: str) -> bytes:
    figure = Figure(figsize=(7.5, 2.8))
    ax = figure.add_subplot()
    label = None if highlight is None else f'"{tokens[highlight]}" itself (the query)'
    weight_bars(weights, tokens, ax=ax, highlight=highlight, highlight_label=label, title=title)
    figure.tight_layout()
    return figure_png(figure, dpi=80)


class _QueryChart:
    """A widget with a query selector that ends in a chart, which it also offers as ``image/png``: a static
    picture of the widget as it stands, for pages without a widget manager (the course's website, an exported
    notebook). JupyterLab and the other front ends still draw the live widget."""

    @property
    def query_index(self) -> int:
        return self.query_selector.value

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        if data is not None and self.chart.value:
            data["image/png"] = base64.b64encode(self.chart.value).decode("ascii")
        return data


class ScalingWalkthrough(_QueryChart, widgets.VBox):
    """The widget of :func:`scaling_walkthrough`.

    Attributes:
        query_selector: ``ToggleButtons``; its value is the query's index.
        scale_slider: ``FloatLogSlider`` for the temperature τ, from 0.25 to 64.
        readout, weights_table, chart: ``HTML`` with the largest weight and the entropy, ``HTML`` with every
            weight, ``Image`` with the bar chart (PNG).
        raw_scores: ``[N, N]`` unscaled scores ``q · k`` of the sentence.
    """

    def __init__(self, sentence: ToySentence | None = None, *, query: str = "bank", sqrt_d_k: float = 8.0) -> None:
        where = "scaling_walkthrough"
        if sentence is not None and not isinstance(sentence, ToySentence):
            raise TypeError(f"{where}: sentence must be a ToySentence, got {type(sentence).__name__}")
        self.sentence = bank_sentence() if sentence is None else sentence
        if query not in self.sentence.tokens:
            raise ValueError(f"{where}: query must be one of {list(self.sentence.tokens)}, got {query!r}")
        sqrt_d_k = _validate.positive_finite(where, "sqrt_d_k", sqrt_d_k)
        if not 0.25 <= sqrt_d_k <= 64:
            raise ValueError(f"{where}: sqrt_d_k must lie in [0.25, 64], got {sqrt_d_k}")
        self.raw_scores = self.sentence.queries @ self.sentence.keys.T          # [N, N]
        self.natural_sqrt_d_k = math.sqrt(self.sentence.d_k)

        self.query_selector = widgets.ToggleButtons(options=_token_options(self.sentence.tokens),
                                                    value=self.sentence.index(query), description="Query token:",
                                                    style={"button_width": "auto"})
        self.scale_slider = widgets.FloatLogSlider(value=sqrt_d_k, base=2, min=-2, max=6, step=0.25, description="τ",
                                                   readout_format=".3g", continuous_update=True,
                                                   layout=widgets.Layout(width="480px"))
        self.hint = widgets.HTML(f"<i>{SCALING_HINT}</i>")
        self.readout = widgets.HTML()
        self.weights_table = widgets.HTML()
        self.chart = widgets.Image(format="png")
        super().__init__([self.query_selector, self.scale_slider, self.hint, self.readout, self.weights_table,
                          self.chart])
        self.add_class("scaling-walkthrough")
        self.query_selector.observe(self._update, names="value")
        self.scale_slider.observe(self._update, names="value")
        self._update()

    def __repr__(self) -> str:
        token = self.sentence.tokens[self.query_index]
        return f"ScalingWalkthrough(query={token!r}, sqrt_d_k={self.sqrt_d_k:.3g})"

    @property
    def sqrt_d_k(self) -> float:
        return float(self.scale_slider.value)

    @property
    def weights(self) -> torch.Tensor:
        """``[N]``: softmax of the selected query's scores divided by the temperature τ."""
        return torch.softmax(self.raw_scores[self.query_index] / self.sqrt_d_k, dim=-1)

    def _update(self, change: object = None) -> None:
        tokens, weights = self.sentence.tokens, self.weights
        top = int(weights.argmax())
        exact = weights.detach().to(torch.float64)
        entropy = float(-(exact * exact.clamp_min(1e-300).log()).sum())           # nats; 0·log 0 counts as 0
        uniform_entropy = math.log(len(tokens))
        ratio = self.sqrt_d_k / self.natural_sqrt_d_k
        natural = f"√d_k = √{self.sentence.d_k} = {self.natural_sqrt_d_k:.3g}"
        if math.isclose(ratio, 1.0):
            effect = (f"τ = {natural}: what the formula divides by for these {self.sentence.d_k}-wide "
                      "vectors (the toy's scores are written by hand, so nothing makes it the best τ).")
        elif ratio < 1:
            effect = (f"τ = {self.sqrt_d_k:.3g} is {1 / ratio:.3g}× below {natural}: "
                      "score differences are amplified, the softmax sharpens.")
        else:
            effect = (f"τ = {self.sqrt_d_k:.3g} is {ratio:.3g}× above {natural}: "
                      "score differences shrink, the softmax flattens.")
        self.readout.value = (
            f'<b>"{html.escape(tokens[self.query_index])}"</b> attends most to '
            f'<b>"{html.escape(tokens[top])}"</b>: weight <span class="largest-weight">'
            f"{float(weights[top]):.3f}</span>. Entropy "
            f'<span class="entropy">{entropy:.3f}</span> nats '
            f"(one-hot 0, uniform {uniform_entropy:.3f}).<br>{effect}"
        )
        self.weights_table.value = _weights_table(tokens, weights)
        title = f'softmax(q·k / {self.sqrt_d_k:.3g}) for the query "{tokens[self.query_index]}"'
        self.chart.value = _bar_chart_png(tokens, weights, self.query_index, title)


class QueryExplorer(_QueryChart, widgets.VBox):
    """The widget of :func:`query_explorer`: ``query_selector`` (``ToggleButtons``, its value the query's index),
    ``sentence_view`` (``HTML``, the key tokens shaded by weight), ``chart`` (``Image``, PNG) and the
    ``[N_q, N_k]`` ``attention_weights`` shown."""

    def __init__(self, tokens: Sequence[str], attention_weights: torch.Tensor, *,
                 key_tokens: Sequence[str] | None = None, query: int | str = 0, title: str = "attention") -> None:
        where = "query_explorer"
        weights = _validate.matrix(where, "attention_weights", attention_weights)
        key_tokens = tokens if key_tokens is None else key_tokens
        for name, labels, size in (("tokens", tokens, weights.shape[0]),
                                   ("key_tokens", key_tokens, weights.shape[1])):
            _validate.labels(where, name, labels)
            if len(labels) != size:
                raise ValueError(f"{where}: {name} must have {size} entries to match "
                                 f"attention_weights {_validate.shape_str(weights)}, got {len(labels)}")
        if isinstance(query, str):
            if query not in tokens:
                raise ValueError(f"{where}: query must be one of {list(tokens)}, got {query!r}")
            query = list(tokens).index(query)
        query = _validate.integer(where, "query", query, minimum=0)
        if query >= len(tokens):
            raise ValueError(f"{where}: query index must be below {len(tokens)}, got {query}")
        self.tokens, self.key_tokens = list(tokens), list(key_tokens)
        self.attention_weights = weights.detach().float().cpu()
        self.title = title
        self.query_selector = widgets.ToggleButtons(options=_token_options(self.tokens), value=query,
                                                    description="Query token:", style={"button_width": "auto"})
        self.sentence_view = widgets.HTML()
        self.chart = widgets.Image(format="png")
        super().__init__([self.query_selector, self.sentence_view, self.chart])
        self.add_class("query-explorer")
        self.query_selector.observe(self._update, names="value")
        self._update()

    def __repr__(self) -> str:
        return f"QueryExplorer(query={self.tokens[self.query_index]!r}, title={self.title!r})"

    @property
    def weights(self) -> torch.Tensor:
        """``[N_k]``: the selected query's row of the attention map."""
        return self.attention_weights[self.query_index]

    def _update(self, change: object = None) -> None:
        weights = self.weights
        top = int(weights.argmax())
        self.sentence_view.value = (
            f'<b>"{html.escape(self.tokens[self.query_index])}"</b> attends most to '
            f'<b>"{html.escape(self.key_tokens[top])}"</b> '
            f'(<span class="largest-weight">{float(weights[top]):.3f}</span>)'
            + _weights_table(self.key_tokens, weights)
        )
        highlight = self.query_index if self.key_tokens == self.tokens else None
        self.chart.value = _bar_chart_png(self.key_tokens, weights, highlight,
                                          f'{self.title}: query "{self.tokens[self.query_index]}"')


def scaling_walkthrough(sentence: ToySentence | None = None, *, query: str = "bank",
                        sqrt_d_k: float = 8.0) -> ScalingWalkthrough:
    """The interactive scaling walkthrough: pick a query token of "The bank of the river was muddy." and drag the
    temperature τ (what the scores are divided by; √d_k in the formula) to see the softmax sharpen or flatten.

    Args:
        sentence: the toy sentence (default :func:`~attn_course.data.toy_sentence.bank_sentence`).
        query: the token selected at first.
        sqrt_d_k: the temperature τ the slider starts at, in [0.25, 64].

    Returns:
        A :class:`ScalingWalkthrough` widget; display it as the last line of a cell.

    Raises:
        TypeError, ValueError: an unknown query token or an out-of-range temperature.
    """
    return ScalingWalkthrough(sentence, query=query, sqrt_d_k=sqrt_d_k)


def query_explorer(tokens: Sequence[str], attention_weights: torch.Tensor, *, key_tokens: Sequence[str] | None = None,
                   query: int | str = 0, title: str = "attention") -> QueryExplorer:
    """Explore an attention map (the toy one, a real BERT head) one query token at a time: where its attention goes.

    Args:
        tokens: the ``N_q`` query tokens.
        attention_weights: ``[N_q, N_k]``, e.g. from :func:`attn_course.self_attention`.
        key_tokens: the ``N_k`` key tokens; default ``tokens``.
        query: the query selected at first, by index or token.
        title: shown above the chart.

    Returns:
        A :class:`QueryExplorer` widget.

    Raises:
        TypeError, ValueError: a map that is not 2-D or labels that do not match it.
    """
    return QueryExplorer(tokens, attention_weights, key_tokens=key_tokens, query=query, title=title)
