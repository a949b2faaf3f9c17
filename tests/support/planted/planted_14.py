"""Planted mistakes for chapter 14_serving: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "14_serving"

# The solution's gather, with its block index, its slot or its positions changed.
_GATHER = (
    "def gather_sequence(pool, block_table, length, block_size):\n"
    "    positions = torch.arange({positions})\n"
    "    blocks = torch.tensor({table})[{index}]\n"
    "    return pool[{slot}]\n"
)


def _gather(positions="length", table="block_table", index="positions // block_size",
            slot="blocks * block_size + positions % block_size") -> str:
    return _GATHER.format(positions=positions, table=table, index=index, slot=slot)


# The solution's admission rule, with its block count, its comparison or its end changed.
_ADMISSION = (
    "def fixed_admission(waiting, free_blocks, block_size, running, max_batch_size):\n"
    "    admitted = []\n"
    "    for index, length in enumerate(waiting):\n"
    "        needed = {needed}\n"
    "        if {full} or {refused}:\n"
    "            {stop}\n"
    "        admitted.append(index)\n"
    "        {take}\n"
    "    return admitted\n"
)


def _admission(needed="-(-length // block_size)", full="running + len(admitted) >= max_batch_size",
               refused="needed > free_blocks", stop="break", take="free_blocks -= needed") -> str:
    return _ADMISSION.format(needed=needed, full=full, refused=refused, stop=stop, take=take)


_RATE = "def acceptance_rate(p, q):\n    return {body}\n"

PLANTED = {
    "ada": {
        "gather_sequence": (                        # every slot of the last block, the unused ones too
            _gather(positions="-(-length // block_size) * block_size"),
            "q1_gather_sequence",
            "every slot of the sequence's",
        ),
        "fixed_admission": (                        # the classmate's code, handed in as it was
            _admission(stop="continue"),
            "q2_find_the_bug_admission",
            "the classmate's code as it was",
        ),
        "acceptance_rate": (                        # kept with p / q: every rate 1
            _RATE.format(body="(q * (p / q)).sum(-1)"),
            "q3_predict_acceptance_rate",
            "rates are all 1",
        ),
    },
    "grace": {
        "gather_sequence": (                        # position p put in block (p - 1) // block_size
            _gather(index="(positions - 1) // block_size"),
            "q1_gather_sequence",
            "look it up in block -1",
        ),
        "fixed_admission": (                        # blocks rounded down
            _admission(needed="length // block_size"),
            "q2_find_the_bug_admission",
            "round up",
        ),
        "acceptance_rate": (                        # averaged over the model's distribution, not the draft's
            _RATE.format(body="(p * torch.where(q > 0, p / q, torch.zeros_like(p)).clamp(max=1)).sum(-1)"),
            "q3_predict_acceptance_rate",
            "over the target's distribution",
        ),
    },
    "hedy": {
        "gather_sequence": (                        # the block's id not multiplied by the block size
            _gather(slot="blocks + positions % block_size"),
            "q1_gather_sequence",
            "add the offset to the block's id",
        ),
        "fixed_admission": (                        # a request that fits exactly refused
            _admission(refused="needed >= free_blocks"),
            "q2_find_the_bug_admission",
            "needs exactly the free blocks fits",
        ),
        "acceptance_rate": (                        # the rejection rate
            _RATE.format(body="1 - torch.minimum(p, q).sum(-1)"),
            "q3_predict_acceptance_rate",
            "rejection rate",
        ),
    },
    "barbara": {
        "gather_sequence": (                        # the pool's first slots, as if contiguous
            _gather(slot="positions"),
            "q1_gather_sequence",
            "one contiguous row",
        ),
        "fixed_admission": (                        # the running requests ignored
            _admission(full="len(admitted) >= max_batch_size"),
            "q2_find_the_bug_admission",
            "as if it were empty",
        ),
        "acceptance_rate": (                        # averaged over the vocabulary
            _RATE.format(body="torch.where(q > 0, p / q, torch.zeros_like(p)).clamp(max=1).mean(-1)"),
            "q3_predict_acceptance_rate",
            "over the vocabulary",
        ),
    },
    "linus": {
        "gather_sequence": (                        # the blocks in the pool's order
            _gather(table="sorted(block_table)"),
            "q1_gather_sequence",
            "pool's order",
        ),
        "fixed_admission": (                        # every request compared with all the free blocks
            _admission(take="pass"),
            "q2_find_the_bug_admission",
            "compare every request with all the free blocks",
        ),
    },
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "gather_sequence": (
        "def gather_sequence(pool, block_table, length, block_size):\n"
        "    from attn_course.serving import BlockManager\n"
        "    manager = BlockManager(max(block_table) + 1, block_size, prefix_caching=False)\n"
        "    manager._tables['s'] = list(block_table)\n"
        "    return pool[manager.slots('s', length)]\n",
        "q1_gather_sequence",
        "which this exercise forbids",
    ),
    "fixed_admission": (
        "def fixed_admission(waiting, free_blocks, block_size, running, max_batch_size):\n"
        "    from attn_course.serving import BlockManager\n"
        "    count = BlockManager(1, block_size).blocks_for\n"
        "    admitted = []\n"
        "    for index, length in enumerate(waiting):\n"
        "        if running + len(admitted) >= max_batch_size or count(length) > free_blocks:\n"
        "            break\n"
        "        admitted.append(index)\n"
        "        free_blocks -= count(length)\n"
        "    return admitted\n",
        "q2_find_the_bug_admission",
        "which this exercise forbids",
    ),
    "acceptance_rate": (                            # measured, not predicted
        "def acceptance_rate(p, q):\n"
        "    guesses = torch.multinomial(q.reshape(-1, q.shape[-1]), 2000, replacement=True)\n"
        "    ratio = (p.reshape(-1, p.shape[-1]) / q.reshape(-1, q.shape[-1])).gather(1, guesses)\n"
        "    return (torch.rand(ratio.shape) < ratio).double().mean(-1).reshape(p.shape[:-1])\n",
        "q3_predict_acceptance_rate",
        "which this exercise forbids",
    ),
}

# An answer that computes nothing (issue 31): an empty tensor fails every test of its question.
PLANTED["eve"] = {
    "gather_sequence": (
        "def gather_sequence(pool, block_table, length, block_size):\n"
        "    return pool.new_empty(0)\n",
        "q1_gather_sequence",
        "is empty",
    ),
}
