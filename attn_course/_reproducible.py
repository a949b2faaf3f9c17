"""What makes a cached training run checkable: a digest of the weights, and how far two histories differ.

The chapters that read cached runs (11, 12, 13) record :func:`state_digest` at every record; the tools that made
the caches (``tools/train_*.py --check``) train every run again and compare with :func:`largest_difference`.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["state_digest", "largest_difference"]


def state_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's (and buffer's) bytes, in the state dict's order."""
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def largest_difference(a: object, b: object) -> float:
    """The largest ``|a − b|`` over two nested lists of numbers of the same shape (``inf`` if the shapes differ)."""
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return float("inf")
        return max((largest_difference(x, y) for x, y in zip(a, b)), default=0.0)
    return abs(a - b) if a != b else 0.0
