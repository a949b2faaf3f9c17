"""FlexAttention's mask and score functions against the package's own implementation of each variant.

``flex_attention`` runs eagerly on the CPU (it materialises the scores and warns so); each
variant written as a ``mask_mod``/``score_mod`` must give what the package's masks, ALiBi biases
and soft-capped attention give, in float64, with and without cached tokens before the queries.
"""

import warnings

import pytest
import torch

from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.positions.alibi import alibi_bias, alibi_slopes
from attn_course.variants import flex_attention as flex
from attn_course.variants.masks import attention_sink_mask, document_mask, sliding_window_mask

B, H, D = 2, 4, 16


@pytest.fixture(autouse=True)
def quiet_eager_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield


def inputs(n_q, n_k, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=generator, dtype=torch.float64) for n in (n_q, n_k, n_k)]


CASES = [(40, 40, 0), (8, 40, 32)]          # no cache; 8 new queries after 32 cached tokens


@pytest.mark.parametrize("n_q, n_k, offset", CASES)
@pytest.mark.parametrize("variant", ["causal", "sliding_window", "attention_sinks"])
def test_masks(variant, n_q, n_k, offset):
    q, k, v = inputs(n_q, n_k)
    mask_mod, mask = {
        "causal": (flex.causal(offset=offset), causal_mask(n_q, n_k)),
        "sliding_window": (flex.sliding_window(7, offset=offset), sliding_window_mask(n_q, n_k, window=7)),
        "attention_sinks": (flex.attention_sinks(7, 3, offset=offset), attention_sink_mask(n_q, n_k, window=7,
                                                                                           sinks=3)),
    }[variant]
    torch.testing.assert_close(flex.flex_attend(q, k, v, mask_mod=mask_mod), self_attention(q, k, v, mask)[0],
                               rtol=0, atol=1e-12)


def test_documents_packed_in_one_sequence():
    q, k, v = inputs(30, 30)
    ids = torch.tensor([[0] * 10 + [1] * 15 + [2] * 5, [0] * 3 + [1] * 27])                 # [B, N]
    for causal in (False, True):
        expected = self_attention(q, k, v, document_mask(ids, causal=causal).unsqueeze(1))[0]
        got = flex.flex_attend(q, k, v, mask_mod=flex.documents(ids, causal=causal))
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_q, n_k, offset", CASES)
def test_alibi(n_q, n_k, offset):
    q, k, v = inputs(n_q, n_k)
    slopes = alibi_slopes(H, dtype=torch.float64)
    bias = alibi_bias(H, n_q, n_k, dtype=torch.float64)                                    # [H, N_q, N_k]
    blocked = torch.zeros(n_q, n_k, dtype=torch.float64).masked_fill(~causal_mask(n_q, n_k), float("-inf"))
    expected = self_attention(q, k, v, bias + blocked)[0]
    got = flex.flex_attend(q, k, v, mask_mod=flex.causal(offset=offset), score_mod=flex.alibi(slopes, offset=offset))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_soft_capping():
    q, k, v = inputs(40, 40)
    q = q * 8                                                     # scores of ±30 or so: the cap bites
    expected = flex.soft_capped_attention(q, k, v, cap=20.0, mask=causal_mask(40))
    got = flex.flex_attend(q, k, v, mask_mod=flex.causal(), score_mod=flex.soft_capping(20.0))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    # The cap changes the result here, and vanishes as the cap grows.
    assert (expected - self_attention(q, k, v, causal_mask(40))[0]).abs().max() > 1e-2
    loose = flex.soft_capped_attention(q, k, v, cap=1e9, mask=causal_mask(40))
    torch.testing.assert_close(loose, self_attention(q, k, v, causal_mask(40))[0], rtol=0, atol=1e-9)


def test_soft_capped_attention_against_gemma2():
    # Gemma 2's eager attention in transformers applies tanh capping to the scaled scores (and
    # takes its softmax in float32, hence 1e-6 rather than float64's round-off).
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    q, k, v = inputs(12, 12, seed=3)
    q = q * 6

    class Module(torch.nn.Module):
        num_key_value_groups = 1
        training = False

    mask = torch.zeros(12, 12, dtype=torch.float64).masked_fill(~causal_mask(12), float("-inf"))
    theirs, _ = eager_attention_forward(Module(), q, k, v, mask[None, None], dropout=0.0, scaling=D ** -0.5,
                                        softcap=15.0)
    ours = flex.soft_capped_attention(q, k, v, cap=15.0, mask=causal_mask(12))
    torch.testing.assert_close(ours, theirs.transpose(1, 2), rtol=0, atol=1e-6)


@pytest.mark.parametrize("call, error, message", [
    (lambda: flex.sliding_window(0), ValueError, "sliding_window: window must be >= 1, got 0"),
    (lambda: flex.attention_sinks(4, 5), ValueError, "sinks must be at most window, got sinks=5, window=4"),
    (lambda: flex.causal(offset=-1), ValueError, "offset must be >= 0"),
    (lambda: flex.documents(torch.zeros(2, 2, 2, dtype=torch.long)), ValueError, r"\[N\] or \[B, N\]"),
    (lambda: flex.documents(torch.zeros(3)), TypeError, "integer tensor"),
    (lambda: flex.alibi(torch.ones(2, 2)), TypeError, r"slopes must be a floating \[H\] tensor"),
    (lambda: flex.soft_capping(0.0), ValueError, "cap"),
    (lambda: flex.flex_attend(torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 3)), ValueError, "flex_attend"),
    (lambda: flex.flex_attend(*inputs(4, 4), mask_mod=3), TypeError, "mask_mod must be callable"),
    (lambda: attention_sink_mask(4, window=2, sinks=3), ValueError, "sinks must be at most window"),
    (lambda: document_mask(torch.tensor([0.0, 1.0])), TypeError, "integer tensor"),
])
def test_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def tiles_from_dense(mask, tile):
    """Each tile of a dense boolean mask: empty (no True), full (all True) or partial (some)."""
    n_q, n_k = mask.shape
    blocks = mask.reshape(n_q // tile, tile, n_k // tile, tile).transpose(1, 2).float().mean((-2, -1))
    return torch.where(blocks == 0, flex.EMPTY, torch.where(blocks == 1, flex.FULL, flex.PARTIAL))


@pytest.mark.parametrize("n, window, tile", [(1024, 128, 128), (1024, 384, 128), (512, 100, 64), (256, 256, 128)])
def test_tile_kinds_classify_each_tile_of_the_dense_mask(n, window, tile):
    from torch.nn.attention.flex_attention import create_block_mask

    block_mask = create_block_mask(flex.sliding_window(window), 1, 1, n, n, device="cpu", BLOCK_SIZE=tile)
    expected = tiles_from_dense(sliding_window_mask(n, window=window), tile)
    assert torch.equal(flex.tile_kinds(block_mask)[0, 0], expected)


def test_tile_kinds_per_document_and_batch():
    from torch.nn.attention.flex_attention import create_block_mask

    documents = torch.tensor([0] * 200 + [1] * 56)
    block_mask = create_block_mask(flex.documents(documents, causal=False), 2, 1, 256, 256, device="cpu", BLOCK_SIZE=64)
    expected = tiles_from_dense(document_mask(documents, causal=False), 64)
    kinds = flex.tile_kinds(block_mask)
    assert kinds.shape == (2, 1, 4, 4) and all(torch.equal(kinds[b, 0], expected) for b in range(2))


def test_tile_kinds_refuses_a_dense_mask():
    with pytest.raises(TypeError, match="block_mask must be a torch.nn.attention.flex_attention.BlockMask, got Tensor"):
        flex.tile_kinds(torch.ones(4, 4, dtype=torch.bool))
