"""Tests for attn_course.teaching.widgets, headless: set widget values, read widget state."""

from __future__ import annotations

import math
import re

import pytest
import torch

from attn_course.data.toy_sentence import bank_sentence
from attn_course.teaching.widgets import query_explorer, scaling_walkthrough

from helpers import close

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SENTENCE = bank_sentence()


def expected_weights(token: str, sqrt_d_k: float) -> torch.Tensor:
    """softmax(q · k / √d_k) for one query, computed here in float64."""
    scores = SENTENCE.queries.double() @ SENTENCE.keys.double().T       # [N, N]
    return torch.softmax(scores[SENTENCE.index(token)] / sqrt_d_k, dim=-1)


def png(image) -> bytes:
    """An ``ipywidgets.Image`` holds its bytes as a memoryview."""
    return bytes(image.value)


def span_number(html: str, css_class: str) -> float:
    match = re.search(rf'<span class="{css_class}">([^<]+)</span>', html)
    assert match, f"no <span class={css_class!r}> in {html!r}"
    return float(match.group(1))


@pytest.fixture(scope="module")
def walkthrough_png_at_8() -> bytes:
    return png(scaling_walkthrough().chart)


# --- scaling_walkthrough --------------------------------------------------------------------


def test_walkthrough_starts_on_bank_at_sqrt_d_k_8():
    w = scaling_walkthrough()
    assert w.query_selector.value == SENTENCE.index("bank")
    assert w.scale_slider.value == 8
    close(w.weights.double(), expected_weights("bank", 8), 1e-6)


def test_walkthrough_readout_shows_the_largest_weight_to_three_decimals():
    w = scaling_walkthrough()
    assert span_number(w.readout.value, "largest-weight") == round(float(w.weights.max()), 3)
    assert '"river"' in w.readout.value                      # bank attends most to river


def test_walkthrough_readout_shows_the_entropy():
    w = scaling_walkthrough()
    p = expected_weights("bank", 8)
    assert span_number(w.readout.value, "entropy") == pytest.approx(
        float(-(p * p.log()).sum()), abs=5e-4
    )


def test_small_sqrt_d_k_makes_the_softmax_one_hot():
    w = scaling_walkthrough()
    readout_at_8 = w.readout.value
    w.scale_slider.value = 0.25
    assert float(w.weights.max()) > 0.99
    close(w.weights.double(), expected_weights("bank", 0.25), 1e-6)
    assert w.readout.value != readout_at_8
    assert span_number(w.readout.value, "entropy") < span_number(readout_at_8, "entropy")
    assert span_number(w.readout.value, "largest-weight") == round(float(w.weights.max()), 3)


def test_large_sqrt_d_k_makes_the_softmax_nearly_uniform():
    w = scaling_walkthrough()
    w.scale_slider.value = 64
    p = w.weights.double()
    entropy = float(-(p * p.log()).sum())
    assert entropy == pytest.approx(math.log(8), abs=0.05)
    assert span_number(w.readout.value, "entropy") == pytest.approx(entropy, abs=5e-4)


def test_selecting_another_query_shows_its_row():
    w = scaling_walkthrough()
    w.query_selector.value = SENTENCE.index("muddy")
    close(w.weights.double(), expected_weights("muddy", 8), 1e-6)
    assert w.readout.value.startswith('<b>"muddy"</b>')
    assert span_number(w.readout.value, "largest-weight") == round(float(w.weights.max()), 3)


def test_chart_is_png_and_changes_when_the_slider_moves(walkthrough_png_at_8):
    w = scaling_walkthrough()
    assert png(w.chart).startswith(PNG_SIGNATURE)
    assert png(w.chart) == walkthrough_png_at_8                  # same state, same picture
    w.scale_slider.value = 1
    assert png(w.chart).startswith(PNG_SIGNATURE)
    assert png(w.chart) != walkthrough_png_at_8


def test_weights_table_lists_every_token_and_weight():
    w = scaling_walkthrough()
    table = w.weights_table.value
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", table)
    tokens, weights = cells[: len(SENTENCE.tokens)], cells[len(SENTENCE.tokens):]
    assert tokens == list(SENTENCE.tokens)
    expected = expected_weights("bank", 8)
    assert [float(text) for text in weights] == [round(float(p), 3) for p in expected]


def test_repr_is_short_and_holds_no_image_bytes():
    text = repr(scaling_walkthrough())
    assert text == "ScalingWalkthrough(query='bank', sqrt_d_k=8)"
    assert "PNG" not in text and len(text) < 100


def test_walkthrough_on_a_narrower_lift_gives_the_same_weights():
    w = scaling_walkthrough(bank_sentence(6), query="river", sqrt_d_k=4)
    close(w.weights.double(), expected_weights("river", 4), 1e-5)


@pytest.mark.parametrize("sqrt_d_k", [0.25, 64])
def test_walkthrough_accepts_the_ends_of_the_slider_range(sqrt_d_k):
    assert scaling_walkthrough(sqrt_d_k=sqrt_d_k).scale_slider.value == sqrt_d_k


@pytest.mark.parametrize("query", ["nope", "Bank", ""])
def test_walkthrough_with_unknown_query_raises_value_error(query):
    with pytest.raises(ValueError, match="scaling_walkthrough: query must be one of"):
        scaling_walkthrough(query=query)


@pytest.mark.parametrize("sqrt_d_k", [0.2, 64.5, 100, 0, -8, math.inf])
def test_walkthrough_with_sqrt_d_k_outside_the_slider_range_raises_value_error(sqrt_d_k):
    with pytest.raises(ValueError, match="scaling_walkthrough: sqrt_d_k"):
        scaling_walkthrough(sqrt_d_k=sqrt_d_k)


def test_walkthrough_rejects_a_non_sentence_and_a_non_number():
    with pytest.raises(TypeError, match="sentence must be a ToySentence"):
        scaling_walkthrough("The bank of the river was muddy.")
    with pytest.raises(TypeError, match="sqrt_d_k"):
        scaling_walkthrough(sqrt_d_k="8")


# --- query_explorer -------------------------------------------------------------------------

TOKENS = ["a", "b", "c"]
MAP = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.1, 0.85, 0.05]])   # rows: queries


def test_explorer_starts_on_the_first_query_and_shows_its_row():
    w = query_explorer(TOKENS, MAP)
    assert w.query_index == 0
    assert torch.equal(w.weights, MAP[0])
    assert span_number(w.sentence_view.value, "largest-weight") == 0.6
    assert png(w.chart).startswith(PNG_SIGNATURE)


def test_explorer_selecting_another_query_shows_that_row():
    w = query_explorer(TOKENS, MAP)
    view, chart = w.sentence_view.value, png(w.chart)
    w.query_selector.value = 2
    assert torch.equal(w.weights, MAP[2])
    assert span_number(w.sentence_view.value, "largest-weight") == 0.85
    assert '<b>"b"</b>' in w.sentence_view.value                 # c attends most to b
    assert w.sentence_view.value != view and png(w.chart) != chart


def test_explorer_chart_names_the_highlighted_bar_in_a_legend(monkeypatch):
    import attn_course.teaching.widgets as widgets

    legends = []

    def recording_weight_bars(*args, **kwargs):
        ax = original(*args, **kwargs)
        legends.append([text.get_text() for text in ax.get_legend().get_texts()])
        return ax

    original = widgets.weight_bars
    monkeypatch.setattr(widgets, "weight_bars", recording_weight_bars)
    w = query_explorer(TOKENS, MAP, query="b")
    w.query_selector.value = 2
    assert legends[0] == ['"b" itself (the query)'] and legends[-1] == ['"c" itself (the query)']


def test_explorer_starts_on_a_query_given_by_token():
    assert torch.equal(query_explorer(TOKENS, MAP, query="b").weights, MAP[1])


def test_explorer_with_separate_key_tokens():
    weights = torch.tensor([[0.25, 0.25, 0.5], [1.0, 0.0, 0.0]])    # [N_q=2, N_k=3]
    w = query_explorer(["x", "y"], weights, key_tokens=TOKENS, query=1)
    assert torch.equal(w.weights, weights[1])
    assert '<b>"a"</b>' in w.sentence_view.value
    assert repr(w) == "QueryExplorer(query='y', title='attention')"


def test_explorer_gives_repeated_tokens_distinct_labels():
    w = query_explorer(["the", "cat", "the"], MAP)
    labels = [label for label, _ in w.query_selector.options]
    assert len(set(labels)) == 3
    w.query_selector.value = 2
    assert torch.equal(w.weights, MAP[2])


@pytest.mark.parametrize(
    ("tokens", "key_tokens"),
    [(["a", "b"], None), (TOKENS, ["x", "y"]), (TOKENS + ["d"], TOKENS)],
    ids=["too-few-tokens", "too-few-key-tokens", "too-many-tokens"],
)
def test_explorer_with_label_size_mismatch_raises_value_error(tokens, key_tokens):
    with pytest.raises(ValueError, match="query_explorer: .*tokens must have 3 entries"):
        query_explorer(tokens, MAP, key_tokens=key_tokens)


def test_explorer_with_one_dimensional_weights_raises_value_error():
    with pytest.raises(ValueError, match="2-D"):
        query_explorer(TOKENS, MAP[0])


def test_explorer_rejects_integer_weights_and_bad_queries():
    with pytest.raises(TypeError, match="attention_weights"):
        query_explorer(TOKENS, torch.eye(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="below 3"):
        query_explorer(TOKENS, MAP, query=3)
    with pytest.raises(ValueError, match="'z'"):
        query_explorer(TOKENS, MAP, query="z")
    with pytest.raises(TypeError, match="query"):
        query_explorer(TOKENS, MAP, query=1.0)
