"""Planted mistakes for chapter 09_modern_variants: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "09_modern_variants"

PLANTED = {
    "ada": {
        "rms_norm": (                             # LayerNorm, from chapter 08's habit
            "def rms_norm(x, weight, eps):\n"
            "    return F.layer_norm(x, x.shape[-1:], eps=eps) * weight\n",
            "q1_rms_norm",
            "that is LayerNorm",
        ),
        "decode_costs": (                         # the rotary part left out of every key
            "def decode_costs(config, form):\n"
            "    heads, latent = config['num_attention_heads'], config['kv_lora_rank']\n"
            "    if form == 'absorbed':\n"
            "        return latent, heads * (latent + latent)\n"
            "    per_head = config['qk_nope_head_dim'] + config['v_head_dim']\n"
            "    return heads * per_head, heads * per_head\n",
            "q3_latent_decode_costs",
            "left out the rotary part",
        ),
        "fixed_evict": (                          # the newest tokens only: the sinks evicted
            "def fixed_evict(keys, values, sinks, recent):\n"
            "    size = sinks + recent\n"
            "    return keys[:, :, -size:], values[:, :, -size:]\n",
            "q4_find_the_bug_sink_cache",
            "the sinks are gone",
        ),
    },
    "grace": {
        "rms_norm": (                             # eps added after the root
            "def rms_norm(x, weight, eps):\n"
            "    return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight\n",
            "q1_rms_norm",
            "eps after the square root",
        ),
        "swiglu": (                               # SiLU on the wrong projection
            "def swiglu(x, w_gate, w_up, w_down):\n"
            "    return (F.silu(x @ w_up.T) * (x @ w_gate.T)) @ w_down.T\n",
            "q2_swiglu",
            "SiLU to the up projection",
        ),
        "decode_costs": (                         # one head's work, not all heads'
            "def decode_costs(config, form):\n"
            "    rope = config['qk_rope_head_dim']\n"
            "    if form == 'absorbed':\n"
            "        key = config['kv_lora_rank'] + rope\n"
            "        return key, key + config['kv_lora_rank']\n"
            "    per_head = config['qk_nope_head_dim'] + rope + config['v_head_dim']\n"
            "    return config['num_attention_heads'] * per_head, per_head\n",
            "q3_latent_decode_costs",
            "You counted one head",
        ),
        "fixed_evict": (                          # the classmate's code as handed in: short caches doubled
            "def fixed_evict(keys, values, sinks, recent):\n"
            "    keep = lambda t: torch.cat((t[:, :, :sinks], t[:, :, -recent:]), dim=2)\n"
            "    return keep(keys), keep(values)\n",
            "q4_find_the_bug_sink_cache",
            "holds some tokens twice",
        ),
    },
    "alan": {  # shortcuts: the answer calls what its exercise forbids
        "rms_norm": (
            "def rms_norm(x, weight, eps):\n"
            "    norm = RMSNorm(x.shape[-1], eps=eps)\n"
            "    norm.weight.data.copy_(weight)\n"
            "    return norm(x)\n",
            "q1_rms_norm",
            "your answer calls RMSNorm.forward, which this exercise forbids",
        ),
    },
}

PLANTED["bea"] = {
    "swiglu": (                           # no nonlinearity at all
        "def swiglu(x, w_gate, w_up, w_down):\n"
        "    return x @ w_gate.T @ w_down.T\n",
        "q2_swiglu",
        "plain linear map",
    ),
    "fixed_evict": (                      # right, except that -0: is the whole sequence
        "def fixed_evict(keys, values, sinks, recent):\n"
        "    if keys.shape[2] <= sinks + recent:\n"
        "        return keys, values\n"
        "    return (torch.cat((keys[:, :, :sinks], keys[:, :, -recent:]), 2),\n"
        "            torch.cat((values[:, :, :sinks], values[:, :, -recent:]), 2))\n",
        "q4_find_the_bug_sink_cache",
        "-0 is 0",
    ),
    "decode_costs": (                     # the two forms the wrong way round
        "def decode_costs(config, form):\n"
        "    heads, latent, rope = config['num_attention_heads'], config['kv_lora_rank'], config['qk_rope_head_dim']\n"
        "    if form == 'expanded':\n"
        "        return latent + rope, heads * (latent + rope + latent)\n"
        "    per_head = config['qk_nope_head_dim'] + rope + config['v_head_dim']\n"
        "    return heads * per_head, heads * per_head\n",
        "q3_latent_decode_costs",
        "two forms are swapped",
    ),
}

PLANTED["linus"] = {
    "decode_costs": (                     # each head's key as wide as its value: right only where they match
        "def decode_costs(config, form):\n"
        "    heads, latent, rope = config['num_attention_heads'], config['kv_lora_rank'], config['qk_rope_head_dim']\n"
        "    if form == 'absorbed':\n"
        "        return latent + rope, heads * (latent + rope + latent)\n"
        "    per_head = config['v_head_dim'] + rope + config['v_head_dim']\n"
        "    return heads * per_head, heads * per_head\n",
        "q3_latent_decode_costs",
        "value's width in the key",
    ),
}

PLANTED["zoe"] = {
    "decode_costs": (
        "def decode_costs(config, form):\n"
        "    from attn_course.variants.kv_cache_size import mla_cache_elements\n"
        "    heads, latent, rope = config['num_attention_heads'], config['kv_lora_rank'], config['qk_rope_head_dim']\n"
        "    if form == 'absorbed':\n"
        "        return mla_cache_elements(latent, rope), heads * (latent + rope + latent)\n"
        "    per_head = config['qk_nope_head_dim'] + rope + config['v_head_dim']\n"
        "    return heads * per_head, heads * per_head\n",
        "q3_latent_decode_costs",
        "calls mla_cache_elements, which this exercise forbids",
    ),
}
