"""Students that attack the tests themselves (issue 31), for an end-to-end hostile class.

Each answers without computing: an empty tensor, a tensor that broadcasts (and that cost the grader
memory in proportion to its size), inputs zeroed or a mask filled in place so that a reference
computed after the call agrees, or a measurement the guard on random numbers did not see under make
grade. The checks and hidden tests now compare with :func:`attn_course.checks.compare.matches`
(type, device, shape and dtype before values; no broadcasting), compute every reference before the
call from inputs the answer never sees, and ask a prediction twice and to a precision no measurement
reaches; so each of these notebooks scores exactly ``expect["score"]``, under make grade as under
otter run.

The answers are the hostile planted students of tests/support/planted/ (support.planted.HOSTILE),
whose failure of every test of their questions, hidden tests included, is checked without otter by
tests/checks/test_hostile_answers.py. A hostile class hands in, for each entry, a notebook of the
chapter's imports and the answers of ``replace`` (each in place of the solution cell that starts
``def NAME(``); every other question is unanswered and scores 0, so the notebook's total is 0.
"""

from __future__ import annotations

from support.planted import PLANTED_BY_CHAPTER


def _answers(chapter: str, **planted_by_name: str) -> dict[str, str]:
    """{answer name: the code of the hostile planted student named for it}."""
    return {name: PLANTED_BY_CHAPTER[chapter][student][name][0] for name, student in planted_by_name.items()}


#: {student: {"chapter": ..., "replace": {answer name: its code}, "expect": {"score": the notebook's total,
#: "stopped": None (graded to the end)}}}.
#: One notebook per chapter, each of its answers a different attack (every attack on every question is run
#: without otter by tests/checks/test_hostile_answers.py; here each attack goes once through make grade):
#: empty (eve: ``x.new_empty((0,) + (1,) * x.dim())``, allclose of nothing was True), inputs changed in place
#: (mallory: ``v.zero_()``, ``mask.fill_(True)``, ``w_o.zero_()``, then the zeros a reference computed after
#: the call gave), broadcasting (bob: ``torch.ones(2**18, 1, 1, 1, 1)``, 2 GB of the grader's memory), and a
#: measurement through ``torch.ops.aten`` (carlo), which the watch on random numbers does not see and whose
#: draws, in the sandbox, never moved the grader's generator that the old guard read.
ATTACKS = {
    "checks_attacks_02": {
        "chapter": "02_formula",
        "replace": _answers("02_formula", stable_softmax="eve", my_attention="mallory", predicted_score_std="carlo",
                            fixed_attention="bob", query_gradient="mallory"),
        "expect": {"score": 0.0, "stopped": None},     # scored 0 by the tests, not by being stopped
    },
    "checks_attacks_03": {
        "chapter": "03_multi_head",
        "replace": _answers("03_multi_head", split_fused_qkv="eve", fixed_multi_head_attention="mallory",
                            grouped_query_attention="mallory", mean_pool_kv_heads="eve"),
        "expect": {"score": 0.0, "stopped": None},     # scored 0 by the tests, not by being stopped
    },
}
