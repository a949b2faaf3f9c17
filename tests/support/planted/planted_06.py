"""Planted mistakes for chapter 06_flash_attention: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter, and by
tests/checks/test_checks_flash.py, which runs each against its check directly.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "06_flash_attention"

# The frame of the Triton exercise around the student's update; {update} is indented 8 spaces.
KERNEL = '''def small_attention_kernel(Q, K, V, Out, n_k, scale, N_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                           BLOCK_N: tl.constexpr):
    rows = tl.arange(0, N_Q)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + rows[:, None] * HEAD_DIM + dims[None, :])
    m_i = tl.full([N_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([N_Q], tl.float32)
    acc = tl.zeros([N_Q, HEAD_DIM], tl.float32)
    for start in range(0, n_k, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        inside = cols < n_k
        k = tl.load(K + cols[:, None] * HEAD_DIM + dims[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(V + cols[:, None] * HEAD_DIM + dims[None, :], mask=inside[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * (scale * 1.4426950408889634)
        s = tl.where(inside[None, :], s, float("-inf"))
{update}
    tl.store(Out + rows[:, None] * HEAD_DIM + dims[None, :], acc / l_i[:, None])


small_attention_kernel = triton.jit(small_attention_kernel)
'''

UPDATE = '''        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new'''


def kernel_with(update: str) -> str:
    """The Triton exercise's cell with ``update`` as the student's rescaling step."""
    return KERNEL.format(update=update)


PLANTED = {
    "linus": {
        "merge_partial_attention": (
            "def merge_partial_attention(out_a, lse_a, out_b, lse_b):\n"
            "    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)\n",
            "q1_merge_partial",
            "You averaged out_a and out_b",
        ),
        "causal_tile_counts": (
            "def causal_tile_counts(n, block_q, block_k):\n"
            "    tiles = math.ceil(n / block_q)\n"
            "    return tiles * (tiles + 1) // 2, tiles\n",
            "q2_predict_tiles",
            "You used block_q for the key tiles too",
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
            "q3_find_the_bug_rescale",
            "rescale the accumulated output by the correction too",
        ),
        "small_attention_kernel": (
            kernel_with(UPDATE.replace("tl.exp2", "tl.exp")),
            "q4_triton_rescale",
            "use tl.exp2, not tl.exp",
        ),
        "attention_backward": (
            "def attention_backward(q, k, v, out, lse, grad_out):\n"
            "    scale = 1 / math.sqrt(q.shape[-1])\n"
            "    p = torch.exp(q @ k.T * scale - lse[:, None])\n"
            "    grad_s = p * (grad_out @ v.T)\n"
            "    return scale * grad_s @ k, scale * grad_s.T @ q, p.T @ grad_out\n",
            "q5_backward_from_lse",
            "Your dQ leaves out Δ",
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
        "causal_tile_counts": (
            "def causal_tile_counts(n, block_q, block_k):\n"
            "    computed = 0\n"
            "    for q_start in range(0, n, block_q):\n"
            "        q_end = min(q_start + block_q, n)\n"
            "        computed += math.ceil(q_end / block_k)\n"
            "    return computed, math.ceil(n / block_q)\n",
            "q2_predict_tiles",
            "You counted one masked tile per query tile",
        ),
        "small_attention_kernel": (
            kernel_with(UPDATE.replace("        m_i = m_new", "        m_i = m_i")),
            "q4_triton_rescale",
            "the running maximum is never updated",
        ),
        "attention_backward": (
            "def attention_backward(q, k, v, out, lse, grad_out):\n"
            "    p = torch.exp(q @ k.T / math.sqrt(q.shape[-1]) - lse[:, None])\n"
            "    grad_s = p * (grad_out @ v.T - (grad_out * out).sum(-1, keepdim=True))\n"
            "    return grad_s @ k, grad_s.T @ q, p.T @ grad_out\n",
            "q5_backward_from_lse",
            "Your dQ is missing the scale",
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
    "causal_tile_counts": (
        "def causal_tile_counts(n, block_q, block_k):\n"
        "    computed = masked = 0\n"
        "    for q_start in range(0, n, block_q):\n"
        "        q_end = min(q_start + block_q, n)\n"
        "        for k_start in range(0, q_end, block_k):\n"
        "            computed += 1\n"
        "            masked += min(k_start + block_k, n) - 1 > q_start\n"
        "    return computed, masked\n"
    ),
    "small_attention_kernel": kernel_with(UPDATE),
    "attention_backward": (
        "def attention_backward(q, k, v, out, lse, grad_out):\n"
        "    scale = 1 / math.sqrt(q.shape[-1])\n"
        "    p = torch.exp(q @ k.T * scale - lse[:, None])\n"
        "    delta = (grad_out * out).sum(-1, keepdim=True)\n"
        "    grad_s = p * (grad_out @ v.T - delta)\n"
        "    return scale * grad_s @ k, scale * grad_s.T @ q, p.T @ grad_out\n"
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
    "causal_tile_counts": (
        "def causal_tile_counts(n, block_q, block_k):\n"
        "    from attn_course.teaching.flash_diagrams import tile_counts\n"
        "    counts = tile_counts(n, n, block_q, block_k, causal=True)\n"
        "    return counts['computed'], counts['masked']\n",
        "q2_predict_tiles",
        "calls tile_counts, which this exercise forbids",
    ),
    "fixed_streaming_attention": (        # not streaming at all
        "def fixed_streaming_attention(q, k, v, block):\n"
        "    return torch.softmax(q @ k.T / math.sqrt(q.shape[1]), dim=-1) @ v\n",
        "q3_find_the_bug_rescale",
        "calls torch.softmax, which this exercise forbids",
    ),
    "attention_backward": (
        "def attention_backward(q, k, v, out, lse, grad_out):\n"
        "    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))\n"
        "    with torch.enable_grad():\n"
        "        o = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1) @ v\n"
        "    return torch.autograd.grad(o, (q, k, v), grad_out)\n",
        "q5_backward_from_lse",
        "which this exercise forbids: the exercise is to derive the gradients by hand",
    ),
}
