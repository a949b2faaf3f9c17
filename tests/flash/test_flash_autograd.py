"""The PyTorch FlashAttention backward (TiledAttentionFunction), against float64 math and SDPA."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attn_course import self_attention
from attn_course.flash import TiledAttentionFunction, tiled_attention, tiled_attention_backward
from attn_course.measure.memory import peak_memory


def float64_gradients(q, k, v, grad_out, causal, grad_lse=None):
    """Output, log-sum-exp and gradients of attention written out in float64, through autograd."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    lse = torch.logsumexp(scores, dim=-1)
    loss = (out * grad_out.double()).sum()
    if grad_lse is not None:
        loss = loss + (lse * grad_lse.double()).sum()
    loss.backward()
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("batch", "heads", "n", "block_q", "block_k"),
                         [(1, 1, 1, 64, 64), (2, 3, 77, 32, 16), (1, 2, 200, 64, 48), (3, 1, 129, 128, 64)])
def test_gradients_match_float64_math_and_sdpa(causal, batch, heads, n, block_q, block_k):
    generator = torch.Generator().manual_seed(n + batch)
    q, k, v, grad_out = (torch.randn(batch, heads, n, 24, generator=generator) for _ in range(4))
    ours = leaves(q, k, v)
    out = tiled_attention(*ours, causal=causal, block_q=block_q, block_k=block_k)
    out.backward(grad_out)
    sdpa = leaves(q, k, v)
    F.scaled_dot_product_attention(*sdpa, is_causal=causal).backward(grad_out)
    exact = float64_gradients(q, k, v, grad_out, causal)
    for name, mine, theirs, truth in zip("qkv", ours, sdpa, exact[2:]):
        sdpa_error = (theirs.grad.double() - truth).abs().max().item()
        error = (mine.grad.double() - truth).abs().max().item()
        assert error <= 3 * sdpa_error + 1e-6, f"d{name}: {error:.1e} against SDPA's {sdpa_error:.1e}"


def test_keys_longer_than_queries_and_a_custom_scale():
    generator = torch.Generator().manual_seed(3)
    q, grad_out = torch.randn(2, 2, 30, 8, generator=generator), torch.randn(2, 2, 30, 5, generator=generator)
    k, v = torch.randn(2, 2, 70, 8, generator=generator), torch.randn(2, 2, 70, 5, generator=generator)
    ours, sdpa = leaves(q, k, v), leaves(q, k, v)
    tiled_attention(*ours, scale=0.3, block_q=16, block_k=32).backward(grad_out)
    F.scaled_dot_product_attention(*sdpa, scale=0.3).backward(grad_out)
    for mine, theirs in zip(ours, sdpa):
        assert torch.allclose(mine.grad, theirs.grad, atol=1e-5)


def test_gradcheck_in_float64_including_the_log_sum_exp():
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 11, 4, generator=generator, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    for causal in (False, True):
        assert torch.autograd.gradcheck(lambda a, b, c, causal=causal: TiledAttentionFunction.apply(
            a, b, c, causal, None, 4, 3), (q, k, v))


def test_gradient_through_the_log_sum_exp_matches_float64():
    generator = torch.Generator().manual_seed(9)
    q, k, v, grad_out = (torch.randn(1, 2, 45, 8, generator=generator) for _ in range(4))
    grad_lse = torch.randn(1, 2, 45, generator=generator)
    ours = leaves(q, k, v)
    out, lse = tiled_attention(*ours, causal=True, block_q=16, block_k=16, return_lse=True)
    ((out * grad_out).sum() + (lse * grad_lse).sum()).backward()
    exact = float64_gradients(q, k, v, grad_out, True, grad_lse)
    for mine, truth in zip(ours, exact[2:]):
        assert (mine.grad.double() - truth).abs().max() < 1e-5


def test_saves_only_inputs_output_and_log_sum_exp():
    q, k, v = (torch.randn(1, 2, 300, 16, requires_grad=True) for _ in range(3))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        tiled_attention(q, k, v, causal=True, block_q=64, block_k=64)
    assert saved and all(300 * 300 not in (math.prod(shape), shape[-1] * shape[-2] if len(shape) > 1 else 0)
                         for shape in saved)
    assert sorted(math.prod(shape) for shape in saved) == [600] + [9600] * 4   # lse, then q, k, v, O


def test_no_grad_path_is_unchanged_and_builds_no_graph():
    q, k, v = (torch.randn(1, 1, 40, 8, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        out = tiled_attention(q, k, v, block_q=16, block_k=16)
    assert out.grad_fn is None
    assert isinstance(tiled_attention(q, k, v).grad_fn, type(TiledAttentionFunction.apply(q, k, v)[0].grad_fn))


def test_training_memory_is_linear_in_n_and_far_below_naive():
    def forward_backward(fn, n, **options):
        q, k, v = (torch.randn(1, 1, n, 32, requires_grad=True) for _ in range(3))

        def run():
            out = fn(q, k, v, **options)
            out = out[0] if isinstance(out, tuple) else out
            out.backward(torch.ones_like(out))
        return peak_memory(run)[1]

    tiled = [forward_backward(tiled_attention, n, block_q=64, block_k=64) for n in (512, 1024)]
    naive = forward_backward(self_attention, 1024)
    assert tiled[1] < 2.5 * tiled[0]          # ×2 per doubling of N, plus tiles
    assert naive > 10 * tiled[1]


@pytest.mark.parametrize(("changes", "error", "message"), [
    ({"lse": torch.zeros(1, 1, 5)}, ValueError, r"lse must be \[1, 1, 4\]"),
    ({"grad_output": "g"}, TypeError, r"grad_output must be a torch.Tensor"),
    ({"output": torch.zeros(1, 1, 4, 3)}, ValueError, r"output must be \[1, 1, 4, 8\]"),
    ({"block_k": 0}, ValueError, r"block_k must be >= 1"),
])
def test_backward_rejects_bad_input(changes, error, message):
    q = torch.randn(1, 1, 4, 8)
    arguments = {"q": q, "k": q, "v": q, "output": q, "lse": torch.zeros(1, 1, 4), "grad_output": q, **changes}
    with pytest.raises(error, match=r"^tiled_attention_backward: " + message):
        tiled_attention_backward(**arguments)
