"""Planted mistakes for chapter 09_transformer_bert: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "08_transformer_bert"

PLANTED = {
    "ada": {
        "corrupt": (                              # every chosen token masked
            "def corrupt(input_ids, chosen, mask_id, special_ids, vocab_size, seed):\n"
            "    return torch.where(chosen, mask_id, input_ids)\n",
            "q1_corrupt_80_10_10",
            "turns every chosen token into [MASK]",
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
        "corrupt": (                              # the rule applied to every position, chosen or not
            "def corrupt(input_ids, chosen, mask_id, special_ids, vocab_size, seed):\n"
            "    generator = torch.Generator().manual_seed(seed)\n"
            "    fate = torch.rand(input_ids.shape, generator=generator)\n"
            "    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special_ids])\n"
            "    random_ids = ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]\n"
            "    corrupted = torch.where(fate < 0.8, mask_id, input_ids)\n"
            "    return torch.where((fate >= 0.8) & (fate < 0.9), random_ids, corrupted)\n",
            "q1_corrupt_80_10_10",
            "changes positions that were not chosen",
        ),
        "head_most_on": (                         # the largest single weight instead of the mean
            "def head_most_on(attentions, key):\n"
            "    on_key = torch.stack([a[0, :, :, key].amax(-1) for a in attentions])\n"
            "    return divmod(int(on_key.argmax()), on_key.shape[1])\n",
            "q4_head_most_on_a_token",
            "a single query gives the key the most",
        ),
        "predicted_unchanged_share": (            # the random draws that hit the original left out
            "def predicted_unchanged_share(n_ordinary):\n"
            "    return 0.1\n",
            "q2_predict_unchanged_share",
            "the tokens the rule leaves alone",
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
    "corrupt": (                          # random replacements drawn from every id, the specials too
        "def corrupt(input_ids, chosen, mask_id, special_ids, vocab_size, seed):\n"
        "    generator = torch.Generator().manual_seed(seed)\n"
        "    fate = torch.rand(input_ids.shape, generator=generator)\n"
        "    random_ids = torch.randint(vocab_size, input_ids.shape, generator=generator)\n"
        "    corrupted = torch.where(chosen & (fate < 0.8), mask_id, input_ids)\n"
        "    return torch.where(chosen & (fate >= 0.8) & (fate < 0.9), random_ids, corrupted)\n",
        "q1_corrupt_80_10_10",
        "include special tokens",
    ),
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "corrupt": (
        "def corrupt(input_ids, chosen, mask_id, special_ids, vocab_size, seed):\n"
        "    from attn_course.models.bert.masking import mask_tokens\n"
        "    return mask_tokens(input_ids, mask_id=mask_id, vocab_size=vocab_size, special_ids=special_ids,\n"
        "                       probability=1.0, generator=torch.Generator().manual_seed(seed)).input_ids\n",
        "q1_corrupt_80_10_10",
        "calls mask_tokens, which this exercise forbids",
    ),
    "fixed_mlm_loss": (
        "def fixed_mlm_loss(logits, labels):\n"
        "    from attn_course.models.bert.masked_lm import masked_lm_loss\n"
        "    return masked_lm_loss(logits, labels)\n",
        "q3_find_the_bug_mlm_loss",
        "calls masked_lm_loss, which this exercise forbids",
    ),
}
