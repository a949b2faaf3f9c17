"""Why divide by √d_k: the experiments behind chapter 02, as small functions.

* :func:`dot_product_spread`: the dot product of two random vectors with unit-variance
  entries has variance ``d_k``, so unscaled scores grow with the head size; dividing
  by √d_k brings the variance back to 1.
* :func:`softmax_saturation`: as scores grow (or the divisor shrinks) the softmax
  approaches one-hot, and its Jacobian, the thing gradients flow through, goes to 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from attn_course import _validate

__all__ = ["dot_product_spread", "softmax_jacobian", "softmax_saturation"]


def dot_product_spread(
    d_k_values: Sequence[int], *, n_pairs: int = 20_000, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Measure the variance of ``q · k`` for random ``q, k`` with N(0, 1) entries.

    Args:
        d_k_values: head sizes to try.
        n_pairs: random (q, k) pairs per head size.
        seed: seed of the random generator, for repeatable numbers.

    Returns:
        ``{"d_k": [D], "raw_variance": [D], "scaled_variance": [D]}`` (float64), where
        scaled means divided by √d_k. Theory says ``d_k`` and ``1``.

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
    """Jacobian of the softmax at output ``weights``: ``diag(p) - p pᵀ``.

    Args:
        weights: ``[..., N]``, a softmax output (rows summing to 1).

    Returns:
        ``[..., N, N]``: entry ``(i, j)`` is ``∂p_i / ∂s_j``.
    """
    weights = _validate.floating_tensor("softmax_jacobian", "weights", weights, min_dim=1)
    return torch.diag_embed(weights) - weights.unsqueeze(-1) * weights.unsqueeze(-2)


def softmax_saturation(
    scores: torch.Tensor, divisors: Sequence[float]
) -> dict[str, torch.Tensor]:
    """How peaked ``softmax(scores / divisor)`` is, and how much gradient gets through.

    Args:
        scores: ``[N]`` raw scores of one query.
        divisors: values of the scaling factor (√d_k) to try.

    Returns:
        ``{"divisor", "max_weight", "entropy", "gradient_norm"}``, each ``[D]``
        (float64). ``gradient_norm`` is the Frobenius norm of the softmax Jacobian
        with respect to its input ``scores / divisor``: near 0 means almost no
        gradient reaches the scores.

    Raises:
        TypeError, ValueError: scores not a 1-D floating tensor, or a divisor that is
        not a positive finite number.
    """
    where = "softmax_saturation"
    scores = _validate.floating_tensor(where, "scores", scores)
    if scores.dim() != 1 or scores.numel() == 0:
        raise ValueError(
            f"{where}: scores must be 1-D [N] with N >= 1, got shape {_validate.shape_str(scores)}"
        )
    divisors = _validate.sequence(where, "divisors", divisors, of="numbers")
    values = [_validate.positive_finite(where, f"divisors[{i}]", d) for i, d in enumerate(divisors)]
    scores = scores.detach().to(torch.float64)
    rows = {"max_weight": [], "entropy": [], "gradient_norm": []}
    for divisor in values:
        weights = torch.softmax(scores / divisor, dim=-1)
        entropy = -(weights * weights.clamp_min(1e-300).log()).sum()
        rows["max_weight"].append(weights.max().item())
        rows["entropy"].append(entropy.item())
        rows["gradient_norm"].append(torch.linalg.matrix_norm(softmax_jacobian(weights)).item())
    result = {"divisor": torch.tensor(values, dtype=torch.float64)}
    result.update({name: torch.tensor(column, dtype=torch.float64) for name, column in rows.items()})
    return result
