"""Check chapter 10's exercises: the messages of Ulysses' all-to-all, a ring of partial results merged in one
process, and the ring's causal work step by step (the bytes a rank sends: :mod:`attn_course.checks.distributed_bytes`).
The ranks are simulated in one process; the references are slices of the full tensor, ``self_attention`` and
:func:`~attn_course.distributed.layout.token_positions`."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import (
    NOTHING_YET,
    CheckFailed,
    call_answer,
    diagnose,
    name_mistake,
    same,
    watched,
)
from attn_course.checks.distributed_bytes import BITS, number_of_bytes
from attn_course.checks.forbidden import Forbidden, forbid
from attn_course.core.attention import self_attention
from attn_course.distributed.layout import token_positions

__all__ = ["check_ulysses_exchange", "check_ring_by_hand", "check_visible_pairs_by_step"]


def _tensor_list(result: object, count: int, what: str) -> list[torch.Tensor]:
    if result is Ellipsis or result is None:
        raise CheckFailed(NOTHING_YET)
    if not isinstance(result, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in result):
        raise CheckFailed(f"Your function should return a list of {count} tensors ({what}), "
                          f"got {type(result).__name__}.")
    if len(result) != count:
        raise CheckFailed(f"Your function should return {count} tensors, one per rank, got {len(result)}.")
    return list(result)


CUT_ALONG_TOKENS = ("sent[r][s] holds all H heads of a slice of rank r's tokens: you cut the shard along the "
                    "tokens. The all-to-all cuts it along the heads: rank s gets every one of rank r's N/P "
                    "tokens, for rank s's heads only.")
SENT_TRANSPOSED = ("sent[r][s] holds rank s's tokens: that is what rank s sends to rank r. sent[r][s] is rank r's "
                   "own tokens (it only has those), for the heads that rank s will hold.")
OWN_HEADS_SENT = ("Rank r sends every rank its own heads, r·H/P .. (r+1)·H/P - 1; rank s must get the heads it will "
                  "hold, s·H/P .. (s+1)·H/P - 1.")
HEADS_INTERLEAVED = ("Rank r got heads r, r + P, r + 2P, ...; the all-to-all gives each rank a contiguous block of "
                     "heads: rank r holds heads r·H/P .. (r+1)·H/P - 1.")
NO_SWAP = ("Each rank still holds a slice of the sequence: after the all-to-all, rank r holds *every* token "
           "(N of them) for its share of the heads, H / P.")
OWN_SHARD_ONLY = ("Rank r only has its own tokens for its heads: it must also receive the other ranks' tokens for "
                  "those heads, and join them along the sequence.")
TOKENS_OUT_OF_ORDER = ("Each rank has the right heads, but the tokens are not in sequence order: the piece that came "
                       "from rank s holds tokens s·N/P .. (s+1)·N/P - 1 and goes in that place, whatever the order "
                       "the pieces arrived in.")
KEPT_PART_COUNTED = ("Your bytes include the piece a rank keeps, sent[r][r]: it never leaves the rank. Count the "
                     "P - 1 pieces that go to the other ranks.")
ONE_PIECE_COUNTED = "You counted one piece; rank r sends one to each of the other P - 1 ranks."
ELEMENTS_NOT_BYTES = ("You counted elements, not bytes: multiply by the bytes of one element, "
                      "tensor.element_size() (4 for float32, 2 for bfloat16).")

_BY_HAND = "the exercise is to work out the all-to-all's messages yourself"
#: What chapter 10's first exercise may not call: the course's Ulysses, all-to-all and layouts.
EXCHANGE_RULES = forbid(
    _BY_HAND,
    "attn_course.distributed.ulysses.sequence_to_heads",
    "attn_course.distributed.ulysses.heads_to_sequence",
    "attn_course.distributed.ulysses.AllToAll",
    "attn_course.distributed.ulysses.ulysses_bytes",
    "attn_course.distributed.communication.all_to_all",
    "attn_course.distributed.layout.shard",
    "attn_course.distributed.layout.unshard",
)


def _exchange_parts(result: object, p: int) -> tuple[list[list[torch.Tensor]], list[torch.Tensor], list[float]]:
    """``(sent, received, bytes_sent)`` from what the answer returned, or the failure saying what is missing."""
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        raise CheckFailed("Your function should return three things, (sent, received, bytes_sent), got "
                          f"{type(result).__name__}" + (f" of length {len(result)}" if isinstance(result, (tuple, list))
                                                        else "") + ".")
    sent, received, bytes_sent = result
    if not isinstance(sent, (list, tuple)) or len(sent) != p or not all(
            isinstance(row, (list, tuple)) and len(row) == p and all(isinstance(t, torch.Tensor) for t in row)
            for row in sent):
        raise CheckFailed(f"sent should be a list of {p} lists (one per sending rank r) of {p} tensors (one per "
                          "receiving rank s).")
    received = _tensor_list(received, p, "received: what each rank holds afterwards, [B, H/P, N, d]")
    if isinstance(bytes_sent, torch.Tensor):
        bytes_sent = bytes_sent.tolist()
    if not isinstance(bytes_sent, (list, tuple)) or len(bytes_sent) != p:
        raise CheckFailed(f"bytes_sent should be a list of {p} numbers, one per rank, got {bytes_sent!r}.")
    counts = [number_of_bytes(b, f"bytes_sent[{r}]") for r, b in enumerate(bytes_sent)]
    return [list(row) for row in sent], received, counts


def check_ulysses_exchange(exchange_fn: Callable[[list[torch.Tensor]], tuple]) -> bool:
    """Check ``fn(shards) -> (sent, received, bytes_sent)``: the messages of Ulysses' first all-to-all.

    ``shards[r]`` is rank ``r``'s ``[B, H, N/P, d]``. ``sent[r][s]`` must be the ``[B, H/P, N/P, d]`` rank
    ``r`` sends rank ``s`` (its tokens, for rank ``s``'s heads; ``sent[r][r]`` the part it keeps),
    ``received[r]`` the ``[B, H/P, N, d]`` rank ``r`` holds afterwards, in sequence order, and
    ``bytes_sent[r]`` the bytes that leave rank ``r``. Tried for ``P`` = 2 in float32 and 3 in bfloat16.

    Raises:
        CheckFailed: naming pieces cut along the tokens, ``sent[r][s]`` the wrong way round, a rank
            sending its own heads, interleaved heads, no swap at all, only the rank's own tokens,
            tokens out of order, the kept piece counted, one piece counted, elements or bits for
            bytes, or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> def exchange(shards):
        ...     p = len(shards)
        ...     sent = [list(shard.chunk(p, dim=2)) for shard in shards]
        ...     return sent, [torch.cat(row, dim=2) for row in sent], [0] * p
        >>> check_ulysses_exchange(exchange)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: sent[r][s] holds all H heads of a slice of rank r's tokens: ...
    """
    exchange_fn = watched("check_ulysses_exchange", exchange_fn, EXCHANGE_RULES)
    generator = torch.Generator().manual_seed(91)
    for p, heads, n, dtype in [(2, 4, 8, torch.float32), (3, 6, 18, torch.bfloat16)]:
        full = torch.randn(2, heads, n, 3, generator=generator).to(dtype)     # [B, H, N, d]
        shards = list(full.chunk(p, dim=2))                                   # rank r: [B, H, N/P, d]
        result = call_answer("check_ulysses_exchange", exchange_fn, shards,
                             described=f"{p} shards of shape {list(shards[0].shape)} ({dtype})")
        sent, received, bytes_sent = _exchange_parts(result, p)
        h, t = heads // p, n // p
        for r in range(p):
            for s in range(p):
                piece, want = sent[r][s], shards[r][:, s * h:(s + 1) * h]      # [B, H/P, N/P, d]
                if same(piece, want):
                    continue
                name_mistake(piece, [(CUT_ALONG_TOKENS, shards[r].chunk(p, dim=2)[s]),
                                     (SENT_TRANSPOSED, shards[s][:, r * h:(r + 1) * h]),
                                     (OWN_HEADS_SENT, shards[r][:, r * h:(r + 1) * h]),
                                     (HEADS_INTERLEAVED, shards[r][:, s::p])], same)
                diagnose(piece, want, [], ("", "head", "token", "feature"), f"sent[{r}][{s}]")
        for r in range(p):
            part, want = received[r], full[:, r * h:(r + 1) * h]                # [B, H/P, N, d]
            if same(part, want):
                continue
            pieces = [shards[s][:, r * h:(r + 1) * h] for s in range(p)]         # what each rank sent rank r
            if part.shape == shards[r].shape:
                raise CheckFailed(NO_SWAP)
            if same(part, pieces[r]):
                raise CheckFailed(OWN_SHARD_ONLY)
            mistakes = [(TOKENS_OUT_OF_ORDER, torch.cat(pieces[::-1], dim=2)),
                        (TOKENS_OUT_OF_ORDER, torch.cat([pieces[(r + s) % p] for s in range(p)], dim=2)),
                        (TOKENS_OUT_OF_ORDER, torch.cat([pieces[(r - s) % p] for s in range(p)], dim=2)),
                        (HEADS_INTERLEAVED, full[:, r::p])]
            diagnose(part, want, mistakes, ("", "head", "token", "feature"), f"received[{r}]")
        piece_elements = 2 * h * t * 3                                          # B · H/P · N/P · d
        element = full.element_size()
        expected = (p - 1) * piece_elements * element
        for r, got in enumerate(bytes_sent):
            if math.isclose(got, expected, rel_tol=1e-9):
                continue
            name_mistake(got, [(KEPT_PART_COUNTED, p * piece_elements * element),
                               (ONE_PIECE_COUNTED, piece_elements * element),
                               (ELEMENTS_NOT_BYTES, (p - 1) * piece_elements),
                               (BITS, 8 * expected)], functools.partial(math.isclose, rel_tol=1e-9))
            raise CheckFailed(f"bytes_sent[{r}] is not right for {p} ranks with shards of shape "
                              f"{list(shards[0].shape)} in {dtype}: expected {expected:,} bytes, got {got:,}.")
    return True


NOT_RESCALED = ("When a new block arrives you rescale its output but not the output accumulated so far: both parts "
                "must be weighted by exp(their log-sum-exp - the new one), or the earlier blocks keep too much weight.")
PLAIN_SUM = ("You add the blocks' outputs as they are. Each block's softmax only saw its own keys: weight each "
             "part by its share of the total, exp(lse_part - lse_total), before adding.")
PLAIN_MEAN = ("You average the blocks' outputs. A block whose scores are larger deserves more weight: weight "
              "each part by exp(lse_part - lse_total).")
LSE_NOT_UPDATED = ("Your log-sum-exp is not updated after a merge, so every later block is weighed against the "
                   "first block's alone.")


def _ring_mistakes(q_blocks, k_blocks, v_blocks) -> dict[str, list[torch.Tensor]]:
    """What each known wrong merge gives, rank by rank."""
    variants: dict[str, list[torch.Tensor]] = {NOT_RESCALED: [], PLAIN_SUM: [], PLAIN_MEAN: [], LSE_NOT_UPDATED: []}
    p = len(q_blocks)
    for r in range(p):
        partial = []
        for s in range(p):
            j = (r - s) % p
            scores = q_blocks[r] @ k_blocks[j].transpose(-2, -1) / math.sqrt(q_blocks[r].shape[-1])
            partial.append((torch.softmax(scores, -1) @ v_blocks[j], torch.logsumexp(scores, -1, keepdim=True)))
        variants[PLAIN_SUM].append(sum(o for o, _ in partial))
        variants[PLAIN_MEAN].append(sum(o for o, _ in partial) / p)
        out, lse = partial[0]
        stale_out, stale_lse = partial[0]
        for block_out, block_lse in partial[1:]:
            new = torch.logaddexp(lse, block_lse)
            out, lse = out + block_out * torch.exp(block_lse - new), new
            stale_new = torch.logaddexp(stale_lse, block_lse)
            stale_out = stale_out * torch.exp(stale_lse - stale_new) + block_out * torch.exp(block_lse - stale_new)
        variants[NOT_RESCALED].append(out)
        variants[LSE_NOT_UPDATED].append(stale_out)
    return variants


#: What chapter 10's find-the-bug exercise may not call: the course's merge and ring, or attention over all keys.
RING_RULES = (
    Forbidden("attn_course.flash.tiled.merge_attention_outputs",
              "the exercise is to fix the classmate's merge, not to call the course's"),
    Forbidden("attn_course.flash.tiled.merge_softmax_blocks",
              "the exercise is to fix the classmate's merge, not to call the course's"),
    Forbidden("attn_course.distributed.ring.ring_attention",
              "the exercise is to fix the classmate's ring, not to call the course's"),
    Forbidden("attn_course.distributed.ring.ring_attention_on_rank",
              "the exercise is to fix the classmate's ring, not to call the course's"),
    Forbidden("attn_course.distributed.ring.RingAttentionFunction",
              "the exercise is to fix the classmate's ring, not to call the course's"),
)


def check_ring_by_hand(ring_fn: Callable[..., list[torch.Tensor]]) -> bool:
    """Check ``fn(q_blocks, k_blocks, v_blocks) -> outputs``: non-causal ring attention simulated in one
    process. Rank ``r`` holds ``q_blocks[r] [B, n, d]`` and, at step ``s``, the K/V block ``(r - s) mod P``;
    ``outputs[r]`` must be its rows of ``softmax(Q Kᵀ / √d) V`` over all the keys, for ``P`` = 3 and 4.

    Raises:
        CheckFailed: naming an accumulated output that is not rescaled, a plain sum or mean of the blocks,
            a log-sum-exp that is not updated, or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> def ring(qs, ks, vs):
        ...     def blocks(q):
        ...         return [torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1) @ v for k, v in zip(ks, vs)]
        ...     return [sum(blocks(q)) / len(ks) for q in qs]
        >>> check_ring_by_hand(ring)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You average the blocks' outputs. A block whose scores are larger ...
    """
    ring_fn = watched("check_ring_by_hand", ring_fn, RING_RULES)
    generator = torch.Generator().manual_seed(93)
    for world_size, n, d in [(3, 4, 8), (4, 3, 4)]:
        q, k, v = (3 * torch.randn(2, world_size * n, d, generator=generator) for _ in range(3))   # [B, N, d]
        blocks = [list(t.chunk(world_size, dim=1)) for t in (q, k, v)]
        got = _tensor_list(call_answer("check_ring_by_hand", ring_fn, *blocks,
                                       described=f"{world_size} blocks of {n} tokens each"),
                           world_size, "each rank's [B, n, d] output")
        expected = list(self_attention(q, k, v)[0].chunk(world_size, dim=1))
        mistakes = _ring_mistakes(*blocks)
        for rank, (part, want) in enumerate(zip(got, expected)):
            diagnose(part, want, [(message, outputs[rank]) for message, outputs in mistakes.items()],
                     ("", "token", "feature"), f"Rank {rank}'s output")
    return True


SOURCE_R_PLUS_S = ("At step s your rank r holds the block of rank (r + s) mod P. Blocks travel to rank r + 1, so at "
                   "step s rank r holds the one that started on rank (r - s) mod P.")
STRICTLY_BEFORE = ("You counted keys strictly before the query. Under a causal mask the query at position p also "
                   "sees the key at p: key position <= query position.")
NO_MASK = ("Every entry of yours is (N/P)², every pair of a rank's queries with the block's keys: that is "
           "attention without a mask. Count only the pairs with key position <= query position.")
STEPS_RANKS_TRANSPOSED = ("Your entry [s][r] is the count for rank s at step r: the outer list is the steps, the "
                          "inner one the ranks, entry [s][r] for rank r at step s.")
LAYOUTS_SWAPPED = "Your counts belong to the other layout: check which tokens each rank holds."
PAIRS_WRONG = ("For P = {p}, N = {n} and the {layout} layout, expected {expected} (one row per step, one entry per "
               "rank), got {got}.")


def _visible_pairs(p: int, n: int, layout: str, *, source: Callable[[int, int], int] = lambda r, s: r - s,
                   strict: bool = False) -> list[list[int]]:
    """``[s][r]``: (query, key) pairs with key <= query (``<`` with ``strict``) between rank ``r``'s queries
    and the block of rank ``source(r, s) mod P``."""
    counts = []
    for s in range(p):
        row = []
        for r in range(p):
            queries = token_positions(r, p, n, layout)[:, None]                      # [N/P, 1]
            keys = token_positions(source(r, s) % p, p, n, layout)[None, :]           # [1, N/P]
            row.append(int((keys < queries).sum() if strict else (keys <= queries).sum()))
        counts.append(row)
    return counts


def _count_grid(result: object, p: int) -> list[list[object]]:
    if isinstance(result, torch.Tensor):
        result = result.tolist()
    if not isinstance(result, (list, tuple)) or len(result) != p or not all(
            isinstance(row, (list, tuple, torch.Tensor)) and len(row) == p for row in result):
        raise CheckFailed(f"Your function should return {p} lists (one per step) of {p} counts (one per rank), "
                          f"got {result!r}.")
    return [[int(c) if isinstance(c, numbers.Real) and not isinstance(c, bool) else c
             for c in (row.tolist() if isinstance(row, torch.Tensor) else row)] for row in result]


def check_visible_pairs_by_step(pairs_fn: Callable[[int, int, str], list[list[int]]]) -> bool:
    """Check ``fn(world_size, n, layout) -> counts``: ``counts[s][r]``, the (query, key) pairs with key
    position <= query position between rank ``r``'s queries and the K/V block it holds at step ``s`` of
    the ring (rank ``(r - s) mod P``'s), for ``n`` tokens laid out ``"contiguous"`` or ``"zigzag"``, for
    ``P`` = 4, 3 and 2.

    Raises:
        CheckFailed: naming the block of rank ``(r + s) mod P``, keys strictly before the query, no mask,
            steps and ranks transposed, the two layouts swapped, or the first case that differs.

    Example (a wrong answer, and what it is told):
        >>> check_visible_pairs_by_step(lambda p, n, layout: [[(n // p) ** 2] * p for _ in range(p)])
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Every entry of yours is (N/P)², every pair of a rank's queries ...
    """
    for p, n in [(4, 32), (3, 18), (2, 8)]:
        for layout in ("contiguous", "zigzag"):
            got = _count_grid(call_answer("check_visible_pairs_by_step", pairs_fn, p, n, layout,
                                          described=f"world_size={p}, n={n}, layout={layout!r}"), p)
            expected = _visible_pairs(p, n, layout)
            if got == expected:
                continue
            other = "zigzag" if layout == "contiguous" else "contiguous"
            name_mistake(got, [(SOURCE_R_PLUS_S, _visible_pairs(p, n, layout, source=lambda r, s: r + s)),
                               (STRICTLY_BEFORE, _visible_pairs(p, n, layout, strict=True)),
                               (NO_MASK, [[(n // p) ** 2] * p for _ in range(p)]),
                               (STEPS_RANKS_TRANSPOSED, [list(row) for row in zip(*expected)]),
                               (LAYOUTS_SWAPPED, _visible_pairs(p, n, other))])
            raise CheckFailed(PAIRS_WRONG.format(p=p, n=n, layout=layout, expected=expected, got=got))
    return True
