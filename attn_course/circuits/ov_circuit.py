"""An induction head's end-to-end OV circuit, and how much of it copies.

Elhage et al. (2021) read a head's effect on the logits through its full OV circuit: a token ``s`` that the
head attends to enters as ``W_E[s]``, the head writes ``W_OV`` of it, the unembedding turns that into logits.
In the course's row-vector weights, for head ``h``:

    ``OV_full = W_E @ W_V[h] @ W_O[h] @ W_U``   ``[V, V]``: row ``s`` = logits added when attending to token ``s``

(the paper's ``W_U W_OV W_E``, transposed). A copying head raises the logit of the token it attends to:
its matrix has a large diagonal and mostly positive eigenvalues. The product has rank at most ``d_head``, so at
most ``d_head`` of its ``V`` eigenvalues are nonzero; the others come out as round-off (about 1e-8 of the largest
in float32) whose signs the CPU's last bits decide, and are left out. The measures:

- ``positive_fraction``: the share of the nonzero eigenvalues with positive real part;
- ``positivity_ratio``: ``Σ λ_i / Σ |λ_i|`` (the paper's eigenvalue summary; 1 for a pure copier, −1 for its opposite);
- ``diagonal_top_share``: the share of tokens ``s`` whose own logit ``OV_full[s, s]`` is the largest in row ``s``;
- ``nonzero_eigenvalues``: how many eigenvalues exceed round-off: ``|λ| > max|λ| · V · ε`` (``ε`` of the circuit's
  dtype; the tolerance of ``torch.linalg.matrix_rank``, applied to eigenvalues).

Only the direct path is taken (the token's embedding, not what layer 0 wrote about it); positions, biases
and LayerNorm are left out. Eigenvalues are computed in float64.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from attn_course import _validate
from attn_course.circuits.recording import check_head, check_model
from attn_course.models.attention_only import AttentionOnlyTransformer

__all__ = ["full_ov_circuit", "CopyingScores", "copying_scores"]


def full_ov_circuit(model: AttentionOnlyTransformer, layer: int, head: int) -> torch.Tensor:
    """``W_E @ W_V[h] @ W_O[h] @ W_U`` ``[V, V]``: row ``s`` holds the logits head ``h`` adds when it attends to ``s``.

    Raises:
        TypeError: ``model`` of another kind.
        ValueError: a layer or head that does not exist.

    Example:
        >>> from attn_course.models.attention_only import AttentionOnlyTransformer
        >>> model = AttentionOnlyTransformer(10, n_heads=2, d_model=8, max_len=6)
        >>> full_ov_circuit(model, 1, 0).shape
        torch.Size([10, 10])
    """
    model = check_model("full_ov_circuit", model)
    layer, head = check_head("full_ov_circuit", model, layer, head)
    return model.W_E @ model.W_V(layer)[head] @ model.W_O(layer)[head] @ model.W_U     # [V, E][E, d][d, E][E, V]


class CopyingScores(NamedTuple):
    """How much a ``[V, V]`` circuit copies (see :mod:`~attn_course.circuits.ov_circuit`)."""

    positive_fraction: float
    positivity_ratio: float
    diagonal_top_share: float
    nonzero_eigenvalues: int


def copying_scores(circuit: torch.Tensor) -> CopyingScores:
    """The eigenvalue and diagonal measures of copying for a square circuit matrix.

    Args:
        circuit: ``[V, V]``, e.g. :func:`full_ov_circuit` (row = attended token, column = logit).

    Returns:
        :class:`CopyingScores`: fraction of the nonzero eigenvalues with positive real part, ``Σλ / Σ|λ|`` (real
        part of the sum; complex eigenvalues come in conjugate pairs), the share of rows whose diagonal entry
        is their largest (a tie counts for the diagonal only if it is the first largest), and how many
        eigenvalues are nonzero (above ``max|λ| · V · ε``, ``ε`` of ``circuit``'s dtype).

    Raises:
        TypeError: not a floating tensor.
        ValueError: not square 2-D, NaN or infinite entries, or all eigenvalues zero.

    Example:
        >>> copying_scores(torch.eye(5))
        CopyingScores(positive_fraction=1.0, positivity_ratio=1.0, diagonal_top_share=1.0, nonzero_eigenvalues=5)
        >>> scores = copying_scores(1 - torch.eye(4))           # attending to s raises every logit but s's
        >>> scores.positive_fraction, round(scores.positivity_ratio, 6) + 0.0, scores.diagonal_top_share
        (0.25, 0.0, 0.0)
    """
    where = "copying_scores"
    circuit = _validate.matrix(where, "circuit", circuit, axes="[V, V]")
    if circuit.shape[0] != circuit.shape[1]:
        raise ValueError(f"{where}: circuit must be square [V, V], got shape {_validate.shape_str(circuit)}")
    if not torch.isfinite(circuit).all():
        raise ValueError(f"{where}: circuit has NaN or infinite entries")
    eigenvalues = torch.linalg.eigvals(circuit.double())                          # [V] complex
    magnitude = eigenvalues.abs().sum()
    if magnitude == 0:
        raise ValueError(f"{where}: every eigenvalue of circuit is zero; nothing to measure")
    nonzero = eigenvalues.abs() > eigenvalues.abs().max() * circuit.shape[0] * torch.finfo(circuit.dtype).eps
    diagonal_top = circuit.argmax(dim=1) == torch.arange(circuit.shape[0], device=circuit.device)
    return CopyingScores((eigenvalues.real[nonzero] > 0).double().mean().item(),
                         (eigenvalues.sum().real / magnitude).item(),
                         diagonal_top.double().mean().item(), int(nonzero.sum()))
