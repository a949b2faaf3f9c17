"""attn_course.distributed.ring: ring attention on real processes (gloo) against single-process attention.

Each world size runs in one launch whose ranks loop over every configuration (layout × causal),
so the file costs a few launches: outputs and gradients are gathered with ``unshard`` and
compared with :func:`~attn_course.core.attention.self_attention` and autograd on the full tensors;
the work and the bytes each rank did, counted from outside by the taps of
:mod:`attn_course.measure.distributed.taps`, are compared with formulas written out here.
"""

from __future__ import annotations

import contextlib
import functools
from unittest import mock

import pytest
import torch

from attn_course import self_attention
from attn_course.distributed import communication, launch, ring_attention, ring_work, shard, unshard
from attn_course.distributed import ring as ring_module
from attn_course.measure.distributed.taps import count_ring_work, count_traffic

B, H, N, D = 1, 2, 24, 8                          # N = 24 splits into 2P chunks for P = 2, 3, 4
LAYOUT_NAMES = ("contiguous", "zigzag", "striped")
CONFIGS = [(layout, causal) for layout in LAYOUT_NAMES for causal in (False, True)]
WORLD_SIZES = [2, 3, 4]


def full_tensors(seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, D, generator=generator) for _ in range(4))     # q, k, v, dO


def grouped_tensors() -> tuple[torch.Tensor, ...]:
    """q and dO with 4 heads, k and v with 2 (grouped-query attention, G = 2), seeded."""
    generator = torch.Generator().manual_seed(2)
    return tuple(torch.randn(B, heads, N, D, generator=generator) for heads in (4, 2, 2, 4))


def close(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    """helpers.close, written out: the ranks import this module, and helpers would bring hypothesis."""
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


def forgetful_merge(out_a, lse_a, out_b, lse_b):
    """A planted bug: the merged lse is right, but out_b is added without its weight exp(lse_b - lse)."""
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse).nan_to_num(0.0).unsqueeze(-1) * out_a + out_b, lse


# --- what every rank runs (top-level functions: the launched processes import them by name) ----------

def ring_cases(rank: int, world_size: int, q, k, v, grad_out) -> dict:
    """Every configuration on this rank: output, gradients, work and bytes, plus the planted merge."""
    results = {}
    for layout, causal in CONFIGS:
        parts = [shard(t, rank, world_size, layout).requires_grad_() for t in (q, k, v)]
        with count_ring_work() as work:
            with count_traffic() as forward_traffic:
                out = ring_attention(*parts, causal=causal, layout=layout)
            with count_traffic() as backward_traffic:
                # sum(out ∘ dO) backpropagates dO; out.backward(dO) would import sympy (2 s a process).
                (out * shard(grad_out, rank, world_size, layout)).sum().backward()
        results[layout, causal] = dict(out=out.detach(), grads=[p.grad for p in parts], work=work,
                                       forward_bytes=forward_traffic.bytes_sent,
                                       backward_bytes=backward_traffic.bytes_sent)
    for layout, causal in CONFIGS:                  # grouped-query attention: 4 query heads read 2 K/V heads
        q4, k2, v2, g4 = grouped_tensors()
        parts = [shard(t, rank, world_size, layout).requires_grad_() for t in (q4, k2, v2)]
        with count_traffic() as forward_traffic:
            out = ring_attention(*parts, causal=causal, layout=layout)
        with count_traffic() as backward_traffic:
            (out * shard(g4, rank, world_size, layout)).sum().backward()
        results["grouped", layout, causal] = dict(out=out.detach(), grads=[p.grad for p in parts],
                                                  forward_bytes=forward_traffic.bytes_sent,
                                                  backward_bytes=backward_traffic.bytes_sent)
    results["order"] = order_of_events(rank, world_size, q, k, v)
    with mock.patch.object(ring_module, "merge_attention_outputs", forgetful_merge):
        for layout, causal in CONFIGS:
            parts = [shard(t, rank, world_size, layout) for t in (q, k, v)]
            results["planted", layout, causal] = ring_attention(*parts, causal=causal, layout=layout)
    return results


def order_of_events(rank: int, world_size: int, q, k, v) -> list[str]:
    """What one contiguous forward does, in order: "pass" (a transfer started), "attend" (a block
    attended to), "wait" (a transfer completed)."""
    events = []
    real_pass, real_attend = communication.pass_around_ring, ring_module.attend_to_block

    def recording_pass(tensors, **options):
        transfer = real_pass(tensors, **options)
        events.append("pass")
        real_wait = transfer.wait
        transfer.wait = lambda: (events.append("wait"), real_wait())[1]
        return transfer

    def recording_attend(*args):
        events.append("attend")
        return real_attend(*args)

    with mock.patch.object(communication, "pass_around_ring", recording_pass), \
            mock.patch.object(ring_module, "attend_to_block", recording_attend):
        ring_attention(*[shard(t, rank, world_size) for t in (q, k, v)])
    return events


def ring_with_a_wrong_dtype_on_the_last_rank(rank: int, world_size: int, q, k, v) -> torch.Tensor:
    """The last rank passes float64 keys and raises; the others wait in the ring for its blocks."""
    parts = [shard(t, rank, world_size) for t in (q, k, v)]
    if rank == world_size - 1:
        parts[1] = parts[1].double()
    return ring_attention(*parts)


HALF_DTYPES = (torch.bfloat16, torch.float16)
HALF_N = 96                                       # longer rows than N: rounding errors have room to add up


def recording_pass(sent: list, real_pass, tensors, **options):
    """pass_around_ring, noting the dtype of every tensor it sends."""
    sent.extend(t.dtype for t in tensors)
    return real_pass(tensors, **options)


def half_precision_cases(rank: int, world_size: int, q, k, v, grad_out) -> dict:
    """Causal ring attention in bfloat16 and float16 (every layout), as the library runs it and with
    its accumulators left in the input's dtype (a planted fault); outputs and gradients, and the
    dtype of every tensor the ring sent."""
    results = {}
    for dtype in HALF_DTYPES:
        for layout in LAYOUT_NAMES:
            for accumulate in ("float32", "input"):
                patch = (mock.patch.object(ring_module, "accumulation_dtype", lambda dtype: dtype)
                         if accumulate == "input" else contextlib.nullcontext())
                parts = [shard(t, rank, world_size, layout).to(dtype).requires_grad_() for t in (q, k, v)]
                sent: list[torch.dtype] = []
                recording = functools.partial(recording_pass, sent, communication.pass_around_ring)
                with patch, mock.patch.object(communication, "pass_around_ring", recording):
                    out = ring_attention(*parts, causal=True, layout=layout)
                    (out * shard(grad_out, rank, world_size, layout).to(dtype)).sum().backward()
                results[dtype, layout, accumulate] = dict(
                    out=out.detach(), grads=[p.grad for p in parts], sent=sent)
    return results


@functools.cache
def gathered_half(world_size: int) -> dict:
    generator = torch.Generator().manual_seed(1)
    q, k, v, grad_out = (torch.randn(B, H, HALF_N, D, generator=generator) for _ in range(4))
    return {"ranks": launch(half_precision_cases, world_size, q, k, v, grad_out), "inputs": (q, k, v, grad_out)}


@functools.cache
def gathered(world_size: int) -> dict:
    """One launch per world size; every rank's results, in rank order."""
    q, k, v, grad_out = full_tensors()
    return {"ranks": launch(ring_cases, world_size, q, k, v, grad_out), "inputs": (q, k, v, grad_out)}


def reference(q, k, v, grad_out, causal):
    """Single-process attention on the full tensors and its gradients (autograd)."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    mask = torch.ones(N, N, dtype=torch.bool).tril() if causal else None          # True = may attend
    out, _ = self_attention(*leaves, mask)
    out.backward(grad_out)
    return out.detach(), [leaf.grad for leaf in leaves]


# --- outputs and gradients --------------------------------------------------------------------------

@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_outputs_and_gradients_equal_single_process_attention(world_size):
    run = gathered(world_size)
    for layout, causal in CONFIGS:
        ranks = [result[layout, causal] for result in run["ranks"]]
        expected_out, expected_grads = reference(*run["inputs"], causal)
        close(unshard([r["out"] for r in ranks], layout), expected_out, 1e-5)
        for index, expected in enumerate(expected_grads):                         # dq, dk, dv
            close(unshard([r["grads"][index] for r in ranks], layout), expected, 1e-5)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_grouped_query_attention_equals_sdpa_and_sends_only_the_kv_heads(world_size):
    """Reference: PyTorch's SDPA with enable_gqa on the full tensors; bytes: H_kv = 2 heads travel, not 4."""
    q, k, v, grad_out = grouped_tensors()
    block = B * 2 * (N // world_size) * D * 4                                # one K shard of 2 heads, float32
    for layout, causal in CONFIGS:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        expected = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)
        expected.backward(grad_out)
        ranks = [result["grouped", layout, causal] for result in gathered(world_size)["ranks"]]
        close(unshard([r["out"] for r in ranks], layout), expected.detach(), 1e-5)
        for index, leaf in enumerate(leaves):                                 # dq [.., 4 heads], dk, dv [.., 2]
            close(unshard([r["grads"][index] for r in ranks], layout), leaf.grad, 1e-5)
        for r in ranks:
            assert r["forward_bytes"] == 2 * (world_size - 1) * block
            assert r["backward_bytes"] == (2 * (world_size - 1) + 2 * world_size) * block


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_a_merge_that_forgets_to_rescale_fails_the_comparison(world_size):
    run = gathered(world_size)
    for layout, causal in CONFIGS:
        planted = unshard([result["planted", layout, causal] for result in run["ranks"]], layout)
        expected_out, _ = reference(*run["inputs"], causal)
        with pytest.raises(AssertionError):
            close(planted, expected_out, 1e-5)
        assert (planted - expected_out).abs().max() > 0.1


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_each_step_starts_passing_its_block_on_before_attending_to_it(world_size):
    expected = ["pass", "attend", "wait"] * (world_size - 1) + ["attend"]       # the last block goes nowhere
    assert [result["order"] for result in gathered(world_size)["ranks"]] == [expected] * world_size


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected).norm() / expected.norm()).item()


def sdpa_errors(q, k, v, grad_out, dtype, expected_out, expected_grads) -> list[float]:
    """PyTorch's own attention run in ``dtype`` on the same inputs: the error to expect of that precision."""
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
    (out * grad_out.to(dtype)).sum().backward()
    return [relative_error(out, expected_out)] + [
        relative_error(leaf.grad, grad) for leaf, grad in zip(leaves, expected_grads)]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_half_precision_accumulates_in_float32_as_accurate_as_sdpa_in_that_precision(world_size):
    """bf16/fp16 inputs: output and gradients within 2x of SDPA's error in the same precision, against
    float64 attention on the same rounded inputs; K/V travel in the input's dtype, dK/dV sums in float32.
    Left in the input's dtype (the planted fault), the sums miss that bound: the test has teeth."""
    run = gathered_half(world_size)
    q, k, v, grad_out = run["inputs"]
    for dtype in HALF_DTYPES:
        rounded = [t.to(dtype).double() for t in (q, k, v, grad_out)]          # the inputs both sides see
        leaves = [t.clone().requires_grad_() for t in rounded[:3]]
        mask = torch.ones(HALF_N, HALF_N, dtype=torch.bool).tril()
        expected_out, _ = self_attention(*leaves, mask)
        expected_out.backward(rounded[3])
        expected_grads = [leaf.grad for leaf in leaves]
        sdpa = sdpa_errors(*rounded, dtype, expected_out.detach(), expected_grads)
        for layout in LAYOUT_NAMES:
            errors = {}
            for accumulate in ("float32", "input"):
                ranks = [result[dtype, layout, accumulate] for result in run["ranks"]]
                outs = unshard([r["out"] for r in ranks], layout)
                assert outs.dtype == dtype
                errors[accumulate] = [relative_error(outs, expected_out.detach())] + [
                    relative_error(unshard([r["grads"][i] for r in ranks], layout), expected_grads[i])
                    for i in range(3)]
            ours, planted = errors["float32"], errors["input"]
            context = f"{dtype} {layout} P={world_size}: ours {ours}, planted {planted}, SDPA {sdpa}"
            assert all(e <= 2 * s for e, s in zip(ours, sdpa)), context
            assert any(e > 2 * s for e, s in zip(planted, sdpa)), context
            sent = [d for r in run["ranks"] for d in r[dtype, layout, "float32"]["sent"]]
            assert set(sent) == {dtype, torch.float32}, sent          # K/V in the input's dtype, dK/dV sums in float32


# --- work and traffic ---------------------------------------------------------------------------------

def chunks_of(rank: int, world_size: int, layout: str) -> list[int]:
    return [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]


def pairs_by_chunk_ids(world_size: int, layout: str, causal: bool) -> list[int]:
    """Chunk pairs each rank must compute, from chunk ids alone: a query chunk sees the key chunks
    with a smaller or equal id (chunks are equal and in sequence order), all of them without a mask."""
    counts = []
    for rank in range(world_size):
        keys = [c for source in range(world_size) for c in chunks_of(source, world_size, layout)]
        counts.append(sum(1 for cq in chunks_of(rank, world_size, layout) for ck in keys if not causal or ck <= cq))
    return counts


def chunk_positions_by_hand(rank: int, world_size: int, n: int, layout: str) -> list[list[int]]:
    """The positions of each chunk a rank holds, from the layouts' definitions (not layout.py)."""
    if layout == "striped":
        return [list(range(rank, n, world_size))]                         # token i on rank i mod P: one stripe
    length = n // (world_size if layout == "contiguous" else 2 * world_size)
    return [list(range(c * length, (c + 1) * length)) for c in chunks_of(rank, world_size, layout)]


def work_by_positions(world_size: int, layout: str, causal: bool) -> list[dict]:
    """Per rank, the ring's steps written out from token positions: rank r holds rank (r - s) mod P's
    block at step s; a (query chunk, key chunk) pair is computed when any key is visible to any query
    (``key <= query``), masked when some but not all are, and counts rows × cols score elements."""
    result = []
    for rank in range(world_size):
        computed = masked = 0
        scores_by_step = []
        for step in range(world_size):
            source = (rank - step) % world_size
            scores = 0
            for queries in chunk_positions_by_hand(rank, world_size, N, layout):
                for keys in chunk_positions_by_hand(source, world_size, N, layout):
                    visible = [not causal or key <= query for query in queries for key in keys]
                    if any(visible):
                        computed += 1
                        masked += not all(visible)
                        scores += len(queries) * len(keys)
            scores_by_step.append(scores)
        result.append(dict(computed=computed, masked=masked, scores_by_step=scores_by_step))
    return result


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_measured_work_equals_ring_work_contiguous_is_imbalanced_zigzag_and_striped_are_not(world_size):
    run = gathered(world_size)
    for layout, causal in CONFIGS:
        works = [result[layout, causal]["work"] for result in run["ranks"]]
        predicted = ring_work(world_size, layout, causal)
        by_hand = work_by_positions(world_size, layout, causal)
        if layout != "striped":
            assert predicted == pairs_by_chunk_ids(world_size, layout, causal)
        assert predicted == [r["computed"] for r in by_hand]
        assert [w.forward for w in works] == predicted
        assert [w.backward for w in works] == predicted                      # the backward visits the same pairs
        chunks_per_rank = 2 if layout == "zigzag" else 1
        assert [w.forward + w.skipped for w in works] == [world_size * chunks_per_rank ** 2] * world_size
        diagonal = (world_size if layout == "striped" else chunks_per_rank) if causal else 0   # pairs with a mask
        assert [w.masked for w in works] == [diagonal] * world_size == [r["masked"] for r in by_hand]
        assert [w.forward_scores_by_step for w in works] == [r["scores_by_step"] for r in by_hand]
        assert all(len(w.forward_seconds_by_step) == world_size for w in works)    # timed, not checked
    assert ring_work(world_size, "contiguous", True) == list(range(1, world_size + 1))      # rank P - 1: P times rank 0
    assert ring_work(world_size, "zigzag", True) == [2 * world_size + 1] * world_size       # balanced
    assert ring_work(world_size, "striped", True) == [world_size] * world_size              # balanced, all masked


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_bytes_sent_per_rank_follow_the_ring_formulas(world_size):
    n_local, element = N // world_size, 4                                    # float32
    block = B * H * n_local * D * element                                    # one K (or V, dK, dV) shard
    for layout, causal in CONFIGS:
        for result in gathered(world_size)["ranks"]:
            traffic = result[layout, causal]
            assert traffic["forward_bytes"] == 2 * (world_size - 1) * block        # K and V, P - 1 hops
            assert traffic["backward_bytes"] == (2 * (world_size - 1) + 2 * world_size) * block   # + dK, dV, P hops


# --- failures -----------------------------------------------------------------------------------------

def test_a_rank_that_raises_ends_the_run_with_its_error():
    q, k, v, _ = full_tensors()
    with pytest.raises(TypeError, match="must share one dtype"):
        launch(ring_with_a_wrong_dtype_on_the_last_rank, 2, q, k, v, timeout=60)


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda x: ring_attention(x, x.double(), x), TypeError, "dtype"),
        (lambda x: ring_attention(x, x[:, :, :4], x[:, :, :4]), ValueError, "cut from the sequence the same way"),
        (lambda x: ring_attention(torch.randn(1, 3, 6, 8), x, x), ValueError, "H divisible by H_kv.*H=3.*H_kv=2"),
        (lambda x: ring_attention(x[0], x, x), ValueError, "q must be 4-D"),
        (lambda x: ring_attention(x.long(), x, x), TypeError, "floating"),
        (lambda x: ring_attention(x[:, :, :5], x[:, :, :5], x[:, :, :5], layout="zigzag"), ValueError,
         "even N_local.*N_local=5"),
        (lambda x: ring_attention(x, x, x, layout="diagonal"), ValueError, "layout must be one of"),
        (lambda x: ring_work(2, "Striped", True), ValueError, "layout must be one of"),
        (lambda x: ring_attention(*(x[:, :, :0],) * 3), ValueError, "at least one token"),
        (lambda x: ring_attention(x, x, x, causal=1), TypeError, "causal must be a bool"),
        (lambda x: ring_attention(x, x, x), RuntimeError, "no process group"),
        (lambda x: shard(torch.randn(1, 2, 12, 8), 0, 4, "zigzag"), ValueError, "N=12 must be divisible by 8"),
        (lambda x: ring_work(0, "zigzag", True), ValueError, "world_size"),
    ],
)
def test_bad_inputs_are_rejected_naming_the_argument(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call(torch.randn(1, 2, 6, 8))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_striped_blocks_are_a_triangle_with_its_diagonal_from_ranks_up_to_this_one_without_from_later(world_size):
    """ring_work's docstring, counted from positions: at a step holding rank t's block, rank r sees
    L (L + 1) / 2 scores when t <= r and L (L - 1) / 2 when t > r (L = N / P); none is all hidden."""
    length = N // world_size
    for rank in range(world_size):
        queries = chunk_positions_by_hand(rank, world_size, N, "striped")[0]
        for source in range(world_size):
            keys = chunk_positions_by_hand(source, world_size, N, "striped")[0]
            visible = sum(key <= query for query in queries for key in keys)
            assert visible == (length * (length + 1) // 2 if source <= rank else length * (length - 1) // 2)
