"""An independent float64 forward pass of AttentionOnlyTransformer, from its state_dict alone.

Written from the formulas (Elhage et al.'s attention-only transformer, Llama's half-split RoPE with base
10 000), not from attn_course's code: embeddings, per-head attention, per-head outputs, residual sum, unembedding.
"""

from __future__ import annotations

import math

import torch


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def rotate_half_split(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of x [..., N, d] by angle n·base^(-2i/d) at position n."""
    n, d = x.shape[-2], x.shape[-1]
    out = x.clone()
    for position in range(n):
        for i in range(d // 2):
            angle = position * base ** (-2 * i / d)
            a, b = x[..., position, i], x[..., position, i + d // 2]
            out[..., position, i] = a * math.cos(angle) - b * math.sin(angle)
            out[..., position, i + d // 2] = a * math.sin(angle) + b * math.cos(angle)
    return out


def reference_forward(model, tokens: torch.Tensor, *, zero_heads: tuple = ()) -> dict:
    """``{"logits" [B, N, V], "patterns" {l: [B, H, N, N]}, "results" {l: [B, H, N, E]}}`` in float64.

    ``zero_heads``: ``(layer, head)`` pairs whose output is left out of the residual stream.
    """
    config = model.config
    state = {name: t.detach().double() for name, t in model.state_dict().items()}
    heads, width = config.n_heads, config.d_model
    d = width // heads
    batch, n = tokens.shape
    x = state["embed.weight"][tokens]                                       # [B, N, E]
    if config.positions == "learned":
        x = x + state["pos_embed.weight"][:n]
    patterns, results = {}, {}
    for layer in range(config.n_layers):
        prefix = f"layers.{layer}."
        h_in = x
        if config.layer_norm:
            h_in = layer_norm(x, state[prefix + "ln.weight"], state[prefix + "ln.bias"])
        per_head = {}
        for name in ("q", "k", "v"):
            w = state[prefix + f"attention.{name}_proj.weight"]             # [H·d, E]
            projected = torch.einsum("bne,fe->bnf", h_in, w)                 # [B, N, H·d]
            if config.bias:
                projected = projected + state[prefix + f"attention.{name}_proj.bias"]
            per_head[name] = projected.reshape(batch, n, heads, d).permute(0, 2, 1, 3)   # [B, H, N, d]
        q, k, v = per_head["q"], per_head["k"], per_head["v"]
        if config.positions == "rotary":
            q, k = rotate_half_split(q), rotate_half_split(k)
        scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(d)
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, -math.inf)
        pattern = torch.softmax(scores, dim=-1)                             # [B, H, N, N]
        z = torch.einsum("bhij,bhjd->bhid", pattern, v)                      # [B, H, N, d]
        w_o = state[prefix + "attention.out_proj.weight"]                   # [E, H·d]
        result = torch.stack([z[:, h] @ w_o[:, h * d:(h + 1) * d].T for h in range(heads)], dim=1)   # [B, H, N, E]
        patterns[layer], results[layer] = pattern, result
        for zero_layer, zero_head in zero_heads:
            if zero_layer == layer:
                result = result.clone()
                result[:, zero_head] = 0
        x = x + result.sum(1)
        if config.bias:
            x = x + state[prefix + "attention.out_proj.bias"]
    if config.layer_norm:
        x = layer_norm(x, state["ln_final.weight"], state["ln_final.bias"])
    logits = x @ state["unembed.weight"].T
    if config.bias:
        logits = logits + state["unembed.bias"]
    return {"logits": logits, "patterns": patterns, "results": results}
