"""Planted mistakes for chapter 07_transformer_bert: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "07_transformer_bert"

PLANTED = {
    "ada": {
        "masked_mean": (
            "def masked_mean(hidden, attention_mask):\n"
            "    return hidden.mean(dim=1)\n",
            "q1_mean_pooling",
            "count the padding",
        ),
        "fixed_mlm_loss": (                       # the classmate's code, handed in as it was
            "def fixed_mlm_loss(logits, labels):\n"
            "    targets = labels.clamp(min=0)\n"
            "    losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction='none')\n"
            "    return losses.mean()\n",
            "q3_find_the_bug_mlm_loss",
            "averages over every position",
        ),
    },
    "grace": {
        "predicted_weight_count": (               # the heads of one layer only
            "def predicted_weight_count(n_tokens):\n"
            "    return 12 * n_tokens**2\n",
            "q2_count_attention_weights",
            "one layer's worth",
        ),
        "head_most_on": (                         # the largest single weight instead of the mean
            "def head_most_on(attentions, key):\n"
            "    on_key = torch.stack([a[0, :, :, key].amax(-1) for a in attentions])\n"
            "    return divmod(int(on_key.argmax()), on_key.shape[1])\n",
            "q4_head_most_on_a_token",
            "a single query gives the key the most",
        ),
        "fixed_mlm_loss": (                       # each sequence averaged first
            "def fixed_mlm_loss(logits, labels):\n"
            "    chosen = labels != -100\n"
            "    losses = F.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction='none')\n"
            "    return ((losses * chosen).sum(1) / chosen.sum(1)).mean()\n",
            "q3_find_the_bug_mlm_loss",
            "a sequence with one blank weighs as much",
        ),
    },
}

PLANTED["bea"] = {
    "masked_mean": (                      # padding left out of the sum, but still in the count
        "def masked_mean(hidden, attention_mask):\n"
        "    return (hidden * attention_mask[..., None]).sum(dim=1) / hidden.shape[1]\n",
        "q1_mean_pooling",
        "still divide by N",
    ),
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "masked_mean": (
        "def masked_mean(hidden, attention_mask):\n"
        "    from attn_course.models.bert.analysis import mean_pool\n"
        "    return mean_pool(hidden, attention_mask)\n",
        "q1_mean_pooling",
        "calls mean_pool, which this exercise forbids",
    ),
    "fixed_mlm_loss": (
        "def fixed_mlm_loss(logits, labels):\n"
        "    from attn_course.models.bert.masked_lm import masked_lm_loss\n"
        "    return masked_lm_loss(logits, labels)\n",
        "q3_find_the_bug_mlm_loss",
        "calls masked_lm_loss, which this exercise forbids",
    ),
}
