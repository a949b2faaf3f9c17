"""Why divide by √d_k: the experiments behind chapter 02. Unscaled scores have variance ``d_k``
(:func:`dot_product_spread`); they saturate the softmax, whose Jacobian then goes to 0, and the division by
``τ`` scales every gradient below it by ``1/τ`` (:func:`softmax_saturation`, :func:`attention_gradients`,
:func:`scaling_experiment`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from attn_course import _validate

__all__ = ["attention_gradients", "dot_product_spread", "scaling_experiment", "softmax_jacobian", "softmax_saturation"]


def dot_product_spread(d_k_values: Sequence[int], *, n_pairs: int = 20_000, seed: int = 0) -> dict[str, torch.Tensor]:
    """Measure the variance of ``q · k`` for ``n_pairs`` random ``q, k`` with N(0, 1) entries, per head size.

    Returns:
        ``{"d_k": [D], "raw_variance": [D], "scaled_variance": [D]}`` (float64), scaled meaning divided by
        √d_k. Theory says ``d_k`` and ``1``.

    Raises:
        TypeError, ValueError: sizes or counts that are not positive ints.

    Example:
        >>> spread = dot_product_spread([16, 256], n_pairs=4000)
        >>> [round(v) for v in spread["raw_variance"].tolist()]    # theory: 16 and 256
        [17, 251]
    """
    where = "dot_product_spread"
    sizes = _validate.integer_sequence(where, "d_k_values", d_k_values, minimum=1)
    n_pairs = _validate.integer(where, "n_pairs", n_pairs, minimum=2)
    seed = _validate.integer(where, "seed", seed)
    generator = torch.Generator().manual_seed(seed)
    raw, scaled = [], []
    for d_k in sizes:
        q = torch.randn(n_pairs, d_k, generator=generator, dtype=torch.float64)
        k = torch.randn(n_pairs, d_k, generator=generator, dtype=torch.float64)
        dots = (q * k).sum(dim=-1)                                  # [n_pairs]
        raw.append(dots.var().item())
        scaled.append((dots / math.sqrt(d_k)).var().item())
    return {
        "d_k": torch.tensor(sizes, dtype=torch.float64),
        "raw_variance": torch.tensor(raw, dtype=torch.float64),
        "scaled_variance": torch.tensor(scaled, dtype=torch.float64),
    }


def softmax_jacobian(weights: torch.Tensor) -> torch.Tensor:
    """Jacobian of the softmax at output ``weights`` ``[..., N]``: ``diag(p) - p pᵀ``, ``[..., N, N]``, entry
    ``(i, j)`` being ``∂p_i / ∂s_j``."""
    weights = _validate.floating_tensor("softmax_jacobian", "weights", weights, min_dim=1)
    return torch.diag_embed(weights) - weights.unsqueeze(-1) * weights.unsqueeze(-2)


def attention_gradients(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, upstream: torch.Tensor, *,
                        temperature: float) -> dict[str, torch.Tensor]:
    """Backpropagate ``L = Σ a ⊙ upstream`` through ``a = softmax(x W_Q (x W_K)ᵀ / τ)`` by hand.

    The raw scores are ``s = q kᵀ`` with ``q = x W_Q``, ``k = x W_K``. Row by row, ``∂L/∂(s/τ) = J · upstream``
    with ``J = diag(a) - a aᵀ``, so ``∂L/∂s = (1/τ) J · upstream``: the division by ``τ`` in the forward pass
    multiplies every gradient below it by ``1/τ``.

    Args:
        x: ``[..., N, E]`` token vectors (``...``: any batch dimensions, the same for all).
        w_q, w_k: ``[..., E, d_k]`` projections.
        upstream: ``[..., N, N]``, ``∂L/∂a``: what the layers above want the weights to do.
        temperature: ``τ > 0``, what the scores are divided by (``√d_k`` in the formula).

    Returns:
        ``{"weights": a [..., N, N], "scores": ∂L/∂s [..., N, N], "queries": ∂L/∂q [..., N, d_k],
        "w_q": ∂L/∂W_Q [..., E, d_k], "w_q_per_query": [..., N]}``. Query ``i`` only touches row ``i`` of the
        loss; its share of ``∂L/∂W_Q`` is ``x_iᵀ ∂L/∂q_i``, whose norm ``‖x_i‖ ‖∂L/∂q_i‖`` is
        ``w_q_per_query[i]``.

    Raises:
        TypeError: a non-floating tensor, tensors of different dtypes, a temperature that is not a number.
        ValueError: shapes that do not fit together, a temperature that is not positive and finite.

    Example:
        >>> x, w = torch.eye(2), torch.eye(2)
        >>> grads = attention_gradients(x, w, w, torch.tensor([[1.0, 0.0], [0.0, 0.0]]), temperature=1.0)
        >>> grads["weights"][0], grads["scores"][0]
        (tensor([0.7311, 0.2689]), tensor([ 0.1966, -0.1966]))
    """
    where = "attention_gradients"
    x = _validate.floating_tensor(where, "x", x, min_dim=2)
    w_q = _validate.floating_tensor(where, "w_q", w_q, min_dim=2)
    w_k = _validate.floating_tensor(where, "w_k", w_k, min_dim=2)
    upstream = _validate.floating_tensor(where, "upstream", upstream, min_dim=2)
    _validate.same_dtype_and_device(where, x=x, w_q=w_q, w_k=w_k, upstream=upstream)
    temperature = _validate.positive_finite(where, "temperature", temperature)
    *batch, n, width = x.shape
    if w_q.shape != w_k.shape or tuple(w_q.shape[:-1]) != (*batch, width):
        raise ValueError(f"{where}: w_q and w_k must both be [..., E, d_k] with x's batch dimensions and "
                         f"E = {width}, got x {_validate.shape_str(x)}, w_q {_validate.shape_str(w_q)} "
                         f"and w_k {_validate.shape_str(w_k)}")
    if tuple(upstream.shape) != (*batch, n, n):
        raise ValueError(f"{where}: upstream must be [..., N, N] = {[*batch, n, n]}, "
                         f"got {_validate.shape_str(upstream)}")
    q, k = x @ w_q, x @ w_k                                            # [..., N, d_k] each
    weights = torch.softmax(q @ k.transpose(-2, -1) / temperature, dim=-1)      # [..., N, N]
    # J · upstream for each row, without building J: a ⊙ (g - ⟨a, g⟩).
    through_softmax = weights * (upstream - (weights * upstream).sum(-1, keepdim=True))
    scores = through_softmax / temperature                             # ∂L/∂s [..., N, N]
    queries = scores @ k                                               # ∂L/∂q [..., N, d_k]
    return {
        "weights": weights,
        "scores": scores,
        "queries": queries,
        "w_q": x.transpose(-2, -1) @ queries,                          # [..., E, d_k]
        "w_q_per_query": x.norm(dim=-1) * queries.norm(dim=-1),        # [..., N]
    }


def scaling_experiment(d_k_values: Sequence[int], *, n_tokens: int = 16, width: int = 64, n_trials: int = 32,
                       seed: int = 0) -> dict[str, torch.Tensor | dict[str, torch.Tensor]]:
    """What dividing by √d_k does to the weights and to learning, for random heads of size ``d_k``.

    Each of ``n_trials`` draws ``N = n_tokens`` token vectors ``x [N, E]`` (``E = width``) with N(0, 1) entries
    (as after a LayerNorm), ``W_Q, W_K [E, d_k]`` with N(0, 1/E) entries (so ``q`` and ``k`` have unit
    variance) and an upstream gradient ``∂L/∂a [N, N]`` with N(0, 1) entries, then runs
    :func:`attention_gradients` at ``τ = 1`` (unscaled) and ``τ = √d_k`` (scaled). All in float64.

    Returns:
        ``{"d_k": [D], "unscaled": {...}, "scaled": {...}}``, each inner dict of ``[D]`` tensors over the
        ``N · n_trials`` queries of each head size: ``max_weight`` (mean of each query's largest weight),
        ``score_gradient`` (median of ``‖∂L/∂s_i‖``), ``w_q_gradient`` (median of the share ``‖x_i‖ ‖∂L/∂q_i‖``
        of ``∂L/∂W_Q``), ``w_q_gradient_total`` (mean over trials of ``‖∂L/∂W_Q‖``), ``starved`` (the fraction
        of queries whose share is below 1/100 of the median share in the scaled run at the same ``d_k``).

    Raises:
        TypeError, ValueError: sizes or counts that are not positive ints.

    Example:
        >>> result = scaling_experiment([16, 256], n_trials=4)
        >>> result["unscaled"]["max_weight"] > result["scaled"]["max_weight"]
        tensor([True, True])
    """
    where = "scaling_experiment"
    sizes = _validate.integer_sequence(where, "d_k_values", d_k_values, minimum=1)
    n_tokens = _validate.integer(where, "n_tokens", n_tokens, minimum=2)
    width = _validate.integer(where, "width", width, minimum=1)
    n_trials = _validate.integer(where, "n_trials", n_trials, minimum=1)
    seed = _validate.integer(where, "seed", seed)
    generator = torch.Generator().manual_seed(seed)
    runs = ("unscaled", "scaled")
    names = ("max_weight", "score_gradient", "w_q_gradient", "w_q_gradient_total", "starved")
    columns = {run: {name: [] for name in names} for run in runs}
    for d_k in sizes:
        # All trials at once: a batch dimension T in front.
        x = torch.randn(n_trials, n_tokens, width, generator=generator, dtype=torch.float64)
        w_q, w_k = (torch.randn(n_trials, width, d_k, generator=generator, dtype=torch.float64)
                    / math.sqrt(width) for _ in range(2))                       # [T, E, d_k]
        upstream = torch.randn(n_trials, n_tokens, n_tokens, generator=generator, dtype=torch.float64)
        grads = {run: attention_gradients(x, w_q, w_k, upstream, temperature=temperature)
                 for run, temperature in zip(runs, (1.0, math.sqrt(d_k)))}
        typical_share = grads["scaled"]["w_q_per_query"].median()
        for run in runs:
            shares = grads[run]["w_q_per_query"]                                # [T, N]
            columns[run]["max_weight"].append(grads[run]["weights"].amax(dim=-1).mean().item())
            columns[run]["score_gradient"].append(grads[run]["scores"].norm(dim=-1).median().item())
            columns[run]["w_q_gradient"].append(shares.median().item())
            columns[run]["w_q_gradient_total"].append(grads[run]["w_q"].norm(dim=(-2, -1)).mean().item())
            columns[run]["starved"].append((shares < typical_share / 100).double().mean().item())
    result: dict[str, torch.Tensor | dict[str, torch.Tensor]] = {"d_k": torch.tensor(sizes, dtype=torch.float64)}
    for run, column in columns.items():
        result[run] = {name: torch.tensor(values, dtype=torch.float64) for name, values in column.items()}
    return result


def softmax_saturation(scores: torch.Tensor, temperatures: Sequence[float]) -> dict[str, torch.Tensor]:
    """How peaked ``softmax(scores / τ)`` is for one query's ``[N]`` raw scores, and how much gradient gets
    through, for each ``τ``: as ``τ`` shrinks the softmax approaches one-hot and its Jacobian goes to 0.

    Returns:
        ``{"temperature", "max_weight", "entropy", "jacobian_scaled", "jacobian_raw"}``, each ``[T]``
        (float64): the Frobenius norm of the softmax Jacobian with respect to ``scores / τ``, and of
        ``∂a/∂scores``, the same times ``1/τ`` (what reaches the raw scores, and through them ``W_Q`` and
        ``W_K``).

    Raises:
        TypeError, ValueError: scores not a 1-D floating tensor, or a temperature that is not positive and finite.

    Example:
        >>> sweep = softmax_saturation(torch.tensor([0.0, 4.0]), [1.0, 4.0])
        >>> sweep["jacobian_raw"] / sweep["jacobian_scaled"]       # 1/τ
        tensor([1.0000, 0.2500], dtype=torch.float64)
    """
    where = "softmax_saturation"
    scores = _validate.floating_tensor(where, "scores", scores)
    if scores.dim() != 1 or scores.numel() == 0:
        raise ValueError(f"{where}: scores must be 1-D [N] with N >= 1, got shape {_validate.shape_str(scores)}")
    temperatures = _validate.sequence(where, "temperatures", temperatures, of="numbers")
    values = [_validate.positive_finite(where, f"temperatures[{i}]", t) for i, t in enumerate(temperatures)]
    scores = scores.detach().to(torch.float64)
    rows = {"max_weight": [], "entropy": [], "jacobian_scaled": [], "jacobian_raw": []}
    for temperature in values:
        weights = torch.softmax(scores / temperature, dim=-1)
        entropy = -(weights * weights.clamp_min(1e-300).log()).sum()
        jacobian = torch.linalg.matrix_norm(softmax_jacobian(weights)).item()
        rows["max_weight"].append(weights.max().item())
        rows["entropy"].append(entropy.item())
        rows["jacobian_scaled"].append(jacobian)
        rows["jacobian_raw"].append(jacobian / temperature)
    result = {"temperature": torch.tensor(values, dtype=torch.float64)}
    result.update({name: torch.tensor(column, dtype=torch.float64) for name, column in rows.items()})
    return result
