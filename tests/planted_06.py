"""Planted mistakes for chapter 06_flash_attention: each must lose its question's points and get its hint.

Used by tests/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "06_flash_attention"

PLANTED = {
    "linus": {
        "merge_blocks": (
            "def merge_blocks(max_a, sum_a, max_b, sum_b):\n"
            "    return torch.maximum(max_a, max_b), sum_a + sum_b\n",
            "q1_merge_step",
            "relative to its own maximum",
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
            "rescale it too",
        ),
    },
}
