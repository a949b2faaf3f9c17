"""Planted mistakes for chapter 06_flash_attention: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter, and by
tests/checks/test_checks_flash.py, which runs each against its check directly.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "06_flash_attention"

PLANTED = {
    "linus": {
        "merge_partial_attention": (
            "def merge_partial_attention(out_a, lse_a, out_b, lse_b):\n"
            "    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)\n",
            "q1_merge_partial",
            "You averaged out_a and out_b",
        ),
        "fixed_streaming_attention": (
            "def fixed_streaming_attention(q, k, v, block):\n"
            "    row_max = torch.full((q.shape[0],), float('-inf'))\n"
            "    row_sum, acc = torch.zeros(q.shape[0]), torch.zeros(q.shape[0], v.shape[1])\n"
            "    for start in range(0, k.shape[0], block):\n"
            "        scores = q @ k[start:start + block].T / math.sqrt(q.shape[1])\n"
            "        new_max = torch.maximum(row_max, scores.amax(dim=1))\n"
            "        correction = torch.exp(row_max - new_max)\n"
            "        weights = torch.exp(scores - new_max[:, None])\n"
            "        row_sum = row_sum * correction + weights.sum(dim=1)\n"
            "        acc = acc + weights @ v[start:start + block]\n"
            "        row_max = new_max\n"
            "    return acc / row_sum[:, None]\n",
            "q2_find_the_bug_rescale",
            "rescale the accumulated output by the correction too",
        ),
        "attention_backward": (            # section 4's backward, grad_lse ignored
            "def attention_backward(q, k, v, out, lse, grad_out, grad_lse):\n"
            "    scale = 1 / math.sqrt(q.shape[-1])\n"
            "    p = torch.exp(q @ k.T * scale - lse[:, None])\n"
            "    grad_s = p * (grad_out @ v.T - (grad_out * out).sum(-1, keepdim=True))\n"
            "    return scale * grad_s @ k, scale * grad_s.T @ q, p.T @ grad_out\n",
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
        "attention_backward": (
            "def attention_backward(q, k, v, out, lse, grad_out, grad_lse):\n"
            "    scale = 1 / math.sqrt(q.shape[-1])\n"
            "    p = torch.exp(q @ k.T * scale - lse[:, None])\n"
            "    grad_s = p * (grad_out @ v.T - (grad_out * out).sum(-1, keepdim=True)) + grad_lse[:, None]\n"
            "    return scale * grad_s @ k, scale * grad_s.T @ q, p.T @ grad_out\n",
            "q3_backward_from_lse",
            "You added grad_lse to dS as it is",
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
        "def attention_backward(q, k, v, out, lse, grad_out, grad_lse):\n"
        "    scale = 1 / math.sqrt(q.shape[-1])\n"
        "    p = torch.exp(q @ k.T * scale - lse[:, None])\n"
        "    delta = (grad_out * out).sum(-1, keepdim=True)\n"
        "    grad_s = p * (grad_out @ v.T - delta + grad_lse[:, None])\n"
        "    return scale * grad_s @ k, scale * grad_s.T @ q, p.T @ grad_out\n"
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
    "fixed_streaming_attention": (        # not streaming at all
        "def fixed_streaming_attention(q, k, v, block):\n"
        "    return torch.softmax(q @ k.T / math.sqrt(q.shape[1]), dim=-1) @ v\n",
        "q2_find_the_bug_rescale",
        "calls torch.softmax, which this exercise forbids",
    ),
    "attention_backward": (
        "def attention_backward(q, k, v, out, lse, grad_out, grad_lse):\n"
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
