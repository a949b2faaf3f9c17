"""Students that answer with the forbidden operation and hide it (issue 44): under another spelling,
in a thread, with the watch switched off, through the checks' own references or the garbage collector,
computed at cell time, or not hidden at all (a hidden test calls the answer outside the watch). Each
answer computes the right value, so that only the rule can score it 0: the grader reads each answer's
submitted source (attn_course.checks.answer_source) outside the student's process, and a question
whose answer breaks its rule scores 0, hidden tests included.
"""

from __future__ import annotations

_EVASIONS_02 = {
    # 1. the same operation under another name
    "stable_softmax": "def stable_softmax(scores):\n    return torch._softmax(scores, -1, False)\n",
    # 1. another spelling of SDPA, through torch.ops
    "my_attention": ("def my_attention(q, k, v, mask=None):\n"
                     "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
                     "    if mask is not None:\n        scores = scores.masked_fill(~mask, float('-inf'))\n"
                     "    return torch.nan_to_num(torch.ops.aten._softmax(scores, -1, False), nan=0.0) @ v\n"),
    # 5. the course's own reference code, imported from the checks
    "predicted_score_std": ("def predicted_score_std(d_k, std_q=1.0, std_k=1.0):\n"
                            "    import attn_course.checks.scaling as reference\n"
                            "    return math.sqrt(d_k) * std_q * std_k\n"),
    # 4. the runner's guard replaced: a cell finds the runner's globals through the garbage collector and
    # swaps its watch for one that sees nothing; the answer then calls SDPA plainly
    "fixed_attention": ("import contextlib\nimport gc\n\n\n@contextlib.contextmanager\n"
                        "def _sees_nothing(rules):\n    yield []\n\n\n"
                        "for _found in gc.get_objects():\n"
                        "    if type(_found) is dict and 'run_cells' in _found and 'watch_calls' in _found:\n"
                        "        _found['watch_calls'] = _sees_nothing\n\n\n"
                        "def fixed_attention(q, k, v, mask):\n"
                        "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n"),
    # 2. autograd in a thread, which the guard on the calling thread does not see
    "query_gradient": ("import threading\n\n"
                       "def query_gradient(q, k, upstream):\n    box = []\n\n    def run():\n"
                       "        leaf = q.detach().requires_grad_(True)\n"
                       "        weights = torch.softmax(leaf @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)\n"
                       "        box.append(torch.autograd.grad(weights, leaf, upstream)[0])\n\n"
                       "    thread = threading.Thread(target=run)\n    thread.start()\n    thread.join()\n"
                       "    return box[0]\n"),
}

_EVASIONS_11 = {
    # 3. the watch switched off: the profile hook that sees the course's functions (the model, under ablate_head)
    "logits_without_head": ("import sys\n\n"
                            "def logits_without_head(weights, tokens, layer, head):\n    sys.setprofile(None)\n"
                            "    from attn_course.circuits import ablate_head\n"
                            "    from attn_course.models.attention_only import AttentionOnlyTransformer\n"
                            "    layers, heads, width, d = weights['W_Q'].shape\n"
                            "    model = AttentionOnlyTransformer(weights['W_E'].shape[0], n_layers=layers, "
                            "n_heads=heads, d_model=width, max_len=weights['W_pos'].shape[0])\n"
                            "    state = {'embed.weight': weights['W_E'], 'pos_embed.weight': weights['W_pos'], "
                            "'unembed.weight': weights['W_U'].T}\n"
                            "    for at in range(layers):\n"
                            "        for name in 'qkv':\n"
                            "            state[f'layers.{at}.attention.{name}_proj.weight'] = "
                            "weights['W_' + name.upper()][at].transpose(1, 2).reshape(heads * d, width)\n"
                            "        state[f'layers.{at}.attention.out_proj.weight'] = "
                            "weights['W_O'][at].reshape(heads * d, width).T\n"
                            "    model.load_state_dict(state)\n"
                            "    with ablate_head(model, layer, head), torch.no_grad():\n"
                            "        return model(tokens)\n"),
    # 3. the watch switched off: PyTorch's function modes
    "k_composition": ("def k_composition(W_Q, W_K, W_V, W_O):\n"
                      "    with torch._C.DisableTorchFunction():\n"
                      "        from attn_course.circuits import composition_score\n"
                      "        return composition_score(W_Q @ W_K.T, (W_V @ W_O).T)\n"),
    # 6. the answer looked up at cell time: the check's own measurements of every model it may show, read
    # back by matching the scores shown (the heads are shuffled), so the call itself measures nothing
    "most_harmful_head": ("from attn_course.checks.circuits_ablation import ablation_effects\n\n"
                          "_TABLES = []\n"
                          "for seed in (0, 1, 6):                # as trained, and each harmless head made dead\n"
                          "    trained = ablation_effects(seed)\n"
                          "    _TABLES += [trained] + [ablation_effects(seed, head) for head in range(4)\n"
                          "                            if trained[-1][0, head] < 0.1 * trained[-1].max()]\n\n"
                          "def most_harmful_head(previous_token_scores, duplicate_token_scores, induction_scores):\n"
                          "    for *_, induction, rises in _TABLES:\n"
                          "        if torch.equal(induction.sort(dim=1).values, induction_scores.sort(dim=1).values):\n"
                          "            layer, original = divmod(int(rises.argmax()), rises.shape[1])\n"
                          "            shown = induction_scores[layer] == induction[layer, original]\n"
                          "            return layer, int(shown.nonzero()[0])\n"
                          "    return 0, 0\n"),
    # 7. no evasion at all: the forbidden function, which the hidden test calls outside any watch
    "fixed_copying_score": ("def fixed_copying_score(W_E, W_V, W_O, W_U):\n"
                            "    from attn_course.circuits import copying_scores\n"
                            "    return copying_scores(W_O @ W_U @ W_E @ W_V).positive_fraction\n"),
}

_EVASIONS_12 = {
    # 1. RMSNorm under another spelling: PyTorch's functional form, through a module alias
    "qk_norm_scores": ("import torch.nn.functional as G\n\n"
                       "def qk_norm_scores(q, k, q_weight, k_weight, eps, rope_base):\n"
                       "    d = q_weight.shape[0]\n    rope = RotaryEmbedding(d, base=rope_base)\n"
                       "    def normed(t, weight):\n"
                       "        return rope(G.rms_norm(t.unflatten(-1, (-1, d)), (d,), weight, eps).transpose(1, 2))\n"
                       "    return normed(q, q_weight) @ normed(k, k_weight).transpose(-2, -1) / math.sqrt(d)\n"),
    # 3. the watch switched off: the softmax over the scores and the sink, under PyTorch's function modes disabled
    "fixed_softmax_with_sink": ("def fixed_softmax_with_sink(scores, sinks):\n"
                                "    with torch._C.DisableTorchFunction():\n"
                                "        sink = sinks.view(-1, 1, 1).expand(*scores.shape[:-1], 1)\n"
                                "        logits = torch.cat((scores, sink), -1)\n"
                                "        return torch.softmax(logits, dim=-1)[..., :-1]\n"),
    # 7. no evasion at all: the forbidden layer, which the hidden test calls outside any watch
    "gated_output": ("def gated_output(heads, x, w_gate, w_out):\n"
                     "    from attn_course.models.decoder_attention import DecoderAttention, DecoderAttentionConfig\n"
                     "    layer = DecoderAttention(DecoderAttentionConfig(x.shape[-1], 1, 1, heads.shape[-1], "
                     "output_gate=True))\n"
                     "    return (heads * torch.sigmoid(x @ w_gate.T)) @ w_out.T\n"),
    # 6. the answer computed at cell time, so that the call itself counts nothing
    "cache_ranking": ("from attn_course.variants.layout_cache_size import PUBLISHED_CONFIGS as _NAMES\n"
                      "from attn_course.variants.layout_cache_size import cache_elements_by_layout as _count\n"
                      "from attn_course.variants.layout_cache_size import published_config as _config\n\n"
                      "_SIZES = {name: _count(_config(name), 131072).elements for name in _NAMES}\n\n"
                      "def cache_ranking(names):\n    return sorted(names, key=_SIZES.get)\n"),
}

_EVASIONS_13 = {
    # 2. the course's gated delta rule in a thread, which the guard on the calling thread does not see
    "gated_delta_recurrence": ("import threading\n\n"
                               "def gated_delta_recurrence(q, k, v, g, beta, state, scale):\n    box = []\n\n"
                               "    def run():\n"
                               "        from attn_course.variants.delta_rule import gated_delta_rule\n"
                               "        box.append(gated_delta_rule(q, k, v, g, beta, scale=scale,\n"
                               "                                    initial_state=state))\n\n"
                               "    thread = threading.Thread(target=run)\n    thread.start()\n    thread.join()\n"
                               "    return box[0]\n"),
    # 1. the same selection under another name: block selection's private top-k, handed the causal mask
    "fixed_causal_top_k": ("from attn_course.variants import block_selection as _blocks\n\n"
                           "def fixed_causal_top_k(scores, k):\n"
                           "    causal = torch.ones(scores.shape[-1], scores.shape[-1], dtype=torch.bool).tril()\n"
                           "    return _blocks._top_blocks(scores, causal.expand_as(scores), k)\n"),
    # 6. the answer measured at cell time, with random memories, so that the call itself draws nothing
    "better_memory": ("import torch.nn.functional as _F\n\n"
                      "def _recalled(pairs):\n"
                      "    keys, values = (_F.normalize(torch.randn(16, pairs, 32, dtype=torch.float64), dim=-1)\n"
                      "                    for _ in range(2))\n"
                      "    state = torch.zeros(16, 32, 32, dtype=torch.float64)\n"
                      "    for t in range(pairs):\n"
                      "        k, v = keys[:, t, :, None], values[:, t, :, None]\n"
                      "        state = state + k @ (v - state.transpose(1, 2) @ k).transpose(1, 2)\n"
                      "    right = lambda s: ((keys @ s) @ values.transpose(1, 2)).argmax(-1) == torch.arange(pairs)\n"
                      "    return right(keys.transpose(1, 2) @ values).double(), right(state).double()\n\n"
                      "_MEASURED = {pairs: _recalled(pairs) for pairs in (32, 64, 128)}\n\n"
                      "def better_memory(pairs, which):\n"
                      "    group = {'all': slice(None), 'oldest': slice(0, 8), 'newest': slice(-8, None)}[which]\n"
                      "    linear, delta = (recalled[:, group].mean() for recalled in _MEASURED[pairs])\n"
                      "    return 'delta' if delta > linear else 'linear'\n"),
}

#: {student: {"chapter", "replace": {answer: code}, "expect": {"score": 0.0, "stopped": None}}}, as
#: tests/grading/hostile/checks.py's ATTACKS: a notebook of the chapter's imports and these answers.
ATTACKS = {
    "evasions_02": {"chapter": "02_formula", "replace": _EVASIONS_02, "expect": {"score": 0.0, "stopped": None}},
    "evasions_11": {"chapter": "11_induction_heads", "replace": _EVASIONS_11,
                    "expect": {"score": 0.0, "stopped": None}},
    "evasions_12": {"chapter": "12_open_models", "replace": _EVASIONS_12,
                    "expect": {"score": 0.0, "stopped": None}},
    "evasions_13": {"chapter": "13_sparse_recurrent", "replace": _EVASIONS_13,
                    "expect": {"score": 0.0, "stopped": None}},
}
