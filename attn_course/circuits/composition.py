"""How much a layer-1 head reads what a layer-0 head wrote: Elhage et al.'s composition scores.

Following "A Mathematical Framework for Transformer Circuits" (Elhage et al. 2021), in its column-vector
convention (a residual vector ``x`` is a column, a head maps it to ``W_OV x``):

- ``W_OV^h = W_O^h W_V^h`` ``[E, E]``: what head ``h`` writes for the token it attends to;
- ``W_QK^h = W_Q^hᵀ W_K^h`` ``[E, E]``: the score of query ``x_i`` on key ``x_j`` is ``x_iᵀ W_QK^h x_j``
  (before the ``1/√d`` scaling).

In the course's row-vector weights (``q = x @ W_Q[h]``, ``out = z @ W_O[h]``, as
:meth:`~attn_course.models.attention_only.AttentionOnlyTransformer.W_Q` returns them), these are
``W_OV^h = (W_V[h] @ W_O[h])ᵀ`` and ``W_QK^h = W_Q[h] @ W_K[h]ᵀ``.

For a head ``h₁`` of layer 0 and ``h₂`` of layer 1, the composition score is
``‖M W_OV^{h₁}‖_F / (‖M‖_F ‖W_OV^{h₁}‖_F)`` with

- Q-composition: ``M = W_QK^{h₂ᵀ}`` (``h₁`` writes into the query: ``(W_OV x)ᵀ W_QK x_j``);
- K-composition: ``M = W_QK^{h₂}`` (``h₁`` writes into the key: ``x_iᵀ W_QK (W_OV x)``), the induction circuit;
- V-composition: ``M = W_OV^{h₂}`` (``h₁`` writes into the value).

It is 1 when the two matrices line up completely and small for unrelated ones; random matrices of the
same shapes give a baseline well above 0 (:func:`random_composition_baseline`), since each is low-rank (``d``).
LayerNorm, if the model has it, is left out, as in the paper.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from attn_course import _validate
from attn_course.circuits.recording import check_head, check_model
from attn_course.models.attention_only import AttentionOnlyTransformer

__all__ = ["COMPOSITIONS", "ov_matrix", "qk_matrix", "composition_score", "composition_scores", "Baseline",
           "random_composition_baseline"]

COMPOSITIONS = ("q", "k", "v")


def ov_matrix(model: AttentionOnlyTransformer, layer: int, head: int) -> torch.Tensor:
    """``W_OV = W_O W_V`` ``[E, E]`` of one head, column convention: it writes ``W_OV x`` for an attended ``x``.

    Example:
        >>> from attn_course.models.attention_only import AttentionOnlyTransformer
        >>> model = AttentionOnlyTransformer(10, n_heads=2, d_model=8, max_len=6)
        >>> ov_matrix(model, 0, 1).shape, torch.linalg.matrix_rank(ov_matrix(model, 0, 1)).item()   # rank d
        (torch.Size([8, 8]), 4)
    """
    model = check_model("ov_matrix", model)
    layer, head = check_head("ov_matrix", model, layer, head)
    return (model.W_V(layer)[head] @ model.W_O(layer)[head]).T                  # [E, d] @ [d, E] -> [E, E], transposed


def qk_matrix(model: AttentionOnlyTransformer, layer: int, head: int) -> torch.Tensor:
    """``W_QK = W_Qᵀ W_K`` ``[E, E]`` of one head: the score of query ``x_i`` on key ``x_j`` is ``x_iᵀ W_QK x_j``.

    Rotary positions, if any, rotate queries and keys between the two factors; this is the matrix before
    rotation (the score at offset 0).
    """
    model = check_model("qk_matrix", model)
    layer, head = check_head("qk_matrix", model, layer, head)
    return model.W_Q(layer)[head] @ model.W_K(layer)[head].T                    # [E, d] @ [d, E] -> [E, E]


def composition_score(reader: torch.Tensor, writer_ov: torch.Tensor) -> torch.Tensor:
    """``‖M W_OV‖_F / (‖M‖_F ‖W_OV‖_F)`` for ``M = reader`` (``W_QKᵀ``, ``W_QK`` or ``W_OV`` of the later head).

    Args:
        reader: ``[..., E, E]``, the later head's matrix, already transposed for Q-composition.
        writer_ov: ``[..., E, E]``, the earlier head's ``W_OV``.

    Returns:
        ``[...]``, in ``[0, 1]``.

    Raises:
        TypeError: not floating tensors.
        ValueError: not square ``[..., E, E]`` of one size, a zero matrix, or NaN.

    Example:
        >>> round(composition_score(torch.eye(6), torch.eye(6)).item(), 6) == round(1 / 6 ** 0.5, 6)   # ‖I‖/‖I‖² = 1/√E
        True
    """
    where = "composition_score"
    for name, matrix in (("reader", reader), ("writer_ov", writer_ov)):
        matrix = _validate.floating_tensor(where, name, matrix, min_dim=2)
        if matrix.shape[-1] != matrix.shape[-2] or torch.isnan(matrix).any():
            raise ValueError(f"{where}: {name} must be square [..., E, E] without NaN, "
                             f"got shape {_validate.shape_str(matrix)}")
    if reader.shape[-1] != writer_ov.shape[-1]:
        raise ValueError(f"{where}: reader and writer_ov must have one E, got shapes "
                         f"{_validate.shape_str(reader)} and {_validate.shape_str(writer_ov)}")
    norms = torch.linalg.matrix_norm(reader) * torch.linalg.matrix_norm(writer_ov)
    if (norms == 0).any():
        raise ValueError(f"{where}: a zero matrix has no direction to compose with")
    return torch.linalg.matrix_norm(reader @ writer_ov) / norms


def composition_scores(model: AttentionOnlyTransformer, kind: str = "k", *, writer_layer: int = 0,
                       reader_layer: int = 1) -> torch.Tensor:
    """Every pair's composition score: ``[H_writer, H_reader]``, row = head of ``writer_layer``.

    Args:
        model: an :class:`~attn_course.models.attention_only.AttentionOnlyTransformer`.
        kind: ``"q"``, ``"k"`` or ``"v"`` (see the module's docstring for the matrices).
        writer_layer, reader_layer: the earlier and the later layer (``writer_layer < reader_layer``).

    Raises:
        TypeError: ``model`` of another kind.
        ValueError: unknown ``kind``, layers that do not exist or in the wrong order.

    Example:
        >>> from attn_course.models.attention_only import AttentionOnlyTransformer
        >>> model = AttentionOnlyTransformer(10, n_heads=2, d_model=8, max_len=6)
        >>> composition_scores(model, "k").shape
        torch.Size([2, 2])
    """
    where = "composition_scores"
    model = check_model(where, model)
    if not isinstance(kind, str) or kind not in COMPOSITIONS:
        raise ValueError(f"{where}: kind must be one of {COMPOSITIONS}, got {kind!r}")
    check_head(where, model, writer_layer, 0)
    check_head(where, model, reader_layer, 0)
    if writer_layer >= reader_layer:
        raise ValueError(f"{where}: writer_layer={writer_layer} must come before reader_layer={reader_layer}")
    heads = range(model.config.n_heads)
    writers = torch.stack([ov_matrix(model, writer_layer, h) for h in heads])            # [H, E, E]
    if kind == "v":
        readers = torch.stack([ov_matrix(model, reader_layer, h) for h in heads])        # [H, E, E]
    else:
        readers = torch.stack([qk_matrix(model, reader_layer, h) for h in heads])        # [H, E, E]
        if kind == "q":
            readers = readers.transpose(-1, -2)
    return composition_score(readers[None, :], writers[:, None])                         # [H_w, H_r]


class Baseline(NamedTuple):
    """The composition score of random matrices: mean and standard deviation over ``draws``."""

    mean: float
    std: float
    draws: int


def random_composition_baseline(d_model: int, head_dim: int, *, draws: int = 200,
                                generator: torch.Generator | None = None) -> Baseline:
    """The composition score of two random heads: each matrix a product of two Gaussian ``[E, d]`` factors.

    The factors have the shapes of a head's (``W_Q``, ``W_K``, ``W_V``, ``W_Oᵀ`` are ``[E, d]``), so the
    products have rank ``d`` as the model's do; Q-, K- and V-composition have the same distribution here.
    The mean is near ``1/√E`` whatever the rank ``d`` (chapter 11 measures 0.125 at ``E = 64`` for ``d`` = 4,
    16 and 64); a lower rank only widens the spread.

    Args:
        d_model: ``E``; head_dim: ``d ≤ E``.
        draws: how many pairs, at least 2.
        generator: for reproducible draws.

    Returns:
        :class:`Baseline` ``(mean, std, draws)``.

    Raises:
        TypeError: sizes not ints, a generator of another kind.
        ValueError: sizes below 1 (``draws`` below 2), ``head_dim > d_model``.

    Example:
        >>> baseline = random_composition_baseline(64, 16, generator=torch.Generator().manual_seed(0))
        >>> 0.1 < baseline.mean < 0.3
        True
    """
    where = "random_composition_baseline"
    d_model = _validate.integer(where, "d_model", d_model, minimum=1)
    head_dim = _validate.integer(where, "head_dim", head_dim, minimum=1)
    draws = _validate.integer(where, "draws", draws, minimum=2)
    if head_dim > d_model:
        raise ValueError(f"{where}: head_dim={head_dim} must be at most d_model={d_model}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{where}: generator must be a torch.Generator or None, got {type(generator).__name__}")
    factors = torch.randn(4, draws, d_model, head_dim, generator=generator, dtype=torch.float64)   # [4, D, E, d]
    reader = factors[0] @ factors[1].transpose(-1, -2)                            # [D, E, E]
    writer = factors[2] @ factors[3].transpose(-1, -2)                            # [D, E, E]
    scores = composition_score(reader, writer)                                    # [D]
    return Baseline(scores.mean().item(), scores.std().item(), draws)
