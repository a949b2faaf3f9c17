"""Chapter 11's exercise checks: the solutions pass, each known mistake gets its own hint, the course's own
functions (and, for the prediction, any measurement) are refused by name, and the references agree with the
course's model under ablate_head, a float64 forward pass of tests/circuits, and the course's composition and
copying scores."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.checks import CheckFailed
from attn_course.checks.circuits import _cases, _logits, check_logits_without_head
from attn_course.checks.circuits_ablation import check_ablation_prediction
from attn_course.checks.circuits_weights import (
    _built_head,
    _composition_cases,
    _copying,
    _copying_cases,
    check_fixed_copying_score,
    check_k_composition,
)
from attn_course.circuits.trained import load_trained
from attn_course.models.attention_only import AttentionOnlyTransformer

from support.planted import planted_11


def hint(check, fn) -> str:
    with pytest.raises(CheckFailed) as failed:
        check(fn)
    return str(failed.value)


def loop_score(pattern: torch.Tensor, back: int, start: int, *, transposed: bool = False,
               divisor: int | None = None) -> torch.Tensor:
    """Σ over queries i ≥ start of pattern[..., i, i − back], one Python step at a time (float64)."""
    n = pattern.shape[-1]
    total = torch.zeros(pattern.shape[:-2], dtype=torch.float64)
    for i in range(start, n):
        total += (pattern[..., i - back, i] if transposed else pattern[..., i, i - back]).double()
    return total / (n - start if divisor is None else divisor)


# --- (a) the forward pass, one head left out ----------------------------------------------------------------------

def forward(weights, tokens, layer, head, *, positions=True, causal=True, scale=True, keys_dim=-1, leave_out="head",
            layers=None):
    """The exercise's answer, one head at a time with an explicit loop over the heads; the keywords plant mistakes
    (``leave_out``: "head", "none", "every layer", "layer", "other layer")."""
    n = tokens.shape[1]
    stream = weights["W_E"][tokens] + (weights["W_pos"][:n] if positions else 0)         # [B, N, E]
    total_layers, heads = weights["W_Q"].shape[:2]
    for at in range(total_layers if layers is None else layers):
        added = torch.zeros_like(stream)
        for h in range(heads):
            q, k, v = (stream @ weights[name][at, h] for name in ("W_Q", "W_K", "W_V"))  # [B, N, d]
            scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
            if causal:
                scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
            left_out = {"head": (at, h) == (layer, head), "none": False, "every layer": h == head,
                        "layer": at == layer, "other layer": (at, h) == (total_layers - 1 - layer, head)}[leave_out]
            if not left_out:
                added = added + torch.softmax(scores, dim=keys_dim) @ v @ weights["W_O"][at, h]
        stream = stream + added
    return stream @ weights["W_U"]


def solution(weights, tokens, layer, head):
    return forward(weights, tokens, layer, head)


def model_of(weights: dict[str, torch.Tensor]) -> AttentionOnlyTransformer:
    """An AttentionOnlyTransformer holding ``weights`` (the exercise's dict, d = E / H)."""
    layers, heads, width, d = weights["W_Q"].shape
    model = AttentionOnlyTransformer(weights["W_E"].shape[0], n_layers=layers, n_heads=heads, d_model=width,
                                     max_len=weights["W_pos"].shape[0]).double().eval()
    state = {"embed.weight": weights["W_E"], "pos_embed.weight": weights["W_pos"], "unembed.weight": weights["W_U"].T}
    for at in range(layers):
        for name in ("q", "k", "v"):                       # [H, E, d] -> [H·d, E]
            state[f"layers.{at}.attention.{name}_proj.weight"] = weights[f"W_{name.upper()}"][at].transpose(1, 2) \
                .reshape(heads * d, width)
        state[f"layers.{at}.attention.out_proj.weight"] = weights["W_O"][at].reshape(heads * d, width).T
    model.load_state_dict({name: value.double() for name, value in state.items()})
    return model


def test_logits_solution_passes():
    assert check_logits_without_head(solution)
    assert check_logits_without_head(solution, seed=5)


def test_the_checks_reference_is_the_model_under_ablate_head_on_every_case():
    from attn_course.circuits import ablate_head

    for _, weights, tokens, layer, head in _cases(torch.Generator().manual_seed(0)):
        weights64 = {name: value.double() for name, value in weights.items()}
        model = model_of(weights)
        with ablate_head(model, layer, head), torch.no_grad():
            by_the_model = model(tokens)
        assert torch.allclose(_logits(weights64, tokens, frozenset({(layer, head)})), by_the_model, atol=1e-10)


def test_the_checks_reference_is_tests_circuits_float64_forward_on_the_cached_model():
    from circuits.circuits_reference import reference_forward

    case = next(_cases(torch.Generator().manual_seed(0)))
    _, weights, tokens, layer, head = case
    reference = reference_forward(load_trained(0), tokens, zero_heads=[(layer, head)])["logits"]
    weights64 = {name: value.double() for name, value in weights.items()}
    assert torch.allclose(_logits(weights64, tokens, frozenset({(layer, head)})), reference, atol=1e-9)


def test_the_cases_include_three_layers_one_layer_and_sequences_shorter_than_the_position_table():
    cases = list(_cases(torch.Generator().manual_seed(0)))
    assert {weights["W_Q"].shape[0] for _, weights, *_ in cases} >= {1, 2, 3}
    assert {layer for _, weights, _, layer, _ in cases if weights["W_Q"].shape[0] == 2} == {0, 1}
    assert all(tokens.shape[1] < weights["W_pos"].shape[0] for _, weights, tokens, *_ in cases[:2])


def uniform_head(weights, tokens, layer, head):
    # "Leave the head out" by zeroing its keys: it attends evenly and still writes.
    weights["W_K"][layer, head] = 0.0
    return forward(weights, tokens, layer, head, leave_out="none")


def direct_path_only(weights, tokens, layer, head):
    intact = forward(weights, tokens, layer, head, leave_out="none")
    before = forward(dict(weights, W_U=torch.eye(weights["W_E"].shape[1])), tokens, layer, head, layers=layer,
                     leave_out="none")                                              # the stream layer `layer` reads
    q, k, v = (before @ weights[name][layer, head] for name in ("W_Q", "W_K", "W_V"))
    n = tokens.shape[1]
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(torch.ones(n, n).bool().triu(1), -math.inf)
    return intact - torch.softmax(scores, -1) @ v @ weights["W_O"][layer, head] @ weights["W_U"]


@pytest.mark.parametrize("fn, fragment", [
    (lambda w, t, layer, head: forward(w, t, layer, head, leave_out="none"), "no head was left out"),
    (lambda w, t, layer, head: forward(w, t, layer, head, leave_out="every layer"), "of every layer"),
    (lambda w, t, layer, head: forward(w, t, layer, head, leave_out="other layer"), "not of layer"),
    (lambda w, t, layer, head: forward(w, t, layer, head, leave_out="layer"), "all of layer"),
    (lambda w, t, layer, head: forward(w, t, layer, (head + 1) % w["W_Q"].shape[1]), "not head"),
    (lambda w, t, layer, head: forward(w, t, layer, head, positions=False), "token embeddings alone"),
    (lambda w, t, layer, head: forward(w, t, layer, head, causal=False), "not causal"),
    (lambda w, t, layer, head: forward(w, t, layer, head, scale=False), "without the 1/√d"),
    (lambda w, t, layer, head: forward(w, t, layer, head, keys_dim=-2), "runs over the queries"),
    (lambda w, t, layer, head: forward(w, t, layer, head, layers=min(2, w["W_Q"].shape[0])), "runs 2 of the 3"),
    (lambda w, t, layer, head: forward(w, t, layer, head, layers=0), "read the embeddings straight off"),
    (uniform_head, "still writes"),
    (direct_path_only, "direct path"),
    (lambda w, t, layer, head: forward(w, t, layer, head).float()[..., :-1], "should have shape"),
    (lambda w, t, layer, head: forward(w, t, layer, head) + 0.01, "differ from the reference"),
    (lambda w, t, layer, head: ..., "returns nothing yet"),
])
def test_each_forward_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_logits_without_head, fn)


def test_an_answer_that_changes_the_weights_in_place_cannot_change_the_reference():
    def zeroes_then_answers(weights, tokens, layer, head):
        logits = solution(weights, tokens, layer, head)
        for value in weights.values():
            value.zero_()
        return logits

    assert check_logits_without_head(zeroes_then_answers)


@pytest.mark.parametrize("call, name", [
    ("from attn_course.circuits import ablate_head\n"
     "def answer(weights, tokens, layer, head):\n"
     "    with ablate_head(MODEL, layer, head):\n"
     "        return solution(weights, tokens, layer, head)\n", "ablate_head"),
    ("def answer(weights, tokens, layer, head):\n"
     "    MODEL(tokens)\n"
     "    return solution(weights, tokens, layer, head)\n", "AttentionOnlyTransformer"),
    ("from attn_course.circuits import record_patterns\n"
     "def answer(weights, tokens, layer, head):\n    record_patterns(MODEL, tokens)\n"
     "    return solution(weights, tokens, layer, head)\n", "record_patterns"),
    ("from attn_course.core.multihead import MultiHeadAttention\n"
     "def answer(weights, tokens, layer, head):\n    MultiHeadAttention(8, 2)\n"
     "    return solution(weights, tokens, layer, head)\n", "MultiHeadAttention"),
])
def test_the_model_and_its_tools_are_refused_by_name(call, name):
    namespace = {"MODEL": load_trained(0), "solution": solution, "torch": torch}
    exec(call, namespace)
    assert f"calls {name}" in hint(check_logits_without_head, namespace["answer"])


def test_scaled_dot_product_attention_is_allowed():
    def with_sdpa(weights, tokens, layer, head):
        n = tokens.shape[1]
        stream = weights["W_E"][tokens] + weights["W_pos"][:n]
        for at in range(weights["W_Q"].shape[0]):
            q, k, v = (torch.einsum("bne,hed->bhnd", stream, weights[name][at]) for name in ("W_Q", "W_K", "W_V"))
            z = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)   # [B, H, N, d]
            out = torch.einsum("bhnd,hde->bhne", z, weights["W_O"][at])
            out[:, head] = out[:, head] * (at != layer)
            stream = stream + out.sum(1)
        return stream @ weights["W_U"]

    assert check_logits_without_head(with_sdpa)


# --- (c) K-composition ---------------------------------------------------------------------------------------------

def k_composition(W_Q, W_K, W_V, W_O):
    # Loops over the entries of x_i W_QK (y W_OV)ᵀ's matrix, not the checks' matrix_norm.
    qk, ov = W_Q.double() @ W_K.double().T, W_V.double() @ W_O.double()
    product = torch.einsum("ij,kj->ik", qk, ov)                                    # W_QK W_OVᵀ
    return math.sqrt((product ** 2).sum()) / math.sqrt((qk ** 2).sum() * (ov ** 2).sum())


def test_k_composition_solution_passes_as_a_float_and_as_a_tensor():
    assert check_k_composition(k_composition)
    assert check_k_composition(lambda *weights: torch.tensor(k_composition(*weights)), seed=3)


def test_the_row_convention_score_is_the_courses_column_convention_composition_score():
    from attn_course.circuits import composition_score, composition_scores, ov_matrix, qk_matrix

    model = load_trained(0)
    heads = model.config.n_heads
    ours = torch.tensor([[k_composition(model.W_Q(1)[reader], model.W_K(1)[reader], model.W_V(0)[writer],
                                        model.W_O(0)[writer]) for reader in range(heads)] for writer in range(heads)],
                        dtype=torch.float64)
    courses = torch.stack([torch.stack([composition_score(qk_matrix(model, 1, reader), ov_matrix(model, 0, writer))
                                        for reader in range(heads)]) for writer in range(heads)])
    assert torch.allclose(ours, courses.double(), atol=1e-5)
    assert torch.allclose(ours, composition_scores(model, "k").double(), atol=1e-5)


def test_the_previous_token_head_composes_most_with_the_induction_heads():
    from attn_course.circuits import previous_token_score, record_patterns

    model = load_trained(0)
    tokens = torch.randint(model.config.vocab_size, (8, 20), generator=torch.Generator().manual_seed(0)).repeat(1, 2)
    previous = previous_token_score(record_patterns(model, tokens)[0]).mean(0)          # [H] of layer 0
    scores = torch.tensor([[k_composition(model.W_Q(1)[reader], model.W_K(1)[reader], model.W_V(0)[writer],
                                          model.W_O(0)[writer]) for reader in range(4)] for writer in range(4)])
    assert int(scores.mean(1).argmax()) == int(previous.argmax())


def test_the_cases_hold_a_head_as_wide_as_the_stream_first_then_narrower_ones_and_the_cached_pairs():
    cases = list(_composition_cases(torch.Generator().manual_seed(0)))
    assert cases[0][1].shape[0] == cases[0][1].shape[1]
    assert any(w_q.shape[1] < w_q.shape[0] for _, w_q, *_ in cases[1:3])
    assert sum("cached" in case for case, *_ in cases) == 16


def norm(matrix, ord="fro"):
    return torch.linalg.matrix_norm(matrix.double(), ord=ord)


@pytest.mark.parametrize("fn, fragment", [
    (lambda W_Q, W_K, W_V, W_O: norm(W_V @ W_O @ W_Q @ W_K.T) / (norm(W_Q @ W_K.T) * norm(W_V @ W_O)),
     "Q-composition"),
    (lambda W_Q, W_K, W_V, W_O: k_composition(W_K, W_Q, W_V, W_O), "W_K @ W_Q.T"),
    (lambda W_Q, W_K, W_V, W_O: norm(W_Q @ W_K.T @ W_V @ W_O) / (norm(W_Q @ W_K.T) * norm(W_V @ W_O)),
     "column convention"),
    (lambda W_Q, W_K, W_V, W_O: norm(W_K @ W_Q.T @ W_V @ W_O) / (norm(W_Q @ W_K.T) * norm(W_V @ W_O)),
     "the paper's Q-composition formula"),
    (lambda W_Q, W_K, W_V, W_O: norm(W_Q @ W_K.T @ (W_O @ W_V).T) / (norm(W_Q @ W_K.T) * norm(W_O @ W_V)),
     "[d, E] @ [E, d] = [d, d]"),
    (lambda W_Q, W_K, W_V, W_O: norm(W_Q @ W_K.T @ (W_V @ W_O).T), "divide it by ‖W_QK‖ ‖W_OV‖"),
    (lambda W_Q, W_K, W_V, W_O: norm(W_Q @ W_K.T @ (W_V @ W_O).T, 2) / (norm(W_Q @ W_K.T, 2) * norm(W_V @ W_O, 2)),
     "spectral norms"),
    (lambda W_Q, W_K, W_V, W_O: norm(W_Q @ W_K.T @ (W_V @ W_O).T) / (norm(W_Q @ W_K.T, 2) * norm(W_V @ W_O, 2)),
     "spectral norms"),
    (lambda W_Q, W_K, W_V, W_O: norm(W_Q @ W_K.T @ (W_V @ W_O).T) / (norm(W_Q) * norm(W_K) * norm(W_V) * norm(W_O)),
     "the four factors"),
    (lambda W_Q, W_K, W_V, W_O: norm(W_V @ W_O @ W_K) / (norm(W_K) * norm(W_V @ W_O)), "W_K alone"),
    (lambda W_Q, W_K, W_V, W_O: k_composition(W_Q, W_K, W_V, W_O) * 1.01, "expected"),
    (lambda W_Q, W_K, W_V, W_O: torch.ones(2), "should be one number"),
    (lambda W_Q, W_K, W_V, W_O: "high", "should be one number"),
    (lambda W_Q, W_K, W_V, W_O: ..., "returns nothing yet"),
])
def test_each_composition_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_k_composition, fn)


@pytest.mark.parametrize("name", ["composition_score", "qk_matrix", "ov_matrix", "composition_scores"])
def test_the_courses_composition_functions_are_refused_by_name(name):
    import attn_course.circuits.composition as composition

    model = load_trained(0)

    def answer(W_Q, W_K, W_V, W_O):
        if name == "composition_score":
            composition.composition_score(W_Q @ W_K.T, (W_V @ W_O).T)
        elif name == "composition_scores":
            composition.composition_scores(model)
        else:
            getattr(composition, name)(model, 0, 0)
        return k_composition(W_Q, W_K, W_V, W_O)

    assert f"calls {name}, which this exercise forbids" in hint(check_k_composition, answer)


# --- (d) the classmate's copying score, fixed -------------------------------------------------------------------

def fixed_copying_score(W_E, W_V, W_O, W_U):
    # The V × V circuit in float64, its eigenvalues above round-off (numpy, not the checks' d × d product).
    circuit = (W_E.double() @ W_V.double() @ W_O.double() @ W_U.double()).numpy()
    import numpy as np

    eigenvalues = np.linalg.eigvals(circuit)
    nonzero = eigenvalues[np.abs(eigenvalues) > 1e-9 * np.abs(eigenvalues).max()]
    return float((nonzero.real > 0).mean())


def classmate(W_E, W_V, W_O, W_U):
    eigenvalues = torch.linalg.eigvals(W_E @ W_V @ W_O @ W_U)
    return (eigenvalues.real > 0).float().mean().item()


def d_by_d(W_E, W_V, W_O, W_U):
    return torch.linalg.eigvals(W_O @ W_U @ W_E @ W_V)


def test_copying_solutions_pass_from_the_v_by_v_circuit_and_from_the_d_by_d_product():
    assert check_fixed_copying_score(fixed_copying_score)
    assert check_fixed_copying_score(lambda *weights: (d_by_d(*weights).real > 0).double().mean(), seed=4)


def test_the_checks_reference_is_the_courses_positive_fraction_on_the_cached_heads():
    from attn_course.circuits import copying_scores, full_ov_circuit

    model = load_trained(0)
    cached = [case for case in _copying_cases(torch.Generator().manual_seed(0)) if "cached" in case[0]]
    assert len(cached) >= 5                                   # the four layer-1 heads and the previous-token head
    for case, *weights in cached:
        layer, head = (int(word.rstrip(",")) for word in case.split()[-3::2])
        courses = copying_scores(full_ov_circuit(model, layer, head)).positive_fraction
        assert _copying(*weights)[0] == pytest.approx(courses)


def test_a_built_copier_scores_one_and_the_mixed_head_three_fifths():
    generator = torch.Generator().manual_seed(0)
    copier = _built_head((3.0, 2.0, 0.5), 20, 10, generator)
    assert [w.shape for w in copier] == [(20, 10), (10, 3), (3, 10), (10, 20)]
    assert _copying(*copier)[0] == 1.0
    assert sorted(d_by_d(*copier).real.tolist()) == pytest.approx([0.5, 2.0, 3.0])
    mixed = _built_head((5.0, -4.0, 1.0, 0.01, -0.02), 13, 7, generator)
    assert _copying(*mixed)[0] == pytest.approx(0.6)


def with_tolerance(relative):
    def answer(W_E, W_V, W_O, W_U):
        eigenvalues = torch.linalg.eigvals((W_E @ W_V @ W_O @ W_U).double())
        kept = eigenvalues[eigenvalues.abs() > relative * eigenvalues.abs().max()]
        return (kept.real > 0).double().mean().item()

    return answer


@pytest.mark.parametrize("fn, fragment", [
    (classmate, "the classmate's score, unchanged"),
    (lambda *w: (torch.linalg.eigvals((w[0] @ w[1] @ w[2] @ w[3]).double()).real > 0).double().mean().item(),
     ("round-off", "classmate's score, unchanged")),         # the classmate's, in float64: still all V (where
                                                              # LAPACK gives the float32 round-off's signs again, the
                                                              # classmate's score itself: that diagnosis is right too)
    (lambda *w: int((d_by_d(*w).real > 0).sum()), "is a count"),
    (lambda *w: (d_by_d(*w).sum().real / d_by_d(*w).abs().sum()).item(), "Σλ / Σ|λ|"),
    (lambda W_E, W_V, W_O, W_U: (torch.linalg.eigvalsh(W_E @ W_V @ W_O @ W_U) > 0).float().mean(), "eigvalsh"),
    (lambda W_E, W_V, W_O, W_U: (torch.linalg.eigvalsh(W_O @ W_U @ W_E @ W_V) > 0).float().mean(), "eigvalsh"),
    (lambda *w: (d_by_d(*w).abs() > 0).double().mean(), "|λ| > 0 holds"),
    (lambda *w: (d_by_d(*w).real < 0).double().mean(), "negative real part"),
    (lambda W_E, W_V, W_O, W_U: W_V.shape[1] / W_E.shape[0], "that are nonzero"),
    (lambda *w: ((d_by_d(*w).real > 0).sum() / w[0].shape[0]).item(), "counts all V"),
    (lambda *w: (torch.linalg.eigvalsh((lambda m: m + m.T)(w[2] @ w[3] @ w[0] @ w[1])) > 0).double().mean(),
     "symmetric part"),
    (with_tolerance(1e-2), "drops real eigenvalues"),
    (with_tolerance(0.3), "drops real eigenvalues"),
    (with_tolerance(1e-12), "round-off zeros"),          # float32's round-off passes 1e-12 of the largest
    (lambda *w: (torch.cat([d_by_d(*w).real, torch.zeros(1)]) > 0).double().mean(), "round-off zeros too"),
    (lambda *w: fixed_copying_score(*w) * 0.97 + 0.001, "expected"),
    (lambda *w: d_by_d(*w).real, "should be one number"),
])
def test_each_copying_mistake_gets_its_hint(fn, fragment):
    told = hint(check_fixed_copying_score, fn)
    assert any(f in told for f in ((fragment,) if isinstance(fragment, str) else fragment)), told


def test_a_sensible_tolerance_on_the_v_by_v_circuit_passes():
    assert check_fixed_copying_score(with_tolerance(1e-5))


@pytest.mark.parametrize("name", ["full_ov_circuit", "copying_scores"])
def test_the_courses_ov_circuit_and_copying_scores_are_refused_by_name(name):
    from attn_course.circuits import copying_scores, full_ov_circuit

    model = load_trained(0)

    def answer(W_E, W_V, W_O, W_U):
        if name == "full_ov_circuit":
            full_ov_circuit(model, 1, 0)
        else:
            copying_scores(W_O @ W_U @ W_E @ W_V)
        return fixed_copying_score(W_E, W_V, W_O, W_U)

    assert f"calls {name}, which this exercise forbids" in hint(check_fixed_copying_score, answer)


# --- what the checks share, and the planted mistakes of tests/support/planted/planted_11.py ---------------------

CHECK_OF_QUESTION = {"q1_logits_without_head": check_logits_without_head, "q3_k_composition": check_k_composition,
                     "q4_find_the_bug_copying": check_fixed_copying_score}


@pytest.mark.parametrize(
    "student, name",
    [(student, name) for student, functions in planted_11.PLANTED.items() for name, (_, question, _) in
     functions.items() if question in CHECK_OF_QUESTION],
)
def test_each_planted_mistake_gets_its_hint_from_the_check(student, name):
    code, question, phrase = planted_11.PLANTED[student][name]
    namespace = {"torch": torch, "math": math}
    exec(code, namespace)
    assert phrase in hint(CHECK_OF_QUESTION[question], namespace[name])


@pytest.mark.parametrize("check", list(CHECK_OF_QUESTION.values()))
def test_a_check_refuses_what_is_not_a_function(check):
    with pytest.raises(TypeError, match="expected your function"):
        check(torch.zeros(3))


def test_the_checks_leave_the_callers_random_state_as_it_was():
    state = torch.random.get_rng_state()
    check_logits_without_head(solution)
    check_k_composition(k_composition)
    check_fixed_copying_score(fixed_copying_score)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_the_checks_draw_fresh_inputs_for_another_seed():
    seen = []

    def recording(*weights):
        seen.append(weights[0].clone())
        return k_composition(*weights)

    for seed in (0, 1):
        check_k_composition(recording, seed=seed)
    assert not torch.equal(seen[0], seen[len(seen) // 2])


# --- (b) which head's ablation hurts most --------------------------------------------------------------------

def strongest_route_head(previous_token_scores, duplicate_token_scores, induction_scores):
    # The layer-0 head whose pattern layer 1 reads: previous-token (seed 0) or duplicate-token (seed 1).
    return 0, int(torch.maximum(previous_token_scores[0], duplicate_token_scores[0]).argmax())


@pytest.mark.parametrize("dead_head", [None, 1])
def test_ablation_effects_are_those_of_an_independent_float64_forward(dead_head):
    # The check's measurement against tests/circuits' forward pass written from the formulas, a head left out;
    # with a dead head, against that forward pass on the model with the head's weights zeroed by hand.
    from circuits.circuits_reference import reference_forward

    from attn_course.checks.circuits_ablation import ablation_effects
    from attn_course.circuits.trained import load_trained
    from attn_course.circuits.training import InductionSetup

    model = load_trained(0)
    if dead_head is not None:
        attention, d = model.layers[0].attention, model.config.d_model // model.config.n_heads
        with torch.no_grad():
            for weight in (attention.q_proj.weight, attention.k_proj.weight):
                weight[dead_head * d:(dead_head + 1) * d] = 0.0
            attention.out_proj.weight[:, dead_head * d:(dead_head + 1) * d] = 0.0
    batch = InductionSetup().repeats(48, torch.Generator().manual_seed(2024))        # as the check draws it
    tokens = batch.tokens

    def repeated_loss(zero_heads=()):
        logits = reference_forward(model, tokens, zero_heads=zero_heads)["logits"]        # [B, N, V] float64
        losses = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")
        return losses[batch.predictable[:, 1:]].mean().item()                             # the repeat's tokens

    def repeat_score(pattern, back):
        """Per sequence, the mean over its second copy's queries i of pattern[b, :, i, i − P_b + 1 − back]."""
        scores = []
        for b in range(pattern.shape[0]):
            p = batch.periods[b].item()
            queries = batch.second_copy[b].nonzero().flatten().tolist()
            scores.append(torch.stack([pattern[b, :, i, i - p + 1 - back] for i in queries]).double().mean(0))
        return torch.stack(scores)                                                         # [B, H]

    previous, duplicate, induction, rises = ablation_effects(0, dead_head)
    patterns = reference_forward(model, tokens)["patterns"]
    by_layer = [patterns[layer] for layer in range(2)]
    assert torch.allclose(previous, torch.stack([loop_score(p, 1, 1).mean(0) for p in by_layer]).float(), atol=1e-5)
    assert torch.allclose(duplicate, torch.stack([repeat_score(p, 1).mean(0) for p in by_layer]).float(), atol=1e-5)
    assert torch.allclose(induction, torch.stack([repeat_score(p, 0).mean(0) for p in by_layer]).float(), atol=1e-5)
    intact = repeated_loss()
    for layer, head in [(0, int(previous[0].argmax())), (1, 0), (0, int(previous[0].argmin()))]:
        assert rises[layer, head].item() == pytest.approx(repeated_loss([(layer, head)]) - intact, abs=1e-4)
    if dead_head is not None:            # uniform causal attention: query i puts 1 / (i + 1) on each key
        n = tokens.shape[1]
        assert previous[0, dead_head].item() == pytest.approx(sum(1 / (i + 1) for i in range(1, n)) / (n - 1), abs=1e-5)
        assert rises[0, dead_head].item() == pytest.approx(0.0, abs=1e-6)


def test_the_layer_zero_head_that_layer_one_reads_is_the_right_prediction():
    assert check_ablation_prediction(strongest_route_head)
    assert check_ablation_prediction(strongest_route_head, seed=7)


@pytest.mark.parametrize("fn, fragment", [
    (lambda previous, duplicate, induction: (1, int(induction[1].argmax())), "You picked the head that copies best"),
    (lambda previous, duplicate, induction: (0, int(induction[0].argmax())), "raised it by"),
    # a head that attends evenly scores the same on the two repeat scores: a rule that picks it
    (lambda previous, duplicate, induction: (0, int((induction[0] - duplicate[0]).abs().argmin()))
     if bool(((induction[0] - duplicate[0]).abs() < 1e-6).any())
     else strongest_route_head(previous, duplicate, induction), "That head is the dead one"),
    # the rules that fit some models only: layer 0's lowest induction score (seeds 0 and 1), one route's score
    (lambda previous, duplicate, induction: (0, int(induction[0].argmin())), "lowest induction score"),
    (lambda previous, duplicate, induction: (0, int(previous[0].argmax())), "seed 1's model"),
    (lambda previous, duplicate, induction: (0, int(duplicate[0].argmax())), "no duplicate-token head"),
    (lambda previous, duplicate, induction: (0, int(previous[0].argmax())), "no previous-token head"),
    (lambda previous, duplicate, induction: (1, 0), "whatever the scores"),
    (lambda previous, duplicate, induction: (int(previous[0].argmax()), 0), "You return (head, layer)"),
    (lambda previous, duplicate, induction: (2, 0), "There is no layer 2"),
    (lambda previous, duplicate, induction: previous.argmax(), "two ints"),
    (lambda previous, duplicate, induction: (0.0, 3.0), "two ints"),
    (lambda previous, duplicate, induction: ..., "returns nothing yet"),
])
def test_each_prediction_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_ablation_prediction, fn)


def measured(previous_token_scores, duplicate_token_scores, induction_scores):
    from attn_course.circuits.trained import load_trained

    load_trained(0)
    return strongest_route_head(previous_token_scores, duplicate_token_scores, induction_scores)


@pytest.mark.parametrize("fn, fragment", [
    (lambda previous, duplicate, induction: (0, int(torch.randint(4, ()))),
     "calls torch.randint, which this exercise forbids"),
    (measured, "calls load_trained, which this exercise forbids"),
])
def test_a_prediction_that_measures_or_guesses_is_refused(fn, fragment):
    assert fragment in hint(check_ablation_prediction, fn)


def test_a_prediction_that_changes_with_the_random_state_is_caught_even_unwatched():
    answers = iter([(0, 1), (0, 2)] * 50)
    assert "two different answers" in hint(check_ablation_prediction, lambda previous, duplicate, induction:
                                           next(answers))


def test_the_check_refuses_to_pass_without_its_models():
    with pytest.raises(FileNotFoundError, match="cached models"):
        check_ablation_prediction(strongest_route_head, models=(0, 999))


