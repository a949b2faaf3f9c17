"""An answer's rules read from its source (attn_course.checks.answer_source): every spelling of what an
exercise forbids, and the ways around a check, found in the code; honest answers pass."""

from __future__ import annotations

import sys

import pytest

from attn_course.checks.answer_source import ESCAPE, source_violations
from attn_course.checks.forbidden import AUTOGRAD, RANDOM, Forbidden

SOFTMAX = [Forbidden("torch.softmax", "the exercise is to write softmax")]
SDPA = [Forbidden("torch.nn.functional.scaled_dot_product_attention", "write attention yourself")]
GRADIENT = [Forbidden(AUTOGRAD, "derive the gradient by hand")]
SCORE = [Forbidden("attn_course.circuits.scores.induction_score", "read the score off the pattern yourself")]
IMPORTS = "import torch\nimport torch.nn.functional as F\n"


def found(answer_cells: list[str], rules, name: str = "answer") -> list[tuple[str, str]]:
    return [(written, rule.name) for written, rule in source_violations([IMPORTS, *answer_cells], name, rules)]


@pytest.mark.parametrize("body", [
    "torch._softmax(x, -1, False)", "torch.ops.aten._softmax(x, -1, False)",
    "torch.ops.aten._softmax.default(x, -1, 0)",
    "F.softmin(-x, dim=-1)", "x.softmax(-1)", "torch.special.log_softmax(x, -1).exp()", "torch.nn.Softmax(-1)(x)",
    "getattr(torch, 'softmax')(x, -1)",
])
def test_every_spelling_of_softmax_is_found(body):
    assert ("torch.softmax" in {rule for _, rule in found([f"def answer(x):\n    return {body}\n"], SOFTMAX)})


@pytest.mark.parametrize("body", [
    "torch.ops.aten.scaled_dot_product_attention(q, k, v)", "torch._C._nn.scaled_dot_product_attention(q, k, v)",
    "torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[0]",
])
def test_every_spelling_of_sdpa_is_found(body):
    assert {rule for _, rule in found([f"def answer(q, k, v):\n    return {body}\n"], SDPA)} >= {SDPA[0].name}


def test_forward_mode_autograd_and_torch_func_are_autograd():
    forward = ("import torch.autograd.forward_ad as fwAD\ndef answer(x, t):\n    with fwAD.dual_level():\n"
               "        return fwAD.unpack_dual(torch.tanh(fwAD.make_dual(x, t))).tangent\n")
    assert ("fwAD.make_dual", AUTOGRAD) in found([forward], GRADIENT)
    assert found(["def answer(f, x):\n    return torch.func.grad(f)(x)\n"], GRADIENT)
    assert found(["def answer(y, x):\n    y.sum().backward()\n    return x.grad\n"], GRADIENT)


@pytest.mark.parametrize("cell", [
    # a thread or a process runs what no watch on the caller's thread sees
    "import threading\ndef answer(x):\n    box = []\n    threading.Thread(target=lambda: box.append(x)).start()\n"
    "    return box\n",
    "from concurrent.futures import ThreadPoolExecutor\ndef answer(x):\n"
    "    return ThreadPoolExecutor().submit(torch.softmax, x, -1).result()\n",
    # the watch switched off
    "import sys\ndef answer(x):\n    sys.setprofile(None)\n    return x\n",
    "def answer(x):\n    with torch._C.DisableTorchFunction():\n        return x\n",
    # the runner's guard replaced through the garbage collector, frames or code built at run time
    "import gc\ndef answer(x):\n    return [o for o in gc.get_objects() if callable(o)]\n",
    "def answer(x):\n    return eval('torch.soft' + 'max')(x, -1)\n",
    "def answer(x):\n    return getattr(torch, 'soft' + 'max')(x, -1)\n",
    "def answer(x):\n    return __import__('importlib').import_module('torch').softmax(x, -1)\n",
    "def answer(x):\n    return answer.__globals__['torch']\n",
    # the checks' and the measurements' own references
    "from attn_course.checks.circuits import stripe_mean\ndef answer(pattern):\n    return stripe_mean(pattern, 1)\n",
    "import attn_course.checks.latent_costs as c\ndef answer(n):\n    return c._decode_reference(n)\n",
    "from attn_course.measure.kv_cache import positions_processed\ndef answer(n):\n"
    "    return positions_processed(n)\n",
])
def test_the_ways_around_a_check_are_found_whatever_the_exercise(cell):
    assert ESCAPE.name in {rule for _, rule in found([cell], [])}, cell


def test_a_value_computed_at_cell_time_counts_as_the_answer_computing_it():
    cells = ["from attn_course.circuits.scores import induction_score",
             "looked_up = induction_score(pattern, 5)",
             "def helper():\n    return looked_up\n",
             "def answer(pattern):\n    return helper()\n"]
    assert found(cells, SCORE) == [("induction_score", SCORE[0].name)]
    # Under another import path (the package's re-export), and as an attribute.
    assert found(["import attn_course.circuits as circuits\ndef answer(p):\n"
                  "    return circuits.scores.induction_score(p, 5)\n"], SCORE)


def test_random_numbers_from_any_generator_are_found():
    rules = [Forbidden(RANDOM, "predict, do not sample")]
    for body in ("torch.rand(3)", "torch.randn_like(x)", "x.normal_()", "__import__('random').random()"):
        assert found([f"def answer(x):\n    return {body}\n"], rules), body
    assert found(["import random\ndef answer(x):\n    return random.random()\n"], rules)


def test_honest_answers_break_no_rule():
    stable = ("def answer(x):\n    shifted = x - x.max(dim=-1, keepdim=True).values\n    e = shifted.exp()\n"
              "    return e / e.sum(dim=-1, keepdim=True)\n")
    assert found([stable], SOFTMAX) == []
    attention = ("import math\ndef helper(x):\n    return x.exp() / x.exp().sum(-1, keepdim=True)\n"
                 "def answer(q, k, v):\n    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
                 "    return helper(scores) @ v\n")
    assert found([attention], [*SOFTMAX, *SDPA]) == []
    # The last definition is the one in force: a first try that broke the rule, then rewritten.
    assert found(["def answer(x):\n    return torch.softmax(x, -1)\n", stable], SOFTMAX) == []
    # A class-based answer with super().__init__ and a constant getattr of something allowed.
    module = ("class answer(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.scale = getattr(torch, 'float32')\n    def forward(self, x):\n        return x * 2\n")
    assert found([module], SOFTMAX) == []
    assert source_violations(["x = 1"], "answer", SOFTMAX) == []        # nothing defined: nothing found


def test_a_check_in_a_notebook_reads_the_answer_from_its_input_history():
    import torch

    from attn_course.checks.diagnosis import CheckFailed, call_answer

    cell = ("import threading\ndef answer(x):\n    box = []\n"
            "    thread = threading.Thread(target=lambda: box.append(torch.softmax(x, -1)))\n"
            "    thread.start()\n    thread.join()\n    return box[0]\n")
    namespace = {"In": ["", IMPORTS, cell]}             # IPython's input history, as a kernel keeps it
    exec(IMPORTS + cell, namespace)
    # The watch on the calling thread sees nothing; the source says it all.
    with pytest.raises(CheckFailed, match=r"your answer calls threading.Thread, which this exercise forbids"):
        call_answer("check_softmax", namespace["answer"], torch.zeros(3), forbidden=SOFTMAX)
    del namespace["In"]                                  # outside a notebook: the watch alone
    assert call_answer("check_softmax", namespace["answer"], torch.zeros(3), forbidden=SOFTMAX).shape == (3,)


def evasions() -> list:
    """Issue 44's hidden answers (tests/grading/hostile/evasion.py), each with its chapter."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "grading" / "hostile" / "evasion.py"
    spec = importlib.util.spec_from_file_location("hostile_evasion", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [pytest.param(attack["chapter"], name, code, id=f"{attack['chapter'][:2]}-{name}")
            for attack in module.ATTACKS.values() for name, code in attack["replace"].items()]


@pytest.mark.slow
@pytest.mark.parametrize("chapter, name, code", evasions())
def test_each_hidden_forbidden_call_is_refused_by_the_notebooks_own_check_cell(chapter, name, code):
    # The notebook's check reads the answer's source from IPython's input history, as the grader reads the
    # submitted one: whatever the watch in the student's process missed, the check cell fails, naming the rule.
    from support.exercises import CHAPTERS, chapter_namespace, failures, public_tests

    master = next(path for path in CHAPTERS if path.stem == chapter)
    question = next(question for question, tests in public_tests(master).items()
                    if any(f"({name})" in test for test in tests))
    namespace = chapter_namespace(master)
    namespace["In"] = ["", "import torch\nimport math\n", code]
    runner = vars(sys.modules.get("attn_course_grading.in_sandbox", sys))
    guard = runner.get("watch_calls")
    try:
        exec(compile(code, f"<{name} answer>", "exec"), namespace)
        messages = failures(public_tests(master)[question][:1], namespace, question)
    finally:                                            # an answer that replaces the grader's guard (attack 4)
        if guard is not None:
            runner["watch_calls"] = guard
    assert messages and ("which this exercise forbids" in messages[0] or "the checks' own code" in messages[0]), \
        messages
