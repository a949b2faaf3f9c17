"""Planted mistakes for chapter 04_causal: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "04_causal"

PLANTED = {
    "ada": {
        "kv_cache_bytes": (
            "def kv_cache_bytes(batch, num_kv_heads, head_dim, dtype, prompt_tokens, new_tokens):\n"
            "    tokens = prompt_tokens + new_tokens\n"
            "    size = 2 * batch * num_kv_heads * tokens * head_dim * torch.finfo(dtype).bits // 8\n"
            "    return size, size\n",
            "q5_predict_kv_cache",
            "the cache allocates ahead",
        ),
        "my_causal_mask": (
            "def my_causal_mask(n_q, n_k):\n"
            "    return torch.ones(n_q, n_k, dtype=torch.bool).tril()\n",
            "q1_causal_mask",
            "aligned to the top-left",
        ),
        "positions_without_cache": (
            "def positions_without_cache(P, T):\n"
            "    return T * P + T * (T + 1) // 2\n",
            "q2_positions_without_cache",
            "one position too many per step",
        ),
        "fixed_decode_logits": (
            "def fixed_decode_logits(model, new_ids, caches):\n"
            "    positions = torch.arange(new_ids.shape[1])\n"
            "    x = model.token_embedding(new_ids) + model.position_embedding(positions)\n"
            "    for block, cache in zip(model.blocks, caches):\n"
            "        x, _ = block(x, kv_cache=cache)\n"
            "    return model.head(model.final_norm(x))\n",
            "q3_find_the_bug",
            "positions restart at 0",
        ),
        "cached_attention_step": (
            "def cached_attention_step(q, k, v, past_keys, past_values, lengths):\n"
            "    keys = torch.cat([past_keys, k], dim=-2)\n"
            "    values = torch.cat([past_values, v], dim=-2)\n"
            "    output = torch.nn.functional.scaled_dot_product_attention(q, keys, values, is_causal=True)\n"
            "    return output, keys, values\n",
            "q4_cached_attention_step",
            "aligned to the top-left",
        ),
    },
    "grace": {
        "kv_cache_bytes": (
            "def kv_cache_bytes(batch, num_kv_heads, head_dim, dtype, prompt_tokens, new_tokens):\n"
            "    per_token = batch * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8\n"
            "    capacity = prompt_tokens\n"
            "    while capacity < prompt_tokens + new_tokens:\n"
            "        capacity *= 2\n"
            "    return per_token * (prompt_tokens + new_tokens), per_token * capacity\n",
            "q5_predict_kv_cache",
            "counted only the keys",
        ),
        "my_causal_mask": (
            "def my_causal_mask(n_q, n_k):\n"
            "    query_position = torch.arange(n_q)[:, None] + (n_k - n_q)\n"
            "    return torch.arange(n_k)[None, :] < query_position\n",
            "q1_causal_mask",
            "hides the diagonal",
        ),
        "positions_without_cache": (
            "def positions_without_cache(P, T):\n"
            "    return torch.tensor(T * P + T * (T - 1) // 2)\n",
            "q2_positions_without_cache",
            "not a Python int",
        ),
        "fixed_decode_logits": (
            "def fixed_decode_logits(model, new_ids, caches):\n"
            "    start = len(caches[0])\n"
            "    positions = torch.arange(start, start + new_ids.shape[1])\n"
            "    x = model.token_embedding(new_ids) + model.position_embedding(positions)\n"
            "    for block in model.blocks:\n"
            "        x, _ = block(x)\n"
            "    return model.head(model.final_norm(x))\n",
            "q3_find_the_bug",
            "ignores the cache",
        ),
        "cached_attention_step": (
            "def cached_attention_step(q, k, v, past_keys, past_values, lengths):\n"
            "    from attn_course import padding_mask\n"
            "    keys = torch.cat([past_keys, k], dim=-2)\n"
            "    values = torch.cat([past_values, v], dim=-2)\n"
            "    mask = causal_mask(q.shape[-2], keys.shape[-2]) & padding_mask(lengths, keys.shape[-2])[:, None]\n"
            "    return self_attention(q, keys, values, mask)[0], keys, values\n",
            "q4_cached_attention_step",
            "assumes the padding comes after the tokens",
        ),
    },
    "linus": {
        "kv_cache_bytes": (
            "def kv_cache_bytes(batch, num_kv_heads, head_dim, dtype, prompt_tokens, new_tokens):\n"
            "    per_token = 2 * batch * num_kv_heads * head_dim * torch.finfo(dtype).bits\n"
            "    capacity = prompt_tokens\n"
            "    while capacity < prompt_tokens + new_tokens:\n"
            "        capacity *= 2\n"
            "    return per_token * (prompt_tokens + new_tokens), per_token * capacity\n",
            "q5_predict_kv_cache",
            "counted bits, not bytes",
        ),
        "cached_attention_step": (
            "def cached_attention_step(q, k, v, past_keys, past_values, lengths):\n"
            "    keys = torch.cat([past_keys, k], dim=-2)\n"
            "    values = torch.cat([past_values, v], dim=-2)\n"
            "    n_q, n_k = q.shape[-2], keys.shape[-2]\n"
            "    real = torch.arange(n_k)[None, :] >= n_k - lengths[:, None]\n"
            "    mask = causal_mask(n_q, n_k) & real[:, None, None, :]\n"
            "    scores = (q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, -1e9)\n"
            "    return torch.softmax(scores, dim=-1) @ values, keys, values\n",
            "q4_cached_attention_step",
            "padded query slots are averages of values, not zeros",
        ),
    },
}

# A left-padded batch's padding taken from its first sequence for all of them.
PLANTED["bea"] = {
    "cached_attention_step": (
        "def cached_attention_step(q, k, v, past_keys, past_values, lengths):\n"
        "    keys = torch.cat([past_keys, k], dim=-2)\n"
        "    values = torch.cat([past_values, v], dim=-2)\n"
        "    n_q, n_k = q.shape[-2], keys.shape[-2]\n"
        "    pad = n_k - int(lengths[0])\n"
        "    mask = causal_mask(n_q, n_k) & (torch.arange(n_k) >= pad)\n"
        "    return self_attention(q, keys, values, mask)[0], keys, values\n",
        "q4_cached_attention_step",
        "the same for every sequence of the batch",
    ),
}

# Shortcuts the statements forbid: each is refused by name.
PLANTED["zoe"] = {
    "kv_cache_bytes": (
        "def kv_cache_bytes(batch, num_kv_heads, head_dim, dtype, prompt_tokens, new_tokens):\n"
        "    cache = KVCache()\n"
        "    shape = (batch, num_kv_heads, prompt_tokens, head_dim)\n"
        "    cache.append(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))\n"
        "    for _ in range(new_tokens):\n"
        "        step = (batch, num_kv_heads, 1, head_dim)\n"
        "        cache.append(torch.zeros(step, dtype=dtype), torch.zeros(step, dtype=dtype))\n"
        "    return 0, cache.memory_bytes\n",
        "q5_predict_kv_cache",
        "which this exercise forbids: a prediction follows from the rule alone",
    ),
    "my_causal_mask": (
        "def my_causal_mask(n_q, n_k):\n"
        "    from attn_course import causal_mask\n"
        "    return causal_mask(n_q, n_k)\n",
        "q1_causal_mask",
        "calls causal_mask, which this exercise forbids",
    ),
    "fixed_decode_logits": (
        "def fixed_decode_logits(model, new_ids, caches):\n"
        "    return model(new_ids, kv_caches=caches)\n",
        "q3_find_the_bug",
        "calls TinyLanguageModel.forward, which this exercise forbids",
    ),
}
