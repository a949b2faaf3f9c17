"""Tests for attn_course.masks: explicit loops, SDPA's conventions, and laws."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_course.attention import self_attention
from attn_course.masks import causal_mask, padding_mask

FAST = settings(max_examples=25, deadline=None)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator)


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


def causal_by_loop(n_q: int, n_k: int, offset: int) -> torch.Tensor:
    """Query i at absolute position offset + i may see key j when j <= offset + i."""
    mask = torch.zeros(n_q, n_k, dtype=torch.bool)
    for i in range(n_q):
        for j in range(n_k):
            mask[i, j] = j <= offset + i
    return mask


def padding_by_loop(lengths: list[int], n: int) -> torch.Tensor:
    mask = torch.zeros(len(lengths), 1, n, dtype=torch.bool)
    for b, length in enumerate(lengths):
        for j in range(n):
            mask[b, 0, j] = j < length
    return mask


# --- causal_mask ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_square_causal_mask_is_lower_triangle(n):
    mask = causal_mask(n)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, torch.ones(n, n).tril().bool())
    assert torch.equal(causal_mask(n, n), mask)


@pytest.mark.parametrize(("n_q", "n_k"), [(1, 1), (1, 5), (2, 5), (3, 4), (4, 4)])
def test_default_offset_aligns_queries_with_the_last_keys(n_q, n_k):
    mask = causal_mask(n_q, n_k)
    assert mask.shape == (n_q, n_k)
    assert torch.equal(mask, causal_by_loop(n_q, n_k, n_k - n_q))
    assert mask[-1].all()                                  # the last query sees every key


@pytest.mark.parametrize(("n_q", "n_k"), [(1, 5), (3, 4), (3, 7)])
def test_default_offset_matches_torch_causal_lower_right(n_q, n_k):
    bias = pytest.importorskip("torch.nn.attention.bias")
    q, k, v = randn(2, n_q, 8, seed=1), randn(2, n_k, 8, seed=2), randn(2, n_k, 8, seed=3)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.causal_lower_right(n_q, n_k))
    close(self_attention(q, k, v, causal_mask(n_q, n_k))[0], expected)


@pytest.mark.parametrize(
    ("n_q", "n_k", "offset"), [(3, 5, 0), (3, 5, 1), (5, 3, 0), (2, 4, -1), (4, 4, 2), (1, 3, 9)]
)
def test_explicit_offset_matches_loop(n_q, n_k, offset):
    assert torch.equal(causal_mask(n_q, n_k, offset=offset), causal_by_loop(n_q, n_k, offset))


@pytest.mark.parametrize(("n_q", "n_k"), [(3, 5), (5, 3), (1, 4), (4, 4)])
def test_offset_zero_matches_sdpa_is_causal(n_q, n_k):
    q, k, v = randn(2, 2, n_q, 8, seed=1), randn(2, 2, n_k, 8, seed=2), randn(2, 2, n_k, 8, seed=3)
    output, _ = self_attention(q, k, v, causal_mask(n_q, n_k, offset=0))
    close(output, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_causal_mask_is_created_on_the_requested_device():
    assert causal_mask(3, device="cpu").device == torch.device("cpu")
    try:
        torch.empty(1, device="meta")
    except (RuntimeError, NotImplementedError):
        pytest.skip("this PyTorch build has no 'meta' device")
    mask = causal_mask(3, 5, device="meta")
    assert mask.device.type == "meta" and mask.shape == (3, 5) and mask.dtype == torch.bool


@FAST
@given(
    n_q=st.integers(1, 6),
    extra=st.integers(0, 4),
    seed=st.integers(0, 2**31 - 1),
    position=st.integers(0, 9),
)
def test_causal_output_ignores_keys_and_values_in_the_future(n_q, extra, seed, position):
    n_k = n_q + extra                          # queries are the last n_q of n_k tokens
    position = position % n_k                  # change every key and value from here on
    q, k, v = randn(2, n_q, 4, seed=seed), randn(2, n_k, 4, seed=seed + 1), randn(2, n_k, 3)
    new_k, new_v = k.clone(), v.clone()
    new_k[:, position:] = randn(2, n_k - position, 4, seed=seed + 2)
    new_v[:, position:] = randn(2, n_k - position, 3, seed=seed + 3)

    mask = causal_mask(n_q, n_k)
    before, _ = self_attention(q, k, v, mask)
    after, _ = self_attention(q, new_k, new_v, mask)
    for i in range(n_q):
        if extra + i < position:               # query i sits before every changed key
            assert torch.equal(before[:, i], after[:, i])
        else:
            assert not torch.equal(before[:, i], after[:, i])


CAUSAL_BAD_ARGUMENTS = [
    pytest.param({"n_q": 2.0}, TypeError, "n_q", id="float-n_q"),
    pytest.param({"n_q": True}, TypeError, "n_q", id="bool-n_q"),
    pytest.param({"n_q": "3"}, TypeError, "n_q", id="string-n_q"),
    pytest.param({"n_q": 0}, ValueError, "n_q", id="zero-n_q"),
    pytest.param({"n_q": -2}, ValueError, "n_q", id="negative-n_q"),
    pytest.param({"n_q": 3, "n_k": 0}, ValueError, "n_k", id="zero-n_k"),
    pytest.param({"n_q": 3, "n_k": 4.5}, TypeError, "n_k", id="float-n_k"),
    pytest.param({"n_q": 3, "n_k": False}, TypeError, "n_k", id="bool-n_k"),
    pytest.param({"n_q": 3, "offset": 1.0}, TypeError, "offset", id="float-offset"),
    pytest.param({"n_q": 3, "offset": True}, TypeError, "offset", id="bool-offset"),
]


@pytest.mark.parametrize(("arguments", "error", "name"), CAUSAL_BAD_ARGUMENTS)
def test_causal_mask_rejects_bad_sizes_naming_the_argument(arguments, error, name):
    with pytest.raises(error, match=rf"causal_mask: {name} must"):
        causal_mask(**arguments)


# --- padding_mask ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lengths", "n"), [([2, 3], 3), ([0, 1, 4], 4), ([5], 5), ([1, 1, 1, 1], 2)]
)
def test_padding_mask_matches_loop(lengths, n):
    mask = padding_mask(lengths, n)
    assert mask.dtype == torch.bool
    assert mask.shape == (len(lengths), 1, n)
    assert torch.equal(mask, padding_by_loop(lengths, n))


def test_padding_mask_accepts_list_tuple_and_tensor_alike():
    expected = padding_by_loop([3, 0, 5], 5)
    assert torch.equal(padding_mask([3, 0, 5], 5), expected)
    assert torch.equal(padding_mask((3, 0, 5), 5), expected)
    assert torch.equal(padding_mask(torch.tensor([3, 0, 5]), 5), expected)
    assert torch.equal(padding_mask(torch.tensor([3, 0, 5], dtype=torch.int32), 5), expected)


def test_padding_mask_in_self_attention_matches_sdpa_with_the_same_mask():
    lengths = [4, 2, 6]
    q, k, v = randn(3, 5, 8, seed=1), randn(3, 6, 8, seed=2), randn(3, 6, 4, seed=3)
    mask = padding_mask(lengths, 6)                                  # [B, 1, N_k]
    output, weights = self_attention(q, k, v, mask)
    close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    for b, length in enumerate(lengths):
        assert torch.equal(weights[b, :, length:], torch.zeros(5, 6 - length))


def test_padding_mask_unsqueezed_works_per_head():
    lengths = torch.tensor([3, 5])
    q, k, v = randn(2, 4, 5, 8, seed=1), randn(2, 4, 5, 8, seed=2), randn(2, 4, 5, 8, seed=3)
    mask = padding_mask(lengths, 5).unsqueeze(1)                     # [B, 1, 1, N_k]
    output, _ = self_attention(q, k, v, mask)
    close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_padding_combined_with_causal_mask_matches_sdpa():
    q, k, v = randn(2, 5, 8, seed=1), randn(2, 5, 8, seed=2), randn(2, 5, 8, seed=3)
    mask = causal_mask(5) & padding_mask([3, 5], 5)                  # [B, N, N]
    output, _ = self_attention(q, k, v, mask)
    close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_zero_length_sequence_gets_zero_output():
    q, k, v = randn(2, 3, 4, seed=1), randn(2, 3, 4, seed=2), randn(2, 3, 4, seed=3)
    output, weights = self_attention(q, k, v, padding_mask([0, 3], 3))
    assert torch.equal(output[0], torch.zeros(3, 4))
    assert torch.equal(weights[0], torch.zeros(3, 3))
    assert not output.isnan().any()


@FAST
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    n_q=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_padded_keys_get_zero_weight_and_do_not_change_the_output(lengths, n_q, seed):
    n = max(lengths) + 1                                   # at least one padded key
    batch = len(lengths)
    q, k, v = randn(batch, n_q, 4, seed=seed), randn(batch, n, 4, seed=seed + 1), randn(batch, n, 3)
    mask = padding_mask(lengths, n)
    output, weights = self_attention(q, k, v, mask)

    new_k, new_v = k.clone(), v.clone()
    for b, length in enumerate(lengths):
        assert torch.equal(weights[b, :, length:], torch.zeros(n_q, n - length))
        close(weights[b].sum(dim=-1), torch.ones(n_q))
        new_k[b, length:] = 1e3                            # garbage in the padding
        new_v[b, length:] = -1e3
    assert torch.equal(self_attention(q, new_k, new_v, mask)[0], output)


PADDING_BAD_ARGUMENTS = [
    pytest.param([1.0, 2.0], 3, TypeError, "lengths", id="float-list"),
    pytest.param(torch.tensor([1.0, 2.0]), 3, TypeError, "lengths", id="float-tensor"),
    pytest.param(torch.tensor([True, False]), 3, TypeError, "lengths", id="bool-tensor"),
    pytest.param([True, 2], 3, TypeError, "lengths", id="bool-in-list"),
    pytest.param(torch.tensor([[1, 2]]), 3, ValueError, "1-D", id="two-dimensional"),
    pytest.param(torch.tensor(2), 3, ValueError, "1-D", id="zero-dimensional"),
    pytest.param([1, 4], 3, ValueError, "0..n=3", id="length-above-n"),
    pytest.param([1, -1], 3, ValueError, "0..n=3", id="negative-length"),
    pytest.param([1, 2], 0, ValueError, "n must be >= 1", id="n-zero"),
    pytest.param([1, 2], 3.0, TypeError, "n must be an int", id="float-n"),
    pytest.param("12", 3, TypeError, "lengths", id="string-lengths"),
    pytest.param(["1", "2"], 3, TypeError, "lengths", id="list-of-strings"),
    pytest.param(3, 3, TypeError, "lengths", id="bare-int"),
]


@pytest.mark.parametrize(("lengths", "n", "error", "fragment"), PADDING_BAD_ARGUMENTS)
def test_padding_mask_rejects_bad_arguments(lengths, n, error, fragment):
    with pytest.raises(error) as raised:
        padding_mask(lengths, n)
    assert str(raised.value).startswith("padding_mask:")
    assert fragment in str(raised.value)
