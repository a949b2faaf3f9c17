"""The Triton kernels' newer paths against float64 math, by the FlashAttention rule.

Grouped-query and multi-query heads (``k``, ``v`` with ``H_kv < H`` heads, read in place),
bottom-right causal with ``N_q < N_k`` (queries are the last positions, as after a KV cache),
and the staged key loop (unmasked full tiles, masked diagonal band and partial last tile),
forward and backward, at lengths that are and are not tile multiples. The rule and its
float64 reference are in ``tests/support/flash_rule.py``.
"""

import pytest
import torch

pytest.importorskip("triton")

# PRECISE_DTYPE: float32 in the interpreter, float16 on a GPU (which refuses float32). pinned_configs:
# on a GPU each kernel in its default configuration, compiled once (see gpu_setup).
from gpu_setup import PRECISE_DTYPE, pinned_configs, round_off  # noqa: E402, F401

from attn_course.flash.configs import kernel_config  # noqa: E402
from attn_course.flash.triton_attention import flash_attention  # noqa: E402

from support.flash_rule import DTYPES, assert_flash_rule, random_inputs  # noqa: E402

BLOCK_M = kernel_config("forward", 32).block_m     # 128: query tile of the forward
BLOCK_N = kernel_config("forward", 32).block_n     # 64: key tile (and both backward tiles)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (3, 1)], ids=["gqa", "mqa"])
@pytest.mark.parametrize("length", [BLOCK_M, 70], ids=["tile_multiple", "partial_tile"])
def test_grouped_and_multi_query_heads(length, heads, kv_heads, causal, dtype):
    assert_flash_rule(*random_inputs(2, heads, kv_heads, length, length, 32, dtype), causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_q, n_k", [
    (1, 5),                       # one query after four cached keys
    (17, 200),                    # partial tiles on both sides
    (BLOCK_N, 2 * BLOCK_M),       # tile multiples: the band is cut exactly on tile edges
    (70, 3 * BLOCK_N),            # partial query tile, full key tiles
    (BLOCK_M + 3, BLOCK_M + 3),   # equal lengths, one tile plus a bit
])
@pytest.mark.slow
def test_bottom_right_causal_with_fewer_queries_than_keys(n_q, n_k, dtype):
    assert_flash_rule(*random_inputs(1, 2, 2, n_q, n_k, 32, dtype, seed=1), causal=True)


def test_bottom_right_causal_with_grouped_heads_and_a_long_cache():
    assert_flash_rule(*random_inputs(1, 4, 2, 40, 300, 64, DTYPES[0], seed=2), causal=True)


@pytest.mark.parametrize("causal", [False, True])
def test_key_tiles_below_the_diagonal_and_the_partial_last_tile(causal):
    # 2 query tiles of the forward, 5 key tiles of 64 (the last with 6 keys): every stage runs,
    # the unmasked one on several tiles per program.
    assert_flash_rule(*random_inputs(1, 1, 1, 2 * BLOCK_M + 6, 2 * BLOCK_M + 6, 16, DTYPES[0], seed=3),
                      causal=causal)


def test_query_sees_only_its_bottom_right_keys():
    # Changing key j must leave query i's output alone when j > i + N_k - N_q, and change it otherwise.
    # Exact in any dtype: a masked key's weight is exactly 0, and the rest of the sum is unchanged.
    q, k, v, _ = random_inputs(1, 1, 1, 3, 10, 16, PRECISE_DTYPE, seed=4)
    base = flash_attention(q, k, v, causal=True)
    changed_v = v.clone()
    changed_v[..., 8, :] += 1.0                 # key 8: visible to queries 1 and 2 only (offset 7)
    changed = flash_attention(q, k, changed_v, causal=True)
    difference = (changed - base).abs().amax(dim=-1)[0, 0]
    assert difference[0] == 0 and (difference[1:] > 0).all()


def test_grouped_heads_read_their_own_group():
    # Query heads 0, 1 use key/value head 0; heads 2, 3 use head 1: the same as repeating k and v.
    # The same sums, in another compiled specialisation (groups 2 against 1): round-off apart at most;
    # a wrong group would be off by the size of the outputs.
    q, k, v, _ = random_inputs(1, 4, 2, 20, 30, 16, PRECISE_DTYPE, seed=5)
    grouped = flash_attention(q, k, v)
    repeated = flash_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1))
    torch.testing.assert_close(grouped, repeated, atol=round_off(q.dtype), rtol=0)


def test_grouped_gradients_have_the_key_value_shape():
    q, k, v, _ = random_inputs(1, 4, 1, 8, 8, 16, PRECISE_DTYPE, seed=6)
    k.requires_grad_()
    v.requires_grad_()
    flash_attention(q, k, v, causal=True).sum().backward()
    assert k.grad.shape == k.shape and v.grad.shape == v.shape


def test_clear_errors_for_groups_and_causal_lengths():
    q, k, v, _ = random_inputs(1, 4, 3, 8, 8, 16, PRECISE_DTYPE)
    with pytest.raises(ValueError, match=r"H % H_kv == 0, got q \[1, 4, 8, 16\], k \[1, 3, 8, 16\]"):
        flash_attention(q, k, v)
    q, k, v, _ = random_inputs(1, 2, 2, 9, 8, 16, PRECISE_DTYPE)
    with pytest.raises(ValueError, match=r"causal needs N_q <= N_k .*got N_q=9, N_k=8"):
        flash_attention(q, k, v, causal=True)
