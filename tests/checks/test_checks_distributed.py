"""Chapter 10's exercise checks: the solutions pass, each known mistake gets its own hint, and what the
exercises claim holds."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from attn_course.checks import CheckFailed
from attn_course.checks.distributed import (
    check_bytes_sent_per_rank,
    check_causal_work,
    check_ring_by_hand,
    check_ulysses_exchange,
)
from attn_course.distributed.layout import token_positions


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

def sent(method, batch, heads, n, head_dim, world_size, bytes_per_element):
    shard = batch * heads * (n // world_size) * head_dim * bytes_per_element
    return 2 * (world_size - 1) * shard if method == "ring" else 4 * (world_size - 1) * shard // world_size


def test_bytes_solution_passes_and_matches_the_papers_trend():
    assert check_bytes_sent_per_rank(sent)
    # N growing with P (N / P fixed): the ring's bytes per rank grow like P - 1, Ulysses' stay below 4 shards.
    ring = [sent("ring", 1, 8, 1024 * p, 64, p, 2) for p in (2, 4, 8)]
    ulysses = [sent("ulysses", 1, 8, 1024 * p, 64, p, 2) for p in (2, 4, 8)]
    assert ring == [2 * (p - 1) * 8 * 1024 * 64 * 2 for p in (2, 4, 8)]
    assert all(u < 4 * 8 * 1024 * 64 * 2 for u in ulysses) and ulysses == sorted(ulysses)


def mistaken(ring=None, ulysses=None):
    def fn(method, *args):
        wrong = ring if method == "ring" else ulysses
        return wrong(*args) if wrong else sent(method, *args)
    return fn


def shard_of(batch, heads, n, head_dim, p, b):
    return batch * heads * (n // p) * head_dim * b


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (mistaken(ring=lambda *a: 2 * a[4] * shard_of(*a)), "P - 1 times"),
        (mistaken(ring=lambda *a: (a[4] - 1) * shard_of(*a)), "only the keys"),
        (mistaken(ring=lambda *a: 2 * (a[4] - 1) * shard_of(*a) * a[4]), "whole sequence"),
        (mistaken(ulysses=lambda *a: 2 * (a[4] - 1) * shard_of(*a) // a[4]), "there are four"),
        (mistaken(ulysses=lambda *a: 4 * shard_of(*a)), "keeps its own part"),
        (lambda method, *a: 8 * sent(method, *a), "8 bits in a byte"),
        (lambda method, *a: sent(method, *a) + 1, "is not right"),
        (lambda method, *a: "lots", "a number of bytes"),
        (lambda method, *a: ..., "returns nothing yet"),
    ],
)
def test_bytes_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_bytes_sent_per_rank, fn)


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


# --- causal work ----------------------------------------------------------------------------------------------

def held(rank, world_size, n, layout):
    """The positions a rank holds, written out here: one block each, or zig-zag chunks r and 2P-1-r."""
    if layout == "contiguous":
        size = n // world_size
        return list(range(rank * size, (rank + 1) * size))
    size = n // (2 * world_size)
    mirror = 2 * world_size - 1 - rank
    return [*range(rank * size, (rank + 1) * size), *range(mirror * size, (mirror + 1) * size)]


def work(world_size, n, layout):
    return [sum(position + 1 for position in held(r, world_size, n, layout)) for r in range(world_size)]


def test_the_layouts_written_out_are_the_course_layouts():
    for p, n in [(2, 16), (4, 32)]:
        for layout in ("contiguous", "zigzag"):
            course = [token_positions(r, p, n, layout).tolist() for r in range(p)]
            assert course == [held(r, p, n, layout) for r in range(p)]


def test_causal_work_solution_passes_and_shows_the_imbalance():
    assert check_causal_work(work)
    # Written out for P = 4, N = 32: contiguous blocks of 8, zig-zag chunks of 4.
    assert work(4, 32, "contiguous") == [sum(range(1, 9)), sum(range(9, 17)), sum(range(17, 25)), sum(range(25, 33))]
    assert len(set(work(4, 32, "zigzag"))) == 1                        # every rank the same work


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda p, n, layout: [n // p * n] * p, "attention without a mask"),
        (lambda p, n, layout: [sum(held(r, p, n, layout)) for r in range(p)], "p + 1 keys"),
        (lambda p, n, layout: work(p, n, "zigzag" if layout == "contiguous" else "contiguous"), "other layout"),
        (lambda p, n, layout: [1] * p, "expected"),
        (lambda p, n, layout: [1], "one per rank"),
        (lambda p, n, layout: ..., "returns nothing yet"),
    ],
)
def test_causal_work_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_causal_work, fn)
