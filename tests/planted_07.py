"""Planted mistakes for chapter 07_transformer_bert: each must lose its question's points and get its hint.

Used by tests/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "07_transformer_bert"

PLANTED = {
    "ada": {
        "masked_mean": (
            "def masked_mean(hidden, attention_mask):\n"
            "    return hidden.mean(dim=1)\n",
            "q1_mean_pooling",
            "padding must not count",
        ),
    },
    "grace": {
        "fixed_bert_layer": (
            "def fixed_bert_layer(layer, x):\n"
            "    attended, _ = layer.self_attention(x)\n"
            "    x = x + layer.norm_self(attended)\n"
            "    return x + layer.norm_ffn(layer.feed_forward(x))\n",
            "q3_find_the_bug_post_ln",
            "after the residual addition",
        ),
    },
}
