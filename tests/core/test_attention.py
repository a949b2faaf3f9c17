"""Tests for attn_course.core.attention, against F.scaled_dot_product_attention and float64 math."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attn_course.core.attention import (
    classic_self_attention,
    scaled_dot_product,
    self_attention,
    softmax_with_empty_rows,
)
from attn_course.core.masks import causal_mask

from helpers import FAST, close, randn, random_mask


def sdpa(q, k, v, mask=None, **kwargs):
    """F.scaled_dot_product_attention after expanding q, k, v to one batch shape."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (t.expand(*batch, *t.shape[-2:]) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)


def sdpa_weights(q, k, mask=None, **kwargs):
    """SDPA's own attention weights: with the identity as values, the output is the weights."""
    identity = torch.eye(k.shape[-2], dtype=q.dtype)                 # [N_k, N_k]
    return sdpa(q, k, identity, mask, **kwargs)


# Shapes (q, k, v): plain, batched, broadcast batch dimensions, N_q != N_k, d_v != d_k.
SHAPES = [
    pytest.param((5, 8), (5, 8), (5, 8), id="unbatched-square"),
    pytest.param((2, 5, 8), (2, 7, 8), (2, 7, 8), id="batched-nq-ne-nk"),
    pytest.param((2, 3, 5, 8), (3, 7, 8), (3, 7, 8), id="kv-without-leading-batch"),
    pytest.param((2, 3, 5, 8), (1, 3, 7, 8), (1, 3, 7, 8), id="kv-batch-of-one"),
    pytest.param((2, 1, 5, 8), (1, 3, 7, 8), (2, 3, 7, 4), id="both-broadcast-dv-ne-dk"),
    pytest.param((4, 6), (3, 9, 6), (3, 9, 2), id="unbatched-q-batched-kv"),
]


# --- agreement with F.scaled_dot_product_attention --------------------------------------


@pytest.mark.parametrize(("q_shape", "k_shape", "v_shape"), SHAPES)
def test_matches_sdpa_without_mask(q_shape, k_shape, v_shape):
    q, k, v = randn(*q_shape, seed=1), randn(*k_shape, seed=2), randn(*v_shape, seed=3)
    output, weights = self_attention(q, k, v)
    close(output, sdpa(q, k, v), 1e-6)
    close(weights, sdpa_weights(q, k), 1e-6)


@pytest.mark.parametrize(("q_shape", "k_shape", "v_shape"), SHAPES)
def test_matches_sdpa_with_boolean_mask(q_shape, k_shape, v_shape):
    q, k, v = randn(*q_shape, seed=1), randn(*k_shape, seed=2), randn(*v_shape, seed=3)
    mask = random_mask(q_shape[-2], k_shape[-2], seed=4)             # [N_q, N_k]
    mask[:, 0] = True  # no fully masked row here: that case has its own tests
    output, weights = self_attention(q, k, v, mask)
    close(output, sdpa(q, k, v, mask), 1e-6)
    close(weights, sdpa_weights(q, k, mask), 1e-6)


def test_matches_sdpa_with_batched_boolean_mask():
    q, k, v = randn(2, 3, 5, 8, seed=1), randn(2, 3, 7, 8, seed=2), randn(2, 3, 7, 8, seed=3)
    mask = random_mask(2, 1, 5, 7, seed=4)                           # [B, 1, N_q, N_k]
    mask[..., 0] = True
    output, _ = self_attention(q, k, v, mask)
    close(output, sdpa(q, k, v, mask), 1e-6)


@pytest.mark.parametrize(("q_shape", "k_shape", "v_shape"), SHAPES)
def test_matches_sdpa_with_float_additive_mask(q_shape, k_shape, v_shape):
    q, k, v = randn(*q_shape, seed=1), randn(*k_shape, seed=2), randn(*v_shape, seed=3)
    mask = randn(q_shape[-2], k_shape[-2], seed=4)                   # finite biases
    mask[random_mask(*mask.shape, p=0.3, seed=5)] = float("-inf")    # and some blocked pairs
    mask[:, 0] = 0.0
    output, weights = self_attention(q, k, v, mask)
    close(output, sdpa(q, k, v, mask), 1e-6)
    close(weights, sdpa_weights(q, k, mask), 1e-6)


@pytest.mark.parametrize("scale", [0.05, 0.5, 1.0, 3.0])
def test_custom_scale_matches_sdpa_scale(scale):
    q, k, v = randn(2, 5, 8, seed=1), randn(2, 7, 8, seed=2), randn(2, 7, 3, seed=3)
    output, weights = self_attention(q, k, v, scale=scale)
    close(output, sdpa(q, k, v, scale=scale), 1e-6)
    close(weights, sdpa_weights(q, k, scale=scale), 1e-6)


@pytest.mark.parametrize("n", [1, 2, 6])
def test_square_causal_mask_matches_sdpa_is_causal(n):
    q, k, v = randn(2, 3, n, 8, seed=1), randn(2, 3, n, 8, seed=2), randn(2, 3, n, 8, seed=3)
    output, _ = self_attention(q, k, v, causal_mask(n))
    close(output, sdpa(q, k, v, is_causal=True), 1e-6)


def test_default_scale_is_one_over_sqrt_d_k():
    q, k, v = randn(3, 5, 16, seed=1), randn(3, 7, 16, seed=2), randn(3, 7, 16, seed=3)
    close(self_attention(q, k, v)[0], self_attention(q, k, v, scale=0.25)[0], 0.0)


# --- half precision -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_error_is_no_worse_than_sdpa(dtype):
    q64, k64, v64 = (randn(2, 4, 16, 32, seed=s, dtype=torch.float64) for s in (1, 2, 3))
    q, k, v = q64.to(dtype), k64.to(dtype), v64.to(dtype)
    mask = random_mask(16, 16, seed=4)
    mask[:, 0] = True
    output, weights = self_attention(q, k, v, mask)
    assert output.dtype == dtype and weights.dtype == dtype

    # End to end, as a user sees it: float64 math on the unrounded inputs is the truth.
    reference = sdpa(q64, k64, v64, mask)
    our_error = (output.double() - reference).abs().max().item()
    sdpa_error = (sdpa(q, k, v, mask).double() - reference).abs().max().item()
    floor = torch.finfo(dtype).eps / 4
    assert our_error <= 2 * sdpa_error + floor, (our_error, sdpa_error)
    # The weights are right to the dtype's rounding, given the values actually received.
    close(weights.double(), sdpa_weights(q.double(), k.double(), mask), torch.finfo(dtype).eps)


def test_float16_products_beyond_float16_range_do_not_overflow():
    # q · k reaches about 1e5 here, beyond float16's largest value 65504; only after
    # scaling by 1/1000 do the scores become ordinary numbers.
    q = (60 * randn(4, 32, seed=1).sign()).half()
    k = (60 * randn(6, 32, seed=2).sign()).half()
    k[0] = q[0]                                         # q[0] · k[0] = 60² · 32 = 115200
    v = randn(6, 4, seed=3, dtype=torch.float16)
    output, weights = self_attention(q, k, v, scale=1e-3)
    assert torch.isfinite(output).all() and torch.isfinite(weights).all()
    reference = sdpa_weights(q.double(), k.double(), scale=1e-3)
    close(weights.double(), reference, 2e-3)


# --- gradients ------------------------------------------------------------------------------


def test_gradients_match_sdpa_with_float_mask():
    q = randn(2, 3, 5, 8, seed=1).requires_grad_()
    k = randn(2, 3, 7, 8, seed=2).requires_grad_()
    v = randn(2, 3, 7, 6, seed=3).requires_grad_()
    mask = randn(5, 7, seed=4).requires_grad_()                     # additive, finite
    upstream = randn(2, 3, 5, 6, seed=5)
    inputs = (q, k, v, mask)

    ours = torch.autograd.grad(self_attention(q, k, v, mask)[0], inputs, upstream)
    theirs = torch.autograd.grad(sdpa(q, k, v, mask), inputs, upstream)
    for name, mine, reference in zip("q k v mask".split(), ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference, atol=1e-5, rtol=1e-5, msg=name)


def test_gradients_match_sdpa_with_boolean_mask():
    q = randn(2, 5, 8, seed=1).requires_grad_()
    k = randn(2, 7, 8, seed=2).requires_grad_()
    v = randn(2, 7, 8, seed=3).requires_grad_()
    mask = random_mask(2, 5, 7, seed=4)
    mask[..., 0] = True
    upstream = randn(2, 5, 8, seed=5)

    ours = torch.autograd.grad(self_attention(q, k, v, mask)[0], (q, k, v), upstream)
    theirs = torch.autograd.grad(sdpa(q, k, v, mask), (q, k, v), upstream)
    for name, mine, reference in zip("q k v".split(), ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("mask_kind", ["none", "boolean-with-fully-masked-row", "float"])
def test_gradcheck_passes_in_float64(mask_kind):
    q = randn(2, 3, 4, seed=1, dtype=torch.float64).requires_grad_()
    k = randn(2, 5, 4, seed=2, dtype=torch.float64).requires_grad_()
    v = randn(2, 5, 3, seed=3, dtype=torch.float64).requires_grad_()
    if mask_kind == "none":
        inputs, function = (q, k, v), self_attention
    elif mask_kind == "float":
        mask = randn(3, 5, seed=4, dtype=torch.float64).requires_grad_()
        inputs, function = (q, k, v, mask), self_attention
    else:
        mask = random_mask(2, 3, 5, seed=4)
        mask[0, 1] = False                                          # a fully masked row
        mask[1, :, 0] = True
        inputs = (q, k, v)

        def function(q, k, v):
            return self_attention(q, k, v, mask)

    assert torch.autograd.gradcheck(function, inputs)


# --- fully masked rows ----------------------------------------------------------------------


def _mask_with_fully_masked_rows(kind: str) -> torch.Tensor:
    allowed = random_mask(2, 4, 6, seed=4)
    allowed[..., 0] = True
    allowed[0, 1] = False                                           # query 1 of batch 0
    allowed[1, 3] = False                                           # query 3 of batch 1
    if kind == "boolean":
        return allowed
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))


@pytest.mark.parametrize("kind", ["boolean", "float"])
def test_fully_masked_row_gives_zero_not_nan(kind):
    q, k, v = randn(2, 4, 8, seed=1), randn(2, 6, 8, seed=2), randn(2, 6, 5, seed=3)
    mask = _mask_with_fully_masked_rows(kind)
    output, weights = self_attention(q, k, v, mask)

    assert not output.isnan().any() and not weights.isnan().any()
    for batch, row in [(0, 1), (1, 3)]:
        assert torch.equal(weights[batch, row], torch.zeros(6))
        assert torch.equal(output[batch, row], torch.zeros(5))
    # Every other row is ordinary attention.
    others = torch.ones(2, 4, dtype=torch.bool)
    others[0, 1] = others[1, 3] = False
    close(output[others], sdpa(q, k, v, mask)[others], 1e-6)


@pytest.mark.parametrize("kind", ["boolean", "float"])
def test_fully_masked_row_has_finite_zero_gradients(kind):
    q = randn(2, 4, 8, seed=1).requires_grad_()
    k = randn(2, 6, 8, seed=2).requires_grad_()
    v = randn(2, 6, 5, seed=3).requires_grad_()
    mask = _mask_with_fully_masked_rows(kind)
    output, weights = self_attention(q, k, v, mask)
    loss = (output * randn(2, 4, 5, seed=5)).sum() + (weights * randn(2, 4, 6, seed=6)).sum()
    loss.backward()

    for grad in (q.grad, k.grad, v.grad):
        assert torch.isfinite(grad).all()
    assert torch.equal(q.grad[0, 1], torch.zeros(8))
    assert torch.equal(q.grad[1, 3], torch.zeros(8))


def test_fully_masked_row_contributes_nothing_to_key_and_value_gradients():
    # Reference: SDPA on batch 0 with the fully masked query deleted altogether.
    q = randn(4, 8, seed=1)
    k = randn(6, 8, seed=2).requires_grad_()
    v = randn(6, 5, seed=3).requires_grad_()
    mask = _mask_with_fully_masked_rows("boolean")[0]               # row 1 fully masked
    upstream = randn(4, 5, seed=5)
    ours = torch.autograd.grad(self_attention(q, k, v, mask)[0], (k, v), upstream)

    keep = torch.tensor([0, 2, 3])
    reference_output = F.scaled_dot_product_attention(q[keep], k, v, attn_mask=mask[keep])
    theirs = torch.autograd.grad(reference_output, (k, v), upstream[keep])
    for mine, reference in zip(ours, theirs, strict=True):
        close(mine, reference, 1e-5)


def test_classic_attention_averages_every_value_on_fully_masked_row():
    q, k, v = randn(2, 4, 8, seed=1), randn(2, 6, 8, seed=2), randn(2, 6, 5, seed=3)
    mask = _mask_with_fully_masked_rows("boolean")
    classic_output, classic_weights = classic_self_attention(q, k, v, mask)
    output, weights = self_attention(q, k, v, mask)

    # The classic version silently attends uniformly to keys it was told to ignore...
    close(classic_weights[0, 1], torch.full((6,), 1 / 6), 1e-7)
    close(classic_output[0, 1], v[0].mean(dim=0), 1e-6)
    # ...where self_attention returns nothing at all.
    assert torch.equal(weights[0, 1], torch.zeros(6))
    assert torch.equal(output[0, 1], torch.zeros(5))


# --- classic_self_attention -----------------------------------------------------------------


@pytest.mark.parametrize("use_mask", [False, True])
def test_classic_attention_equals_self_attention_without_fully_masked_rows(use_mask):
    q, k, v = randn(2, 5, 8, seed=1), randn(2, 7, 8, seed=2), randn(2, 7, 4, seed=3)
    mask = None
    if use_mask:
        mask = random_mask(2, 5, 7, seed=4)
        mask[..., 0] = True
    expected_output, expected_weights = self_attention(q, k, v, mask)
    output, weights = classic_self_attention(q, k, v, mask)
    close(output, expected_output, 1e-6)
    close(weights, expected_weights, 1e-6)


def test_classic_attention_treats_zero_in_a_float_mask_as_blocked():
    q, k, v = randn(5, 8, seed=1), randn(7, 8, seed=2), randn(7, 4, seed=3)
    allowed = random_mask(5, 7, seed=4)
    allowed[:, 0] = True
    output, _ = classic_self_attention(q, k, v, allowed.float())    # 1 = keep, 0 = block
    close(output, sdpa(q, k, v, allowed), 1e-6)


def test_classic_attention_in_float16_refuses_the_minus_1e9_fill():
    # classic_self_attention fills masked scores with the Python number -1e9. PyTorch's
    # masked_fill checks that a Python scalar fits the tensor's dtype, and float16's largest
    # magnitude is 65504, so in float16 the call raises instead of silently storing -inf.
    q, k, v = (randn(1, 3, 4, seed=s, dtype=torch.float16) for s in (1, 2, 3))
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    with pytest.raises(RuntimeError, match="overflow"):
        classic_self_attention(q, k, v, mask)
    # self_attention handles the same float16 inputs.
    output, weights = self_attention(q, k, v, mask)
    close(weights.double(), sdpa_weights(q.double(), k.double(), mask), 1e-3)


# --- laws (hypothesis) ----------------------------------------------------------------------


@st.composite
def attention_inputs(draw):
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    n_q, n_k = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    d_k, d_v = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**31 - 1))
    p = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    q = randn(*batch, n_q, d_k, seed=seed)
    k = randn(*batch, n_k, d_k, seed=seed + 1)
    v = randn(*batch, n_k, d_v, seed=seed + 2)
    mask = random_mask(*batch, n_q, n_k, p=p, seed=seed + 3)
    return q, k, v, mask


@FAST
@given(attention_inputs())
def test_weight_rows_sum_to_one_and_masked_weights_are_exactly_zero(inputs):
    q, k, v, mask = inputs
    _, weights = self_attention(q, k, v, mask)
    assert (weights >= 0).all()
    assert torch.equal(weights[~mask], torch.zeros_like(weights[~mask]))
    has_key = mask.any(dim=-1)                                       # [..., N_q]
    sums = weights.sum(dim=-1)
    close(sums[has_key], torch.ones_like(sums[has_key]), 1e-6)
    assert torch.equal(sums[~has_key], torch.zeros_like(sums[~has_key]))


@FAST
@given(attention_inputs())
def test_matches_sdpa_on_random_shapes_and_masks(inputs):
    q, k, v, mask = inputs
    mask[..., 0] = True
    output, weights = self_attention(q, k, v, mask)
    close(output, sdpa(q, k, v, mask), 1e-6)
    close(weights, sdpa_weights(q, k, mask), 1e-6)


@FAST
@given(
    batch=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    n_q=st.integers(1, 5),
    n_k=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_results_are_invariant_under_batch_broadcasting(batch, n_q, n_k, seed):
    q = randn(*batch, n_q, 4, seed=seed)
    k, v = randn(n_k, 4, seed=seed + 1), randn(n_k, 3, seed=seed + 2)   # shared by the batch
    mask = random_mask(n_q, n_k, seed=seed + 3)
    output, weights = self_attention(q, k, v, mask)

    expanded = self_attention(
        q, k.expand(*batch, n_k, 4), v.expand(*batch, n_k, 3), mask.expand(*batch, n_q, n_k)
    )
    close(output, expanded[0], 1e-6)
    close(weights, expanded[1], 1e-6)
    flat_q = q.reshape(-1, n_q, 4)
    for index in range(flat_q.shape[0]):                             # one sequence at a time
        single_output, _ = self_attention(flat_q[index], k, v, mask)
        close(output.reshape(-1, n_q, 3)[index], single_output, 1e-6)


# --- input checks ---------------------------------------------------------------------------

Q, K, V = randn(2, 5, 8, seed=1), randn(2, 7, 8, seed=2), randn(2, 7, 4, seed=3)

BAD_INPUTS = [
    pytest.param({"k": randn(2, 7, 4)}, ValueError, ["q", "k", "[2, 5, 8]", "[2, 7, 4]"],
                 id="d_k-differs-between-q-and-k"),
    pytest.param({"v": randn(2, 6, 4)}, ValueError, ["k", "v", "[2, 7, 8]", "[2, 6, 4]"],
                 id="n_k-differs-between-k-and-v"),
    pytest.param({"mask": torch.ones(4, 7, dtype=torch.bool)}, ValueError,
                 ["mask", "[4, 7]", "[2, 5, 7]"], id="mask-not-broadcastable"),
    pytest.param({"mask": torch.ones(3, 2, 5, 7, dtype=torch.bool)}, ValueError,
                 ["mask", "[3, 2, 5, 7]"], id="mask-with-extra-batch-dims"),
    pytest.param({"q": Q.long()}, TypeError, ["q", "int64"], id="integer-q"),
    pytest.param({"v": V.int()}, TypeError, ["v", "int32"], id="integer-v"),
    pytest.param({"k": K.double()}, TypeError, ["dtype", "float32", "float64"],
                 id="mixed-dtypes"),
    pytest.param({"q": Q.tolist()}, TypeError, ["q", "list"], id="list-q"),
    pytest.param({"v": V.numpy()}, TypeError, ["v", "ndarray"], id="numpy-v"),
    pytest.param({"mask": torch.ones(5, 7, dtype=torch.int64)}, TypeError, ["mask", "int64"],
                 id="integer-mask"),
    pytest.param({"mask": [[True] * 7] * 5}, TypeError, ["mask", "list"], id="list-mask"),
    pytest.param({"scale": 0}, ValueError, ["scale", "0"], id="scale-zero"),
    pytest.param({"scale": -0.5}, ValueError, ["scale", "-0.5"], id="scale-negative"),
    pytest.param({"scale": math.inf}, ValueError, ["scale", "inf"], id="scale-inf"),
    pytest.param({"scale": math.nan}, ValueError, ["scale", "nan"], id="scale-nan"),
    pytest.param({"scale": "2"}, TypeError, ["scale", "str"], id="scale-string"),
    pytest.param({"scale": True}, TypeError, ["scale", "bool"], id="scale-bool"),
    pytest.param({"k": randn(3, 7, 8), "v": randn(3, 7, 4)}, ValueError,
                 ["batch", "q [2]", "k [3]"], id="batch-dims-not-broadcastable"),
    pytest.param({"q": randn(8)}, ValueError, ["q", "[8]"], id="one-dimensional-q"),
    pytest.param({"k": randn(8)}, ValueError, ["k", "[8]"], id="one-dimensional-k"),
]


@pytest.mark.parametrize(("changes", "error", "fragments"), BAD_INPUTS)
def test_bad_input_raises_with_message_naming_the_argument(changes, error, fragments):
    arguments = {"q": Q, "k": K, "v": V, "mask": None, **changes}
    scale = arguments.pop("scale", None)
    with pytest.raises(error) as raised:
        self_attention(*arguments.values(), scale=scale)
    message = str(raised.value)
    assert message.startswith("self_attention:")
    for fragment in fragments:
        assert fragment in message


def _meta(*shape: int) -> torch.Tensor:
    try:
        return torch.empty(*shape, device="meta")
    except (RuntimeError, NotImplementedError):
        pytest.skip("this PyTorch build has no 'meta' device")


def test_inputs_on_different_devices_raise_value_error():
    with pytest.raises(ValueError, match="device") as raised:
        self_attention(Q, _meta(2, 7, 8), V)
    assert "k on meta" in str(raised.value) and "q on cpu" in str(raised.value)


def test_mask_on_another_device_raises_value_error():
    with pytest.raises(ValueError, match="mask") as raised:
        self_attention(Q, K, V, _meta(5, 7).bool())
    assert "meta" in str(raised.value)


def test_zero_keys_give_zero_output_like_sdpa():
    q, k, v = randn(2, 3, 4, seed=1), randn(2, 0, 4, seed=2), randn(2, 0, 5, seed=3)
    output, weights = self_attention(q, k, v)
    assert weights.shape == (2, 3, 0)
    assert torch.equal(output, torch.zeros(2, 3, 5))
    assert torch.equal(output, sdpa(q, k, v))


# --- softmax_with_empty_rows ----------------------------------------------------------------


def test_softmax_of_all_minus_inf_row_is_zeros_not_nan():
    scores = torch.tensor([[1.0, 2.0, 3.0], [-math.inf] * 3, [0.0, -math.inf, 0.0]])
    weights = softmax_with_empty_rows(scores)
    assert torch.equal(weights[1], torch.zeros(3))
    # Hand-computed rows: softmax(1, 2, 3) and the two remaining equal scores.
    e = math.e
    total = 1 + e + e**2
    close(weights[0], torch.tensor([1 / total, e / total, e**2 / total]), 1e-7)
    assert torch.equal(weights[2], torch.tensor([0.5, 0.0, 0.5]))


def test_softmax_of_one_dimensional_empty_row_is_zeros():
    assert torch.equal(softmax_with_empty_rows(torch.full((4,), -math.inf)), torch.zeros(4))


def test_softmax_gradient_of_empty_row_is_zero_not_nan():
    scores = torch.tensor([[0.5, -math.inf], [-math.inf, -math.inf]], requires_grad=True)
    softmax_with_empty_rows(scores).mul(torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.equal(scores.grad[1], torch.zeros(2))


@FAST
@given(
    rows=st.integers(1, 4),
    n=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    p_blocked=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_softmax_with_empty_rows_matches_torch_softmax_on_other_rows(rows, n, seed, p_blocked):
    scores = 3 * randn(rows, n, seed=seed)
    scores[~random_mask(rows, n, p=1 - p_blocked, seed=seed + 1)] = -math.inf
    weights = softmax_with_empty_rows(scores)
    empty = (scores == -math.inf).all(dim=-1)
    assert torch.equal(weights[empty], torch.zeros_like(weights[empty]))
    close(weights[~empty], torch.softmax(scores[~empty], dim=-1), 1e-7)


def test_softmax_with_empty_rows_rejects_integer_scores():
    with pytest.raises(TypeError, match="scores"):
        softmax_with_empty_rows(torch.tensor([1, 2, 3]))


# --- scaled_dot_product: the formula on its own, in the inputs' dtype ------------------------


@pytest.mark.parametrize(("q_shape", "k_shape", "v_shape"), SHAPES)
def test_formula_matches_sdpa_in_float64_with_a_boolean_and_a_float_mask(q_shape, k_shape, v_shape):
    q, k, v = (randn(*shape, seed=s, dtype=torch.float64) for s, shape in enumerate((q_shape, k_shape, v_shape)))
    allowed = random_mask(q_shape[-2], k_shape[-2], seed=4)
    allowed[:, 0] = True
    additive = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, -math.inf)
    for mask in (None, allowed, additive):
        output, weights = scaled_dot_product(q, k, v, mask)
        close(output, sdpa(q, k, v, mask), 1e-12)
        close(weights, sdpa_weights(q, k, mask), 1e-12)


def test_formula_is_what_self_attention_computes_in_float32():
    q, k, v = randn(2, 5, 8, seed=1), randn(2, 7, 8, seed=2), randn(2, 7, 4, seed=3)
    mask = torch.ones(2, 5, 7, dtype=torch.bool).tril()
    mask[0, 2] = False                                              # one fully masked row
    for ours, formula in zip(self_attention(q, k, v, mask, scale=0.3),
                             scaled_dot_product(q, k, v, mask, scale=0.3), strict=True):
        assert torch.equal(ours, formula)
    assert torch.equal(scaled_dot_product(q, k, v, mask)[1][0, 2], torch.zeros(7))


def test_formula_keeps_float16_where_self_attention_computes_in_float32():
    # q · k reaches 60² · 32 = 115200 before the scale: beyond float16's 65504.
    q = (60 * randn(4, 32, seed=1).sign()).half()
    k = (60 * randn(6, 32, seed=2).sign()).half()
    k[0] = q[0]
    v = randn(6, 4, seed=3, dtype=torch.float16)
    output, weights = scaled_dot_product(q, k, v, scale=1e-3)
    assert output.dtype == weights.dtype == torch.float16
    assert not torch.isfinite(output).all()                         # inf - inf in the softmax
    assert torch.isfinite(self_attention(q, k, v, scale=1e-3)[0]).all()


def test_formula_in_float16_rounds_the_scores_and_loses_accuracy():
    # Entries of size 3 give raw scores of a few hundred, which float16 stores only to the
    # nearest 1/4 (spacing 0.25 from 256 to 512): after the scale 1/8 an exponent can be off
    # by 1/64, a weight by about 1.6 %. self_attention's float32 scores are exact products.
    q64, k64, v64 = (3 * randn(64, 64, seed=s, dtype=torch.float64) for s in (1, 2, 3))
    q, k, v = q64.half(), k64.half(), v64.half()
    truth = sdpa(q.double(), k.double(), v.double())                # the float16 inputs, exactly
    no_upcast = (scaled_dot_product(q, k, v)[0].double() - truth).abs().max().item()
    upcast = (self_attention(q, k, v)[0].double() - truth).abs().max().item()
    rounding = (truth.half().double() - truth).abs().max().item()   # storing the result in float16
    assert upcast <= 1.5 * rounding
    assert no_upcast > 5 * upcast


@pytest.mark.parametrize(("changes", "error", "fragments"), BAD_INPUTS)
def test_formula_checks_its_inputs_like_self_attention(changes, error, fragments):
    arguments = {"q": Q, "k": K, "v": V, "mask": None, **changes}
    scale = arguments.pop("scale", None)
    with pytest.raises(error) as raised:
        scaled_dot_product(*arguments.values(), scale=scale)
    message = str(raised.value)
    assert message.startswith("scaled_dot_product:")
    for fragment in fragments:
        assert fragment in message


def test_softmax_with_empty_rows_rejects_a_zero_dimensional_tensor():
    with pytest.raises(ValueError, match="softmax_with_empty_rows: scores"):
        softmax_with_empty_rows(torch.tensor(1.0))


def test_the_packages_shape_broadcasting_follows_torch():
    """_validate.broadcast_shapes replaces torch.broadcast_shapes (which imports sympy, 2 s per new process)."""
    import itertools

    from attn_course._validate import broadcast_shapes

    sizes = [[], [1], [3], [1, 3], [2, 1], [2, 3], [4, 1, 3], [3, 2], [1, 1, 1]]
    for a, b in itertools.product(sizes, repeat=2):
        try:
            expected = torch.broadcast_shapes(a, b)
        except RuntimeError:
            with pytest.raises(ValueError, match="do not broadcast"):
                broadcast_shapes(a, b)
        else:
            assert broadcast_shapes(a, b) == expected
