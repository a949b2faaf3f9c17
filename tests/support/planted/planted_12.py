"""Planted mistakes for chapter 12_open_models: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "12_open_models"

# The solution's QK-norm scores, with one of its steps changed.
_QK = (
    "def qk_norm_scores(q, k, q_weight, k_weight, eps, rope_base):\n"
    "    rope = RotaryEmbedding(q_weight.shape[0], base=rope_base)\n"
    "    d = q_weight.shape[0]\n"
    "    def normed(t, weight):\n"
    "        heads = {split}\n"
    "        {before}\n"
    "        rms = {rms}\n"
    "        return {out}\n"
    "    return normed(q, q_weight) @ normed(k, {k_weight}).transpose(-2, -1) / math.sqrt(d)\n"
)


def _qk(split="t.unflatten(-1, (-1, d)).transpose(1, 2)", before="pass",
        rms="torch.sqrt(heads.pow(2).mean(dim=-1, keepdim=True) + eps)", out="rope(heads / rms * weight)",
        k_weight="k_weight") -> str:
    return _QK.format(split=split, before=before, rms=rms, out=out, k_weight=k_weight)


# The solution's sink softmax, with its shift or its denominator changed.
_SINK = (
    "def fixed_softmax_with_sink(scores, sinks):\n"
    "    sink = {sink}\n"
    "    top = {top}\n"
    "    e = torch.exp(scores - top)\n"
    "    return e / (e.sum(dim=-1, keepdim=True) + {term})\n"
)


def _sink(sink="sinks.view(-1, 1, 1)", top="torch.maximum(scores.amax(dim=-1, keepdim=True), sink)",
          term="torch.exp(sink - top)") -> str:
    return _SINK.format(sink=sink, top=top, term=term)


_GATE = "def gated_output(heads, x, w_gate, w_out):\n    return {body}\n"
_RANK = ("def cache_ranking(names):\n"
         "    smallest_first = {order}\n"
         "    return sorted(names, key=smallest_first.index)\n")
_AT_4K = "['qwen3-next-80b-a3b-instruct', 'gpt-oss-120b', 'qwen3-8b', 'gemma-3-27b-it']"

PLANTED = {
    "ada": {
        "qk_norm_scores": (                         # one norm over the token's whole query, as a layer's RMSNorm
            _qk(split="t", rms="torch.sqrt(heads.pow(2).mean(dim=-1, keepdim=True) + eps)",
                out="rope((heads / rms).unflatten(-1, (-1, d)).transpose(1, 2) * weight)"),
            "q1_qk_norm_scores",
            "whole query",
        ),
        "fixed_softmax_with_sink": (                # the classmate's code, handed in as it was
            _sink(top="scores.amax(dim=-1, keepdim=True)", term="torch.exp(sink)"),
            "q2_find_the_bug_sink_softmax",
            "the classmate's code as it was",
        ),
        "gated_output": (                           # the gate after the output projection
            _GATE.format(body="(heads @ w_out.T) * torch.sigmoid(x @ w_gate.T)"),
            "q3_output_gate",
            "after the output projection",
        ),
        "cache_ranking": (                          # the order of the table at 4,096 tokens
            _RANK.format(order=_AT_4K),
            "q4_predict_cache_ranking",
            "order of the table at 4,096 tokens",
        ),
    },
    "grace": {
        "qk_norm_scores": (                         # rotated first, normalised after
            _qk(before="heads = rope(heads)", out="heads / rms * weight"),
            "q1_qk_norm_scores",
            "rotate first",
        ),
        "fixed_softmax_with_sink": (                # the sink dropped: a plain softmax
            _sink(term="0"),
            "q2_find_the_bug_sink_softmax",
            "rows sum to one",
        ),
        "gated_output": (                           # SwiGLU's SiLU instead of the sigmoid
            _GATE.format(body="(heads * F.silu(x @ w_gate.T)) @ w_out.T"),
            "q3_output_gate",
            "SiLU",
        ),
        "cache_ranking": (                          # gpt-oss first: the linear states taken for large
            _RANK.format(order="['gpt-oss-120b', 'qwen3-next-80b-a3b-instruct', 'gemma-3-27b-it', 'qwen3-8b']"),
            "q4_predict_cache_ranking",
            "gpt-oss before Qwen3-Next",
        ),
    },
    "hedy": {
        "qk_norm_scores": (                         # eps added after the root
            _qk(rms="torch.sqrt(heads.pow(2).mean(dim=-1, keepdim=True)) + eps"),
            "q1_qk_norm_scores",
            "eps after the square root",
        ),
        "fixed_softmax_with_sink": (                # no shift at all: exp overflows near 1000
            _sink(top="0"),
            "q2_find_the_bug_sink_softmax",
            "exp overflows",
        ),
        "gated_output": (                           # no sigmoid
            _GATE.format(body="(heads * (x @ w_gate.T)) @ w_out.T"),
            "q3_output_gate",
            "pass it through a sigmoid",
        ),
        "cache_ranking": (                          # largest first
            _RANK.format(order="['qwen3-8b', 'gemma-3-27b-it', 'gpt-oss-120b', 'qwen3-next-80b-a3b-instruct']"),
            "q4_predict_cache_ranking",
            "largest cache first",
        ),
    },
    "barbara": {
        "qk_norm_scores": (                         # the queries only
            _qk(out="rope(heads / rms * weight) if weight is q_weight else rope(heads)"),
            "q1_qk_norm_scores",
            "queries only",
        ),
        "fixed_softmax_with_sink": (                # a sink per query row: [H, 1] meets [N_q, 1]
            _sink(sink="sinks[:, None]"),
            "q2_find_the_bug_sink_softmax",
            "changes with the query",
        ),
        "gated_output": (                           # no output projection
            _GATE.format(body="heads * torch.sigmoid(x @ w_gate.T)"),
            "q3_output_gate",
            "before the output projection",
        ),
        "cache_ranking": (                          # Qwen3-Next's linear layers grown like full ones
            _RANK.format(order="['gpt-oss-120b', 'gemma-3-27b-it', 'qwen3-next-80b-a3b-instruct', 'qwen3-8b']"),
            "q4_predict_cache_ranking",
            "linear-attention (Gated DeltaNet) layers grow",
        ),
    },
    "linus": {
        "qk_norm_scores": (                         # no weight
            _qk(out="rope(heads / rms)"),
            "q1_qk_norm_scores",
            "never multiply by their weights",
        ),
        "fixed_softmax_with_sink": (                # the sink's own weight returned too
            "def fixed_softmax_with_sink(scores, sinks):\n"
            "    logits = torch.cat((scores, sinks.view(-1, 1, 1).expand(*scores.shape[:-1], 1)), dim=-1)\n"
            "    e = torch.exp(logits - logits.amax(dim=-1, keepdim=True))\n"
            "    return e / e.sum(dim=-1, keepdim=True)\n",
            "q2_find_the_bug_sink_softmax",
            "N + 1 weights",
        ),
    },
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "qk_norm_scores": (
        "def qk_norm_scores(q, k, q_weight, k_weight, eps, rope_base):\n"
    "    rope = RotaryEmbedding(q_weight.shape[0], base=rope_base)\n"
        "    d = q_weight.shape[0]\n"
        "    def normed(t, weight):\n"
        "        norm = torch.nn.RMSNorm(d, eps=eps)\n"
        "        norm.weight.data.copy_(weight)\n"
        "        return rope(norm(t.unflatten(-1, (-1, d))).transpose(1, 2))\n"
        "    return normed(q, q_weight) @ normed(k, k_weight).transpose(-2, -1) / math.sqrt(d)\n",
        "q1_qk_norm_scores",
        "which this exercise forbids",
    ),
    "fixed_softmax_with_sink": (                    # the softmax over the scores and the sink, the sink dropped
        "def fixed_softmax_with_sink(scores, sinks):\n"
        "    logits = torch.cat((scores, sinks.view(-1, 1, 1).expand(*scores.shape[:-1], 1)), dim=-1)\n"
        "    return torch.softmax(logits, dim=-1)[..., :-1]\n",
        "q2_find_the_bug_sink_softmax",
        "calls torch.softmax, which this exercise forbids",
    ),
    "cache_ranking": (                              # counted, not predicted
        "def cache_ranking(names):\n"
        "    from attn_course.variants.layout_cache_size import cache_elements_by_layout, published_config\n"
        "    count = lambda name: cache_elements_by_layout(published_config(name), 131072).elements\n"
        "    return sorted(names, key=count)\n",
        "q4_predict_cache_ranking",
        "which this exercise forbids",
    ),
}

# An answer that computes nothing (issue 31): an empty tensor fails every test of its question.
PLANTED["eve"] = {
    "gated_output": (
        "def gated_output(heads, x, w_gate, w_out):\n"
        "    return heads.new_empty(0)\n",
        "q3_output_gate",
        "is empty",
    ),
}
