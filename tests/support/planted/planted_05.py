"""Planted mistakes for chapter 05_rope: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "05_rope"

PLANTED = {
    "ada": {
        "left_padded_positions": (
            "def left_padded_positions(attention_mask):\n"
            "    return torch.arange(attention_mask.shape[-1]).expand_as(attention_mask)\n",
            "q1_left_padded_positions",
            "positions 0 .. N-1 of the padded batch",
        ),
        "pair_making_turns": (
            "def pair_making_turns(d, base, context, turns):\n"
            "    return d / 2 * math.log(context / turns) / math.log(base)\n",
            "q2_pair_making_turns",
            "a full turn is 2π radians",
        ),
        "fixed_last_token_scores": (
            "def fixed_last_token_scores(q_last, keys, base):\n"
            "    rope = RotaryEmbedding(keys.shape[-1], base=base)\n"
            "    return (rope(q_last[None]) @ rope(keys).T)[0]\n",
            "q3_find_the_bug_cache_position",
            "rotated at position 0",
        ),
        "rotate_pairs": (
            "def rotate_pairs(x, positions, base, interleaved):\n"
            "    d = x.shape[-1]\n"
            "    theta = base ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)\n"
            "    angles = positions.double()[:, None] * theta\n"
            "    first, second = x.double().chunk(2, dim=-1)\n"
            "    cos, sin = angles.cos(), angles.sin()\n"
            "    return torch.cat((first * cos - second * sin, first * sin + second * cos), -1).to(x.dtype)\n",
            "q4_rotate_pairs",
            "paired the features the other way",
        ),
        "llama3_frequencies": (
            "def llama3_frequencies(theta, factor, context, low, high):\n"
            "    wavelength = 2 * math.pi / theta\n"
            "    a = (context / low - wavelength) / (context / low - context / high)\n"
            "    blended = (1 - a) * theta / factor + a * theta\n"
            "    new = torch.where(wavelength > context / low, theta / factor, theta)\n"
            "    return torch.where((wavelength >= context / high) & (wavelength <= context / low), blended, new)\n",
            "q5_llama3_frequencies",
            "linear in the wavelength",
        ),
    },
    "grace": {
        "left_padded_positions": (
            "def left_padded_positions(attention_mask):\n"
            "    return attention_mask.cumsum(-1)\n",
            "q1_left_padded_positions",
            "Your positions start at 1",
        ),
        "pair_making_turns": (
            "def pair_making_turns(d, base, context, turns):\n"
            "    return d * math.log(context / (2 * math.pi * turns)) / math.log(base)\n",
            "q2_pair_making_turns",
            "as if i counted features",
        ),
        "fixed_last_token_scores": (
            "def fixed_last_token_scores(q_last, keys, base):\n"
            "    rope = RotaryEmbedding(keys.shape[-1], base=base)\n"
            "    q = rope(q_last[None], torch.tensor([keys.shape[0] - 1]))\n"
            "    return (q @ keys.T)[0]\n",
            "q3_find_the_bug_cache_position",
            "Your keys are not rotated",
        ),
        "rotate_pairs": (
            "def rotate_pairs(x, positions, base, interleaved):\n"
            "    d = x.shape[-1]\n"
            "    theta = base ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)\n"
            "    angles = positions.double()[:, None] * theta\n"
            "    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)\n"
            "    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)\n"
            "    turned = (a * cos + b * sin, -a * sin + b * cos)\n"
            "    return torch.stack(turned, -1).flatten(-2) if interleaved else torch.cat(turned, -1)\n",
            "q4_rotate_pairs",
            "the rotation goes the other way",
        ),
        "llama3_frequencies": (
            "def llama3_frequencies(theta, factor, context, low, high):\n"
            "    wavelength = 2 * math.pi / theta\n"
            "    a = (context / wavelength - low) / (high - low)\n"
            "    blended = a * theta / factor + (1 - a) * theta\n"
            "    new = torch.where(wavelength > context / low, theta / factor, theta)\n"
            "    return torch.where((wavelength >= context / high) & (wavelength <= context / low), blended, new)\n",
            "q5_llama3_frequencies",
            "the wrong way round",
        ),
    },
    "linus": {
        "left_padded_positions": (
            "def left_padded_positions(attention_mask):\n"
            "    return attention_mask.flip(-1).cumsum(-1).flip(-1) - 1\n",
            "q1_left_padded_positions",
            "count down",
        ),
        "pair_making_turns": (
            "def pair_making_turns(d, base, context, turns):\n"
            "    return math.floor(d / 2 * math.log(context / (2 * math.pi * turns)) / math.log(base))\n",
            "q2_pair_making_turns",
            "return the real number",
        ),
        "fixed_last_token_scores": (
            "def fixed_last_token_scores(q_last, keys, base):\n"
            "    rope = RotaryEmbedding(keys.shape[-1], base=base)\n"
            "    q = rope(q_last[None], torch.tensor([keys.shape[0]]))\n"
            "    return (q @ rope(keys).T)[0]\n",
            "q3_find_the_bug_cache_position",
            "one past the newest token",
        ),
        "rotate_pairs": (
            "def rotate_pairs(x, positions, base, interleaved):\n"
            "    d = x.shape[-1]\n"
            "    theta = base ** (-torch.arange(d // 2, dtype=torch.float64) / d)\n"
            "    angles = positions.double()[:, None] * theta\n"
            "    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)\n"
            "    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)\n"
            "    turned = (a * cos - b * sin, a * sin + b * cos)\n"
            "    return torch.stack(turned, -1).flatten(-2) if interleaved else torch.cat(turned, -1)\n",
            "q4_rotate_pairs",
            "the exponent counts features",
        ),
        "llama3_frequencies": (
            "def llama3_frequencies(theta, factor, context, low, high):\n"
            "    return theta / factor\n",
            "q5_llama3_frequencies",
            "that is Position Interpolation",
        ),
    },
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "left_padded_positions": (
        "def left_padded_positions(mask):\n"
        "    from attn_course.models.llama.block import positions_from_attention_mask\n"
        "    return positions_from_attention_mask(mask)\n",
        "q1_left_padded_positions",
        "calls positions_from_attention_mask, which this exercise forbids",
    ),
    "rotate_pairs": (
        "def rotate_pairs(x, positions, base, interleaved):\n"
        "    from attn_course.positions.rope import RotaryEmbedding\n"
        "    return RotaryEmbedding(x.shape[-1], base=base, interleaved=interleaved)(x, positions)\n",
        "q4_rotate_pairs",
        "calls RotaryEmbedding.__init__, which this exercise forbids",
    ),
    "llama3_frequencies": (
        "def llama3_frequencies(theta, factor, context, low, high):\n"
        "    from attn_course.positions.rope_scaling import Llama3Scaling\n"
        "    return Llama3Scaling(factor, context, low, high).frequencies(theta)\n",
        "q5_llama3_frequencies",
        "calls Llama3Scaling.__init__, which this exercise forbids",
    ),
}
