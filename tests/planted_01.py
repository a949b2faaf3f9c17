"""Planted mistakes for chapter 01_intuition: each must lose its question's points and get its hint.

Used by tests/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "01_intuition"

PLANTED = {
    "linus": {
        "fixed_attention_map": (
            "def fixed_attention_map(queries, keys):\n"
            "    return torch.softmax(queries @ keys.T / queries.shape[-1] ** 0.5, dim=0)\n",
            "q3_find_the_bug",
            "wrong dimension",
        ),
    },
}
