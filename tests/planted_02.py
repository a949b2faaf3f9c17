"""Planted mistakes for chapter 02_formula: each must lose its question's points and get its hint.

Used by tests/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "02_formula"

PLANTED = {
    "ada": {
        "stable_softmax": (
            "def stable_softmax(scores):\n"
            "    e = torch.exp(scores)\n"
            "    return e / e.sum(dim=0, keepdim=True)\n",
            "q1_stable_softmax",
            "normalises over the wrong dimension",
        ),
        "my_attention": (
            "def my_attention(q, k, v, mask=None):\n"
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
            "    if mask is not None:\n"
            "        scores = scores.masked_fill(mask, float('-inf'))\n"
            "    return torch.softmax(scores, dim=-1) @ v\n",
            "q2_attention_from_scratch",
            "mask is inverted",
        ),
        "fixed_attention": (
            "def fixed_attention(q, k, v):\n"
            "    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v\n",
            "q4_find_the_bug",
            "forgot the scaling",
        ),
    },
    "grace": {
        "stable_softmax": (
            "def stable_softmax(scores):\n"
            "    e = torch.exp(scores)\n"
            "    return e / e.sum(dim=-1, keepdim=True)\n",
            "q1_stable_softmax",
            "overflows",
        ),
        "my_attention": (
            "def my_attention(q, k, v, mask=None):\n"
            "    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)\n"
            "    if mask is not None:\n"
            "        weights = weights * mask\n"
            "    return weights @ v\n",
            "q2_attention_from_scratch",
            "after the softmax",
        ),
        "fixed_attention": (
            "def fixed_attention(q, k, v):\n"
            "    d_model = q.shape[1] * q.shape[-1]\n"
            "    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_model), dim=-1) @ v\n",
            "q4_find_the_bug",
            "instead of the head dimension",
        ),
    },
}
