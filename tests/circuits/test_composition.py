"""Composition scores and the OV circuit against formulas written out here, on constructed and random weights."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.circuits import (
    composition_score,
    composition_scores,
    copying_scores,
    full_ov_circuit,
    ov_matrix,
    qk_matrix,
    random_composition_baseline,
)
from attn_course.models.attention_only import AttentionOnlyTransformer


@pytest.fixture
def model() -> AttentionOnlyTransformer:
    torch.manual_seed(8)
    return AttentionOnlyTransformer(9, n_layers=2, n_heads=2, d_model=6, max_len=5).eval()


def _paper_matrices(model, layer, head):
    """W_OV = W_O W_V and W_QK = W_Q^T W_K in the paper's column convention, from the nn.Linear weights.

    nn.Linear computes y = W x (W is [out, in]): head h's rows of q_proj.weight are its W_Q [d, E], its columns
    of out_proj.weight its W_O [E, d].
    """
    attention = model.layers[layer].attention
    d = attention.head_dim
    rows = slice(head * d, (head + 1) * d)
    w_q, w_k, w_v = (getattr(attention, f"{n}_proj").weight.detach()[rows].double() for n in "qkv")   # [d, E]
    w_o = attention.out_proj.weight.detach()[:, rows].double()                                      # [E, d]
    return w_o @ w_v, w_q.T @ w_k


def test_ov_and_qk_matrices_are_the_papers(model):
    for layer in range(2):
        for head in range(2):
            ov, qk = _paper_matrices(model, layer, head)
            torch.testing.assert_close(ov_matrix(model, layer, head).double(), ov, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(qk_matrix(model, layer, head).double(), qk, atol=1e-6, rtol=1e-6)


def test_the_qk_matrix_gives_the_attention_scores(model):
    """x_i^T W_QK x_j / sqrt(d) is the score of query i on key j, which softmax turns into the pattern."""
    x = torch.randn(4, 6)
    qk = qk_matrix(model, 1, 0)
    attention = model.layers[1].attention
    q, k = attention.q_proj(x)[:, :3], attention.k_proj(x)[:, :3]
    torch.testing.assert_close(x @ qk @ x.T, q @ k.T, atol=1e-5, rtol=1e-5)


def test_q_k_and_v_composition_follow_the_papers_products(model):
    def score(m, w):
        return (torch.linalg.matrix_norm(m @ w) / (torch.linalg.matrix_norm(m) * torch.linalg.matrix_norm(w))).item()

    for writer in range(2):
        ov_1, _ = _paper_matrices(model, 0, writer)
        for reader in range(2):
            ov_2, qk_2 = _paper_matrices(model, 1, reader)
            assert composition_scores(model, "q")[writer, reader].item() == pytest.approx(score(qk_2.T, ov_1), rel=1e-5)
            assert composition_scores(model, "k")[writer, reader].item() == pytest.approx(score(qk_2, ov_1), rel=1e-5)
            assert composition_scores(model, "v")[writer, reader].item() == pytest.approx(score(ov_2, ov_1), rel=1e-5)


def test_k_composition_sees_a_key_that_reads_what_the_earlier_head_wrote_and_q_composition_does_not():
    """Head 0 of layer 0 writes into dimensions 0-1; head 0 of layer 1 reads them on the key side only."""
    model = AttentionOnlyTransformer(5, n_layers=2, n_heads=1, d_model=6, max_len=4)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        a0 = model.layers[0].attention
        a0.v_proj.weight[:2, 4:6] = torch.eye(2)          # reads dims 4-5
        a0.out_proj.weight[0:2, :2] = torch.eye(2)        # writes dims 0-1
        a1 = model.layers[1].attention
        a1.k_proj.weight[:2, 0:2] = torch.eye(2)          # keys read dims 0-1: what head (0, 0) wrote
        a1.q_proj.weight[:2, 2:4] = torch.eye(2)          # queries read dims 2-3: nothing head (0, 0) wrote
        a1.v_proj.weight[:2, 2:4] = torch.eye(2)
        a1.out_proj.weight[2:4, :2] = torch.eye(2)
    assert composition_scores(model, "k").item() == pytest.approx(1 / math.sqrt(2))   # ‖P‖_F / (‖P‖_F ‖P‖_F)
    assert composition_scores(model, "q").item() == 0.0
    assert composition_scores(model, "v").item() == 0.0


def test_composition_score_is_one_for_aligned_rank_one_matrices_and_scale_free():
    u, v = torch.randn(5, 1), torch.randn(5, 1)
    reader, writer = v @ u.T, u @ v.T                                     # reader @ writer = (u·u) v v^T
    assert composition_score(reader, writer).item() == pytest.approx(1.0, rel=1e-5)
    a, b = torch.randn(5, 5), torch.randn(5, 5)
    assert composition_score(3 * a, 0.5 * b).item() == pytest.approx(composition_score(a, b).item(), rel=1e-5)


def test_the_random_baseline_is_near_one_over_root_e_whatever_the_rank():
    """For Gaussian A, B of size E: ‖AB‖² ≈ E³, ‖A‖²‖B‖² ≈ E⁴, so the score is about 1/√E; products of
    rank-d factors keep that mean (each factor's scale cancels in the ratio) and only spread wider."""
    baselines = {rank: random_composition_baseline(64, rank, draws=200, generator=torch.Generator().manual_seed(0))
                 for rank in (4, 16, 64)}
    for baseline in baselines.values():
        assert baseline.mean == pytest.approx(1 / 8, rel=0.05) and baseline.draws == 200
    assert baselines[4].std > baselines[16].std > baselines[64].std > 0


def test_full_ov_circuit_is_the_product_of_embedding_value_output_and_unembedding(model):
    ov, _ = _paper_matrices(model, 1, 1)
    w_e = model.embed.weight.detach().double()                           # [V, E]: row t is token t
    w_u = model.unembed.weight.detach().double()                         # [V, E]: logits = W_u x
    expected = (w_u @ ov @ w_e.T).T                                      # paper: W_U W_OV W_E, column = source token
    torch.testing.assert_close(full_ov_circuit(model, 1, 1).double(), expected, atol=1e-6, rtol=1e-5)


def test_copying_scores_of_hand_built_circuits():
    assert tuple(copying_scores(2 * torch.eye(4))) == (1.0, 1.0, 1.0, 4)
    cycle = torch.eye(6).roll(1, dims=1)                                  # attending to s raises s + 1: no copying
    scores = copying_scores(cycle)
    # eigenvalues: the 6th roots of unity, real parts cos(2πk/6) > 0 for k = 0, 1, 5; their sum is 0
    assert scores.positive_fraction == pytest.approx(3 / 6)
    assert scores.positivity_ratio == pytest.approx(0.0, abs=1e-12)
    assert scores.diagonal_top_share == 0.0
    mixed = torch.diag(torch.tensor([3.0, -1.0, 2.0, -2.0]))
    scores = copying_scores(mixed)
    assert scores.positive_fraction == 0.5
    assert scores.positivity_ratio == pytest.approx((3 - 1 + 2 - 2) / 8)
    # rank 2 of 4 (as an OV circuit of a head narrower than V): the two zero eigenvalues come out as round-off,
    # whose signs are noise; only the nonzero ones, 2 and -1, count
    left, right = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 2.0]]), torch.tensor([[2.0, 0.0, 0.0, 0.0],
                                                                                               [0.0, -1.0, 0.0, 0.0]])
    low_rank = left @ right                                               # [4, 4], eigenvalues 2, -1, 0, 0
    for noisy in (low_rank, low_rank + 1e-7 * torch.randn(4, 4, generator=torch.Generator().manual_seed(0))):
        scores = copying_scores(noisy)
        assert scores.nonzero_eigenvalues == 2 and scores.positive_fraction == 0.5


@pytest.mark.parametrize("call, error, words", [
    (lambda m: composition_scores(m, "x"), ValueError, "kind"),
    (lambda m: composition_scores(m, "k", writer_layer=1, reader_layer=1), ValueError, "before"),
    (lambda m: composition_scores(m, "k", reader_layer=2), ValueError, "layer"),
    (lambda m: composition_score(torch.zeros(3, 3), torch.eye(3)), ValueError, "zero"),
    (lambda m: composition_score(torch.eye(3), torch.eye(4)), ValueError, "one E"),
    (lambda m: composition_score(torch.ones(3, 4), torch.ones(3, 4)), ValueError, "square"),
    (lambda m: random_composition_baseline(8, 16), ValueError, "head_dim"),
    (lambda m: random_composition_baseline(8, 4, draws=1), ValueError, "draws"),
    (lambda m: copying_scores(torch.ones(3, 4)), ValueError, "square"),
    (lambda m: copying_scores(torch.tensor([[float("nan")]])), ValueError, "NaN"),
    (lambda m: copying_scores(torch.zeros(3, 3)), ValueError, "zero"),
    (lambda m: full_ov_circuit(m, 0, 2), ValueError, "head"),
    (lambda m: ov_matrix("model", 0, 0), TypeError, "AttentionOnlyTransformer"),
])
def test_bad_arguments_are_refused_by_name(model, call, error, words):
    with pytest.raises(error, match=words):
        call(model)
