"""Check chapter 14's exercises on serving: a sequence's keys gathered from its blocks in a paged cache, which
waiting requests the scheduler admits, and how often a draft model's token is kept, each against a reference
written out here.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer, check_shape, diagnose
from attn_course.checks.forbidden import RANDOM, Forbidden, forbid

__all__ = ["check_gather_sequence", "check_admission", "check_acceptance_rate", "gathered_slots",
           "admission_reference", "acceptance_rate_reference"]


# --- 1. a sequence's keys, gathered from its blocks -------------------------------------------------------------

WHOLE_BLOCKS = ("You return {got} positions, every slot of the sequence's {blocks} blocks: its last block is only "
                "partly filled (positions {length} and up are not the sequence's; they hold whatever was there). "
                "Keep the first length positions.")
DROPS_PARTIAL = ("You return {got} positions, the sequence's full blocks only: its last {rest} token(s) sit in a "
                 "block that is only partly filled, and they count too. A sequence of length tokens holds "
                 "⌈length / block_size⌉ blocks.")
WRONG_LENGTH = "You return {got} positions; the sequence has {length}."
CONTIGUOUS = ("You read the pool's first slots, as if the sequence's cache were one contiguous row. Its tokens are "
              "in the blocks its block table names: position p is in block block_table[p // block_size].")
NO_SCALE = ("You add the offset to the block's id, block_table[p // block_size] + p % block_size: a block holds "
            "block_size slots, so block b starts at slot b * block_size.")
POOL_ORDER = ("You read the blocks in the pool's order: a sequence's blocks are wherever the free list put them, "
              "and its block table lists them in the sequence's order. Follow the table.")
PREVIOUS_BLOCK = ("Position {p} is the first of the sequence's block {index}, and you look it up in block {before} "
                  "((p - 1) // block_size): positions 0 .. block_size - 1 are the first block, so p belongs to "
                  "block p // block_size, at offset p % block_size.")
NEXT_BLOCK = ("Position {p} lies inside the sequence's block {index}, and you look it up in block {after} (p / "
              "block_size rounded up): it belongs to block p // block_size, rounded down.")

_WRITE_THE_LOOKUP = "the exercise is to look the slots up in the block table yourself"
#: What the gather exercise may not call: the block manager's lookups, or the paged cache that gathers.
GATHER_RULES = forbid(_WRITE_THE_LOOKUP, "attn_course.serving.block_manager.BlockManager.slot",
                      "attn_course.serving.block_manager.BlockManager.slots",
                      "attn_course.serving.paged_cache.PagedKVCache")


def gathered_slots(block_table: list[int], length: int, block_size: int, *, plant: str | None = None) -> list[int]:
    """The pool slot of each position ``0 .. length - 1``: ``block_table[p // block_size] * block_size + p %
    block_size``; or with one mistake planted (``plant``)."""
    table = sorted(block_table) if plant == "pool_order" else block_table

    def slot(p: int) -> int:
        index = {"previous_block": (p - 1) // block_size, "next_block": -(-p // block_size)}.get(plant, p // block_size)
        index = min(index, len(table) - 1)                   # -1 stays: Python's last entry, as an answer gets
        if plant == "contiguous":
            return p
        if plant == "no_scale":
            return table[index] + p % block_size
        return table[index] * block_size + p % block_size

    return [slot(p) for p in range(length)]


def _gather_cases() -> list[tuple[torch.Tensor, list[int], int, int]]:
    """``(pool [num_slots, H, d], block_table, length, block_size)``: a last block partly filled, a sequence
    that fills its blocks exactly, a longer one over blocks of 16, and blocks of one token."""
    generator = torch.Generator().manual_seed(141)
    cases = []
    for num_blocks, block_size, heads, dim, table, length in [(6, 4, 2, 3, [4, 1, 5], 10), (5, 4, 1, 2, [2, 0], 8),
                                                              (4, 16, 2, 4, [3, 0, 2], 35), (6, 1, 1, 3, [4, 2, 5], 3)]:
        pool = torch.randn(num_blocks * block_size, heads, dim, generator=generator)
        cases.append((pool, table, length, block_size))
    return cases


def check_gather_sequence(gather_fn: Callable[[torch.Tensor, list[int], int, int], torch.Tensor]) -> bool:
    """Check ``fn(pool [num_slots, H, d], block_table, length, block_size) -> [length, H, d]``: a sequence's keys
    (or values) in position order, position ``p`` read from slot ``block_table[p // block_size] * block_size +
    p % block_size`` of the pool, against the slots listed here.

    Raises:
        TypeError: ``gather_fn`` is not callable.
        CheckFailed: naming every slot of the last block returned, the partly filled block left out, the pool's
            first slots read, the block's id not multiplied by the block size, the blocks in the pool's order, the
            block before or after at a block's edge, or the first position that differs.

    Example (a wrong answer, and what it is told):
        >>> def full_blocks(pool, block_table, length, block_size):
        ...     return torch.cat([pool[b * block_size:(b + 1) * block_size] for b in block_table])
        >>> check_gather_sequence(full_blocks)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You return 12 positions, every slot of the sequence's 3 blocks: ...
    """
    where = "check_gather_sequence"
    if not callable(gather_fn):
        raise TypeError(f"{where}: expected your function, got {type(gather_fn).__name__}")
    for pool, table, length, block_size in _gather_cases():
        described = (f"a pool of shape {list(pool.shape)}, block_table={table}, length={length}, "
                     f"block_size={block_size}")
        got = call_answer(where, gather_fn, pool, list(table), length, block_size, described=described,
                          forbidden=GATHER_RULES)
        expected = pool[gathered_slots(table, length, block_size)]
        if isinstance(got, torch.Tensor) and got.dim() == 3 and got.shape[1:] == pool.shape[1:] \
                and got.shape[0] != length:
            blocks, rest = -(-length // block_size), length % block_size
            template = WHOLE_BLOCKS if got.shape[0] == blocks * block_size and rest else \
                DROPS_PARTIAL if got.shape[0] == length - rest and rest else WRONG_LENGTH
            raise CheckFailed(template.format(got=got.shape[0], blocks=blocks, length=length, rest=rest))
        plants = [(message, pool[gathered_slots(table, length, block_size, plant=plant)])
                  for plant, message in (("contiguous", CONTIGUOUS), ("no_scale", NO_SCALE),
                                         ("pool_order", POOL_ORDER))]
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.equal(got, expected):
            p = int((got != expected).flatten(1).any(1).nonzero()[0])
            index = p // block_size
            for plant, message in (("previous_block", PREVIOUS_BLOCK), ("next_block", NEXT_BLOCK)):
                planted = pool[gathered_slots(table, length, block_size, plant=plant)]
                if torch.equal(got[p], planted[p]) and not torch.equal(planted[p], expected[p]) and \
                        not any(torch.equal(got, wrong) for _, wrong in plants):
                    before = f"{index - 1}" if index else "-1, the table's last entry in Python,"
                    raise CheckFailed(message.format(p=p, index=index, before=before, after=index + 1))
        diagnose(got, expected, [(message, wrong) for message, wrong in plants if not torch.equal(wrong, expected)],
                 ("position", "head", "feature"), "Your result")
    return True


# --- 2. which waiting requests are admitted --------------------------------------------------------------------

NOT_INDICES = "Your function should return a list of the admitted requests' indices in the queue, got {what}."
CLASSMATES_ADMISSION = ("This is the classmate's code as it was: a request that does not fit is passed over, and "
                        "smaller ones behind it are admitted first. Each time blocks free up, a short request "
                        "arriving later takes them again, and the long one can wait forever. The queue is first "
                        "come, first served: stop at the first request that does not fit.")
FLOOR_BLOCKS = ("A {length}-token prompt needs {want} of the {block_size}-token blocks, and you count {got}: round "
                "up, ⌈length / block_size⌉ = -(-length // block_size), so that its last tokens have a block.")
PLUS_ONE_BLOCK = ("A {length}-token prompt fills exactly {want} of the {block_size}-token blocks, and you ask for "
                  "{got}: length // block_size + 1 is one too many when the length is a multiple of the block size; "
                  "round up instead.")
STRICT_FIT = ("A request that needs exactly the free blocks fits: admit it when the blocks it needs are <= the free "
              "blocks, not <.")
IGNORES_RUNNING = ("You fill the batch as if it were empty: {running} requests are already running, so only "
                   "max_batch_size - running = {room} more may join.")
IGNORES_BATCH = "You admit more than the batch holds: at most max_batch_size - running = {room} may join."
KEEPS_BLOCKS = ("You compare every request with all the free blocks: each admitted request takes its blocks, and "
                "the next one must fit in what is left.")
WRONG_ADMISSION = ("With waiting prompts {waiting} (in arrival order), {free} free blocks of {block_size}, {running} "
                   "running of at most {batch}: you admit {got}, the rule admits {want}.")

_WRITE_THE_RULE = "the exercise is to fix the classmate's admission rule, not to call the course's scheduler"
#: What the admission exercise may not call: the scheduler, or the block manager's own accounting.
ADMISSION_RULES = forbid(_WRITE_THE_RULE, "attn_course.serving.scheduler.Scheduler.schedule",
                         "attn_course.serving.block_manager.BlockManager.can_allocate",
                         "attn_course.serving.block_manager.BlockManager.allocate",
                         "attn_course.serving.block_manager.BlockManager.blocks_for")


def _blocks(length: int, block_size: int, plant: str | None = None) -> int:
    """The blocks a prompt of ``length`` tokens needs, ⌈length / block_size⌉, or as a counting mistake counts."""
    if plant == "floor":
        return length // block_size
    if plant == "plus_one":
        return length // block_size + 1
    return -(-length // block_size)


def admission_reference(waiting: list[int], free_blocks: int, block_size: int, running: int, max_batch_size: int,
                        *, plant: str | None = None) -> list[int]:
    """The indices of the waiting requests admitted, first come first served: while the batch has room, the head
    of the queue is admitted if its prompt's ⌈length / block_size⌉ blocks fit in the free ones, and the first that
    does not fit stops admission. ``plant`` names a mistake to make instead."""
    admitted, free = [], free_blocks
    room = max_batch_size if plant == "ignores_running" else max_batch_size - running
    for index, length in enumerate(waiting):
        if len(admitted) >= room and plant != "ignores_batch":
            break
        needed = _blocks(length, block_size, plant)
        fits = needed < free if plant == "strict" else needed <= free_blocks if plant == "keeps_blocks" \
            else needed <= free
        if not fits:
            if plant == "classmate":
                continue
            break
        admitted.append(index)
        free -= needed
    return admitted


#: ``(waiting, free_blocks, block_size, running, max_batch_size)``: a long prompt at the head that does not fit
#: with short ones behind it, a prompt one token past a block, one that fills its blocks exactly, requests that
#: share the free blocks, and a batch with little room.
_ADMISSION_CASES = (([40, 5, 6], 2, 16, 1, 8), ([20, 3], 1, 16, 0, 8), ([32, 16], 4, 16, 2, 8),
                    ([20, 4], 2, 16, 0, 8), ([10, 20, 30, 4], 4, 16, 0, 8), ([4, 4, 4, 4], 10, 8, 5, 7))


def check_admission(admit_fn: Callable[[list[int], int, int, int, int], list[int]]) -> bool:
    """Check ``fn(waiting, free_blocks, block_size, running, max_batch_size) -> list[int]``: the indices of the
    waiting requests (their prompt lengths, in arrival order) that join the batch this step, first come first
    served, each needing ``⌈length / block_size⌉`` of the free blocks.

    Raises:
        TypeError: ``admit_fn`` is not callable.
        CheckFailed: naming the classmate's queue jumping, blocks rounded down or one too many, a request that
            fits exactly refused, the running requests or the batch's size ignored, every request compared with
            all the free blocks, or the first wrong answer.

    Example (a wrong answer, and what it is told):
        >>> def rounds_down(waiting, free_blocks, block_size, running, max_batch_size):
        ...     admitted = []
        ...     for index, length in enumerate(waiting):
        ...         needed = length // block_size
        ...         if running + len(admitted) >= max_batch_size or needed > free_blocks:
        ...             break
        ...         admitted.append(index)
        ...         free_blocks -= needed
        ...     return admitted
        >>> check_admission(rounds_down)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: A 40-token prompt needs 3 of the 16-token blocks, and you count 2: ...
    """
    where = "check_admission"
    if not callable(admit_fn):
        raise TypeError(f"{where}: expected your function, got {type(admit_fn).__name__}")
    for waiting, free, block_size, running, batch in _ADMISSION_CASES:
        arguments = (list(waiting), free, block_size, running, batch)
        described = (f"waiting={list(waiting)}, free_blocks={free}, block_size={block_size}, running={running}, "
                     f"max_batch_size={batch}")
        got = call_answer(where, admit_fn, *arguments, described=described, forbidden=ADMISSION_RULES)
        if not isinstance(got, (list, tuple)) or not all(isinstance(index, numbers.Integral) for index in got):
            raise CheckFailed(NOT_INDICES.format(what=repr(got)[:80]))
        got, want = [int(index) for index in got], admission_reference(*arguments)
        if got == want:
            continue
        room = batch - running
        # In this order: a case can give two mistakes the same answer, and the cases are laid out so that each
        # mistake is first caught where it alone gives that answer.
        messages = (("classmate", CLASSMATES_ADMISSION), ("keeps_blocks", KEEPS_BLOCKS), ("floor", FLOOR_BLOCKS),
                    ("plus_one", PLUS_ONE_BLOCK), ("strict", STRICT_FIT), ("ignores_running", IGNORES_RUNNING),
                    ("ignores_batch", IGNORES_BATCH))
        for plant, message in messages:
            if got != admission_reference(*arguments, plant=plant):
                continue
            # The first prompt whose blocks a counting mistake miscounts (the other mistakes ignore it).
            length = next((length for length in waiting
                           if _blocks(length, block_size, plant) != _blocks(length, block_size)), 0)
            raise CheckFailed(message.format(length=length, want=_blocks(length, block_size),
                                             got=_blocks(length, block_size, plant),
                                             block_size=block_size, running=running, room=room))
        raise CheckFailed(WRONG_ADMISSION.format(waiting=list(waiting), free=free, block_size=block_size,
                                                 running=running, batch=batch, got=got, want=want))
    return True


# --- 3. the draft's acceptance rate --------------------------------------------------------------------------

NOT_A_TENSOR = "Your function should return a tensor of rates, one per distribution pair, got {what}."
ALWAYS_ONE = ("Your rates are all 1: you kept the draft's token with probability p(x) / q(x), and summed q(x) · p(x) "
              "/ q(x) = Σ p(x) = 1. Where the draft proposes a token more often than the target would choose it, "
              "q(x) > p(x), it must be kept only with probability p(x) / q(x) < 1; where q(x) < p(x) the ratio is "
              "above 1, and a probability stops at 1: keep with min(1, p(x) / q(x)).")
WEIGHTED_BY_P = ("You average min(1, p(x) / q(x)) over the target's distribution p: the token being tested was drawn "
                 "by the draft, so average over q(x), Σ q(x) min(1, p(x) / q(x)) = Σ min(p(x), q(x)).")
UNWEIGHTED = ("You average min(1, p / q) over the vocabulary, every token alike: weight each token by how often the "
              "draft proposes it, q(x).")
REJECTION = "You return the rejection rate, 1 − Σ min(p, q): the rate of keeping the draft's token is Σ min(p, q)."
SUM_OF_RATIOS = ("You sum min(1, p(x) / q(x)) over the vocabulary without weighting it by q(x): the result is not "
                 "a probability (it can pass 1).")

_PREDICT = "a prediction follows from the two distributions: compute it, do not sample or run the engine"
#: What the prediction may not do: draw random numbers, or run the verification or the engine.
ACCEPTANCE_RULES = (Forbidden(RANDOM, _PREDICT),
                    *forbid(_PREDICT, "attn_course.serving.speculative.verify_sampled",
                            "attn_course.serving.speculative.verify_greedy", "attn_course.serving.engine.Engine"))


def acceptance_rate_reference(p: torch.Tensor, q: torch.Tensor, *, plant: str | None = None) -> torch.Tensor:
    """``[...]``: the probability that rejection sampling keeps the draft's token, ``Σ_x q(x) min(1, p(x)/q(x)) =
    Σ_x min(p(x), q(x))`` over the last dimension, in float64; or with one mistake planted (``plant``)."""
    p, q = p.double(), q.double()
    ratio = torch.where(q > 0, p / q.clamp(min=1e-300), torch.zeros_like(p))
    if plant == "ratio":
        return (q * ratio).sum(-1)
    if plant == "weighted_by_p":
        return (p * ratio.clamp(max=1)).sum(-1)
    if plant == "unweighted":
        return ratio.clamp(max=1).mean(-1)
    if plant == "sum_of_ratios":
        return ratio.clamp(max=1).sum(-1)
    rate = torch.minimum(p, q).sum(-1)
    return 1 - rate if plant == "rejection" else rate


def _distributions(generator: torch.Generator, *shape: int, peaked: float) -> torch.Tensor:
    return torch.softmax(peaked * torch.randn(*shape, generator=generator, dtype=torch.float64), dim=-1)


def _acceptance_cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(p, q)``: pairs of distributions over vocabularies of 5 and 11 tokens, peaked and flat, in float64 and
    float32; then a draft equal to the target, and one that proposes only tokens the target never chooses."""
    generator = torch.Generator().manual_seed(141)
    cases = [(_distributions(generator, 4, 5, peaked=2.0), _distributions(generator, 4, 5, peaked=2.0)),
             (_distributions(generator, 2, 3, 11, peaked=1.0).float(),
              _distributions(generator, 2, 3, 11, peaked=3.0).float())]
    same = _distributions(generator, 3, 6, peaked=1.5)
    disjoint_p = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float64)
    disjoint_q = torch.tensor([[0.0, 0.0, 0.3, 0.7]], dtype=torch.float64)
    return cases + [(same, same.clone()), (disjoint_p, disjoint_q)]


def check_acceptance_rate(rate_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(p, q) -> [...]``: for target distributions ``p`` and draft distributions ``q`` (``[..., V]``,
    each summing to 1 over the vocabulary), the probability that speculative decoding's rejection sampling keeps
    the draft's token, ``Σ_x q(x) min(1, p(x) / q(x)) = Σ_x min(p(x), q(x))``, against float64 here.

    Raises:
        TypeError: ``rate_fn`` is not callable.
        CheckFailed: naming the ratio p/q taken for a probability (every rate 1), the average taken over p or over
            the vocabulary, the rejection rate, a sum of ratios, or the first rate that differs.

    Example (a wrong answer, and what it is told):
        >>> def kept_with_ratio(p, q):
        ...     return (q * (p / q)).sum(-1)
        >>> check_acceptance_rate(kept_with_ratio)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your rates are all 1: you kept the draft's token with ...
    """
    where = "check_acceptance_rate"
    if not callable(rate_fn):
        raise TypeError(f"{where}: expected your function, got {type(rate_fn).__name__}")
    mistakes = (("ratio", ALWAYS_ONE), ("weighted_by_p", WEIGHTED_BY_P), ("unweighted", UNWEIGHTED),
                ("rejection", REJECTION), ("sum_of_ratios", SUM_OF_RATIOS))
    for p, q in _acceptance_cases():
        described = f"p and q of shape {list(p.shape)} ({str(p.dtype).removeprefix('torch.')})"
        got = call_answer(where, rate_fn, p, q, described=described, forbidden=ACCEPTANCE_RULES)
        if not isinstance(got, torch.Tensor):
            raise CheckFailed(NOT_A_TENSOR.format(what=type(got).__name__))
        expected = acceptance_rate_reference(p, q)
        check_shape(got, expected, "Your rates")
        plants = [(message, acceptance_rate_reference(p, q, plant=plant)) for plant, message in mistakes]
        diagnose(got.double(), expected, [(message, planted) for message, planted in plants
                                          if not torch.allclose(planted, expected)],
                 ("",) + ("pair",) * (p.dim() - 2) + ("position",), "Your rate")
    return True
