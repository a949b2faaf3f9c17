"""Planted mistakes for chapter 06_flash_attention: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter, and by
tests/checks/test_checks_flash.py, which runs each against its check directly.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "06_flash_attention"

# Exercise 2: the classmate's loop up to its update of the output (each entry adds its own update and return).
STREAM_LOOP = (
    "def streaming_attention(q, kv_tiles):\n"
    "    scale = 1 / math.sqrt(q.shape[-1])\n"
    "    row_max, row_sum = torch.full(q.shape[:1], float('-inf')), torch.zeros(q.shape[:1])\n"
    "    out = torch.zeros(q.shape[0], kv_tiles[0][1].shape[-1])\n"
    "    for k_tile, v_tile in kv_tiles:\n"
    "        scores = q @ k_tile.T * scale\n"
    "        new_max = torch.maximum(row_max, scores.amax(dim=-1))\n"
    "        correction = torch.exp(row_max - new_max)\n"
    "        weights = torch.exp(scores - new_max[:, None])\n"
    "        new_sum = row_sum * correction + weights.sum(dim=-1)\n"
)

PLANTED = {
    "linus": {
        "merge_partial_attention": (
            "def merge_partial_attention(out_a, lse_a, out_b, lse_b):\n"
            "    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)\n",
            "q1_merge_partial",
            "You averaged out_a and out_b",
        ),
        "streaming_attention": (           # the classmate's loop handed in unchanged
            STREAM_LOOP +
            "        out = (out * correction[:, None] + weights @ v_tile) / new_sum[:, None]\n"
            "        row_max, row_sum = new_max, new_sum\n"
            "    return out, row_max + torch.log(row_sum)\n",
            "q2_streaming_attention",
            "multiply it back by l_old",
        ),
        "attention_backward": (            # section 4's backward through the cap, grad_lse ignored
            "def attention_backward(q, k, v, out, lse, grad_out, grad_lse, cap):\n"
            "    scale = 1 / math.sqrt(q.shape[-1])\n"
            "    s = cap * torch.tanh(q @ k.T * scale / cap)\n"
            "    p = torch.exp(s - lse[:, None])\n"
            "    grad_s = p * (grad_out @ v.T - (grad_out * out).sum(-1, keepdim=True))\n"
            "    grad_x = grad_s * (1 - (s / cap) ** 2)\n"
            "    return scale * grad_x @ k, scale * grad_x.T @ q, p.T @ grad_out\n",
            "q3_backward_from_lse",
            "Your gradients ignore grad_lse",
        ),
        "forward_hbm_bytes": (
            "def forward_hbm_bytes(n, d, block_q, bytes_per_number):\n"
            "    return 4 * n * d * bytes_per_number + 4 * n\n",
            "q4_forward_traffic",
            "You counted K and V once",
        ),
    },
    "grace": {
        "merge_partial_attention": (
            "def merge_partial_attention(out_a, lse_a, out_b, lse_b):\n"
            "    lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))\n"
            "    w_a, w_b = torch.exp(lse_a - lse), torch.exp(lse_b - lse)\n"
            "    return w_a[..., None] * out_a + w_b[..., None] * out_b, lse\n",
            "q1_merge_partial",
            "exp(lse_a) overflows float32",
        ),
        "streaming_attention": (           # the loop mended, the log-sum-exp without its maximum
            STREAM_LOOP +
            "        out = (out * (row_sum * correction)[:, None] + weights @ v_tile) / new_sum[:, None]\n"
            "        row_max, row_sum = new_max, new_sum\n"
            "    return out, torch.log(row_sum)\n",
            "q2_streaming_attention",
            "LSE = m + log(l)",
        ),
        "attention_backward": (            # every term of dS right, the cap left out of the chain rule
            "def attention_backward(q, k, v, out, lse, grad_out, grad_lse, cap):\n"
            "    scale = 1 / math.sqrt(q.shape[-1])\n"
            "    p = torch.exp(cap * torch.tanh(q @ k.T * scale / cap) - lse[:, None])\n"
            "    delta = (grad_out * out).sum(-1, keepdim=True)\n"
            "    grad_s = p * (grad_out @ v.T - delta + grad_lse[:, None])\n"
            "    return scale * grad_s @ k, scale * grad_s.T @ q, p.T @ grad_out\n",
            "q3_backward_from_lse",
            "Q and K reach S through the cap",
        ),
        "forward_hbm_bytes": (
            "def forward_hbm_bytes(n, d, block_q, bytes_per_number):\n"
            "    tiles = math.ceil(n / block_q)\n"
            "    return 2 * n * d + 2 * n * d * tiles + n\n",
            "q4_forward_traffic",
            "You counted numbers, not bytes",
        ),
    },
}

# The answers that must pass, in the same form (the notebook's solutions are the same code).
SOLUTIONS = {
    "merge_partial_attention": (
        "def merge_partial_attention(out_a, lse_a, out_b, lse_b):\n"
        "    lse = torch.logaddexp(lse_a, lse_b)\n"
        "    w_a, w_b = torch.exp(lse_a - lse), torch.exp(lse_b - lse)\n"
        "    return w_a[..., None] * out_a + w_b[..., None] * out_b, lse\n"
    ),
    "attention_backward": (
        "def attention_backward(q, k, v, out, lse, grad_out, grad_lse, cap):\n"
        "    scale = 1 / math.sqrt(q.shape[-1])\n"
        "    s = cap * torch.tanh(q @ k.T * scale / cap)\n"
        "    p = torch.exp(s - lse[:, None])\n"
        "    delta = (grad_out * out).sum(-1, keepdim=True)\n"
        "    grad_x = p * (grad_out @ v.T - delta + grad_lse[:, None]) * (1 - (s / cap) ** 2)\n"
        "    return scale * grad_x @ k, scale * grad_x.T @ q, p.T @ grad_out\n"
    ),
    "forward_hbm_bytes": (
        "def forward_hbm_bytes(n, d, block_q, bytes_per_number):\n"
        "    tiles = math.ceil(n / block_q)\n"
        "    return (2 * n * d + 2 * n * d * tiles) * bytes_per_number + 4 * n\n"
    ),
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "merge_partial_attention": (
        "def merge_partial_attention(out_a, lse_a, out_b, lse_b):\n"
        "    from attn_course.flash.tiled import merge_attention_outputs\n"
        "    return merge_attention_outputs(out_a, lse_a, out_b, lse_b)\n",
        "q1_merge_partial",
        "calls merge_attention_outputs, which this exercise forbids",
    ),
    "streaming_attention": (               # the tiles joined, then attention at once
        "def streaming_attention(q, kv_tiles):\n"
        "    k, v = (torch.cat(parts) for parts in zip(*kv_tiles))\n"
        "    scores = q @ k.T / math.sqrt(q.shape[1])\n"
        "    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)\n",
        "q2_streaming_attention",
        "calls torch.cat, which this exercise forbids",
    ),
    "attention_backward": (
        "def attention_backward(q, k, v, out, lse, grad_out, grad_lse, cap):\n"
        "    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))\n"
        "    with torch.enable_grad():\n"
        "        o = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1) @ v\n"
        "    return torch.autograd.grad(o, (q, k, v), grad_out)\n",
        "q3_backward_from_lse",
        "which this exercise forbids: the exercise is to derive the gradients by hand",
    ),
    "forward_hbm_bytes": (
        "def forward_hbm_bytes(n, d, block_q, bytes_per_number):\n"
        "    from attn_course.flash.io_model import fused_forward_bytes\n"
        "    return fused_forward_bytes(n, d, block_q, bytes_per_number=bytes_per_number)\n",
        "q4_forward_traffic",
        "calls fused_forward_bytes, which this exercise forbids",
    ),
}
