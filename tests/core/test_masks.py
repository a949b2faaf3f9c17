"""Tests for attn_course.core.masks: explicit loops, SDPA's conventions, and laws."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attn_course.core.attention import self_attention
from attn_course.core.masks import (
    causal_mask,
    combine_masks,
    key_padding_to_boolean,
    padding_mask,
    restrict_mask,
    to_additive,
    to_boolean,
    to_score_shape,
)
from attn_course.variants.masks import sliding_window_mask

from helpers import FAST, close

TOL = 1e-6   # float32 masks tests: tighter than the shared default


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator)


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
    close(self_attention(q, k, v, causal_mask(n_q, n_k))[0], expected, tol=TOL)


@pytest.mark.parametrize(
    ("n_q", "n_k", "offset"), [(3, 5, 0), (3, 5, 1), (5, 3, 0), (2, 4, -1), (4, 4, 2), (1, 3, 9)]
)
def test_explicit_offset_matches_loop(n_q, n_k, offset):
    assert torch.equal(causal_mask(n_q, n_k, offset=offset), causal_by_loop(n_q, n_k, offset))


@pytest.mark.parametrize(("n_q", "n_k"), [(3, 5), (5, 3), (1, 4), (4, 4)])
def test_offset_zero_matches_sdpa_is_causal(n_q, n_k):
    q, k, v = randn(2, 2, n_q, 8, seed=1), randn(2, 2, n_k, 8, seed=2), randn(2, 2, n_k, 8, seed=3)
    output, _ = self_attention(q, k, v, causal_mask(n_q, n_k, offset=0))
    close(output, F.scaled_dot_product_attention(q, k, v, is_causal=True), tol=TOL)


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
    close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), tol=TOL)
    for b, length in enumerate(lengths):
        assert torch.equal(weights[b, :, length:], torch.zeros(5, 6 - length))


def test_padding_mask_unsqueezed_works_per_head():
    lengths = torch.tensor([3, 5])
    q, k, v = randn(2, 4, 5, 8, seed=1), randn(2, 4, 5, 8, seed=2), randn(2, 4, 5, 8, seed=3)
    mask = padding_mask(lengths, 5).unsqueeze(1)                     # [B, 1, 1, N_k]
    output, _ = self_attention(q, k, v, mask)
    close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), tol=TOL)


def test_padding_combined_with_causal_mask_matches_sdpa():
    q, k, v = randn(2, 5, 8, seed=1), randn(2, 5, 8, seed=2), randn(2, 5, 8, seed=3)
    mask = causal_mask(5) & padding_mask([3, 5], 5)                  # [B, N, N]
    output, _ = self_attention(q, k, v, mask)
    close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), tol=TOL)


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
        close(weights[b].sum(dim=-1), torch.ones(n_q), tol=TOL)
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


# --- sliding_window_mask --------------------------------------------------------------------


def sliding_window_by_loop(n_q: int, n_k: int, window: int, offset: int) -> torch.Tensor:
    """Query i at absolute position offset + i sees key j when offset + i - window < j <= offset + i."""
    mask = torch.zeros(n_q, n_k, dtype=torch.bool)
    for i in range(n_q):
        for j in range(n_k):
            mask[i, j] = offset + i - window < j <= offset + i
    return mask


@pytest.mark.parametrize(
    ("n_q", "n_k", "window", "offset"),
    [(4, 4, 2, 0), (6, 6, 3, 0), (5, 5, 1, 0), (3, 7, 2, 4), (3, 7, 3, 1), (4, 2, 2, 0),
     (2, 6, 4, -1), (1, 9, 3, 8), (3, 5, 2, 9)],
)
def test_sliding_window_mask_matches_loop(n_q, n_k, window, offset):
    mask = sliding_window_mask(n_q, n_k, window=window, offset=offset)
    assert mask.dtype == torch.bool and mask.shape == (n_q, n_k)
    assert torch.equal(mask, sliding_window_by_loop(n_q, n_k, window, offset))


@pytest.mark.parametrize(("n_q", "n_k", "window"), [(4, 4, 2), (1, 1, 1), (3, 7, 2), (2, 5, 5), (5, 5, 3)])
def test_sliding_window_default_offset_aligns_queries_with_the_last_keys(n_q, n_k, window):
    expected = sliding_window_by_loop(n_q, n_k, window, n_k - n_q)
    assert torch.equal(sliding_window_mask(n_q, n_k, window=window), expected)
    if n_q == n_k:
        assert torch.equal(sliding_window_mask(n_q, window=window), expected)


@pytest.mark.parametrize(("n_q", "n_k", "offset"), [(5, 5, None), (3, 6, None), (3, 6, 1), (4, 4, 2)])
@pytest.mark.parametrize("extra", [0, 1, 10])
def test_window_at_least_the_key_count_equals_the_causal_mask(n_q, n_k, offset, extra):
    # Positions reach at most n_k - 1 + offset's excess; a window of n_k + max(offset, 0) + extra covers them.
    window = n_k + max(offset or 0, 0) + extra
    assert torch.equal(sliding_window_mask(n_q, n_k, window=window, offset=offset),
                       causal_mask(n_q, n_k, offset=offset))


@pytest.mark.parametrize("n", [1, 4, 6])
def test_window_of_one_lets_each_query_see_only_itself(n):
    assert torch.equal(sliding_window_mask(n, window=1), torch.eye(n, dtype=torch.bool))


@FAST
@given(
    n=st.integers(2, 7),
    window=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_sliding_window_output_ignores_keys_outside_the_window(n, window, seed):
    q, k, v = randn(2, n, 4, seed=seed), randn(2, n, 4, seed=seed + 1), randn(2, n, 3, seed=seed + 2)
    mask = sliding_window_mask(n, window=window)
    output, _ = self_attention(q, k, v, mask)
    close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), tol=TOL)
    last = n - 1                                 # the last query: change every key it may not see
    new_k, new_v = k.clone(), v.clone()
    new_k[:, : max(last - window + 1, 0)] = 1e3
    new_v[:, : max(last - window + 1, 0)] = -1e3
    assert torch.equal(self_attention(q, new_k, new_v, mask)[0][:, last], output[:, last])


def test_sliding_window_mask_is_created_on_the_requested_device():
    try:
        torch.empty(1, device="meta")
    except (RuntimeError, NotImplementedError):
        pytest.skip("this PyTorch build has no 'meta' device")
    mask = sliding_window_mask(3, 5, window=2, device="meta")
    assert mask.device.type == "meta" and mask.shape == (3, 5) and mask.dtype == torch.bool


SLIDING_BAD_WINDOWS = [
    pytest.param(0, ValueError, id="zero"),
    pytest.param(-2, ValueError, id="negative"),
    pytest.param(2.0, TypeError, id="float"),
    pytest.param(True, TypeError, id="bool"),
    pytest.param(None, TypeError, id="none"),
]


@pytest.mark.parametrize(("window", "error"), SLIDING_BAD_WINDOWS)
def test_sliding_window_mask_rejects_bad_windows_naming_the_argument(window, error):
    with pytest.raises(error, match=r"^sliding_window_mask: window must"):
        sliding_window_mask(4, window=window)


@pytest.mark.parametrize(("arguments", "error"), [
    pytest.param({"n_q": 0}, ValueError, id="zero-n_q"),
    pytest.param({"n_q": 3, "n_k": 2.0}, TypeError, id="float-n_k"),
    pytest.param({"n_q": 3, "offset": 1.5}, TypeError, id="float-offset"),
])
def test_sliding_window_mask_size_errors_name_sliding_window_mask(arguments, error):
    with pytest.raises(error, match=r"^sliding_window_mask: (n_q|n_k|offset) must"):
        sliding_window_mask(**arguments, window=2)


# --- combine_masks --------------------------------------------------------------------------


def test_combine_masks_is_logical_and_with_broadcasting():
    causal = causal_mask(4)                                          # [N, N]
    padding = padding_mask([4, 2, 3], 4)                             # [B, 1, N]
    combined = combine_masks(causal, padding)
    assert combined.dtype == torch.bool and combined.shape == (3, 4, 4)
    for b in range(3):
        for i in range(4):
            for j in range(4):
                assert combined[b, i, j] == (bool(causal[i, j]) and bool(padding[b, 0, j]))


def test_combine_masks_of_three_matches_loop():
    window = sliding_window_mask(5, window=2)                        # [N, N]
    padding = padding_mask([5, 3], 5)                                # [B, 1, N]
    per_head = torch.tensor([[True, False, True], [False, True, True]]).view(2, 3, 1, 1)   # [B, H, 1, 1]
    combined = combine_masks(window, padding.unsqueeze(1), per_head)
    assert combined.shape == (2, 3, 5, 5)
    for b in range(2):
        for h in range(3):
            for i in range(5):
                for j in range(5):
                    expected = bool(window[i, j]) and bool(padding[b, 0, j]) and bool(per_head[b, h, 0, 0])
                    assert combined[b, h, i, j] == expected


def test_combine_masks_skips_none():
    mask = causal_mask(3)
    assert torch.equal(combine_masks(None, mask, None), mask)
    padding = padding_mask([1, 3], 3)
    assert torch.equal(combine_masks(mask, None, padding), combine_masks(mask, padding))


def test_combine_masks_of_nothing_is_none():
    assert combine_masks() is None
    assert combine_masks(None) is None
    assert combine_masks(None, None) is None


def test_combined_mask_in_attention_matches_sdpa():
    q, k, v = randn(2, 5, 8, seed=1), randn(2, 5, 8, seed=2), randn(2, 5, 4, seed=3)
    mask = combine_masks(sliding_window_mask(5, window=3), padding_mask([5, 2], 5))
    close(self_attention(q, k, v, mask)[0], F.scaled_dot_product_attention(q, k, v, attn_mask=mask), tol=TOL)


COMBINE_BAD_MASKS = [
    pytest.param((causal_mask(3), torch.zeros(3, 3)), TypeError, "masks[1] must be boolean", id="float-mask"),
    pytest.param((torch.ones(3, 3, dtype=torch.long),), TypeError, "masks[0] must be boolean", id="int-mask"),
    pytest.param((causal_mask(3), [[True] * 3] * 3), TypeError, "masks[1] must be a torch.Tensor", id="list"),
    pytest.param((causal_mask(3), causal_mask(4)), ValueError, "broadcast", id="3x3-with-4x4"),
    pytest.param((causal_mask(3), padding_mask([1, 2], 4)), ValueError, "broadcast", id="padding-too-long"),
]


@pytest.mark.parametrize(("masks", "error", "fragment"), COMBINE_BAD_MASKS)
def test_combine_masks_rejects_bad_masks(masks, error, fragment):
    with pytest.raises(error) as raised:
        combine_masks(*masks)
    assert str(raised.value).startswith("combine_masks:")
    assert fragment in str(raised.value)


# --- to_additive / to_boolean ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_to_additive_gives_zero_where_allowed_and_minus_inf_elsewhere(dtype):
    allowed = padding_mask([3, 1], 4) & causal_mask(4)               # [B, N, N]
    additive = to_additive(allowed, dtype=dtype)
    assert additive.dtype == dtype and additive.shape == allowed.shape
    for index in torch.cartesian_prod(*(torch.arange(size) for size in allowed.shape)).tolist():
        value = additive[tuple(index)].item()
        assert value == (0.0 if allowed[tuple(index)] else float("-inf"))


def test_to_additive_defaults_to_float32():
    assert to_additive(causal_mask(3)).dtype == torch.float32


def test_additive_mask_gives_the_same_attention_as_the_boolean_one():
    q, k, v = randn(2, 3, 5, 8, seed=1), randn(2, 3, 7, 8, seed=2), randn(2, 3, 7, 4, seed=3)
    allowed = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(4)) < 0.6
    allowed[..., 0] = True
    output, weights = self_attention(q, k, v, to_additive(allowed))
    expected, expected_weights = self_attention(q, k, v, allowed)
    close(output, expected, tol=TOL)
    close(weights, expected_weights, tol=TOL)
    close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), tol=TOL)
    close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=to_additive(allowed)), tol=TOL)


def test_additive_mask_with_a_fully_masked_row_gives_zeros_like_the_boolean_one():
    q, k, v = randn(2, 4, 8, seed=1), randn(2, 6, 8, seed=2), randn(2, 6, 3, seed=3)
    allowed = padding_mask([0, 4], 6)                                # batch 0 sees nothing
    output, weights = self_attention(q, k, v, to_additive(allowed))
    assert torch.equal(output[0], torch.zeros(4, 3)) and torch.equal(weights[0], torch.zeros(4, 6))
    close(output, self_attention(q, k, v, allowed)[0], tol=TOL)


@FAST
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    p=st.sampled_from([0.0, 0.5, 1.0]),
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.float64]),
)
def test_to_boolean_inverts_to_additive(shape, p, seed, dtype):
    generator = torch.Generator().manual_seed(seed)
    allowed = torch.rand(*shape, generator=generator) < p
    round_trip = to_boolean(to_additive(allowed, dtype=dtype))
    assert round_trip.dtype == torch.bool
    assert torch.equal(round_trip, allowed)


def test_to_boolean_treats_finite_negative_values_as_allowed():
    additive = torch.tensor([0.0, -1.0, -1e9, float("-inf"), 2.5, -torch.finfo(torch.float32).max])
    expected = torch.tensor([True, True, True, False, True, True])
    assert torch.equal(to_boolean(additive), expected)
    # The documented way to count large penalties as blocked.
    assert torch.equal(additive > -1e4, torch.tensor([True, True, False, False, True, False]))


def test_to_boolean_of_half_precision_minus_inf():
    additive = torch.tensor([[0.0, float("-inf")], [-60000.0, 0.0]], dtype=torch.float16)
    assert torch.equal(to_boolean(additive), torch.tensor([[True, False], [True, True]]))


@pytest.mark.parametrize(("mask", "dtype", "error", "fragment"), [
    pytest.param(torch.zeros(3, 3), torch.float32, TypeError, "mask must be boolean", id="float-mask"),
    pytest.param(torch.ones(3, 3, dtype=torch.long), torch.float32, TypeError, "mask must be boolean",
                 id="int-mask"),
    pytest.param([[True]], torch.float32, TypeError, "mask must be a torch.Tensor", id="list-mask"),
    pytest.param(causal_mask(3), torch.int32, TypeError, "dtype", id="int-dtype"),
    pytest.param(causal_mask(3), torch.bool, TypeError, "dtype", id="bool-dtype"),
    pytest.param(causal_mask(3), "float32", TypeError, "dtype", id="string-dtype"),
])
def test_to_additive_rejects_bad_arguments(mask, dtype, error, fragment):
    with pytest.raises(error) as raised:
        to_additive(mask, dtype=dtype)
    assert str(raised.value).startswith("to_additive:")
    assert fragment in str(raised.value)


@pytest.mark.parametrize("mask", [
    pytest.param(causal_mask(3), id="bool"),
    pytest.param(torch.zeros(3, 3, dtype=torch.long), id="int"),
    pytest.param([[0.0, float("-inf")]], id="list"),
])
def test_to_boolean_rejects_non_floating_masks(mask):
    with pytest.raises(TypeError, match=r"^to_boolean: mask must be"):
        to_boolean(mask)


# --- the plumbing that brings masks to score shape and combines them ---------------------


@pytest.mark.parametrize(
    "shape, expected",
    [
        ((6, 7), (1, 1, 6, 7)),          # one mask for everything
        ((2, 6, 7), (2, 1, 6, 7)),       # one per sequence
        ((2, 1, 7), (2, 1, 1, 7)),       # padding_mask's [B, 1, N_k]
        ((1, 3, 6, 7), (1, 3, 6, 7)),    # per head
        ((2, 3, 1, 7), (2, 3, 1, 7)),
    ],
)
def test_to_score_shape_broadcasts_exactly_like_the_scores(shape, expected):
    mask = torch.rand(shape) < 0.5
    shaped = to_score_shape(mask, 2, 3, 6, 7)
    assert shaped.shape == expected
    # The same positions are allowed, read through broadcasting against [B, H, N_q, N_k] scores.
    scores = torch.zeros(2, 3, 6, 7)
    torch.testing.assert_close(torch.broadcast_to(shaped, scores.shape),
                               torch.broadcast_to(mask if mask.dim() == 4 else mask.unsqueeze(-3)
                                                  if mask.dim() == 3 else mask, scores.shape))
    assert shaped.data_ptr() == mask.data_ptr()                      # a view, not a copy


@pytest.mark.parametrize("shape", [(6, 6), (2, 6, 8), (3, 1, 7), (2, 2, 6, 7), (7,), (1, 1, 1, 6, 7)])
def test_to_score_shape_says_what_does_not_fit(shape):
    with pytest.raises(ValueError, match=r"EncoderBlock.forward: attn of shape .* does not fit scores "
                                         r"\[B, H, N_q, N_k\] = \[2, 3, 6, 7\]"):
        to_score_shape(torch.ones(shape, dtype=torch.bool), 2, 3, 6, 7, caller="EncoderBlock.forward", name="attn")


def test_to_score_shape_passes_none_and_rejects_integer_masks():
    assert to_score_shape(None, 2, 3, 6, 7) is None
    with pytest.raises(TypeError, match="to_score_shape: mask must be boolean or floating, got dtype torch.int64"):
        to_score_shape(torch.ones(6, 7, dtype=torch.long), 2, 3, 6, 7)


def test_restrict_mask_ands_booleans_and_blocks_additive_masks():
    causal = causal_mask(4)
    other = torch.rand(2, 4, 4) < 0.7
    assert torch.equal(restrict_mask(other, causal), other & causal)
    assert restrict_mask(None, causal) is causal
    soft = -torch.rand(2, 4, 4)                                       # a soft bias, finite everywhere
    restricted = restrict_mask(soft, causal)
    assert restricted.shape == (2, 4, 4)
    assert torch.equal(restricted[:, causal], soft[:, causal])        # allowed: the bias stays
    assert torch.isneginf(restricted[:, ~causal]).all()               # blocked: -inf
    # Attention under the combination equals attention under the two applied one after the other.
    q, k, v = randn(2, 4, 8), randn(2, 4, 8, seed=1), randn(2, 4, 8, seed=2)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=soft.masked_fill(~causal, float("-inf")))
    close(self_attention(q, k, v, restricted)[0], expected, tol=TOL)


def test_restrict_mask_rejects_what_it_cannot_combine():
    with pytest.raises(TypeError, match="restrict_mask: allowed must be boolean"):
        restrict_mask(None, torch.zeros(3, 3))
    with pytest.raises(TypeError, match="restrict_mask: mask must be boolean or floating"):
        restrict_mask(torch.ones(3, 3, dtype=torch.long), causal_mask(3))
    with pytest.raises(ValueError, match="restrict_mask: the batch dimensions"):
        restrict_mask(torch.ones(2, 3, 3, dtype=torch.bool), torch.ones(4, 3, 3, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.bool, torch.long, torch.int32, torch.float32])
def test_key_padding_to_boolean_reads_hugging_face_masks(dtype):
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]]).to(dtype)
    expected = torch.tensor([[True, True, False], [True, False, False]])
    assert torch.equal(key_padding_to_boolean(mask, 2, 3), expected)


@pytest.mark.parametrize(
    "mask, error, fragment",
    [
        (torch.ones(2, 4), ValueError, r"BertModel.forward: attention_mask must be \[B, N\] = \[2, 3\]"),
        (torch.full((2, 3), 0.5), ValueError, "attention_mask must hold only 0 .padding. and 1 .token."),
        (torch.ones(2, 3, dtype=torch.complex64), TypeError, "attention_mask must be boolean or hold 0/1"),
        ([[1, 1, 1], [1, 1, 1]], TypeError, "attention_mask must be a torch.Tensor"),
    ],
)
def test_key_padding_to_boolean_names_the_caller(mask, error, fragment):
    with pytest.raises(error, match=fragment):
        key_padding_to_boolean(mask, 2, 3, caller="BertModel.forward", name="attention_mask")
