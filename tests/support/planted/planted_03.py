"""Planted mistakes for chapter 03_multi_head: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "03_multi_head"

PLANTED = {
    "ada": {
        "split_fused_qkv": (
            "def split_fused_qkv(qkv, num_heads, num_kv_heads):\n"
            "    q, k, v = qkv.chunk(3, dim=-1)\n"
            "    batch, tokens, _ = q.shape\n"
            "    q = q.view(batch, tokens, num_heads, -1).transpose(1, 2)\n"
            "    k = k.view(batch, tokens, num_kv_heads, -1).transpose(1, 2)\n"
            "    v = v.view(batch, tokens, num_kv_heads, -1).transpose(1, 2)\n"
            "    return q, k, v\n",
            "q1_split_fused_qkv",
            "the three parts are not equal",
        ),
        "gqa_parameter_count": (          # a multi-head layer's count, whatever H_kv is
            "def gqa_parameter_count(embed_dim, num_heads, num_kv_heads, bias):\n"
            "    return 4 * embed_dim * embed_dim + (4 * embed_dim if bias else 0)\n",
            "q2_predict_parameters",
            "at the full width E",
        ),
        "fixed_multi_head_attention": (
            "def fixed_multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):\n"
            "    batch, tokens, width = x.shape\n"
            "    d = width // num_heads\n"
            "    q = (x @ w_q.T).view(batch, tokens, num_heads, d).transpose(1, 2)\n"
            "    k = (x @ w_k.T).view(batch, tokens, num_heads, d).transpose(1, 2)\n"
            "    v = (x @ w_v.T).view(batch, tokens, num_heads, d).transpose(1, 2)\n"
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(width)\n"
            "    heads = torch.softmax(scores, dim=-1) @ v\n"
            "    return heads.transpose(1, 2).reshape(batch, tokens, width) @ w_o.T\n",
            "q3_find_the_bug",
            "instead of √d",
        ),
        "grouped_query_attention": (
            "def grouped_query_attention(q, k, v):\n"
            "    groups = q.shape[1] // k.shape[1]\n"
            "    output, _ = self_attention(q, k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1))\n"
            "    return output\n",
            "q4_grouped_query",
            "h % H_kv",
        ),
        "mean_pool_kv_heads": (
            "def mean_pool_kv_heads(w, num_heads, num_kv_heads):\n"
            "    groups = num_heads // num_kv_heads\n"
            "    return w.unflatten(0, (groups, num_kv_heads, -1)).mean(dim=0).flatten(0, 1)\n",
            "q5_mean_pool_kv_heads",
            "G consecutive heads",
        ),
    },
    "grace": {
        "split_fused_qkv": (
            "def split_fused_qkv(qkv, num_heads, num_kv_heads):\n"
            "    batch, tokens, width = qkv.shape\n"
            "    d = width // (num_heads + 2 * num_kv_heads)\n"
            "    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)\n"
            "    return (q.reshape(batch, num_heads, tokens, d), k.reshape(batch, num_kv_heads, tokens, d),\n"
            "            v.reshape(batch, num_kv_heads, tokens, d))\n",
            "q1_split_fused_qkv",
            "scrambles tokens and heads",
        ),
        "gqa_parameter_count": (          # key/value heads E wide, not d
            "def gqa_parameter_count(embed_dim, num_heads, num_kv_heads, bias):\n"
            "    kv_width = num_kv_heads * embed_dim\n"
            "    return 2 * embed_dim * (embed_dim + kv_width) + (2 * (embed_dim + kv_width) if bias else 0)\n",
            "q2_predict_parameters",
            "a key/value head has d = E/H numbers",
        ),
        "fixed_multi_head_attention": (
            "def fixed_multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):\n"
            "    batch, tokens, width = x.shape\n"
            "    d = width // num_heads\n"
            "    q = (x @ w_q.T).view(batch, tokens, num_heads, d).transpose(1, 2)\n"
            "    k = (x @ w_k.T).view(batch, tokens, num_heads, d).transpose(1, 2)\n"
            "    v = (x @ w_v.T).view(batch, tokens, num_heads, d).transpose(1, 2)\n"
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(width)\n"
            "    heads = torch.softmax(scores, dim=-1) @ v\n"
            "    return heads.reshape(batch, tokens, width) @ w_o.T\n",
            "q3_find_the_bug",
            "2 mistakes: (1) You merge the heads without a transpose",
        ),
        "grouped_query_attention": (
            "def grouped_query_attention(q, k, v):\n"
            "    output, _ = self_attention(q, k, v)\n"
            "    return output\n",
            "q4_grouped_query",
            "works when H_kv = H",
        ),
        "mean_pool_kv_heads": (
            "def mean_pool_kv_heads(w, num_heads, num_kv_heads):\n"
            "    groups = num_heads // num_kv_heads\n"
            "    return w.unflatten(0, (num_kv_heads, groups, -1))[:, 0].flatten(0, 1)\n",
            "q5_mean_pool_kv_heads",
            "kept the first head",
        ),
    },
    "linus": {
        "gqa_parameter_count": (          # the biases forgotten
            "def gqa_parameter_count(embed_dim, num_heads, num_kv_heads, bias):\n"
            "    return 2 * embed_dim * (embed_dim + num_kv_heads * (embed_dim // num_heads))\n",
            "q2_predict_parameters",
            "You left out the biases",
        ),
        "fixed_multi_head_attention": (
            "def fixed_multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):\n"
            "    batch, tokens, width = x.shape\n"
            "    d = width // num_heads\n"
            "    q = (x @ w_q.T).view(batch, tokens, num_heads, d).transpose(1, 2)\n"
            "    k = (x @ w_k.T).view(batch, tokens, num_heads, d).transpose(1, 2)\n"
            "    v = (x @ w_v.T).view(batch, tokens, num_heads, d).transpose(1, 2)\n"
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(d)\n"
            "    heads = torch.softmax(scores, dim=-1) @ v\n"
            "    return heads.reshape(batch, tokens, width) @ w_o.T\n",
            "q3_find_the_bug",
            "merge the heads without a transpose",
        ),
    },
    "alan": {  # shortcuts: each answer calls what its exercise forbids
        "split_fused_qkv": (
            "def split_fused_qkv(qkv, num_heads, num_kv_heads):\n"
            "    d = qkv.shape[-1] // (num_heads + 2 * num_kv_heads)\n"
            "    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)\n"
            "    return split_heads(q, num_heads), split_heads(k, num_kv_heads), split_heads(v, num_kv_heads)\n",
            "q1_split_fused_qkv",
            "your answer calls split_heads, which this exercise forbids",
        ),
        "gqa_parameter_count": (
            "def gqa_parameter_count(embed_dim, num_heads, num_kv_heads, bias):\n"
            "    layer = MultiHeadAttention(embed_dim, num_heads, num_kv_heads=num_kv_heads, bias=bias)\n"
            "    return sum(p.numel() for p in layer.parameters())\n",
            "q2_predict_parameters",
            "which this exercise forbids: a prediction follows from the shapes alone",
        ),
        "fixed_multi_head_attention": (
            "def fixed_multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):\n"
            "    layer = MultiHeadAttention(x.shape[-1], num_heads, bias=False)\n"
            "    layers = (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj)\n"
            "    for linear, w in zip(layers, (w_q, w_k, w_v, w_o)):\n"
            "        linear.weight.data.copy_(w)\n"
            "    return layer(x)[0]\n",
            "q3_find_the_bug",
            "your answer calls MultiHeadAttention.forward, which this exercise forbids",
        ),
        "grouped_query_attention": (
            "def grouped_query_attention(q, k, v):\n"
            "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)\n",
            "q4_grouped_query",
            "your answer calls F.scaled_dot_product_attention, which this exercise forbids",
        ),
    },
}

PLANTED["bea"] = {
    "mean_pool_kv_heads": (               # the first H_kv heads of the layer, not each group's mean
        "def mean_pool_kv_heads(w, num_heads, num_kv_heads):\n"
        "    return w[: num_kv_heads * w.shape[0] // num_heads]\n",
        "q5_mean_pool_kv_heads",
        "You kept the first H_kv",
    ),
}

# Hostile students (issue 31): answers that compute nothing and scored before, each now scores 0 on its question,
# in the notebook and under make grade. Each fails every test of its question, the hidden ones too
# (tests/checks/test_hostile_answers.py); tests/grading/hostile/checks.py grades them through make grade.

# Empty answers: allclose of an empty tensor against anything it broadcasts with was True.
PLANTED["eve"] = {
    "split_fused_qkv": (
        "def split_fused_qkv(qkv, num_heads, num_kv_heads):\n"
        "    return tuple(qkv.new_empty((0,) + (1,) * (qkv.dim() + 1)) for _ in range(3))\n",
        "q1_split_fused_qkv",
        "is empty",
    ),
    "fixed_multi_head_attention": (
        "def fixed_multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):\n"
        "    return x.new_empty((0,) + (1,) * x.dim())\n",
        "q3_find_the_bug",
        "is empty",
    ),
    "grouped_query_attention": (
        "def grouped_query_attention(q, k, v):\n"
        "    return q.new_empty((0,) + (1,) * q.dim())\n",
        "q4_grouped_query",
        "is empty",
    ),
    "mean_pool_kv_heads": (
        "def mean_pool_kv_heads(w, num_heads, num_kv_heads):\n"
        "    return w.new_empty((0,) + (1,) * w.dim())\n",
        "q5_mean_pool_kv_heads",
        "is empty",
    ),
}

# Mutation: zero the values in place and return zeros, the reference a check used to compute after the call.
PLANTED["mallory"] = {
    "grouped_query_attention": (
        "def grouped_query_attention(q, k, v):\n"
        "    v.zero_()\n"
        "    return v.new_zeros(*q.shape[:-1], v.shape[-1])\n",
        "q4_grouped_query",
        "differs from the reference",
    ),
    "fixed_multi_head_attention": (
        "def fixed_multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):\n"
        "    w_o.zero_()\n"
        "    return torch.zeros_like(x)\n",
        "q3_find_the_bug",
        "differs from the reference",
    ),
}
