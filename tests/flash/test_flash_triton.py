"""The Triton FlashAttention kernels against float64 math, by the FlashAttention rule.

Without a GPU these run the same kernel source through Triton's interpreter. The rule
(from the FlashAttention test suite): the kernel's error against a float64 reference is at
most a small multiple of the error of plain PyTorch attention computed in the same dtype,
plus a small floor, for the output, the log-sum-exp and each gradient.
"""


import pytest
import torch

pytest.importorskip("triton")

# On a GPU, each kernel in its default configuration: one compilation per specialisation, not one
# per autotuning candidate (autotuning is tested in test_flash_configs.py).
from gpu_setup import pinned_configs  # noqa: E402, F401

from attn_course.flash import launch  # noqa: E402
from attn_course.flash.configs import SUPPORTED_HEAD_DIMS  # noqa: E402
from attn_course.flash.triton_attention import attention_backward, attention_forward, flash_attention  # noqa: E402

from support.flash_rule import DEVICE, DTYPES, assert_flash_rule  # noqa: E402
from support.flash_rule import random_inputs as grouped_inputs  # noqa: E402


def random_inputs(batch, heads, n_q, n_k, head_dim, dtype, *, seed=0, logit_scale=1.0):
    """Multi-head inputs (as many key/value heads as query heads)."""
    return grouped_inputs(batch, heads, heads, n_q, n_k, head_dim, dtype, seed=seed, logit_scale=logit_scale)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [1, 17, 200])
def test_matches_float64_by_the_flash_rule(length, causal, dtype):
    assert_flash_rule(*random_inputs(2, 3, length, length, 64, dtype), causal=causal)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_long_sequence(causal):
    # 1030: 17 key tiles, the last one with only 6 real keys.
    assert_flash_rule(*random_inputs(1, 1, 1030, 1030, 64, DTYPES[0], seed=1), causal=causal)


@pytest.mark.parametrize("n_q, n_k", [(17, 200), (130, 5)])
def test_queries_and_keys_of_different_lengths(n_q, n_k):
    assert_flash_rule(*random_inputs(1, 2, n_q, n_k, 32, DTYPES[0], seed=2), causal=False)


@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_every_supported_head_dim(head_dim):
    assert_flash_rule(*random_inputs(1, 2, 70, 70, head_dim, DTYPES[0], seed=3), causal=True)


def test_logits_scaled_by_50_stay_exact():
    # Very peaked softmax: exp would overflow without the running maximum.
    assert_flash_rule(*random_inputs(1, 2, 150, 150, 64, DTYPES[0], seed=4, logit_scale=50.0), causal=False)


def test_non_contiguous_inputs_and_gradient():
    q, k, v, grad_out = random_inputs(2, 3, 90, 90, 32, DTYPES[0], seed=5)

    def strided(t):   # same values, laid out [B, N, H, d] and viewed as [B, H, N, d]
        return t.transpose(1, 2).contiguous().transpose(1, 2)

    q, k, v, grad_out = map(strided, (q, k, v, grad_out))
    assert not q.is_contiguous() and not grad_out.is_contiguous()
    assert_flash_rule(q, k, v, grad_out, causal=True)


def test_every_element_is_written():
    q, k, v, grad_out = random_inputs(2, 2, 67, 67, 16, DTYPES[0], seed=6)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    attention_forward(q, k, v, causal=True, out=out, lse=lse)
    assert not out.isnan().any() and not lse.isnan().any()
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    attention_backward(grad_out, q, k, v, out, lse, causal=True,
                       grad_q=grads[0], grad_k=grads[1], grad_v=grads[2])
    assert not any(g.isnan().any() for g in grads)
    reference = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert (out.double() - reference).abs().max() < 5e-3


def test_matches_sdpa_and_returns_a_tensor_with_a_graph():
    q, k, v, _ = random_inputs(1, 2, 40, 40, 64, DTYPES[0], seed=7)
    q.requires_grad_()
    out = flash_attention(q, k, v, causal=True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.requires_grad
    reference = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(out.float(), reference, atol=2e-3, rtol=0)


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter note is for machines without a GPU")
def test_interpreter_note_is_printed_once(monkeypatch, capsys):
    monkeypatch.setattr(launch, "_mode_note_shown", False)
    q = torch.randn(1, 1, 4, 16)
    flash_attention(q, q, q)
    flash_attention(q, q, q)
    note = capsys.readouterr().err
    assert note.count("Triton's interpreter") == 1


def _inputs(n_q=8, n_k=8, head_dim=16, dtype=None):
    dtype = dtype or DTYPES[0]
    return (torch.randn(1, 2, n_q, head_dim, dtype=dtype, device=DEVICE),
            torch.randn(1, 2, n_k, head_dim, dtype=dtype, device=DEVICE),
            torch.randn(1, 2, n_k, head_dim, dtype=dtype, device=DEVICE))


@pytest.mark.parametrize("change, error, message", [
    (lambda q, k, v: (q[..., :8], k[..., :8], v[..., :8]), ValueError, "head dimension d must be one of"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), TypeError, "dtype must be one of"),
    (lambda q, k, v: (q, k.float() if q.dtype != torch.float32 else k.half(), v), TypeError, "dtype"),
    (lambda q, k, v: (q[0], k[0], v[0]), ValueError, r"q must be 4-D \[B, H, N, d\]"),
    (lambda q, k, v: (q, k, v[:, :, :3]), ValueError, "v must have k.s shape"),
    (lambda q, k, v: (q, k[:1], v[:1]) if q.shape[0] > 1 else (q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)),
     ValueError, "same B and d"),
    (lambda q, k, v: (q[:, :1], k, v), ValueError, "H % H_kv == 0"),
    (lambda q, k, v: (q[:, :, :0], k, v), ValueError, "at least 1"),
    (lambda q, k, v: (q.tolist(), k, v), TypeError, "q must be"),
    (lambda q, k, v: (q, k.to("meta"), v), ValueError, "device"),
])
def test_clear_errors(change, error, message):
    with pytest.raises(error, match=message):
        flash_attention(*change(*_inputs()))


def test_bfloat16_is_refused_in_the_interpreter():
    if not launch.runs_in_interpreter():
        pytest.skip("bfloat16 is supported on a GPU")
    with pytest.raises(TypeError, match="bfloat16.*interpreter|interpreter.*bfloat16"):
        flash_attention(*_inputs(dtype=torch.bfloat16))


def test_causal_needs_no_more_queries_than_keys_and_scale_must_be_positive():
    with pytest.raises(ValueError, match=r"causal needs N_q <= N_k.*got N_q=8, N_k=4"):
        flash_attention(*_inputs(n_q=8, n_k=4), causal=True)
    with pytest.raises(ValueError, match="scale"):
        flash_attention(*_inputs(), scale=-1.0)
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_attention(*_inputs(), causal=1)
