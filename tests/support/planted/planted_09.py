"""Planted mistakes for chapter 10_modern_variants: each must lose its question's points and get its hint.

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
        "latent_cache_bytes": (                   # a rotary key for every head
            "def latent_cache_bytes(config):\n"
            "    per_layer = config['kv_lora_rank'] + config['num_attention_heads'] * config['qk_rope_head_dim']\n"
            "    return config['num_hidden_layers'] * per_layer * config['bytes_per_element']\n",
            "q3_predict_latent_cache",
            "shared by all heads",
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
        "latent_cache_bytes": (                   # one layer only
            "def latent_cache_bytes(config):\n"
            "    return (config['kv_lora_rank'] + config['qk_rope_head_dim']) * config['bytes_per_element']\n",
            "q3_predict_latent_cache",
            "one layer's worth",
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
}

PLANTED["zoe"] = {
    "latent_cache_bytes": (
        "def latent_cache_bytes(config):\n"
        "    from attn_course.variants.kv_cache_size import cache_size_from_config\n"
        "    return cache_size_from_config(config)\n",
        "q3_predict_latent_cache",
        "calls cache_size_from_config, which this exercise forbids",
    ),
}
