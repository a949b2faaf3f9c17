"""Planted mistakes for chapter 02_formula: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "02_formula"

PLANTED = {
    "ada": {
        "stable_softmax": (
            "def stable_softmax(scores):\n"
            "    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))\n"
            "    return e / e.sum(dim=0, keepdim=True)\n",
            "q1_stable_softmax",
            "normalises over the wrong dimension",
        ),
        "my_attention": (
            "def my_attention(q, k, v, mask=None):\n"
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
            "    if mask is not None:\n"
            "        scores = scores.masked_fill(mask, float('-inf'))\n"
            "    return torch.nan_to_num(torch.softmax(scores, dim=-1)) @ v\n",
            "q2_attention_from_scratch",
            "mask is inverted",
        ),
        "predicted_score_std": (
            "def predicted_score_std(d_k, std_q=1.0, std_k=1.0):\n"
            "    return d_k * std_q**2 * std_k**2\n",
            "q3_predict_score_size",
            "the variance of q·k",
        ),
        "fixed_attention": (  # the buggy code handed in unchanged: both mistakes named
            "def fixed_attention(q, k, v, mask):\n"
            "    d_model = q.shape[1] * q.shape[-1]\n"
            "    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_model), dim=-1)\n"
            "    weights = weights * mask\n"
            "    return weights @ v\n",
            "q4_find_the_bug",
            "Two mistakes remain",
        ),
        "query_gradient": (
            "def query_gradient(q, k, upstream):\n"
            "    a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)\n"
            "    return a * (upstream - (a * upstream).sum(-1, keepdim=True)) @ k\n",
            "q5_query_gradient",
            "times too large",
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
        "predicted_score_std": (
            "def predicted_score_std(d_k, std_q=1.0, std_k=1.0):\n"
            "    return torch.tensor(8.0)\n",
            "q3_predict_score_size",
            "whatever d_k",
        ),
        "fixed_attention": (  # the mask fixed, the √d_model left
            "def fixed_attention(q, k, v, mask):\n"
            "    d_model = q.shape[1] * q.shape[-1]\n"
            "    scores = (q @ k.transpose(-2, -1) / math.sqrt(d_model)).masked_fill(~mask, float('-inf'))\n"
            "    return torch.softmax(scores, dim=-1) @ v\n",
            "q4_find_the_bug",
            "instead of the head dimension",
        ),
        "query_gradient": (
            "def query_gradient(q, k, upstream):\n"
            "    a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)\n"
            "    return a * upstream @ k / math.sqrt(q.shape[-1])\n",
            "q5_query_gradient",
            "only the diagonal",
        ),
    },
    "katherine": {
        "stable_softmax": (
            "def stable_softmax(scores):\n"
            "    e = torch.exp(scores - scores.max())\n"
            "    return e / e.sum(dim=-1, keepdim=True)\n",
            "q1_stable_softmax",
            "one maximum for the whole tensor",
        ),
        "my_attention": (  # right, except that a query with nothing to attend to gets NaN
            "def my_attention(q, k, v, mask=None):\n"
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
            "    if mask is not None:\n"
            "        scores = scores.masked_fill(~mask, float('-inf'))\n"
            "    return torch.softmax(scores, dim=-1) @ v\n",
            "q2_attention_from_scratch",
            "is NaN for query 4",
        ),
        "predicted_score_std": (
            "def predicted_score_std(d_k, std_q=1.0, std_k=1.0):\n"
            "    return math.sqrt(d_k)\n",
            "q3_predict_score_size",
            "ignores std_q and std_k",
        ),
        "fixed_attention": (  # the scaling fixed, the mask still applied after the softmax
            "def fixed_attention(q, k, v, mask):\n"
            "    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)\n"
            "    return (weights * mask) @ v\n",
            "q4_find_the_bug",
            "after the softmax",
        ),
        "query_gradient": (
            "def query_gradient(q, k, upstream):\n"
            "    a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)\n"
            "    return a * (upstream - (a * upstream).sum(-2, keepdim=True)) @ k / math.sqrt(q.shape[-1])\n",
            "q5_query_gradient",
            "runs over the queries",
        ),
    },
    "emmy": {
        "my_attention": (  # the classic -1e9: a query with nothing to attend to averages every value
            "def my_attention(q, k, v, mask=None):\n"
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
            "    if mask is not None:\n"
            "        scores = scores.masked_fill(~mask, -1e9)\n"
            "    return torch.softmax(scores, dim=-1) @ v\n",
            "q2_attention_from_scratch",
            "plain average of all the values",
        ),
    },
    "alan": {  # shortcuts: each answer calls what its exercise forbids
        "stable_softmax": (
            "def stable_softmax(scores):\n"
            "    return torch.softmax(scores, dim=-1)\n",
            "q1_stable_softmax",
            "your answer calls torch.softmax, which this exercise forbids",
        ),
        "my_attention": (
            "def my_attention(q, k, v, mask=None):\n"
            "    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n",
            "q2_attention_from_scratch",
            "your answer calls F.scaled_dot_product_attention, which this exercise forbids",
        ),
        "predicted_score_std": (
            "def predicted_score_std(d_k, std_q=1.0, std_k=1.0):\n"
            "    generator = torch.Generator().manual_seed(0)\n"
            "    q = torch.randn(20000, d_k, generator=generator) * std_q\n"
            "    k = torch.randn(20000, d_k, generator=generator) * std_k\n"
            "    return (q * k).sum(-1).std().item()\n",
            "q3_predict_score_size",
            "must not draw random numbers",
        ),
        "fixed_attention": (
            "def fixed_attention(q, k, v, mask):\n"
            "    return self_attention(q, k, v, mask)\n",
            "q4_find_the_bug",
            "your answer calls self_attention, which this exercise forbids",
        ),
        "query_gradient": (
            "def query_gradient(q, k, upstream):\n"
            "    with torch.enable_grad():\n"
            "        q = q.detach().requires_grad_()\n"
            "        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)\n"
            "        (grad,) = torch.autograd.grad(weights, q, upstream)\n"
            "    return grad\n",
            "q5_query_gradient",
            "which this exercise forbids: the exercise is to derive the gradient by hand",
        ),
    },
}

# Mistakes with recognisers of their own.
PLANTED["bea"] = {
    "my_attention": (                     # the values' size for the keys'
        "def my_attention(q, k, v, mask=None):\n"
        "    scores = q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1])\n"
        "    if mask is not None:\n"
        "        scores = scores.masked_fill(~mask, float('-inf'))\n"
        "    return torch.nan_to_num(torch.softmax(scores, dim=-1)) @ v\n",
        "q2_attention_from_scratch",
        "You divided the scores by √d_v",
    ),
    "fixed_attention": (                  # renormalised after the mask: NaN when a blocked key is the row's max
        "def fixed_attention(q, k, v, mask):\n"
        "    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) * mask\n"
        "    return weights / weights.sum(dim=-1, keepdim=True) @ v\n",
        "q4_find_the_bug",
        "zeroed the blocked weights and divided by the sum of the rest",
    ),
    "query_gradient": (                   # the sigmoid's derivative
        "def query_gradient(q, k, upstream):\n"
        "    a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)\n"
        "    return a * (1 - a) * upstream @ k / math.sqrt(q.shape[-1])\n",
        "q5_query_gradient",
        "as for a sigmoid",
    ),
}

# Shortcuts: the course's helper from section 1's listing, and the tutorials' -1e9 of section 4.
PLANTED["zoe"] = {
    "my_attention": (
        "def my_attention(q, k, v, mask=None):\n"
        "    from attn_course.core.attention import softmax_with_empty_rows\n"
        "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
        "    if mask is not None:\n"
        "        scores = scores.masked_fill(~mask, float('-inf'))\n"
        "    return softmax_with_empty_rows(scores) @ v\n",
        "q2_attention_from_scratch",
        "calls softmax_with_empty_rows, which this exercise forbids",
    ),
    "fixed_attention": (
        "def fixed_attention(q, k, v, mask):\n"
        "    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(mask == 0, -1e9)\n"
        "    return torch.softmax(scores, dim=-1) @ v\n",
        "q4_find_the_bug",
        "float16 cannot store",
    ),
}

# Hostile students (issue 31): answers that compute nothing and scored before, each now scores 0 on its question,
# in the notebook and under make grade. Each one fails every test of its question, the hidden ones too
# (tests/checks/test_hostile_answers.py); tests/grading/hostile/checks.py grades them through make grade.

# Empty answers: allclose of an empty tensor against anything it broadcasts with was True.
PLANTED["eve"] = {
    "stable_softmax": (
        "def stable_softmax(scores):\n"
        "    return scores.new_empty((0,) + (1,) * scores.dim())\n",
        "q1_stable_softmax",
        "is empty",
    ),
    "my_attention": (
        "def my_attention(q, k, v, mask=None):\n"
        "    return q.new_empty((0,) + (1,) * q.dim())\n",
        "q2_attention_from_scratch",
        "is empty",
    ),
    "predicted_score_std": (
        "def predicted_score_std(d_k, std_q=1.0, std_k=1.0):\n"
        "    return torch.empty(0)\n",
        "q3_predict_score_size",
        "a tensor of shape [0]",
    ),
    "fixed_attention": (
        "def fixed_attention(q, k, v, mask):\n"
        "    return q.new_empty((0,) + (1,) * q.dim())\n",
        "q4_find_the_bug",
        "is empty",
    ),
    "query_gradient": (
        "def query_gradient(q, k, upstream):\n"
        "    return q.new_empty((0,) + (1,) * q.dim())\n",
        "q5_query_gradient",
        "is empty",
    ),
}

# Mutation: the answer zeroes its inputs (or fills the mask with True) and returns what the reference, computed
# after the call from the same tensors, would then be. The checks and hidden tests now compute the reference
# first, and the answer only ever gets copies.
PLANTED["mallory"] = {
    "stable_softmax": (
        "def stable_softmax(scores):\n"
        "    scores.zero_()\n"
        "    return torch.full_like(scores, 1 / scores.shape[-1])\n",
        "q1_stable_softmax",
        "it ignores its input",
    ),
    "my_attention": (
        "def my_attention(q, k, v, mask=None):\n"
        "    v.zero_()\n"
        "    return v.new_zeros(*q.shape[:-1], v.shape[-1])\n",
        "q2_attention_from_scratch",
        "differs from the reference",
    ),
    "fixed_attention": (
        "def fixed_attention(q, k, v, mask):\n"
        "    mask.fill_(True)\n"
        "    v.zero_()\n"
        "    return v.new_zeros(*q.shape[:-1], v.shape[-1])\n",
        "q4_find_the_bug",
        "differs from the reference",
    ),
    "query_gradient": (
        "def query_gradient(q, k, upstream):\n"
        "    upstream.zero_()\n"
        "    return torch.zeros_like(q)\n",
        "q5_query_gradient",
        "differs from the reference",
    ),
}

# Broadcasting: a huge answer of ones (it cost the grader 2 GB, linear in the answer), and the right values
# with extra leading dimensions, which a bare allclose broadcast against the reference.
PLANTED["bob"] = {
    "stable_softmax": (
        "def stable_softmax(scores):\n"
        "    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))\n"
        "    return (e / e.sum(dim=-1, keepdim=True)).expand(64, *scores.shape)\n",
        "q1_stable_softmax",
        "has shape [64, 2, 3, 6] but should have shape [2, 3, 6]",
    ),
    "my_attention": (
        "def my_attention(q, k, v, mask=None):\n"
        "    return torch.ones(2**18, 1, 1, 1, 1)\n",
        "q2_attention_from_scratch",
        "has shape [262144, 1, 1, 1, 1]",
    ),
    "fixed_attention": (
        "def fixed_attention(q, k, v, mask):\n"
        "    return torch.ones(2**18, 1, 1, 1, 1, dtype=q.dtype)\n",
        "q4_find_the_bug",
        "has shape [262144, 1, 1, 1, 1]",
    ),
    "query_gradient": (
        "def query_gradient(q, k, upstream):\n"
        "    return torch.ones(2**18, 1, 1, 1, 1, dtype=q.dtype)\n",
        "q5_query_gradient",
        "has shape [262144, 1, 1, 1, 1]",
    ),
}

# Measuring instead of predicting, where the watch on random numbers does not look: from PyTorch's generator
# through torch.ops.aten (in the sandbox, that generator is the sandbox's own, which the grader's guard used to
# read), and from a NumPy generator of the answer's own, which gives the same answer every time.
PLANTED["carlo"] = {
    "predicted_score_std": (
        "def predicted_score_std(d_k, std_q=1.0, std_k=1.0):\n"
        "    pairs = torch.ops.aten.randn.default([2, 2000, d_k], dtype=torch.float64)\n"
        "    return float((pairs[0] * std_q * pairs[1] * std_k).sum(-1).std())\n",
        "q3_predict_score_size",
        "it measures instead of predicting",
    ),
}
PLANTED["nancy"] = {
    "predicted_score_std": (
        "def predicted_score_std(d_k, std_q=1.0, std_k=1.0):\n"
        "    import numpy\n"
        "    pairs = numpy.random.default_rng(0).standard_normal((2, 2000, d_k))\n"
        "    return float((pairs[0] * std_q * pairs[1] * std_k).sum(-1).std())\n",
        "q3_predict_score_size",
        "a prediction is exact",
    ),
}
