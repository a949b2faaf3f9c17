"""Chapter 10's exercise checks: the solutions pass and each known mistake gets its own hint."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.checks import CheckFailed
from attn_course.checks.distributed import (
    check_all_to_all_by_hand,
    check_bytes_sent_per_rank,
    check_causal_work,
    check_ring_by_hand,
)
from attn_course.distributed.layout import token_positions


def hint(check, fn) -> str:
    with pytest.raises(CheckFailed) as failed:
        check(fn)
    return str(failed.value)


# --- the all-to-all by hand --------------------------------------------------------------------------

def by_hand(shards):
    full, h = torch.cat(shards, dim=2), shards[0].shape[1] // len(shards)
    return [full[:, r * h:(r + 1) * h] for r in range(len(shards))]


def test_all_to_all_solution_passes():
    assert check_all_to_all_by_hand(by_hand)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda shards: shards, "still holds a slice of the sequence"),
        (lambda shards: [torch.cat(shards, 2)[:, r::len(shards)] for r in range(len(shards))], "heads r, r + P"),
        (lambda shards: by_hand(shards[::-1]), "not in sequence order"),
        (lambda shards: by_hand(shards)[:-1], "one per rank"),
        (lambda shards: torch.cat(shards, 2), "a list of"),
        (lambda shards: ..., "returns nothing yet"),
    ],
)
def test_all_to_all_mistakes_get_their_hint(fn, fragment):
    assert fragment in hint(check_all_to_all_by_hand, fn)


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
