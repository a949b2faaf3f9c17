"""Flash-decoding (``decode_attention``): a few queries against a long cache, keys split across programs.

Against float64 math by the FlashAttention rule (``tests/support/flash_rule.py``), gradients included
(the backward is the ordinary kernels', fed the merged log-sum-exp): one and several queries,
multi-head, grouped-query and multi-query heads, bottom-right causal, cache lengths that are
and are not multiples of the 128-key split blocks and the 64-key tiles, one split and many.
"""

import pytest
import torch

pytest.importorskip("triton")

# PRECISE_DTYPE: float32 in the interpreter, float16 on a GPU (which refuses float32). pinned_configs:
# on a GPU each kernel in its default configuration, compiled once (see gpu_setup).
from gpu_setup import PRECISE_DTYPE, pinned_configs, round_off  # noqa: E402, F401

from attn_course.flash import triton_attention  # noqa: E402
from attn_course.flash.accuracy import plain_attention  # noqa: E402
from attn_course.flash.configs import DECODE_MAX_QUERIES, SUPPORTED_HEAD_DIMS, kernel_configs  # noqa: E402
from attn_course.flash.decode import attention_decode_forward, decode_num_splits  # noqa: E402
from attn_course.flash.triton_attention import decode_attention, flash_attention  # noqa: E402

from support.flash_rule import DEVICE, DTYPES, assert_flash_rule, random_inputs  # noqa: E402


def decode_kernel(num_splits):
    """``(output, lse)`` by flash-decoding with ``num_splits`` splits, differentiable output."""
    def run(q, k, v, *, causal, scale=None):
        out = decode_attention(q, k, v, causal=causal, scale=scale, num_splits=num_splits)
        _, lse = attention_decode_forward(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale,
                                          num_splits=num_splits)
        return out, lse
    return run


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (8, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("n_q, n_k, num_splits", [
    (1, 450, 3),       # one new token; 3 splits of the 450 keys (the last split takes the partial tile)
    (5, 384, 3),       # three splits of exactly 128 keys
    (16, 300, 2),      # the most queries; causal: the last 15 keys are masked for some rows
])
@pytest.mark.slow
def test_matches_float64_by_the_flash_rule(n_q, n_k, num_splits, heads, kv_heads, causal, dtype):
    inputs = random_inputs(1, heads, kv_heads, n_q, n_k, 16, dtype, seed=n_q)
    assert_flash_rule(*inputs, causal=causal, kernel=decode_kernel(num_splits), gradients=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_q, heads, kv_heads, causal", [(1, 4, 2, True), (16, 2, 1, False)])
def test_gradients_through_the_merged_log_sum_exp(n_q, heads, kv_heads, causal, dtype):
    # The backward kernels recompute the weights from the merged log-sum-exp: it must be exact.
    inputs = random_inputs(1, heads, kv_heads, n_q, 300, 32, dtype, seed=20 + n_q)
    assert_flash_rule(*inputs, causal=causal, kernel=decode_kernel(2))


@pytest.mark.parametrize("n_q, n_k", [(1, 1), (3, 20), (16, 16), (16, 129)])
def test_caches_shorter_than_a_split_block(n_q, n_k):
    # N_k < 128 (or just over it): one split, the tiles masked for bounds and causality.
    assert_flash_rule(*random_inputs(1, 4, 2, n_q, n_k, 16, DTYPES[0], seed=n_k), causal=True,
                      kernel=decode_kernel(1), gradients=False)


@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_every_head_dim_and_many_rows_per_group(head_dim):
    # 16 query heads on one key/value head, 4 queries: 64 rows per program (the wider BLOCK_M).
    # float32 within 1e-5 of float64; float16 (on a GPU) as accurate as float16 attention can be.
    q, k, v, _ = random_inputs(1, 16, 1, 4, 260, head_dim, PRECISE_DTYPE, seed=head_dim)
    expected, expected_lse = plain_attention(*(t.double() for t in (q, k, v)), causal=True)
    out, lse = attention_decode_forward(q, k, v, causal=True, num_splits=2)
    if q.dtype == torch.float32:
        assert (out.double() - expected).abs().max() < 1e-5
        assert (lse.double() - expected_lse).abs().max() < 1e-5
    else:
        assert_flash_rule(q, k, v, None, causal=True, kernel=decode_kernel(2), gradients=False)


def test_the_number_of_splits_changes_only_round_off():
    q, k, v, _ = random_inputs(1, 4, 2, 2, 1100, 32, PRECISE_DTYPE, seed=7)
    outputs = [attention_decode_forward(q, k, v, num_splits=s)[0] for s in (1, 2, 8)]
    for out in outputs[1:]:
        assert (out.float() - outputs[0].float()).abs().max() < round_off(q.dtype)


def test_every_key_is_in_exactly_one_split():
    # Adding s to one key's value moves each output by exactly s times that key's weight (in float64
    # math): a key read by no split, or by two, would show. In float16 (on a GPU) s = 64, so that the
    # move (64 weights of 1e-4 to 3e-2) stands well above the outputs' round-off (about 1e-4).
    q, k, v, _ = random_inputs(1, 2, 1, 1, 700, 16, PRECISE_DTYPE, seed=8)
    shift, atol = (1.0, 1e-6) if q.dtype == torch.float32 else (64.0, 1e-3)
    base, lse = attention_decode_forward(q, k, v, num_splits=5)
    scores = (q.double() @ k.double().transpose(-2, -1)) * 16 ** -0.5                     # [1, 2, 1, 700]
    weights = torch.exp(scores - lse.double()[..., None])
    for key in (0, 127, 128, 255, 256, 511, 512, 639, 640, 699):     # both sides of split edges
        shifted = v.clone()
        shifted[..., key, :] += shift
        moved = attention_decode_forward(q, k, shifted, num_splits=5)[0].double() - base.double()  # [1, 2, 1, 16]
        assert torch.allclose(moved, shift * weights[..., key, None].expand_as(moved), atol=atol), key


def test_every_element_is_written():
    q, k, v, _ = random_inputs(1, 6, 3, 3, 500, 32, PRECISE_DTYPE, seed=9)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    attention_decode_forward(q, k, v, causal=True, num_splits=3, out=out, lse=lse)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


def test_flash_attention_decodes_up_to_16_queries(monkeypatch):
    calls = []
    original = triton_attention.launch_decode
    monkeypatch.setattr(triton_attention, "launch_decode",
                        lambda *args, **kwargs: calls.append(args[0].shape[2]) or original(*args, **kwargs))
    for n_q in (1, DECODE_MAX_QUERIES, DECODE_MAX_QUERIES + 1):
        q, k, v, _ = random_inputs(1, 2, 1, n_q, 40, 16, PRECISE_DTYPE, seed=n_q)
        flash_attention(q, k, v, causal=True)
    assert calls == [1, DECODE_MAX_QUERIES]


def test_strided_inputs():
    # The same numbers read through other strides: the same sums, bit for bit, in any dtype.
    q, k, v, _ = random_inputs(1, 4, 2, 1, 300, 16, PRECISE_DTYPE, seed=10)
    k_strided = k.transpose(1, 2).contiguous().transpose(1, 2)          # laid out [B, N, H, d]
    torch.testing.assert_close(attention_decode_forward(q, k_strided, v, num_splits=2)[0],
                               attention_decode_forward(q, k, v, num_splits=2)[0], atol=1e-7, rtol=0)


def test_split_counts():
    # H200: 132 multiprocessors, two programs each: 8 programs without splitting → 33 splits.
    assert decode_num_splits(1, 8, 32768, multiprocessors=132) == 33
    assert decode_num_splits(4, 8, 1000, multiprocessors=132) == 7          # at most one per 128 keys
    assert decode_num_splits(64, 8, 32768, multiprocessors=132) == 1        # the batch fills the GPU
    assert decode_num_splits(1, 1, 10**6, multiprocessors=132) == 128       # at most 128
    assert decode_num_splits(1, 8, 32768) == 1                              # the interpreter


def test_clear_errors():
    q, k, v, _ = random_inputs(1, 2, 1, 17, 40, 16, PRECISE_DTYPE)
    with pytest.raises(ValueError, match=r"at most 16 queries \(N_q\), got q \[1, 2, 17, 16\]"):
        decode_attention(q, k, v)
    q = q[:, :, :1]
    with pytest.raises(ValueError, match=r"num_splits must be at most .* = 1 for N_k=40 .* got 2"):
        decode_attention(q, k, v, num_splits=2)
    with pytest.raises(ValueError, match="num_splits must be >= 1, got 0"):
        decode_attention(q, k, v, num_splits=0)
    with pytest.raises(TypeError, match="num_splits must be an int, got float"):
        decode_attention(q, k, v, num_splits=2.0)
    with pytest.raises(ValueError, match=r"config must be None or one of kernel_configs\('decode', 16\)"):
        attention_decode_forward(q, k, v, config=kernel_configs("forward", 16)[0])
    with pytest.raises(TypeError, match="multiprocessors must be an int"):
        decode_num_splits(1, 1, 1, multiprocessors=None)


def test_default_splits_match_sdpa():
    # On a GPU a long cache and the automatic split count for its multiprocessors; in the
    # interpreter (one split by default) a short one.
    n_k = 65536 if DEVICE == "cuda" else 600
    q, k, v, _ = random_inputs(1, 8, 1, 1, n_k, 128, DTYPES[0], seed=11)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k.expand(-1, 8, -1, -1), v.expand(-1, 8, -1, -1))
    torch.testing.assert_close(decode_attention(q, k, v), expected, atol=2e-3, rtol=0)
