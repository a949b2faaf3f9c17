"""Planted mistakes for chapter 11_induction_heads: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "11_induction_heads"

# The solution's forward pass, with one of its steps changed.
_FORWARD = (
    "def logits_without_head(weights, tokens, layer, head):\n"
    "    n = tokens.shape[1]\n"
    "    stream = {start}\n"
    "    future = torch.ones(n, n, dtype=torch.bool).triu(1)\n"
    "    for l in range({layers}):\n"
    "        q, k, v = (torch.einsum('bne,hed->bhnd', stream, weights[name][l]) for name in ('W_Q', 'W_K', 'W_V'))\n"
    "        scores = (q @ k.transpose(-2, -1) / {scale}){mask}\n"
    "        out = torch.einsum('bhnd,hde->bhne', torch.softmax(scores, dim={dim}) @ v, weights['W_O'][l])\n"
    "        if {removed}:\n"
    "            {ablate}\n"
    "        stream = stream + out.sum(dim=1)\n"
    "    return stream @ weights['W_U']\n"
)


def _forward(start="weights['W_E'][tokens] + weights['W_pos'][:n]", layers="weights['W_Q'].shape[0]",
             scale="math.sqrt(q.shape[-1])", mask=".masked_fill(future, -math.inf)", dim="-1", removed="l == layer",
             ablate="out[:, head] = 0") -> str:
    return _FORWARD.format(start=start, layers=layers, scale=scale, mask=mask, dim=dim, removed=removed, ablate=ablate)


# The solution's K-composition score, with its matrices, their product or its normalisation changed.
_COMPOSITION = (
    "def k_composition(W_Q, W_K, W_V, W_O):\n"
    "    qk, ov = {qk}, {ov}\n"
    "    norm = torch.linalg.matrix_norm\n"
    "    return {score}\n"
)


def _composition(qk="W_Q @ W_K.T", ov="W_V @ W_O", score="norm(qk @ ov.T) / (norm(qk) * norm(ov))") -> str:
    return _COMPOSITION.format(qk=qk, ov=ov, score=score)


# The classmate's copying score, with its eigenvalues or what it counts of them changed.
_COPYING = (
    "def fixed_copying_score(W_E, W_V, W_O, W_U):\n"
    "    eigenvalues = torch.linalg.{eig}({circuit})\n"
    "    return {share}\n"
)


def _copying(eig="eigvals", circuit="W_O @ W_U @ W_E @ W_V", share="(eigenvalues.real > 0).double().mean().item()"):
    return _COPYING.format(eig=eig, circuit=circuit, share=share)


_HEAD = "def most_harmful_head(previous_token_scores, duplicate_token_scores, induction_scores):\n"

PLANTED = {
    "ada": {
        "logits_without_head": (                   # the intact model: no head left out
            _forward(removed="False"),
            "q1_logits_without_head",
            "no head was left out",
        ),
        "k_composition": (                         # the writer's output in the queries
            _composition(score="norm(ov @ qk) / (norm(qk) * norm(ov))"),
            "q3_k_composition",
            "Q-composition",
        ),
        "fixed_copying_score": (                   # the classmate's code, handed in as it was
            _copying(circuit="W_E @ W_V @ W_O @ W_U", share="(eigenvalues.real > 0).float().mean().item()"),
            "q4_find_the_bug_copying",
            "the classmate's score, unchanged",
        ),
    },
    "grace": {
        "logits_without_head": (                   # the head left out of every layer
            _forward(removed="True"),
            "q1_logits_without_head",
            "of every layer",
        ),
        "k_composition": (                         # the paper's W_QK W_OV with the course's row matrices
            _composition(score="norm(qk @ ov) / (norm(qk) * norm(ov))"),
            "q3_k_composition",
            "column convention",
        ),
        "fixed_copying_score": (                   # how many, not what share
            _copying(share="int((eigenvalues.real > 0).sum())"),
            "q4_find_the_bug_copying",
            "is a count",
        ),
        "most_harmful_head": (                     # the head that copies best
            _HEAD + "    return 1, int(induction_scores[1].argmax())\n",
            "q2_predict_ablation",
            "You picked the head that copies best",
        ),
    },
    "bea": {
        "logits_without_head": (                   # no positions
            _forward(start="weights['W_E'][tokens]"),
            "q1_logits_without_head",
            "token embeddings alone",
        ),
        "k_composition": (                         # not normalised
            _composition(score="norm(qk @ ov.T)"),
            "q3_k_composition",
            "divide it by ‖W_QK‖ ‖W_OV‖",
        ),
        "fixed_copying_score": (                   # a symmetric matrix assumed
            _copying(eig="eigvalsh"),
            "q4_find_the_bug_copying",
            "assumes a symmetric matrix",
        ),
    },
    "linus": {
        "logits_without_head": (                   # each key's weights over the queries
            _forward(dim="-2"),
            "q1_logits_without_head",
            "runs over the queries",
        ),
        "k_composition": (                         # W_O @ W_V: it fits only where d = E
            _composition(ov="W_O @ W_V"),
            "q3_k_composition",
            "W_O @ W_V",
        ),
        "fixed_copying_score": (                   # the chapter's other summary
            _copying(share="(eigenvalues.sum().real / eigenvalues.abs().sum()).item()"),
            "q4_find_the_bug_copying",
            "Σλ / Σ|λ|",
        ),
        "most_harmful_head": (                     # one head, remembered from section 7
            _HEAD + "    return 1, 0\n",
            "q2_predict_ablation",
            "whatever the scores",
        ),
    },
    "katherine": {
        "logits_without_head": (                   # no 1/√d
            _forward(scale="1"),
            "q1_logits_without_head",
            "without the 1/√d",
        ),
        "k_composition": (                         # spectral norms
            _composition(score="norm(qk @ ov.T, 2) / (norm(qk, 2) * norm(ov, 2))"),
            "q3_k_composition",
            "spectral norms",
        ),
        "fixed_copying_score": (                   # |λ| for Re λ
            _copying(circuit="W_E @ W_V @ W_O @ W_U", share="(eigenvalues.abs() > 0).float().mean().item()"),
            "q4_find_the_bug_copying",
            "|λ| > 0 holds",
        ),
        "most_harmful_head": (                     # (head, layer)
            _HEAD + "    return int(previous_token_scores[0].argmax()), 0\n",
            "q2_predict_ablation",
            "You return (head, layer)",
        ),
    },
    "emmy": {
        "logits_without_head": (                   # layers counted from the end
            _forward(removed="l == weights['W_Q'].shape[0] - 1 - layer"),
            "q1_logits_without_head",
            "not of layer",
        ),
        "k_composition": (                         # W_QK transposed: the same number as Q-composition
            _composition(qk="W_K @ W_Q.T"),
            "q3_k_composition",
            "W_K @ W_Q.T",
        ),
        "fixed_copying_score": (                   # a tolerance of a hundredth of the largest
            _copying(circuit="(W_E @ W_V @ W_O @ W_U).double()",
                     share="(eigenvalues.real[eigenvalues.abs() > 1e-2 * eigenvalues.abs().max()] > 0)"
                           ".double().mean().item()"),
            "q4_find_the_bug_copying",
            "drops real eigenvalues",
        ),
        "most_harmful_head": (                     # a rule that fits seed 0 and seed 1 as trained (issue 44)
            _HEAD + "    return 0, int(induction_scores[0].argmin())\n",
            "q2_predict_ablation",
            "lowest induction score",
        ),
    },
    "hedy": {
        "logits_without_head": (                   # the whole layer
            _forward(ablate="out = torch.zeros_like(out)"),
            "q1_logits_without_head",
            "all of layer",
        ),
        "k_composition": (                         # the four factors' norms
            _composition(score="norm(qk @ ov.T) / (norm(W_Q) * norm(W_K) * norm(W_V) * norm(W_O))"),
            "q3_k_composition",
            "the four factors",
        ),
        "fixed_copying_score": (                   # the negative ones
            _copying(share="(eigenvalues.real < 0).double().mean().item()"),
            "q4_find_the_bug_copying",
            "negative real part",
        ),
    },
    "barbara": {
        "logits_without_head": (                   # no causal mask
            _forward(mask=""),
            "q1_logits_without_head",
            "not causal",
        ),
        "k_composition": (                         # the paper's Q-composition formula
            _composition(score="norm(qk.T @ ov) / (norm(qk) * norm(ov))"),
            "q3_k_composition",
            "the paper's Q-composition formula",
        ),
    },
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "logits_without_head": (                       # the cached model under ablate_head
        "def logits_without_head(weights, tokens, layer, head):\n"
        "    from attn_course.circuits import ablate_head\n"
        "    from attn_course.circuits.trained import load_trained\n"
        "    model = load_trained(0)\n"
        "    with ablate_head(model, layer, head):\n"
        "        return model(tokens)\n",
        "q1_logits_without_head",
        "calls load_trained, which this exercise forbids",
    ),
    "k_composition": (
        "def k_composition(W_Q, W_K, W_V, W_O):\n"
        "    from attn_course.circuits import composition_score\n"
        "    return composition_score(W_Q @ W_K.T, (W_V @ W_O).T)\n",
        "q3_k_composition",
        "calls composition_score, which this exercise forbids",
    ),
    "fixed_copying_score": (
        "def fixed_copying_score(W_E, W_V, W_O, W_U):\n"
        "    from attn_course.circuits import copying_scores\n"
        "    return copying_scores(W_O @ W_U @ W_E @ W_V).positive_fraction\n",
        "q4_find_the_bug_copying",
        "calls copying_scores, which this exercise forbids",
    ),
    "most_harmful_head": (                         # measured, not predicted: every head ablated on seed 0's model
        _HEAD +
        "    from attn_course.circuits import ablate_head, span_loss\n"
        "    from attn_course.circuits.trained import load_trained\n"
        "    model = load_trained(0)\n"
        "    tokens = torch.arange(40).remainder(20).repeat(8, 1)\n"
        "    losses = {}\n"
        "    for layer in range(2):\n"
        "        for head in range(4):\n"
        "            with ablate_head(model, layer, head):\n"
        "                losses[layer, head] = span_loss(model, tokens, (21, 40))\n"
        "    return max(losses, key=losses.get)\n",
        "q2_predict_ablation",
        "calls load_trained, which this exercise forbids",
    ),
}

PLANTED["alan"] = {
    "logits_without_head": (                       # a loop written for this chapter's two layers
        _forward(layers="2"),
        "q1_logits_without_head",
        "runs 2 of the 3 layers",
    ),
    "most_harmful_head": (                         # a guess
        _HEAD + "    return 0, int(torch.randint(4, ()))\n",
        "q2_predict_ablation",
        "calls torch.randint, which this exercise forbids",
    ),
}

# An answer that computes nothing (issue 31): an empty tensor fails every test of its question.
PLANTED["eve"] = {
    "logits_without_head": (
        "def logits_without_head(weights, tokens, layer, head):\n"
        "    return weights['W_U'].new_empty(0)\n",
        "q1_logits_without_head",
        "is empty",
    ),
    "k_composition": (
        "def k_composition(W_Q, W_K, W_V, W_O):\n"
        "    return W_Q.new_empty(0)\n",
        "q3_k_composition",
        "should be one number",
    ),
}
