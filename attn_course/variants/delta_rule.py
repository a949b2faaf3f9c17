"""The gated delta rule (Yang et al., Gated Delta Networks, 2024): linear attention that corrects what a key recalls.

Chapter 09's linear attention keeps a state ``S`` (``[d_k, d_v]``, keys along the rows) and adds every
token to it; a query reads ``qᵀ S``. Writing ``S_t`` for the state after token ``t``:

- linear attention:   ``S_t = S_{t-1} + k_t v_tᵀ``
- with decay (RetNet, GLA, Mamba-2):   ``S_t = α_t S_{t-1} + k_t v_tᵀ``
- the delta rule (DeltaNet):   ``S_t = S_{t-1} + β_t k_t (v_t − S_{t-1}ᵀ k_t)ᵀ``: read what the key recalls,
  ``S_{t-1}ᵀ k_t``, and write only the correction towards ``v_t``, by a step ``β_t ∈ (0, 1)``; with a unit key
  and ``β_t = 1`` the key's old value is replaced, not blurred;
- the gated delta rule (Gated DeltaNet; Qwen3-Next's linear layers):
  ``S_t = α_t S_{t-1} + β_t k_t (v_t − α_t S_{t-1}ᵀ k_t)ᵀ``, with ``α_t = exp(g_t)``, ``g_t ≤ 0``.

The output is ``o_t = scale · S_tᵀ q_t``. (Papers often write the state transposed, ``[d_v, d_k]``, as
``S_t = S_{t-1} + β_t (v_t − S_{t-1} k_t) k_tᵀ``: the same numbers.)

**The recurrent form** runs the formula token by token. **The chunked form** computes the same thing a
chunk of ``C`` tokens at a time with matrix products, which is how it trains in parallel. Within a chunk
that starts from state ``S``, with ``γ_i = α_1 ⋯ α_i`` the decay from the chunk's start to its token ``i``,
``Γ_ij = γ_i / γ_j`` and ``B = diag(β)``, unrolling the recurrence gives

- ``A = I + strictly_lower(B (K Kᵀ ⊙ Γ))``, a unit lower-triangular ``[C, C]`` matrix: token ``i``'s
  correction depends on the corrections of the tokens before it in the chunk through their keys' overlap;
- the corrections ``Δ = A⁻¹ B (V − (K ⊙ γ) S)`` (two triangular solves; ``A⁻¹ B`` is the WY/UT
  representation of the product of the chunk's ``I − β_i k_i k_iᵀ``);
- the outputs ``O = scale · ((Q ⊙ γ) S + (Q Kᵀ ⊙ Γ ⊙ causal) Δ)``;
- the state ``S' = γ_C S + (K ⊙ γ_C / γ)ᵀ Δ``.

A sequence whose length is not a multiple of ``C`` is padded with tokens that change nothing (zero keys
and values, ``β = 0``, ``g = 0``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attn_course import _validate

__all__ = ["gated_delta_rule"]


def _check(q, k, v, g, beta, chunk_size, scale, initial_state) -> float:
    where = "gated_delta_rule"
    _validate.four_d(where, q=q, k=k, v=v)
    batch, heads, tokens, d_k = q.shape
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"{where}: expected q and k [B, H, N, d_k] and v [B, H, N, d_v], got q "
                         f"{_validate.shape_str(q)}, k {_validate.shape_str(k)}, v {_validate.shape_str(v)}")
    for name, value in (("g", g), ("beta", beta)):
        value = _validate.floating_tensor(where, name, value)
        if value.shape != q.shape[:3]:
            raise ValueError(f"{where}: {name} must be [B, H, N] = [{batch}, {heads}, {tokens}], got shape "
                             f"{_validate.shape_str(value)}")
        _validate.same_dtype_and_device(where, q=q, **{name: value})
    if (g > 0).any():
        raise ValueError(f"{where}: g is the log of the decay and must be <= 0 (a decay above 1 grows the state "
                         f"without bound), got a largest value of {g.max().item():g}")
    if chunk_size is not None:
        _validate.integer(where, "chunk_size", chunk_size, minimum=1)
    if initial_state is not None:
        initial_state = _validate.floating_tensor(where, "initial_state", initial_state)
        if initial_state.shape != (batch, heads, d_k, v.shape[-1]):
            raise ValueError(f"{where}: initial_state must be [B, H, d_k, d_v] = [{batch}, {heads}, {d_k}, "
                             f"{v.shape[-1]}], got shape {_validate.shape_str(initial_state)}")
        _validate.same_dtype_and_device(where, q=q, initial_state=initial_state)
    return 1.0 / math.sqrt(d_k) if scale is None else _validate.positive_finite(where, "scale", scale)


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
                     chunk_size: int | None = None, scale: float | None = None,
                     initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over a sequence, token by token (``chunk_size=None``) or a chunk at a time.

    Args:
        q, k: ``[B, H, N, d_k]``, the queries and keys (the caller L2-normalises them, as Gated DeltaNet does).
        v: ``[B, H, N, d_v]``.
        g: ``[B, H, N]``, the log of each token's decay ``α_t = exp(g_t)``, at most 0.
        beta: ``[B, H, N]``, each token's writing strength ``β_t`` (in ``(0, 1)`` in the models).
        chunk_size: None for the recurrence, or ``C``, the chunk of the chunked form (any ``N``).
        scale: multiplies the queries; default ``1 / sqrt(d_k)``.
        initial_state: ``[B, H, d_k, d_v]``, the state before the first token (default zeros).

    Returns:
        ``(out [B, H, N, d_v], state [B, H, d_k, d_v])``: every token's output and the state after the last.

    Raises:
        TypeError: a non-floating input, or inputs of different dtypes or devices.
        ValueError: shapes that do not fit, a positive ``g``, ``chunk_size`` below 1, a scale that is not
            positive.

    Example:
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> q, k = (F.normalize(torch.randn(1, 2, 10, 8), dim=-1) for _ in range(2))
        >>> v, g, beta = torch.randn(1, 2, 10, 4), -torch.rand(1, 2, 10), torch.rand(1, 2, 10)
        >>> out, state = gated_delta_rule(q, k, v, g, beta)
        >>> chunked, chunked_state = gated_delta_rule(q, k, v, g, beta, chunk_size=4)
        >>> out.shape, torch.allclose(out, chunked, atol=1e-5), torch.allclose(state, chunked_state, atol=1e-5)
        (torch.Size([1, 2, 10, 4]), True, True)
    """
    scale = _check(q, k, v, g, beta, chunk_size, scale, initial_state)
    state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]) if initial_state is None else initial_state
    if chunk_size is None:
        return _recurrent(q * scale, k, v, g, beta, state)
    return _chunked(q * scale, k, v, g, beta, state, chunk_size)


def _recurrent(q, k, v, g, beta, state):
    """The formula, one token at a time."""
    outputs = []
    for t in range(q.shape[2]):
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]                     # [B, H, d_k], ..., [B, H, d_v]
        state = state * g[:, :, t, None, None].exp()                             # decay: α_t S
        recalled = (k_t.unsqueeze(-1) * state).sum(-2)                           # [B, H, d_v]: what k_t recalls
        correction = beta[:, :, t, None] * (v_t - recalled)                      # [B, H, d_v]
        state = state + k_t.unsqueeze(-1) * correction.unsqueeze(-2)             # [B, H, d_k, d_v]
        outputs.append((q_t.unsqueeze(-1) * state).sum(-2))                      # [B, H, d_v]: S_tᵀ q_t
    return torch.stack(outputs, dim=2), state


def _chunked(q, k, v, g, beta, state, size):
    """The chunked form of the module docstring: each chunk from the state the chunk before left."""
    tokens = q.shape[2]
    pad = -tokens % size                                                         # tokens that change nothing
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    chunks = lambda x: x.unflatten(2, (-1, size))                                # noqa: E731  [B, H, n, C, ...]
    q, k, v, g, beta = map(chunks, (q, k, v, g, beta))
    log_gamma = g.cumsum(-1)                                                     # [B, H, n, C]: log γ_i
    causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    decay = (log_gamma.unsqueeze(-1) - log_gamma.unsqueeze(-2)).masked_fill(~causal, -math.inf).exp()   # Γ ⊙ causal
    overlap = beta.unsqueeze(-1) * (k @ k.transpose(-1, -2)) * decay             # B (K Kᵀ ⊙ Γ), lower part kept
    system = torch.eye(size, dtype=q.dtype, device=q.device) + overlap.tril(-1)  # A, unit lower-triangular
    within = (q @ k.transpose(-1, -2)) * decay                                   # Q Kᵀ ⊙ Γ ⊙ causal
    gamma = log_gamma.exp().unsqueeze(-1)                                        # [B, H, n, C, 1]
    to_end = (log_gamma[..., -1:] - log_gamma).exp().unsqueeze(-1)               # γ_C / γ_i
    outputs = []
    for n in range(q.shape[2]):
        targets = beta[:, :, n, :, None] * (v[:, :, n] - (k[:, :, n] * gamma[:, :, n]) @ state)   # B (V − (K ⊙ γ) S)
        corrections = torch.linalg.solve_triangular(system[:, :, n], targets, upper=False, unitriangular=True)
        outputs.append((q[:, :, n] * gamma[:, :, n]) @ state + within[:, :, n] @ corrections)
        state = gamma[:, :, n, -1:] * state + (k[:, :, n] * to_end[:, :, n]).transpose(-1, -2) @ corrections
    return torch.cat(outputs, dim=2)[:, :, :tokens], state
