"""Chapter 10's exercise checks: the solutions pass, each known mistake gets its own hint, and what the
exercises claim (the bytes against count_traffic, the buggy merge with zero scores, the critical paths)
holds."""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import pytest
import torch

from attn_course.checks import CheckFailed
from attn_course.checks.distributed import check_ring_by_hand, check_ulysses_exchange, check_visible_pairs_by_step
from attn_course.checks.distributed_bytes import check_bytes_sent_per_rank
from attn_course.distributed import launch
from attn_course.distributed.layout import token_positions
from attn_course.measure.distributed.ranks import attention_on_rank


def hint(check, fn) -> str:
    with pytest.raises(CheckFailed) as failed:
        check(fn)
    return str(failed.value)


# --- the all-to-all's messages ----------------------------------------------------------------------------

def exchange(shards, *, cut="heads", transposed=False, own_heads=False, order=None, kept=False, pieces=None,
             element=True):
    """The solution, with one mistake switched on by a keyword."""
    p, h = len(shards), shards[0].shape[1] // len(shards)
    if cut == "tokens":
        sent = [list(shard.chunk(p, dim=2)) for shard in shards]
    elif cut == "interleaved":
        sent = [[shard[:, s::p] for s in range(p)] for shard in shards]
    else:
        sent = [[shards[s if transposed else r][:, (r if transposed or own_heads else s) * h:][:, :h]
                 for s in range(p)] for r in range(p)]
    order = order or (lambda r, s: s)
    received = [torch.cat([sent[order(r, s) % p][r] for s in range(p)], dim=2) for r in range(p)]
    size = (lambda t: t.numel() * t.element_size()) if element else (lambda t: t.numel())
    bytes_sent = [sum(size(t) for s, t in enumerate(row) if kept or s != r) for r, row in enumerate(sent)]
    if pieces is not None:
        bytes_sent = [pieces * size(row[0]) for row in sent]
    return sent, received, bytes_sent


def test_exchange_solution_passes():
    assert check_ulysses_exchange(exchange)


def with_received(received_fn):
    def fn(shards):
        sent, _, bytes_sent = exchange(shards)
        return sent, received_fn(shards, sent), bytes_sent
    return fn


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (functools.partial(exchange, cut="tokens"), "cut the shard along the tokens"),
        (functools.partial(exchange, transposed=True), "that is what rank s sends to rank r"),
        (functools.partial(exchange, own_heads=True), "sends every rank its own heads"),
        (functools.partial(exchange, cut="interleaved"), "heads r, r + P"),
        (with_received(lambda shards, sent: shards), "still holds a slice of the sequence"),
        (with_received(lambda shards, sent: [sent[r][r] for r in range(len(shards))]), "only has its own tokens"),
        (functools.partial(exchange, order=lambda r, s: -1 - s), "not in sequence order"),          # reversed
        (functools.partial(exchange, order=lambda r, s: r - s), "not in sequence order"),           # as a ring
        (with_received(lambda shards, sent: [torch.cat(shards, 2)[:, r::len(shards)] for r in range(len(shards))]),
         "heads r, r + P"),
        (functools.partial(exchange, kept=True), "include the piece a rank keeps"),
        (functools.partial(exchange, pieces=1), "You counted one piece"),
        (functools.partial(exchange, element=False), "You counted elements, not bytes"),
        (lambda shards: (*exchange(shards)[:2], [8 * b for b in exchange(shards)[2]]), "8 bits in a byte"),
        (lambda shards: (*exchange(shards)[:2], [b + 1 for b in exchange(shards)[2]]), "expected"),
        (lambda shards: (*exchange(shards)[:2], ["many"] * len(shards)), "a number of bytes"),
        (lambda shards: exchange(shards)[1], "three things"),
        (lambda shards: (exchange(shards)[1], *exchange(shards)[1:]), "a list of"),
        (lambda shards: (*exchange(shards)[:1], exchange(shards)[1][:-1], exchange(shards)[2]), "one per rank"),
        (lambda shards: ..., "returns nothing yet"),
    ],
)
def test_exchange_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_ulysses_exchange, fn)


def test_exchange_refuses_the_course_layouts():
    from attn_course.distributed.layout import unshard

    def joined_by_unshard(shards):
        sent, _, bytes_sent = exchange(shards)
        return sent, [unshard([row[r] for row in sent]) for r in range(len(shards))], bytes_sent

    assert "calls unshard, which this exercise forbids" in hint(check_ulysses_exchange, joined_by_unshard)


# --- bytes per rank ---------------------------------------------------------------------------------------

def sent(method, batch, heads, kv_heads, n, head_dim, world_size, bytes_per_element, backward, *,
         kv_at_h=False, ring_hops=None, sum_bytes=None, sum_hops=None, ulysses_heads=None, forget=False, bits=False):
    """The solution, with one mistake switched on by a keyword."""
    p, e = world_size, bytes_per_element
    s_q = batch * heads * (n // p) * head_dim
    s_kv = batch * (heads if kv_at_h else kv_heads) * (n // p) * head_dim
    backward = backward and not forget
    if method == "ring":
        hops = p - 1 if ring_hops is None else ring_hops
        total = 2 * hops * s_kv * e
        if backward:
            total += 2 * hops * s_kv * e + 2 * (p if sum_hops is None else sum_hops) * s_kv * (sum_bytes or max(e, 4))
    else:
        q_side, kv_side = (s_q, s_kv) if ulysses_heads is None else ulysses_heads(s_q, s_kv)
        total = (p - 1) * (2 * q_side + 2 * kv_side) * e // p * (2 if backward else 1)
    return 8 * total if bits else total


def test_bytes_solution_passes():
    assert check_bytes_sent_per_rank(sent)


def traffic(world_size, heads, kv_heads, dtype):
    """Bytes rank 0 sends, measured by count_traffic on real ranks: {(method, backward): bytes}."""
    generator = torch.Generator().manual_seed(5)
    q, grad_out = (torch.randn(1, heads, 16, 4, generator=generator).to(dtype) for _ in range(2))
    k, v = (torch.randn(1, kv_heads, 16, 4, generator=generator).to(dtype) for _ in range(2))
    measured = {}
    for method in ("ring", "ulysses"):
        (rank0, *_) = launch(functools.partial(attention_on_rank, method=method, grad_out=grad_out), world_size,
                             q, k, v, timeout=60)
        measured[method, False] = rank0["forward_bytes"]
        measured[method, True] = rank0["forward_bytes"] + rank0["backward_bytes"]
    return measured


@pytest.mark.slow
@pytest.mark.parametrize("world_size, heads, kv_heads, dtype", [(2, 8, 2, torch.bfloat16), (4, 8, 4, torch.float32)])
def test_bytes_solution_is_what_the_ranks_send(world_size, heads, kv_heads, dtype):
    # The formulas the check writes out (the solution here), against the course's ring and Ulysses measured
    # with count_traffic: grouped-query heads, half precision (dK and dV travel in float32) and float32.
    e = torch.empty((), dtype=dtype).element_size()
    measured = traffic(world_size, heads, kv_heads, dtype)
    assert measured == {(method, backward): sent(method, 1, heads, kv_heads, 16, 4, world_size, e, backward)
                        for method in ("ring", "ulysses") for backward in (False, True)}


def test_llama_3_crossovers_are_what_the_solution_says():
    # Llama 3 8B's attention (32 query heads, 8 K/V heads, d = 128) in bfloat16, N = 2^20: forward,
    # ring / Ulysses = P·H_kv / (H + H_kv) = P / 5, so the ring sends less for P = 2 and 4; in training
    # the float32 dK/dV sums make the ring send more at every P, by P(2P - 1) / (5(P - 1)).
    for p in (2, 4, 8):
        ring, ulysses = (Fraction(sent(m, 1, 32, 8, 2**20, 128, p, 2, False)) for m in ("ring", "ulysses"))
        assert ring / ulysses == Fraction(p, 5)
        ring, ulysses = (Fraction(sent(m, 1, 32, 8, 2**20, 128, p, 2, True)) for m in ("ring", "ulysses"))
        assert ring / ulysses == Fraction(p * (2 * p - 1), 5 * (p - 1)) > 1
    # With the sums in bfloat16 the ring would still look cheaper in training at P = 2 (the mistake the check names).
    llama_p2 = (1, 32, 8, 2**20, 128, 2, 2, True)
    assert sent("ring", *llama_p2, sum_bytes=2) < sent("ulysses", *llama_p2)


def only(method, **mistake):
    """The solution, with ``mistake`` (keywords of :func:`sent`) in ``method``'s count only;
    ``a`` below is (batch, heads, kv_heads, n, head_dim, world_size, bytes_per_element, backward)."""
    def fn(m, *args):
        return sent(m, *args, **(mistake if m == method else {}))
    return fn


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (only("ring", kv_at_h=True), "at H heads. With grouped-query"),
        (lambda m, *a: sent(m, *a, ring_hops=a[5]) if m == "ring" else sent(m, *a), "P - 1 times"),
        (lambda m, *a: sent(m, *a) // 2 if m == "ring" else sent(m, *a), "only the keys"),
        (lambda m, *a: sent(m, *a) * a[5] if m == "ring" else sent(m, *a), "whole sequence"),
        (lambda m, *a: sent(m, *a, sum_bytes=a[6]) if m == "ring" else sent(m, *a), "at the input's element size"),
        (lambda m, *a: sent(m, *a, sum_hops=a[5] - 1) if m == "ring" else sent(m, *a), "they make P"),
        (lambda m, *a: sent(m, *a, sum_hops=0) if m == "ring" else sent(m, *a), "not the dK and dV sums"),
        (only("ring", forget=True), "returns the forward pass's bytes"),
        (only("ulysses", forget=True), "returns the forward pass's bytes"),
        (only("ulysses", ulysses_heads=lambda s_q, s_kv: (s_q, s_q)), "all four of Ulysses' all-to-alls at H heads"),
        (only("ulysses", ulysses_heads=lambda s_q, s_kv: (s_kv, s_kv)), "at H_kv heads; only k and v"),
        (only("ulysses", ulysses_heads=lambda s_q, s_kv: (Fraction(s_q, 2), s_kv)), "there are four"),
        (lambda m, *a: sent(m, *a) * a[5] // (a[5] - 1) if m == "ulysses" else sent(m, *a), "keeps its own part"),
        (lambda m, *a: sent(m, *a) * (1 + max(a[6], 4) / a[6]) / 2 if m == "ulysses" and a[7] else sent(m, *a),
         "Ulysses' backward in float32"),
        (only("ring", bits=True), "8 bits in a byte"),
        (lambda m, *a: sent(m, *a) + 1, "is not right"),
        # two mistakes at once are not taken for a third (at 6 query heads per K/V head and P = 4, both would be 8×)
        (lambda m, *a: sent(m, *a, kv_at_h=True, ring_hops=a[5]) if m == "ring" else sent(m, *a), "is not right"),
        (lambda m, *a: "lots", "a number of bytes"),
        (lambda m, *a: ..., "returns nothing yet"),
    ],
)
def test_bytes_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_bytes_sent_per_rank, fn)


@pytest.mark.parametrize("name, module", [("formula_bytes", "attn_course.distributed.schedule"),
                                          ("ulysses_bytes", "attn_course.distributed")])
def test_bytes_refuse_the_course_formulas(name, module):
    import importlib

    formula = getattr(importlib.import_module(module), name)

    def by_the_course(method, batch, heads, kv_heads, n, head_dim, world_size, bytes_per_element, backward):
        if name == "ulysses_bytes":
            return formula(batch, heads, n, head_dim, world_size, element_size=bytes_per_element, backward=backward,
                           kv_heads=kv_heads)
        return formula(method, batch, heads, n, head_dim, world_size, element_size=bytes_per_element,
                       backward=backward, kv_heads=kv_heads)

    assert f"calls {name}, which this exercise forbids" in hint(check_bytes_sent_per_rank, by_the_course)


# --- the ring by hand -------------------------------------------------------------------------------------------

def ring_solution(q_blocks, k_blocks, v_blocks, *, rescale_old=True, update_lse=True):
    outputs = []
    p = len(q_blocks)
    for r in range(p):
        out = lse = None
        for s in range(p):
            j = (r - s) % p
            scores = q_blocks[r] @ k_blocks[j].transpose(-2, -1) / math.sqrt(q_blocks[r].shape[-1])
            block_out, block_lse = torch.softmax(scores, -1) @ v_blocks[j], torch.logsumexp(scores, -1, keepdim=True)
            if out is None:
                out, lse = block_out, block_lse
                continue
            new = torch.logaddexp(lse, block_lse)
            out = (out * torch.exp(lse - new) if rescale_old else out) + block_out * torch.exp(block_lse - new)
            lse = new if update_lse else lse
        outputs.append(out)
    return outputs


def test_ring_solution_passes():
    assert check_ring_by_hand(ring_solution)


def test_the_classmates_ring_is_off_by_a_weighted_mean_when_every_score_is_zero():
    # What exercise 3 asks to predict: with zero scores and equal blocks, the unrescaled merge returns
    # m_0 + m_1/2 + m_2/3 + ... (m_s the mean of the values of the block that arrives at step s), where
    # attention returns their mean (m_0 + ... + m_{P-1}) / P.
    p, n = 4, 3
    values = torch.randn(2, p * n, 5, generator=torch.Generator().manual_seed(3))
    v_blocks, zeros = list(values.chunk(p, dim=1)), [torch.zeros(2, n, 5)] * p
    buggy, right = ring_solution(zeros, zeros, v_blocks, rescale_old=False), ring_solution(zeros, zeros, v_blocks)
    for r in range(p):
        means = [v_blocks[(r - s) % p].mean(1, keepdim=True).expand(2, n, 5) for s in range(p)]
        torch.testing.assert_close(buggy[r], sum(m / (s + 1) for s, m in enumerate(means)))
        torch.testing.assert_close(right[r], sum(means) / p)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda q, k, v: ring_solution(q, k, v, rescale_old=False), "not the output accumulated so far"),
        (lambda q, k, v: ring_solution(q, k, v, update_lse=False), "not updated after a merge"),
        (lambda q, k, v: [sum(torch.softmax(q[r] @ kb.transpose(-2, -1) / math.sqrt(q[r].shape[-1]), -1) @ vb
                              for kb, vb in zip(k, v)) for r in range(len(q))], "as they are"),
        (lambda q, k, v: [sum(torch.softmax(q[r] @ kb.transpose(-2, -1) / math.sqrt(q[r].shape[-1]), -1) @ vb
                              for kb, vb in zip(k, v)) / len(q) for r in range(len(q))], "average the blocks"),
        (lambda q, k, v: ring_solution(q, k, v)[0], "a list of"),
        (lambda q, k, v: ..., "returns nothing yet"),
    ],
)
def test_ring_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_ring_by_hand, fn)


def test_ring_refuses_the_course_merge():
    from attn_course.flash.tiled import merge_attention_outputs

    def merged_by_the_course(q_blocks, k_blocks, v_blocks):
        outputs = []
        for q in q_blocks:
            out = lse = None
            for k, v in zip(k_blocks, v_blocks):
                scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
                o, o_lse = torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)
                out, lse = (o, o_lse) if out is None else merge_attention_outputs(out, lse, o, o_lse)
            outputs.append(out)
        return outputs

    assert "calls merge_attention_outputs, which this exercise forbids" in hint(check_ring_by_hand,
                                                                               merged_by_the_course)


# --- the ring's causal work, step by step ---------------------------------------------------------------------

def held(rank, world_size, n, layout):
    """The positions a rank holds, written out here: one block each, or zig-zag chunks r and 2P-1-r."""
    if layout == "contiguous":
        size = n // world_size
        return list(range(rank * size, (rank + 1) * size))
    size = n // (2 * world_size)
    mirror = 2 * world_size - 1 - rank
    return [*range(rank * size, (rank + 1) * size), *range(mirror * size, (mirror + 1) * size)]


def pairs(world_size, n, layout, *, source=lambda r, s: r - s, visible=lambda key, query: key <= query):
    """The solution, from the positions written out, with the mistakes as keywords."""
    return [[sum(visible(key, query) for query in held(r, world_size, n, layout)
                 for key in held(source(r, s) % world_size, world_size, n, layout))
             for r in range(world_size)] for s in range(world_size)]


def test_the_layouts_written_out_are_the_course_layouts():
    for p, n in [(2, 16), (4, 32)]:
        for layout in ("contiguous", "zigzag"):
            course = [token_positions(r, p, n, layout).tolist() for r in range(p)]
            assert course == [held(r, p, n, layout) for r in range(p)]


def test_visible_pairs_solution_passes():
    assert check_visible_pairs_by_step(pairs)
    assert check_visible_pairs_by_step(lambda p, n, layout: torch.tensor(pairs(p, n, layout)))


def test_critical_paths_at_p_4_and_n_64_are_what_the_solution_says():
    # What exercise 4 asks for: the sum over steps of each step's slowest rank. Blocks of b = 16 tokens:
    # step 0 is b(b + 1)/2 = 136 pairs in both layouts; after that, a contiguous rank's block is all
    # visible or all hidden (b² = 256 for the slowest), a zig-zag rank sees half of every block (128).
    contiguous, zigzag = pairs(4, 64, "contiguous"), pairs(4, 64, "zigzag")
    assert contiguous == [[136] * 4, [0, 256, 256, 256], [0, 0, 256, 256], [0, 0, 0, 256]]
    assert zigzag == [[136] * 4, [128] * 4, [128] * 4, [128] * 4]
    critical = [sum(max(step) for step in grid) for grid in (contiguous, zigzag)]
    assert critical == [904, 520]
    # Counting visible pairs the ratio is 113/65 (about 1.74), below the 4P/(2P + 1) = 16/9 (about 1.78)
    # of chunk pairs counted whole: the diagonal step costs the same in both layouts.
    assert Fraction(*critical) == Fraction(113, 65) < Fraction(16, 9)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (functools.partial(pairs, source=lambda r, s: r + s), "rank (r + s) mod P"),
        (functools.partial(pairs, visible=lambda key, query: key < query), "strictly before the query"),
        (functools.partial(pairs, visible=lambda key, query: True), "attention without a mask"),
        (lambda p, n, layout: [list(row) for row in zip(*pairs(p, n, layout))], "the outer list is the steps"),
        (lambda p, n, layout: pairs(p, n, "zigzag" if layout == "contiguous" else "contiguous"), "other layout"),
        (lambda p, n, layout: [[1] * p] * p, "expected"),
        (lambda p, n, layout: [sum(row) for row in pairs(p, n, layout)], "lists (one per step)"),
        (lambda p, n, layout: ..., "returns nothing yet"),
    ],
)
def test_visible_pairs_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_visible_pairs_by_step, fn)
