"""Planted mistakes for chapter 10_distributed: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "10_distributed"

# The solution's sent, received and bytes, with one line changed in each planted exchange.
_EXCHANGE = (
    "def ulysses_exchange(shards):\n"
    "    p = len(shards)\n"
    "    h = shards[0].shape[1] // p\n"
    "    sent = {sent}\n"
    "    received = {received}\n"
    "    bytes_sent = {bytes_sent}\n"
    "    return sent, received, bytes_sent\n"
)
_SENT = "[[shard[:, s * h:(s + 1) * h] for s in range(p)] for shard in shards]"
_RECEIVED = "[torch.cat([sent[s][r] for s in range(p)], dim=2) for r in range(p)]"
_BYTES = "[sum(t.numel() * t.element_size() for s, t in enumerate(row) if s != r) for r, row in enumerate(sent)]"


def _exchange(sent=_SENT, received=_RECEIVED, bytes_sent=_BYTES) -> str:
    return _EXCHANGE.format(sent=sent, received=received, bytes_sent=bytes_sent)


# The solution's byte count, with one line changed in each planted count.
_BYTES_SIGNATURE = ("def bytes_sent_per_rank(method, batch, heads, kv_heads, n, head_dim, world_size, "
                    "bytes_per_element, backward):\n")
_BYTES_PER_RANK = _BYTES_SIGNATURE + (
    "    p, e = world_size, bytes_per_element\n"
    "    s_q = batch * heads * (n // p) * head_dim\n"
    "    s_kv = batch * {ring_heads} * (n // p) * head_dim\n"
    "    if method == 'ring':\n"
    "        forward = 2 * (p - 1) * s_kv * e\n"
    "        return 2 * forward + 2 * p * s_kv * {sum_bytes} if backward else forward\n"
    "    forward = (p - 1) * ({ulysses}) * e // p\n"
    "    return {ulysses_total}\n"
)


def _bytes_per_rank(ring_heads="kv_heads", sum_bytes="max(e, 4)", ulysses="2 * s_q + 2 * s_kv",
                    ulysses_total="2 * forward if backward else forward") -> str:
    return _BYTES_PER_RANK.format(ring_heads=ring_heads, sum_bytes=sum_bytes, ulysses=ulysses,
                                  ulysses_total=ulysses_total)


# The solution's count of visible pairs, with one line changed in each planted count.
_PAIRS = (
    "def visible_pairs_by_step(world_size, n, layout):\n"
    "    counts = []\n"
    "    for step in range(world_size):\n"
    "        row = []\n"
    "        for rank in range(world_size):\n"
    "            queries = token_positions(rank, world_size, n, layout)[:, None]\n"
    "            keys = token_positions({source} % world_size, world_size, n, layout)[None, :]\n"
    "            row.append(int((keys {compare} queries).sum()))\n"
    "        counts.append(row)\n"
    "    return {result}\n"
)


def _pairs(source="(rank - step)", compare="<=", result="counts") -> str:
    return _PAIRS.format(source=source, compare=compare, result=result)


PLANTED = {
    "ada": {
        "ulysses_exchange": (                     # each shard cut along its tokens
            _exchange(sent="[list(shard.chunk(p, dim=2)) for shard in shards]"),
            "q1_ulysses_exchange",
            "cut the shard along the tokens",
        ),
        "fixed_ring_attention": (                 # the classmate's code, handed in as it was
            "def fixed_ring_attention(q_blocks, k_blocks, v_blocks):\n"
            "    outputs = []\n"
            "    for r, q in enumerate(q_blocks):\n"
            "        out, lse = 0.0, torch.tensor(float('-inf'))\n"
            "        for s in range(len(q_blocks)):\n"
            "            j = (r - s) % len(q_blocks)\n"
            "            scores = q @ k_blocks[j].transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
            "            block_out = torch.softmax(scores, -1) @ v_blocks[j]\n"
            "            block_lse = torch.logsumexp(scores, -1, keepdim=True)\n"
            "            new_lse = torch.logaddexp(lse, block_lse)\n"
            "            out = out + block_out * torch.exp(block_lse - new_lse)\n"
            "            lse = new_lse\n"
            "        outputs.append(out)\n"
            "    return outputs\n",
            "q3_find_the_bug_ring_merge",
            "not the output accumulated so far",
        ),
    },
    "grace": {
        "bytes_sent_per_rank": (                  # the dK/dV sums at the input's 2 bytes, not float32's 4
            _bytes_per_rank(sum_bytes="e"),
            "q2_predict_bytes",
            "at the input's element size",
        ),
        "fixed_ring_attention": (                 # every block weighed equally
            "def fixed_ring_attention(q_blocks, k_blocks, v_blocks):\n"
            "    outputs = []\n"
            "    for q in q_blocks:\n"
            "        parts = [torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v\n"
            "                 for k, v in zip(k_blocks, v_blocks)]\n"
            "        outputs.append(sum(parts) / len(parts))\n"
            "    return outputs\n",
            "q3_find_the_bug_ring_merge",
            "average the blocks",
        ),
        "visible_pairs_by_step": (                # the blocks travelling the other way round the ring
            _pairs(source="(rank + step)"),
            "q4_visible_pairs_by_step",
            "rank (r + s) mod P",
        ),
    },
    "bea": {
        "ulysses_exchange": (                     # sent[r][s] holds what rank s sends rank r
            _exchange(sent="[[shards[s][:, r * h:(r + 1) * h] for s in range(p)] for r in range(p)]",
                      received="[torch.cat(sent[r], dim=2) for r in range(p)]"),
            "q1_ulysses_exchange",
            "that is what rank s sends to rank r",
        ),
        "bytes_sent_per_rank": (                  # the ring's K/V blocks at every query head
            _bytes_per_rank(ring_heads="heads", ulysses="2 * s_q + 2 * batch * kv_heads * (n // p) * head_dim"),
            "q2_predict_bytes",
            "With grouped-query attention they have",
        ),
    },
    "linus": {
        "ulysses_exchange": (                     # the piece a rank keeps counted as sent
            _exchange(bytes_sent="[sum(t.numel() * t.element_size() for t in row) for row in sent]"),
            "q1_ulysses_exchange",
            "the piece a rank keeps",
        ),
        "visible_pairs_by_step": (                # a query not seeing its own key
            _pairs(compare="<"),
            "q4_visible_pairs_by_step",
            "strictly before the query",
        ),
    },
    "katherine": {
        "bytes_sent_per_rank": (                  # Ulysses' k and v at H heads, like q and the output
            _bytes_per_rank(ulysses="4 * s_q"),
            "q2_predict_bytes",
            "all four of Ulysses' all-to-alls at H heads",
        ),
        "visible_pairs_by_step": (                # one row per rank, one entry per step
            _pairs(result="[list(column) for column in zip(*counts)]"),
            "q4_visible_pairs_by_step",
            "the outer list is the steps",
        ),
    },
    "emmy": {
        "ulysses_exchange": (                     # pieces joined in the order a ring would bring them
            _exchange(received="[torch.cat([sent[(r - s) % p][r] for s in range(p)], dim=2) for r in range(p)]"),
            "q1_ulysses_exchange",
            "not in sequence order",
        ),
        "bytes_sent_per_rank": (                  # Ulysses' backward forgotten
            _bytes_per_rank(ulysses_total="forward"),
            "q2_predict_bytes",
            "returns the forward pass's bytes",
        ),
    },
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "ulysses_exchange": (
        _exchange(received="[unshard([row[r] for row in sent]) for r in range(p)]"),   # the chapter's import
        "q1_ulysses_exchange",
        "calls unshard, which this exercise forbids",
    ),
    "bytes_sent_per_rank": (
        _BYTES_SIGNATURE +
        "    from attn_course.distributed.schedule import formula_bytes\n"
        "    return formula_bytes(method, batch, heads, n, head_dim, world_size, element_size=bytes_per_element,\n"
        "                         backward=backward, kv_heads=kv_heads)\n",
        "q2_predict_bytes",
        "calls formula_bytes, which this exercise forbids",
    ),
    "fixed_ring_attention": (
        "def fixed_ring_attention(q_blocks, k_blocks, v_blocks):\n"
        "    from attn_course.flash.tiled import merge_attention_outputs\n"
        "    outputs = []\n"
        "    for q in q_blocks:\n"
        "        out = lse = None\n"
        "        for k, v in zip(k_blocks, v_blocks):\n"
        "            scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5\n"
        "            o, l = torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)\n"
        "            out, lse = (o, l) if out is None else merge_attention_outputs(out, lse, o, l)\n"
        "        outputs.append(out)\n"
        "    return outputs\n",
        "q3_find_the_bug_ring_merge",
        "calls merge_attention_outputs, which this exercise forbids",
    ),
}

PLANTED["alan"] = {
    "bytes_sent_per_rank": (                      # the ring by hand, Ulysses from the course
        _BYTES_SIGNATURE +
        "    from attn_course.distributed.ulysses import ulysses_bytes\n"
        "    s_kv = batch * kv_heads * (n // world_size) * head_dim\n"
        "    if method == 'ring':\n"
        "        forward = 2 * (world_size - 1) * s_kv * bytes_per_element\n"
        "        return 2 * forward + 2 * world_size * s_kv * max(bytes_per_element, 4) if backward else forward\n"
        "    return ulysses_bytes(batch, heads, n, head_dim, world_size, element_size=bytes_per_element,\n"
        "                         backward=backward, kv_heads=kv_heads)\n",
        "q2_predict_bytes",
        "calls ulysses_bytes, which this exercise forbids",
    ),
}
