"""Small test helpers shared by several test files (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import torch
from hypothesis import settings

# The property tests' budget: enough examples to find a broken case, few enough for `make unit`.
# No deadline: the first example pays for imports and lazy initialisation.
FAST = settings(max_examples=25, deadline=None)


def close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-5) -> None:
    """Assert ``actual`` equals ``expected`` to ``tol``, absolute and relative, with the same
    shape, dtype and device (``torch.testing.assert_close``: its message names the worst entry)."""
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal values drawn in float64 from a fixed seed, then cast to ``dtype``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


def random_mask(*shape: int, p: float = 0.6, seed: int = 0) -> torch.Tensor:
    """Boolean mask, True (may attend) with probability ``p``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=generator) < p
