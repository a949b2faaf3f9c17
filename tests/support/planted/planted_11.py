"""Planted mistakes for chapter 11_induction_heads: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "11_induction_heads"

# The solution's induction score, with the stripe (the key read for query i) or the queries changed.
_INDUCTION = (
    "def induction_score_by_hand(pattern, period):\n"
    "    queries = torch.arange({start}, pattern.shape[-1])\n"
    "    return {weights}[..., queries, queries - {back}].mean(dim=-1)\n"
)


def _induction(start="period", back="(period - 1)", weights="pattern") -> str:
    return _INDUCTION.format(start=start, back=back, weights=weights)


_DETECTOR = (
    "def previous_token_detector(pattern):\n"
    "    queries = torch.arange({start}, pattern.shape[-1])\n"
    "    return {weights}[..., queries, queries - {back}].{reduce}\n"
)


def _detector(start="1", back="1", weights="pattern", reduce="mean(dim=-1)") -> str:
    return _DETECTOR.format(start=start, back=back, weights=weights, reduce=reduce)


_FIXED = (
    "def fixed_induction_scores(patterns, period):\n"
    "    stripe = patterns.diagonal(offset={offset}, dim1=-2, dim2=-1){first}\n"
    "    return stripe.mean(dim={dims})\n"
)


def _fixed(offset="1 - period", first="[..., 1:]", dims="(1, -1)") -> str:
    return _FIXED.format(offset=offset, first=first, dims=dims)


_HEAD = "def most_harmful_head(previous_token_scores, duplicate_token_scores, induction_scores):\n"

PLANTED = {
    "ada": {
        "induction_score_by_hand": (               # the earlier copy itself: i - period
            _induction(back="period"),
            "q1_induction_score",
            "the earlier copy of token i itself",
        ),
        "fixed_induction_scores": (                # the classmate's code, handed in as it was
            _fixed(offset="-period", first=""),
            "q4_find_the_bug_induction",
            "the classmate's scores, unchanged",
        ),
    },
    "grace": {
        "induction_score_by_hand": (               # the diagonal from its first entry, i = period - 1
            _induction(start="period - 1"),
            "q1_induction_score",
            "includes i = period − 1",
        ),
        "previous_token_detector": (               # each token's weight on itself
            _detector(back="0"),
            "q3_previous_token_detector",
            "reads the diagonal",
        ),
        "most_harmful_head": (                     # the head that copies best
            _HEAD + "    return 1, int(induction_scores[1].argmax())\n",
            "q2_predict_ablation",
            "You picked the head that copies best",
        ),
    },
    "bea": {
        "induction_score_by_hand": (               # rows read as keys
            _induction(weights="pattern.transpose(-2, -1)"),
            "q1_induction_score",
            "transposed",
        ),
        "previous_token_detector": (               # torch.roll: token 0's previous token is the last one
            "def previous_token_detector(pattern):\n"
            "    shifted = torch.eye(pattern.shape[-1], dtype=pattern.dtype).roll(-1, dims=1)\n"
            "    return (pattern * shifted).sum(dim=-1).mean(dim=-1)\n",
            "q3_previous_token_detector",
            "wrapped around",
        ),
        "fixed_induction_scores": (                # the offset fixed, the diagonal's first entry kept
            _fixed(first=""),
            "q4_find_the_bug_induction",
            "includes i = period − 1",
        ),
    },
    "linus": {
        "previous_token_detector": (               # key i seen from query i - 1
            _detector(weights="pattern.transpose(-2, -1)"),
            "q3_previous_token_detector",
            "pattern[..., i − 1, i]",
        ),
        "fixed_induction_scores": (                # averaged over the heads, not the batch
            _fixed(dims="(2, -1)"),
            "q4_find_the_bug_induction",
            "you averaged over the heads",
        ),
        "most_harmful_head": (                     # one head, remembered from section 7
            _HEAD + "    return 1, 0\n",
            "q2_predict_ablation",
            "whatever the scores",
        ),
    },
    "katherine": {
        "induction_score_by_hand": (               # the period taken to be half the length
            "def induction_score_by_hand(pattern, period):\n"
            "    half = pattern.shape[-1] // 2\n"
            "    queries = torch.arange(half, pattern.shape[-1])\n"
            "    return pattern[..., queries, queries - half + 1].mean(dim=-1)\n",
            "q1_induction_score",
            "not half the length",
        ),
        "previous_token_detector": (               # divided by N: token 0 counted as a zero
            _detector(reduce="sum(dim=-1) / pattern.shape[-1]"),
            "q3_previous_token_detector",
            "You divided by N",
        ),
        "most_harmful_head": (                     # (head, layer)
            _HEAD + "    return int(previous_token_scores[0].argmax()), 0\n",
            "q2_predict_ablation",
            "You return (head, layer)",
        ),
    },
    "emmy": {
        "fixed_induction_scores": (                # one past the right key
            _fixed(offset="2 - period", first="[..., 2:]"),
            "q4_find_the_bug_induction",
            "one past the right key",
        ),
        "previous_token_detector": (               # two tokens back
            _detector(start="2", back="2"),
            "q3_previous_token_detector",
            "two tokens back",
        ),
        "most_harmful_head": (                     # a rule that fits seed 0 and seed 1 as trained (issue 44)
            _HEAD + "    return 0, int(induction_scores[0].argmin())\n",
            "q2_predict_ablation",
            "That head is the dead one",
        ),
    },
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "induction_score_by_hand": (
        "def induction_score_by_hand(pattern, period):\n"
        "    from attn_course.circuits import induction_score\n"
        "    return induction_score(pattern, period)\n",
        "q1_induction_score",
        "calls induction_score, which this exercise forbids",
    ),
    "previous_token_detector": (
        "def previous_token_detector(pattern):\n"
        "    from attn_course.circuits import previous_token_score\n"
        "    return previous_token_score(pattern)\n",
        "q3_previous_token_detector",
        "calls previous_token_score, which this exercise forbids",
    ),
    "fixed_induction_scores": (
        "def fixed_induction_scores(patterns, period):\n"
        "    from attn_course.circuits import induction_score\n"
        "    return induction_score(patterns, period).mean(dim=1)\n",
        "q4_find_the_bug_induction",
        "calls induction_score, which this exercise forbids",
    ),
    "most_harmful_head": (                         # measured, not predicted: every head ablated on seed 0's model
        _HEAD +
        "    from attn_course.circuits import ablate_head, repeated_span, span_loss\n"
        "    from attn_course.circuits.trained import load_trained\n"
        "    model = load_trained(0)\n"
        "    tokens = torch.arange(40).remainder(20).repeat(8, 1)\n"
        "    losses = {}\n"
        "    for layer in range(2):\n"
        "        for head in range(4):\n"
        "            with ablate_head(model, layer, head):\n"
        "                losses[layer, head] = span_loss(model, tokens, repeated_span(20))\n"
        "    return max(losses, key=losses.get)\n",
        "q2_predict_ablation",
        "calls load_trained, which this exercise forbids",
    ),
}

PLANTED["alan"] = {
    "most_harmful_head": (                         # a guess
        _HEAD + "    return 0, int(torch.randint(4, ()))\n",
        "q2_predict_ablation",
        "calls torch.randint, which this exercise forbids",
    ),
}

# An answer that computes nothing (issue 31): an empty tensor fails every test of its question.
PLANTED["eve"] = {
    "induction_score_by_hand": (
        "def induction_score_by_hand(pattern, period):\n"
        "    return pattern.new_empty(0)\n",
        "q1_induction_score",
        "should have shape",
    ),
    "previous_token_detector": (
        "def previous_token_detector(pattern):\n"
        "    return pattern.new_empty(0)\n",
        "q3_previous_token_detector",
        "should have shape",
    ),
}
