"""attention_share and mean_pool: explicit formulas, chapter 08's numbers, and their errors.

strongest_head is tested in test_bert.py, against a search over Hugging Face's attention maps.
"""

from __future__ import annotations

import os

import pytest
import torch

from attn_course.models.bert import attention_share, load_pretrained, mean_pool

pytestmark = pytest.mark.slow

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def random_maps(layers=3, batch=2, heads=4, tokens=6, seed=0, normalised=False):
    generator = torch.Generator().manual_seed(seed)
    maps = [torch.rand(batch, heads, tokens, tokens, generator=generator, dtype=torch.float64) for _ in range(layers)]
    return [m / m.sum(-1, keepdim=True) for m in maps] if normalised else maps


def test_attention_share_is_the_mean_over_queries_of_each_rows_share_on_the_keys():
    maps = random_maps()
    got = attention_share(maps, [0, -1], sequence=1)                                # [L, H]
    assert got.shape == (3, 4)
    for layer in range(3):
        for head in range(4):
            rows = maps[layer][1, head]                                              # [N, N]
            shares = [(rows[i, 0] + rows[i, 5]) / rows[i].sum() for i in range(6)]
            assert got[layer, head].item() == pytest.approx(sum(shares).item() / 6, rel=1e-12)


def test_attention_share_of_weights_is_their_average_on_one_key():
    maps = random_maps(normalised=True)
    assert torch.allclose(attention_share(maps, 2), torch.stack([m[0, :, :, 2].mean(-1) for m in maps]))
    everything = attention_share(maps, list(range(6)))
    assert torch.allclose(everything, torch.ones(3, 4, dtype=torch.float64))


def test_attention_share_gives_zero_for_rows_that_are_all_zero():
    maps = random_maps(layers=1)
    maps[0][0, :, 3] = 0.0                                                           # query 3 attends nothing
    got = attention_share(maps, [1])
    expected = torch.stack([torch.cat([maps[0][0, :, :3, 1] / maps[0][0, :, :3].sum(-1),
                                       torch.zeros(4, 1, dtype=torch.float64),
                                       maps[0][0, :, 4:, 1] / maps[0][0, :, 4:].sum(-1)], dim=1).mean(-1)])
    assert torch.isfinite(got).all() and torch.allclose(got, expected)


def test_attention_share_on_minilm_equals_chapter_08():
    model, tokenizer = load_pretrained()
    with torch.no_grad():
        attentions = model(tokenizer("The bank of the river was muddy.").input_ids).attentions
    stacked = torch.stack([a[0] for a in attentions])                                # [L, H, N, N]
    on_cls, on_sep = attention_share(attentions, [0]), attention_share(attentions, [-1])
    assert torch.allclose(on_cls, stacked[:, :, :, 0].mean(-1), atol=1e-6)
    assert torch.allclose(on_sep, stacked[:, :, :, -1].mean(-1), atol=1e-6)
    assert [round(v, 2) for v in on_cls.mean(-1).tolist()] == [0.28, 0.61, 0.68, 0.56, 0.6, 0.4]
    assert [round(v, 2) for v in on_sep.mean(-1).tolist()] == [0.12, 0.04, 0.01, 0.04, 0.04, 0.04]


@pytest.mark.parametrize(
    "maps, kwargs, error, fragment",
    [
        (torch.rand(2, 1, 4, 5, 5), {}, TypeError, "maps must be a non-empty sequence"),
        ([torch.rand(1, 4, 5, 6)], {}, ValueError, r"maps\[0\] must be \[B, H, N, N\]"),
        ([torch.rand(1, 4, 5, 5), torch.rand(1, 4, 6, 6)], {}, ValueError, r"one shape; maps\[1\]"),
        ([torch.ones(1, 4, 5, 5, dtype=torch.long)], {}, TypeError, "must be a floating-point tensor"),
        ([torch.rand(1, 4, 5, 5)], {"keys": 5}, ValueError, "key 5 is out of range for N=5"),
        ([torch.rand(1, 4, 5, 5)], {"keys": [-6]}, ValueError, "key -6 is out of range"),
        ([torch.rand(1, 4, 5, 5)], {"keys": [0, -5]}, ValueError, "keys name a position twice"),
        ([torch.rand(1, 4, 5, 5)], {"keys": []}, ValueError, "keys must name at least one position"),
        ([torch.rand(1, 4, 5, 5)], {"keys": [0.0]}, TypeError, r"keys\[0\] must be an int"),
        ([torch.rand(1, 4, 5, 5)], {"keys": "0"}, TypeError, "keys must be a sequence of ints"),
        ([torch.rand(1, 4, 5, 5)], {"sequence": 1}, ValueError, "sequence=1 is out of range"),
        ([torch.rand(1, 4, 5, 5)], {"sequence": -1}, ValueError, "sequence must be >= 0"),
    ],
)
def test_attention_share_names_what_is_wrong(maps, kwargs, error, fragment):
    kwargs = {"keys": [0], **kwargs}
    with pytest.raises(error, match=f"^attention_share: .*{fragment}"):
        attention_share(maps, **kwargs)


def test_mean_pool_skips_padding_and_gives_zeros_for_a_sequence_of_only_padding():
    hidden = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4)                  # [B, N, E]
    pooled = mean_pool(hidden, torch.tensor([[1, 1, 0], [0, 0, 0]]))
    assert torch.equal(pooled, torch.stack([hidden[0, :2].mean(0), torch.zeros(4, dtype=torch.float64)]))
    assert torch.equal(mean_pool(hidden), hidden.mean(1))


@pytest.mark.parametrize(
    "hidden, mask, error, fragment",
    [
        (torch.ones(2, 3, 4, dtype=torch.long), None, TypeError, "last_hidden_state must be a floating-point tensor"),
        (torch.ones(2, 3), None, ValueError, "last_hidden_state must have at least 3 dimensions"),
        (torch.ones(2, 3, 4, 5), None, ValueError, r"last_hidden_state must be \[B, N, E\]"),
        (torch.ones(2, 3, 4), [[1, 1, 1]], TypeError, "attention_mask must be a torch.Tensor"),
        (torch.ones(2, 3, 4), torch.ones(2, 4), ValueError, r"attention_mask must be \[B, N\] = \[2, 3\]"),
    ],
)
def test_mean_pool_names_what_is_wrong(hidden, mask, error, fragment):
    with pytest.raises(error, match=f"^mean_pool: {fragment}"):
        mean_pool(hidden, mask)
