"""Chapter 13's exercise checks: the solutions pass, each known mistake gets its own hint, what the statements forbid
is refused by name, and the checks' references agree with the course's gated delta rule and top-k selection (and
with Hugging Face's Qwen3-Next recurrence where transformers is installed); the memory experiment gives the same
answers, far from a tie, whatever its seed."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attn_course.checks import CheckFailed
from attn_course.checks.recurrent_memory import GROUP, QUESTIONS, check_memory_prediction, recall_shares
from attn_course.checks.recurrent_sparse import (
    _DELTA_PLANTS,
    _delta_cases,
    _top_k_cases,
    causal_top_k_reference,
    check_causal_top_k,
    check_gated_delta_recurrence,
    delta_rule_reference,
)
from attn_course.variants.delta_rule import gated_delta_rule
from attn_course.variants.sparse_attention import top_k_keys

from support.planted import planted_13


def hint(check, fn) -> str:
    with pytest.raises(CheckFailed) as failed:
        check(fn)
    return str(failed.value)


def answer(name: str, code: str):
    namespace = {"torch": torch, "math": math, "F": F}                              # the chapter's imports
    exec(compile(code, f"<{name}>", "exec"), namespace)
    return namespace[name]


def delta_variant(mistake: str | None = None):
    """The recurrence in the course's orientation (``S`` is ``[d_k, d_v]``), or with one ``mistake``."""
    def recurrence(q, k, v, g, beta, state, scale):
        initial, outputs = state, []
        scale = {"no_scale": 1.0, "default_scale": q.shape[-1] ** -0.5}.get(mistake, scale)
        for t in range(q.shape[2]):
            q_t, k_t, v_t = q[:, :, t, :, None], k[:, :, t, :, None], v[:, :, t, :, None]   # [B, H, d, 1]
            alpha = {"no_decay": 1.0, "not_exp": g[:, :, t, None, None]}.get(mistake, g[:, :, t, None, None].exp())
            b = 1.0 if mistake == "no_beta" else beta[:, :, t, None, None]
            before, decayed = state, alpha * state
            read = decayed if mistake == "read_transposed" else decayed.transpose(-1, -2)
            recalled = (state.transpose(-1, -2) if mistake == "stale_recall" else read) @ k_t     # [B, H, d_v, 1]
            if mistake == "adds":
                state = decayed + b * k_t @ v_t.transpose(-1, -2)
            elif mistake == "decay_after":
                state = alpha * (state + b * k_t @ (v_t - state.transpose(-1, -2) @ k_t).transpose(-1, -2))
            else:
                state = decayed + b * k_t @ (v_t - recalled).transpose(-1, -2)
            reader = before if mistake == "read_before" else state
            reader = reader if mistake == "out_transposed" else reader.transpose(-1, -2)
            outputs.append(scale * (reader @ q_t)[..., 0])
        returned = {"state_transposed": state.transpose(-1, -2), "initial": initial}.get(mistake, state)
        return torch.stack(outputs, dim=2), returned
    return recurrence


def fixed_causal_top_k(scores, k):
    n = scores.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    best = scores.masked_fill(~causal, float("-inf")).topk(min(k, n), dim=-1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, best, True) & causal


def better_memory(pairs, which):
    return "delta" if which == "newest" else "linear"


def test_the_solutions_pass():
    assert check_gated_delta_recurrence(delta_variant())
    assert check_causal_top_k(fixed_causal_top_k)
    assert check_memory_prediction(better_memory)
    assert check_memory_prediction(better_memory, seed=7)


# --- the references against the course's code and Hugging Face's ------------------------------------------------

@pytest.mark.parametrize("chunk_size", [None, 3])
def test_the_delta_rule_reference_gives_the_courses_gated_delta_rule(chunk_size):
    for q, k, v, g, beta, state, scale in _delta_cases():
        out, final = delta_rule_reference(q, k, v, g, beta, state, scale)
        ours, our_final = gated_delta_rule(q.double(), k.double(), v.double(), g.double(), beta.double(), scale=scale,
                                           initial_state=state.double(), chunk_size=chunk_size)
        assert torch.allclose(out, ours, atol=1e-10) and torch.allclose(final, our_final, atol=1e-10)


def test_the_delta_rule_reference_gives_hugging_faces_qwen3_next_recurrence():
    pytest.importorskip("transformers")
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

    for q, k, v, g, beta, state, _ in _delta_cases():
        scale = q.shape[-1] ** -0.5                                                 # what Hugging Face applies
        layout = lambda t: t.transpose(1, 2).contiguous()                           # noqa: E731  [B, N, H, ...]
        theirs, their_final = torch_recurrent_gated_delta_rule(
            layout(q), layout(k), layout(v), layout(g), layout(beta), initial_state=state.clone(),
            output_final_state=True, use_qk_l2norm_in_kernel=False)
        out, final = delta_rule_reference(q, k, v, g, beta, state, scale)
        assert torch.allclose(layout(theirs).double(), out, atol=1e-5)
        assert torch.allclose(their_final.double(), final, atol=1e-5)


def test_the_top_k_reference_gives_the_courses_top_k_keys():
    generator = torch.Generator().manual_seed(0)
    for n, k in [(1, 1), (6, 1), (6, 3), (9, 9), (7, 20)]:
        scores = torch.randn(3, n, n, generator=generator)
        assert torch.equal(causal_top_k_reference(scores, k), top_k_keys(scores, k))
        assert torch.equal(fixed_causal_top_k(scores, k), top_k_keys(scores, k))


def test_the_memory_experiment_answers_alike_and_far_from_a_tie_whatever_its_seed():
    column = {"all": 0, "oldest": 1, "newest": 2}
    for seed in range(6):
        shares = {pairs: recall_shares(pairs, seed=seed) for pairs in {pairs for pairs, _ in QUESTIONS}}
        for pairs, which in QUESTIONS:
            linear, delta = (shares[pairs][memory][column[which]] for memory in ("linear", "delta"))
            assert abs(linear - delta) > 0.1, (seed, pairs, which, linear, delta)
            assert (delta > linear) == (which == "newest"), (seed, pairs, which)
        # what the diagnoses say: linear attention recalls nearly all of d pairs, the delta rule its newest ones
        assert shares[32]["linear"][0] > 0.95 and shares[32]["delta"][0] < 0.9
        assert shares[128]["delta"][2] > 0.95 and shares[128]["delta"][1] < 0.1


def test_linear_attention_recalls_d_orthogonal_pairs_exactly_but_not_d_random_ones():
    keys, values = torch.eye(32, dtype=torch.float64), F.normalize(torch.randn(32, 32, dtype=torch.float64), dim=-1)
    assert torch.allclose(keys @ (keys.T @ values), values)
    random_keys = F.normalize(torch.randn(32, 32, dtype=torch.float64), dim=-1)
    assert not torch.allclose(random_keys @ (random_keys.T @ values), values, atol=0.1)


# --- the planted mistakes and the forbidden calls ----------------------------------------------------------------

CHECKS = {"gated_delta_recurrence": check_gated_delta_recurrence, "fixed_causal_top_k": check_causal_top_k,
          "better_memory": check_memory_prediction}


@pytest.mark.parametrize("student, name", [(student, name) for student, functions in planted_13.PLANTED.items()
                                           for name in functions])
def test_each_planted_mistake_gets_its_hint_from_the_check(student, name):
    code, _, phrase = planted_13.PLANTED[student][name]
    assert phrase in hint(CHECKS[name], answer(name, code))


@pytest.mark.parametrize("mistake, fragment", [
    ("adds", "add every token"), ("stale_recall", "before its decay"), ("decay_after", "decay after writing"),
    ("no_decay", "never decay"), ("not_exp", "g itself"), ("no_beta", "whole correction"),
    ("read_transposed", "other way round"), ("out_transposed", "other way round"),
    ("read_before", "before the token's own write"), ("no_scale", "not scaled"), ("default_scale", "1/√d_k"),
    ("state_transposed", "state you return is transposed"), ("initial", "return the initial state"),
])
def test_each_delta_rule_mistake_gets_its_hint(mistake, fragment):
    assert fragment in hint(check_gated_delta_recurrence, delta_variant(mistake))


def test_every_planted_delta_rule_mistake_shows_in_the_square_case_and_is_told_apart():
    q, k, v, g, beta, state, scale = _delta_cases()[0]
    assert q.shape[-1] == v.shape[-1] and scale != q.shape[-1] ** -0.5 and state.abs().sum() > 0
    expected, _ = delta_rule_reference(q, k, v, g, beta, state, scale)
    outputs = {plant: delta_rule_reference(q, k, v, g, beta, state, scale, plant=plant)[0]
               for plant, _ in _DELTA_PLANTS}
    messages = dict(_DELTA_PLANTS)
    for plant, out in outputs.items():
        assert not torch.allclose(out, expected, atol=1e-3), plant
        for other, other_out in outputs.items():
            if messages[other] != messages[plant]:
                assert not torch.allclose(out, other_out, atol=1e-3), (plant, other)


@pytest.mark.parametrize("fn, fragment", [
    (lambda q, k, v, g, beta, state, scale: delta_variant()(q, k, v, g, beta, state, scale)[0],
     "should return 2 tensors"),
    (lambda q, k, v, g, beta, state, scale: (q @ v, state), "raised RuntimeError"),
])
def test_what_a_recurrence_returns_is_judged_first(fn, fragment):
    message = hint(check_gated_delta_recurrence, fn)
    assert fragment in message
    if "raised" in message:
        assert "state [2, 2, 4, 4] (d_k = 4, d_v = 4) and scale 0.7" in message


def test_the_courses_delta_rule_and_its_cores_are_refused():
    from attn_course.variants import delta_rule
    from attn_course.variants.gated_deltanet import GatedDeltaNet, GatedDeltaNetConfig

    def through_the_core(q, k, v, g, beta, state, scale):
        return delta_rule._recurrent(q * scale, k, v, g, beta, state)

    def through_the_layer(q, k, v, g, beta, state, scale):
        GatedDeltaNet(GatedDeltaNetConfig(8, 1, 1, 4, 4))
        return delta_variant()(q, k, v, g, beta, state, scale)
    assert "calls _recurrent, which this exercise forbids" in hint(check_gated_delta_recurrence, through_the_core)
    assert "which this exercise forbids" in hint(check_gated_delta_recurrence, through_the_layer)


def lowest(scores, k):
    n = scores.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    best = scores.masked_fill(~causal, float("inf")).topk(min(k, n), dim=-1, largest=False).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, best, True) & causal


def one_too_many(scores, k):
    return fixed_causal_top_k(scores, k + 1)


def swapped_two(scores, k):
    chosen = fixed_causal_top_k(scores, k).clone()
    row = chosen[0, 5]                                                     # keep its worst allowed key instead
    allowed = scores[0, 5, :6]
    row[allowed.argmax()] = False
    row[allowed.argmin()] = True
    return chosen


@pytest.mark.parametrize("fn, fragment", [
    (lowest, "lowest-scoring"), (one_too_many, "it should keep min(k, i + 1) = 3"), (swapped_two, "leaves out key"),
    (lambda scores, k: fixed_causal_top_k(scores, k).int(), "dtype"),
    (lambda scores, k: scores.topk(min(k, scores.shape[-1]), -1).indices, "indices of the keys"),
    (lambda scores, k: torch.zeros_like(scores, dtype=torch.bool), "Query 0 keeps 0 key(s)"),
    (lambda scores, k: top_k_keys(scores, k), "calls top_k_keys, which this exercise forbids"),
])
def test_each_top_k_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_causal_top_k, fn)


def test_the_block_selections_top_blocks_is_refused_too():
    from attn_course.variants import block_selection

    def through_blocks(scores, k):
        n = scores.shape[-1]
        return block_selection._top_blocks(scores, torch.ones(n, n, dtype=torch.bool).tril().expand_as(scores), k)
    assert "which this exercise forbids" in hint(check_causal_top_k, through_blocks)


def test_the_top_k_cases_show_the_mistakes_they_are_there_for():
    cases = _top_k_cases()
    scores, k = cases[0]
    # the classmate's selection differs from the right one, and only some early queries have fewer than k keys
    assert not torch.equal(causal_top_k_reference(scores, k, plant="after"), causal_top_k_reference(scores, k))
    assert 1 < k < scores.shape[-1] and any(k > s.shape[-1] for s, k in cases)


@pytest.mark.parametrize("fn, fragment", [
    (lambda pairs, which: "delta" if which == "newest" or (pairs, which) == (128, "all") else "linear",
     "Asked about the all pairs of 128, you answered 'delta'"),
    (lambda pairs, which: "both", "should return 'linear' or 'delta'"),
    (lambda pairs, which: ["linear", "delta"][int(torch.randint(2, ()))], "calls torch.randint"),
    (lambda pairs, which: "delta" if which == "newest" and pairs > 64 else "linear",
     "Asked about the newest pairs of 64"),
])
def test_each_memory_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_memory_prediction, fn)


def test_a_memory_answer_that_changes_its_mind_is_told():
    said = []

    def fickle(pairs, which):
        said.append(which)
        return ["linear", "delta"][len(said) % 2] if which == "all" else better_memory(pairs, which)
    assert "two different answers" in hint(check_memory_prediction, fickle)


def test_the_courses_memories_are_refused_in_the_prediction():
    from attn_course.variants.linear_attention import linear_attention

    def measured(pairs, which):
        keys = torch.eye(32)[None, None, :8]
        linear_attention(keys, keys, keys)
        return better_memory(pairs, which)
    assert "calls linear_attention, which this exercise forbids" in hint(check_memory_prediction, measured)


# --- inputs --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("check", [check_gated_delta_recurrence, check_causal_top_k, check_memory_prediction])
def test_a_check_given_no_function_says_so(check):
    with pytest.raises(TypeError, match=f"{check.__name__}: expected your function, got int"):
        check(3)


def test_the_memory_checks_numbers_are_checked():
    with pytest.raises(TypeError, match="check_memory_prediction: seed must be an int, got float"):
        check_memory_prediction(better_memory, seed=1.5)
    with pytest.raises(ValueError, match=f"recall_shares: pairs must be >= {GROUP}, got 4"):
        recall_shares(4)
    with pytest.raises(TypeError, match="recall_shares: trials must be an int, got str"):
        recall_shares(16, trials="8")
