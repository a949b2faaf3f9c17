"""Planted mistakes for chapter 13_sparse_recurrent: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "13_sparse_recurrent"

# The solution's recurrence, with one of its lines changed.
_DELTA = (
    "def gated_delta_recurrence(q, k, v, g, beta, state, scale):\n"
    "    outputs = []\n"
    "    for t in range(q.shape[2]):\n"
    "        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]\n"
    "        alpha, b = g[:, :, t, None, None].exp(), beta[:, :, t, None]\n"
    "        decayed = alpha * state\n"
    "        recalled = {recalled}\n"
    "        {before}\n"
    "        state = {update}\n"
    "        {output}\n"
    "    return torch.stack(outputs, dim=2), state\n"
)


def _delta(recalled="(k_t.unsqueeze(-1) * decayed).sum(-2)", before="pass",
           update="decayed + k_t.unsqueeze(-1) * (b * (v_t - recalled)).unsqueeze(-2)",
           out="scale * (q_t.unsqueeze(-1) * state).sum(-2)", output="outputs.append({out})") -> str:
    return _DELTA.format(recalled=recalled, before=before, update=update, output=output.format(out=out))


# The solution's selection, with its mask, its count or its last line changed.
_TOP_K = (
    "def fixed_causal_top_k(scores, k):\n"
    "    n = scores.shape[-1]\n"
    "    causal = {causal}\n"
    "    best = {ranked}.topk({count}, dim=-1).indices\n"
    "    chosen = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, best, True)\n"
    "    return {result}\n"
)


def _top_k(causal="torch.ones(n, n, dtype=torch.bool).tril()", ranked="scores.masked_fill(~causal, float('-inf'))",
           count="min(k, n)", result="chosen & causal") -> str:
    return _TOP_K.format(causal=causal, ranked=ranked, count=count, result=result)


_MEMORY = "def better_memory(pairs, which):\n    return {body}\n"

PLANTED = {
    "ada": {
        "gated_delta_recurrence": (                 # every token added whole: decayed linear attention
            _delta(update="decayed + k_t.unsqueeze(-1) * (b * v_t).unsqueeze(-2)"),
            "q1_gated_delta_recurrence",
            "add every token to the state",
        ),
        "fixed_causal_top_k": (                     # the classmate's code, handed in as it was
            _top_k(ranked="scores"),
            "q2_find_the_bug_causal_top_k",
            "the classmate's code as it was",
        ),
        "better_memory": (                          # the correction can only help
            _MEMORY.format(body="'delta'"),
            "q3_predict_memory_recall",
            "delta rule every time",
        ),
    },
    "grace": {
        "gated_delta_recurrence": (                 # the correction read from the state before its decay
            _delta(recalled="(k_t.unsqueeze(-1) * state).sum(-2)"),
            "q1_gated_delta_recurrence",
            "before its decay",
        ),
        "fixed_causal_top_k": (                     # masked first, but the -inf entries kept for early queries
            _top_k(result="chosen"),
            "q2_find_the_bug_causal_top_k",
            "fewer than k finite scores",
        ),
        "better_memory": (                          # crosstalk taken for the only thing that matters
            _MEMORY.format(body="'linear'"),
            "q3_predict_memory_recall",
            "linear attention every time",
        ),
    },
    "hedy": {
        "gated_delta_recurrence": (                 # the papers' orientation, [d_v, d_k], for the course's state
            _delta(recalled="(decayed @ k_t.unsqueeze(-1)).squeeze(-1)",
                   update="decayed + (b * (v_t - recalled)).unsqueeze(-1) * k_t.unsqueeze(-2)",
                   out="scale * (state @ q_t.unsqueeze(-1)).squeeze(-1)"),
            "q1_gated_delta_recurrence",
            "the state the other way round",
        ),
        "fixed_causal_top_k": (                     # a strict mask: the query's own token excluded
            _top_k(causal="torch.ones(n, n, dtype=torch.bool).tril(-1)"),
            "q2_find_the_bug_causal_top_k",
            "never select their own token",
        ),
        "better_memory": (                          # every answer reversed
            _MEMORY.format(body="'linear' if which == 'newest' else 'delta'"),
            "q3_predict_memory_recall",
            "wrong way round",
        ),
    },
    "barbara": {
        "gated_delta_recurrence": (                 # no scale on the outputs
            _delta(out="(q_t.unsqueeze(-1) * state).sum(-2)"),
            "q1_gated_delta_recurrence",
            "outputs are not scaled",
        ),
        "fixed_causal_top_k": (                     # no mask at all
            _top_k(ranked="scores", result="chosen"),
            "q2_find_the_bug_causal_top_k",
            "which comes after it",
        ),
        "better_memory": (                          # linear attention holds d pairs, then fails
            _MEMORY.format(body="'linear' if pairs <= 32 else 'delta'"),
            "q3_predict_memory_recall",
            "hold d pairs and then fail",
        ),
    },
    "linus": {
        "gated_delta_recurrence": (                 # each output read before the token's write
            _delta(before="outputs.append(scale * (q_t.unsqueeze(-1) * state).sum(-2))", output="pass"),
            "q1_gated_delta_recurrence",
            "before the token's own write",
        ),
        "fixed_causal_top_k": (                     # k keys even where the sequence is shorter: topk fails
            _top_k(count="k"),
            "q2_find_the_bug_causal_top_k",
            "more keys than the 5 tokens",
        ),
        "better_memory": (                          # the delta rule thought to keep its first pairs
            _MEMORY.format(body="'delta' if which in ('newest', 'oldest') else 'linear'"),
            "q3_predict_memory_recall",
            "keep its oldest pairs",
        ),
    },
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "gated_delta_recurrence": (
        "def gated_delta_recurrence(q, k, v, g, beta, state, scale):\n"
        "    from attn_course.variants.delta_rule import gated_delta_rule\n"
        "    return gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=state)\n",
        "q1_gated_delta_recurrence",
        "which this exercise forbids",
    ),
    "fixed_causal_top_k": (
        "def fixed_causal_top_k(scores, k):\n"
        "    from attn_course.variants.sparse_attention import top_k_keys\n"
        "    return top_k_keys(scores, k)\n",
        "q2_find_the_bug_causal_top_k",
        "which this exercise forbids",
    ),
    "better_memory": (                              # measured, not predicted
        "def better_memory(pairs, which):\n"
        "    keys = torch.nn.functional.normalize(torch.randn(pairs, 32), dim=-1)\n"
        "    values = torch.nn.functional.normalize(torch.randn(pairs, 32), dim=-1)\n"
        "    read = keys @ (keys.T @ values)\n"
        "    return 'linear' if (read @ values.T).argmax(-1).eq(torch.arange(pairs)).float().mean() > 0.5 "
        "else 'delta'\n",
        "q3_predict_memory_recall",
        "calls torch.randn, which this exercise forbids",
    ),
}

# An answer that computes nothing (issue 31): an empty tensor fails every test of its question.
PLANTED["eve"] = {
    "fixed_causal_top_k": (
        "def fixed_causal_top_k(scores, k):\n"
        "    return scores.new_empty(0, dtype=torch.bool)\n",
        "q2_find_the_bug_causal_top_k",
        "is empty",
    ),
}
