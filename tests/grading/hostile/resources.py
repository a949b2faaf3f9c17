"""Attacks on the grader's own resources (issue 31), as cells of chapter 03's notebook.

For the end-to-end hostile class (``tests/grading/test_sandbox_grading.py``: chapter 03's
honest answers score 11, graded with ``--seconds 30 --call-seconds 8 --memory-gib 2``). Each
student hands in chapter 03's answers with ``replace``'s answers instead, and ``expect`` is what
that student must get: the exact total, and a substring of ``run["stopped"]`` (None: not stopped).

- ``returns_a_huge_tensor``: ``grouped_query_attention`` returns a [2**22, 1, 1, 1] tensor
  (16 MiB). Compared with broadcasting, against the [2, 4, 5, 3]-like output, each intermediate
  tensor would hold 2**22 times the output (gigabytes): the allocation fails in the submission's
  own grading process, at its memory limit, so q4 (2 points) fails and every other question is
  graded; compared strictly, q4 fails on the shape. Either way 9, and the class is untouched.
- ``slow_on_every_call``: every answer sleeps 6 s, under the 8 s a call may take, then answers
  right. All the calls together get the notebook's 30 s: q1's four calls (three in its check,
  one hidden) take 24 s, q2's first call runs past 30 s in all and the submission is stopped, so
  only q1 (2 points) is earned. Its test phase is capped at 30 s of calls, and it runs beside
  its classmates, not before them.
"""

from __future__ import annotations

_SLEEP = "    import time\n    time.sleep(6)\n"

_SLOW = {
    "split_fused_qkv": (
        "def split_fused_qkv(qkv, num_heads, num_kv_heads):\n" + _SLEEP +
        "    batch, tokens, width = qkv.shape\n"
        "    d = width // (num_heads + 2 * num_kv_heads)\n"
        "    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)\n"
        "    return tuple(part.reshape(batch, tokens, -1, d).transpose(1, 2) for part in (q, k, v))\n"),
    "gqa_parameter_count": (
        "def gqa_parameter_count(embed_dim, num_heads, num_kv_heads, bias):\n" + _SLEEP +
        "    kv_width = num_kv_heads * (embed_dim // num_heads)\n"
        "    return 2 * embed_dim * (embed_dim + kv_width) + (2 * (embed_dim + kv_width) if bias else 0)\n"),
    "fixed_multi_head_attention": (
        "def fixed_multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):\n" + _SLEEP +
        "    batch, tokens, width = x.shape\n"
        "    d = width // num_heads\n"
        "    q, k, v = ((x @ w.T).view(batch, tokens, num_heads, d).transpose(1, 2) for w in (w_q, w_k, w_v))\n"
        "    heads = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1) @ v\n"
        "    return heads.transpose(1, 2).reshape(batch, tokens, width) @ w_o.T\n"),
    "grouped_query_attention": (
        "def grouped_query_attention(q, k, v):\n" + _SLEEP +
        "    groups = q.shape[1] // k.shape[1]\n"
        "    output, _ = self_attention(q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1))\n"
        "    return output\n"),
    "mean_pool_kv_heads": (
        "def mean_pool_kv_heads(w, num_heads, num_kv_heads):\n" + _SLEEP +
        "    return w.unflatten(0, (num_kv_heads, num_heads // num_kv_heads, -1)).mean(dim=1).flatten(0, 1)\n"),
}

ATTACKS = {
    "returns_a_huge_tensor": {
        "chapter": "03_multi_head",
        "replace": {"grouped_query_attention": "def grouped_query_attention(q, k, v):\n"
                                               "    return q.new_zeros(2**22, 1, 1, 1)\n"},
        "expect": {"score": 9.0, "stopped": None},
    },
    "slow_on_every_call": {
        "chapter": "03_multi_head",
        "replace": _SLOW,
        "expect": {"score": 2.0, "stopped": "30 s in all"},
    },
}
