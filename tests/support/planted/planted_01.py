"""Planted mistakes for chapter 01_intuition: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "01_intuition"

PLANTED = {
    "linus": {
        # Divides by the square root of the embedding width E, not of the query width d_k.
        "attention_from_embeddings": (
            "def attention_from_embeddings(x, w_q, w_k, w_v):\n"
            "    q, k, v = x @ w_q, x @ w_k, x @ w_v\n"
            "    weights = torch.softmax(q @ k.T / x.shape[-1] ** 0.5, dim=-1)\n"
            "    return weights @ v, weights\n",
            "q1_attention_from_embeddings",
            "the width of the embeddings",
        ),
        # Forgets that weights sum to one.
        "weights_for_identical_keys": (
            "def weights_for_identical_keys(n):\n"
            "    return torch.ones(n)\n",
            "q2_identical_keys",
            "sum to 4",
        ),
        # Hands in the classmate's code unchanged.
        "fixed_attention_map": (
            "def fixed_attention_map(queries, keys):\n"
            "    scores = keys @ queries.T / keys.shape[-1] ** 0.5\n"
            "    return torch.softmax(scores, dim=-1)\n",
            "q3_find_the_bug",
            "one row per key",
        ),
        # Thinks a factor on the scores cancels out in the softmax.
        "rescaled_weights": (
            "def rescaled_weights(weights, factor):\n"
            "    return weights\n",
            "q4_rescaled_weights",
            "did not change",
        ),
    },
    "ada": {
        # Mixes the values with the scores instead of the weights.
        "attention_from_embeddings": (
            "def attention_from_embeddings(x, w_q, w_k, w_v):\n"
            "    q, k, v = x @ w_q, x @ w_k, x @ w_v\n"
            "    scores = q @ k.T / q.shape[-1] ** 0.5\n"
            "    weights = torch.softmax(scores, dim=-1)\n"
            "    return scores @ v, weights\n",
            "q1_attention_from_embeddings",
            "with the scores, not with the weights",
        ),
        # Thinks the first of several equal keys wins.
        "weights_for_identical_keys": (
            "def weights_for_identical_keys(n):\n"
            "    weights = torch.zeros(n)\n"
            "    weights[0] = 1.0\n"
            "    return weights\n",
            "q2_identical_keys",
            "all the weight on one key",
        ),
        # "Fixes" the shape by transposing the classmate's result: the softmax then runs over the queries.
        "fixed_attention_map": (
            "def fixed_attention_map(queries, keys):\n"
            "    scores = keys @ queries.T / keys.shape[-1] ** 0.5\n"
            "    return torch.softmax(scores, dim=-1).T\n",
            "q3_find_the_bug",
            "normalises over the queries",
        ),
        # The right powers, never normalised.
        "rescaled_weights": (
            "def rescaled_weights(weights, factor):\n"
            "    return weights ** factor\n",
            "q4_rescaled_weights",
            "proportional to the right ones",
        ),
    },
    "grace": {
        # Moves the softmax to the other axis of the classmate's scores: right weights, transposed.
        "fixed_attention_map": (
            "def fixed_attention_map(queries, keys):\n"
            "    scores = keys @ queries.T / keys.shape[-1] ** 0.5\n"
            "    return torch.softmax(scores, dim=0)\n",
            "q3_find_the_bug",
            "right weights, but transposed",
        ),
        # Treats the weights as if they were scores.
        "rescaled_weights": (
            "def rescaled_weights(weights, factor):\n"
            "    return torch.softmax(factor * weights, dim=-1)\n",
            "q4_rescaled_weights",
            "as if they were the scores",
        ),
    },
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "attention_from_embeddings": (
        "def attention_from_embeddings(x, w_q, w_k, w_v):\n"
        "    import torch.nn.functional as F\n"
        "    q, k, v = x @ w_q, x @ w_k, x @ w_v\n"
        "    return F.scaled_dot_product_attention(q, k, v), torch.softmax(q @ k.T / q.shape[-1] ** 0.5, dim=-1)\n",
        "q1_attention_from_embeddings",
        "calls F.scaled_dot_product_attention, which this exercise forbids",
    ),
    "weights_for_identical_keys": (
        "def weights_for_identical_keys(n):\n"
        "    return torch.softmax(torch.zeros(n), dim=-1)\n",
        "q2_identical_keys",
        "calls torch.softmax, which this exercise forbids",
    ),
    "fixed_attention_map": (
        "def fixed_attention_map(queries, keys):\n"
        "    from attn_course import self_attention\n"
        "    return self_attention(queries, keys, keys)[1]\n",
        "q3_find_the_bug",
        "calls self_attention, which this exercise forbids",
    ),
}
