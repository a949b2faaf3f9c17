"""Linear attention (Katharopoulos, Vyas, Pappas and Fleuret, 2020): a kernel in place of the softmax.

Softmax attention weighs key ``j`` for query ``i`` by ``exp(q_i · k_j)``. Replace that by a
dot product of features, ``φ(q_i) · φ(k_j)`` with ``φ(x) = elu(x) + 1`` (positive, so the
weights stay positive), and the output becomes

    out_i = Σ_j (φ(q_i) · φ(k_j)) v_j / Σ_j φ(q_i) · φ(k_j)
          = φ(q_i)ᵀ S / φ(q_i)ᵀ z,        S = Σ_j φ(k_j) v_jᵀ  [d, d_v],   z = Σ_j φ(k_j)  [d]

The sums ``S`` and ``z`` no longer depend on ``i``: computing them once costs ``O(N d d_v)``,
linear in ``N``, instead of the ``O(N² d)`` of forming every pair. With a causal mask the sums
run over ``j <= i`` only, and the same formula read one token at a time is a recurrent network
whose state is ``(S, z)``: a fixed size, however long the sequence, where softmax attention's KV
cache grows by a row per token. The price: the weights are no longer a softmax, so the sharp,
content-based lookups of chapter 01 become blurrier.

Three ways to compute the same causal result, each the check of the others:

* :func:`linear_attention_parallel`: the ``N × N`` matrix of ``φ(q_i) · φ(k_j)``, masked and
  normalised row by row, as attention is usually written (quadratic, for reference);
* :func:`linear_attention_recurrent`: one token at a time, updating ``(S, z)`` (the RNN form,
  what generation uses);
* :func:`linear_attention`: chunks of ``C`` tokens, the pairs inside a chunk as a small masked
  matrix and everything before it through the running state: linear in ``N`` and made of
  matrix products (how fast implementations train).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attn_course import _validate

__all__ = ["elu_feature_map", "linear_attention", "linear_attention_parallel", "linear_attention_recurrent"]


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """The paper's feature map ``φ(x) = elu(x) + 1``: positive, ``x + 1`` for ``x > 0``, ``e^x`` below.

    Raises:
        TypeError: ``x`` not a floating tensor.

    Example:
        >>> elu_feature_map(torch.tensor([-1.0, 0.0, 2.0]))
        tensor([0.3679, 1.0000, 3.0000])
    """
    x = _validate.tensor("elu_feature_map", "x", x)
    if not x.is_floating_point():
        raise TypeError(f"elu_feature_map: x must be a floating tensor, got {x.dtype}")
    return F.elu(x) + 1.0


def _check(where: str, q, k, v, eps) -> float:
    for name, value in (("q", q), ("k", k), ("v", v)):
        value = _validate.tensor(where, name, value)
        if not value.is_floating_point() or value.dim() < 2:
            raise TypeError(f"{where}: {name} must be a floating tensor [..., N, d], got "
                            f"{_validate.shape_str(value)} {value.dtype}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{where}: expected q [..., N_q, d], k [..., N_k, d], v [..., N_k, d_v] with the same "
                         f"batch dimensions, got q {_validate.shape_str(q)}, k {_validate.shape_str(k)}, "
                         f"v {_validate.shape_str(v)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{where}: q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return _validate.positive_finite(where, "eps", eps)


def linear_attention_parallel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                              eps: float = 1e-6) -> torch.Tensor:
    """Linear attention written as attention: the ``N_q × N_k`` weights ``φ(q_i) · φ(k_j)``, normalised.

    Quadratic in ``N``, like softmax attention; the definition the other two forms must match.

    Args:
        q: ``[..., N_q, d]``; k: ``[..., N_k, d]``; v: ``[..., N_k, d_v]``.
        causal: query ``i`` sees keys ``j <= i + N_k - N_q`` (bottom-right, as after a cache).
        eps: added to each row's normaliser, which is a sum of positive terms.

    Returns:
        ``[..., N_q, d_v]``.

    Raises:
        TypeError, ValueError: non-floating or mismatched inputs, ``causal`` not a bool, a bad ``eps``.

    Example:
        >>> q, k, v = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 2)
        >>> linear_attention_parallel(q, k, v, causal=True).shape
        torch.Size([3, 2])
    """
    where = "linear_attention_parallel"
    eps = _check(where, q, k, v, eps)
    _validate.boolean(where, "causal", causal)
    weights = elu_feature_map(q) @ elu_feature_map(k).transpose(-2, -1)                   # [..., N_q, N_k]
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        weights = weights * visible
    return (weights @ v) / (weights.sum(dim=-1, keepdim=True) + eps)


def linear_attention_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                               eps: float = 1e-6) -> torch.Tensor:
    """Causal linear attention as a recurrent network: one token at a time, a fixed-size state.

    For each position ``t``: ``S += φ(k_t) v_tᵀ``, ``z += φ(k_t)``, then
    ``out_t = φ(q_t)ᵀ S / (φ(q_t)ᵀ z + eps)``. The state ``(S [d, d_v], z [d])`` replaces a KV cache.

    Args:
        q, k: ``[..., N, d]``; v: ``[..., N, d_v]`` (one query per key: self-attention).
        eps: as in :func:`linear_attention_parallel`.

    Returns:
        ``[..., N, d_v]``, equal to ``linear_attention_parallel(q, k, v, causal=True)``.

    Raises:
        TypeError, ValueError: as :func:`linear_attention_parallel`, or ``q`` and ``k`` of different lengths.

    Example:
        >>> q, k, v = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 2)
        >>> torch.allclose(linear_attention_recurrent(q, k, v), linear_attention_parallel(q, k, v, causal=True))
        True
    """
    where = "linear_attention_recurrent"
    eps = _check(where, q, k, v, eps)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"{where}: the recurrent form needs one query per key, got q {_validate.shape_str(q)}, "
                         f"k {_validate.shape_str(k)}")
    q_features, k_features = elu_feature_map(q), elu_feature_map(k)                        # [..., N, d]
    state = q.new_zeros((*q.shape[:-2], q.shape[-1], v.shape[-1]))                        # S: [..., d, d_v]
    normaliser = q.new_zeros((*q.shape[:-2], q.shape[-1]))                                # z: [..., d]
    outputs = []
    for t in range(q.shape[-2]):
        state = state + k_features[..., t, :, None] * v[..., t, None, :]                  # += φ(k_t) v_tᵀ
        normaliser = normaliser + k_features[..., t, :]
        query = q_features[..., t, :]                                                     # [..., d]
        numerator = (query[..., None, :] @ state).squeeze(-2)                             # [..., d_v]
        outputs.append(numerator / ((query * normaliser).sum(-1, keepdim=True) + eps))
    return torch.stack(outputs, dim=-2)


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                     chunk_size: int = 64, eps: float = 1e-6) -> torch.Tensor:
    """Linear attention in time and memory linear in ``N``.

    Not causal: ``S = φ(K)ᵀ V`` and ``z = Σ_j φ(k_j)`` once, then every query reads them.
    Causal (self-attention): chunks of ``chunk_size`` tokens. Inside a chunk the pairs ``j <= i``
    are a small masked ``C × C`` matrix; the keys of earlier chunks reach it through the state
    ``(S, z)`` carried from chunk to chunk. Time ``O(N (C d + d d_v))``, memory ``O(C² + d d_v)``
    beyond the inputs.

    Args:
        q: ``[..., N_q, d]``; k: ``[..., N_k, d]``; v: ``[..., N_k, d_v]`` (``N_q = N_k`` when causal).
        causal: each query sees itself and the keys before it.
        chunk_size: ``C >= 1``, tokens per chunk (causal only).
        eps: as in :func:`linear_attention_parallel`.

    Returns:
        ``[..., N_q, d_v]``, equal to :func:`linear_attention_parallel`'s result up to rounding.

    Raises:
        TypeError, ValueError: as :func:`linear_attention_parallel`, ``N_q != N_k`` with ``causal``,
            or a bad ``chunk_size``.

    Example:
        >>> q, k, v = torch.randn(2, 100, 8), torch.randn(2, 100, 8), torch.randn(2, 100, 8)
        >>> out = linear_attention(q, k, v, causal=True, chunk_size=16)
        >>> torch.allclose(out, linear_attention_parallel(q, k, v, causal=True), atol=1e-5)
        True
    """
    where = "linear_attention"
    eps = _check(where, q, k, v, eps)
    _validate.boolean(where, "causal", causal)
    chunk_size = _validate.integer(where, "chunk_size", chunk_size, minimum=1)
    q_features, k_features = elu_feature_map(q), elu_feature_map(k)
    if not causal:
        state = k_features.transpose(-2, -1) @ v                                          # S: [..., d, d_v]
        normaliser = k_features.sum(dim=-2)                                               # z: [..., d]
        return (q_features @ state) / ((q_features @ normaliser[..., None]) + eps)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"{where}: causal linear attention here is self-attention (N_q = N_k), got "
                         f"q {_validate.shape_str(q)}, k {_validate.shape_str(k)}")
    n = q.shape[-2]
    state = q.new_zeros((*q.shape[:-2], q.shape[-1], v.shape[-1]))                        # S before the chunk
    normaliser = q.new_zeros((*q.shape[:-2], 1, q.shape[-1]))                             # z before the chunk
    lower = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    outputs = []
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        q_chunk, k_chunk = q_features[..., start:stop, :], k_features[..., start:stop, :]    # [..., C, d]
        v_chunk = v[..., start:stop, :]                                                   # [..., C, d_v]
        inside = (q_chunk @ k_chunk.transpose(-2, -1)) * lower[: stop - start, : stop - start]   # [..., C, C]
        numerator = inside @ v_chunk + q_chunk @ state                                    # [..., C, d_v]
        denominator = inside.sum(dim=-1, keepdim=True) + (q_chunk * normaliser).sum(-1, keepdim=True)
        outputs.append(numerator / (denominator + eps))
        state = state + k_chunk.transpose(-2, -1) @ v_chunk                               # the chunk joins S, z
        normaliser = normaliser + k_chunk.sum(dim=-2, keepdim=True)
    return torch.cat(outputs, dim=-2)
