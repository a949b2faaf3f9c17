"""Small test helpers shared by several test files (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import torch


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal values drawn in float64 from a fixed seed, then cast to ``dtype``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


def random_mask(*shape: int, p: float = 0.6, seed: int = 0) -> torch.Tensor:
    """Boolean mask, True (may attend) with probability ``p``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=generator) < p
