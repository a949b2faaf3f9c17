"""The grader's side of the sandbox protocol against a hostile submission (issue 31).

Each attack that once worked, reproduced cheaply: hand-made replies checked by
attn_course_grading.replies and decoded by attn_course_grading.wire (no process at all), then a
few trusted submissions (``sandboxed=False``: the protocol is the point, not the sandbox) whose
cells are the attacks of tests/grading/hostile/protocol.py, which the end-to-end hostile class
hands in too:

1. a submission that stops reading its requests: the grader's write has a deadline;
2. strings that are not UTF-8 (lone surrogates), and a tensor where the events belong;
3. a malformed setup reply: that notebook is stopped, with its processes, and no exception
   leaves the constructor with a process behind;
11. strings of megabytes: every string that crosses back is bounded;

and the copy-back rule: an ordinary function's in-place change of a tensor stays in the sandbox;
only kernel launches (their outputs) and caches (appended to) come back.
"""

from __future__ import annotations

import json
import os
import pathlib
import threading
import time

import numpy as np
import pytest
import safetensors.torch
import torch
from hostile.protocol import BLOCKS_THE_PIPE, FORGES_A_REPLY, MALFORMED, TENSOR_EVENT, forged_setup

from attn_course.core.kv_cache import KVCache
from attn_course_grading import replies, sandbox, wire
from attn_course_grading.proc import process_tree
from attn_course_grading.proxies import answer_values
from attn_course_grading.remote import Submission, SubmissionError, SubmissionStopped

#: Short limits: every cell here is tiny, and each deadline tested is waited for in full.
LIMITS = sandbox.Limits(seconds=30, cell_seconds=2, call_seconds=2)


def writable(value: object) -> bool:
    """Whether ``value`` can be written as the grades' JSON files are (UTF-8, non-ASCII kept)."""
    json.dumps(value, ensure_ascii=False).encode("utf-8")
    return True


# --- replies: the shape of each, on hand-made hostile replies -------------------------------------

def test_safe_text_escapes_lone_surrogates_and_bounds_the_length():
    assert replies.safe_text("a \ud800 b", 100) == "a \\ud800 b" and writable(replies.safe_text("\udfff", 10))
    cut = replies.safe_text("x" * 10**7, 50)
    assert len(cut) == 50 and cut.endswith("…")
    assert len(replies.safe_text("\ud800" * 100, 20)) <= 20      # each escape is 6 characters: cut after
    with pytest.raises(TypeError, match="text"):
        replies.safe_text(type("Sneaky", (str,), {})("x"), 10)
    with pytest.raises(ValueError, match="limit"):
        replies.safe_text("x", 0)


def setup(events: object = (), kinds: object = None, **extra) -> dict:
    reply = {"events": list(events) if isinstance(events, tuple) else events,
             "kinds": {"f": "function"} if kinds is None else kinds}
    return dict(reply, **extra)


def test_a_setup_reply_keeps_its_strings_but_safe_and_bounded():
    reply = setup([{"cell": 0, "error": "ValueError: \ud800"}, {"cell": 2, "error": "E" * 10**6}])
    events, kinds = replies.setup_reply(reply, ["f"], cells=3)
    assert events[0] == {"cell": 0, "error": "ValueError: \\ud800"} and kinds == {"f": "function"}
    assert len(events[1]["error"]) == replies.MAX_TEXT_CHARS and writable(events)


class Sneaky(str):
    pass


@pytest.mark.parametrize("reply, reason", [
    (None, "not a dict"),
    ([], "not a dict"),
    (setup(None), "NoneType, not a list"),                                 # attack 3: events None
    (setup("cell 1 failed"), "not a list"),
    (setup([torch.ones(3)]), "Tensor, not a dict"),                         # attack 2: a tensor in the events
    (setup([{"cell": 0, "error": torch.ones(3)}]), "Tensor, not a str"),
    (setup([{"cell": True, "error": "x"}]), "names cell"),                  # a bool is not a cell's index
    (setup([{"cell": 7, "error": "x"}]), "names cell 7"),
    (setup([{"cell": 0, "error": Sneaky("x")}]), "Sneaky, not a str"),
    (setup([{"cell": 0, "error": "x", "more": 1}]), "keys"),
    (setup([{"cell": 0, "error": "x"}] * (replies.MAX_EVENTS + 1)), "more than"),
    (setup(kinds=None) | {"kinds": None}, "not a dict"),
    (setup(kinds={}), "one for each answer"),
    (setup(kinds={"f": "function", "g": "value"}), "one for each answer"),
    (setup(kinds={"f": "builtin"}), "not one of"),
    (setup(kinds={"f": np.zeros(2)}), "not one of"),
    (setup(extra="x"), "keys"),
])
def test_a_malformed_setup_reply_is_refused_with_where(reply, reason):
    with pytest.raises(replies.MalformedReply, match=reason):
        replies.setup_reply(reply, ["f"], cells=3)


def test_an_error_reply_has_an_identifier_for_a_type_and_a_bounded_message():
    error = replies.call_reply({"error": {"type": "E" * 10**6, "message": "\ud800" + "m" * 10**7}}, arguments=0)
    assert error["error"]["type"] == "E" * replies.MAX_TYPE_CHARS
    assert error["error"]["message"].startswith("\\ud800") and len(error["error"]["message"]) == replies.MAX_TEXT_CHARS
    assert replies.call_reply({"error": {"type": "not a name", "message": ""}}, arguments=0)["error"]["type"] == "Error"
    for bad in ({"type": 3, "message": ""}, {"type": "E", "message": None}, {"type": "E"}, "ValueError"):
        with pytest.raises(replies.MalformedReply):
            replies.call_reply({"error": bad}, arguments=0)


def call(value: object = None, after: object = (), forbidden: object = (), **extra) -> dict:
    return dict({"value": value, "after": list(after) if isinstance(after, tuple) else after,
                 "forbidden": list(forbidden) if isinstance(forbidden, tuple) else forbidden}, **extra)


def test_a_value_keeps_its_data_with_every_string_made_safe():
    tensor = torch.ones(2)
    reply = replies.call_reply(call({"k\ud800": ("v\udfff" * 10**6, [1, 2.5, None, True, tensor, torch.float16])},
                                    after=[None, {"length": 0}], forbidden=[["torch.softmax", "torch.softmax"]]),
                               arguments=2, rules=["torch.softmax"])
    ((key, (text, items)),) = reply["value"].items()
    assert key == "k\\ud800" and len(text) == replies.MAX_VALUE_TEXT_CHARS and text.startswith("v\\udfff")
    assert items[:4] == [1, 2.5, None, True] and items[4] is tensor and items[5] is torch.float16
    assert reply["forbidden"] == [["torch.softmax", "torch.softmax"]] and writable([key, text])


@pytest.mark.parametrize("reply, reason", [
    (call(after=[None, None, None]), "at most 2"),                         # more changed arguments than given
    (call(after=None), "not a list"),
    (call(forbidden=[["torch.softmax", "torch.softmax"]] * (replies.MAX_FORBIDDEN + 1)), "at most"),   # 11
    (call(forbidden=[["torch.softmax", "a rule it was not given"]]), "not watched under"),
    (call(forbidden=[[torch.ones(1), "torch.softmax"]]), "Tensor, not a str"),
    (call(forbidden=["torch.softmax"]), "not a pair"),
    (call(value=lambda: 0), "not data"),
    (call(value=[Sneaky("x")]), "not data"),                                # a str subclass: its methods are its own
    (call(value=torch.nn.Parameter(torch.ones(1))), "not data"),
    (call(value={(1, 2): 3}), "keys"),
    (call(extra=1), "keys"),
    ({"value": 1}, "keys"),
])
def test_a_malformed_call_reply_is_refused_with_where(reply, reason):
    with pytest.raises(replies.MalformedReply, match=reason):
        replies.call_reply(reply, arguments=2, rules=["torch.softmax"])


# --- wire: what decodes in Python and fails there is a ValueError, like every other bad reply ------

def blob(structure: object, tensors: dict | None = None) -> bytes:
    return safetensors.torch.save(tensors or {}, metadata={"structure": json.dumps(structure)})


@pytest.mark.parametrize("structure, tensors, reason", [
    ({"ndarray": 0}, {"t0": torch.ones(2, dtype=torch.bfloat16)}, "bfloat16"),   # numpy has no bfloat16
    ({"device": "warp:9"}, None, "device"),
    ({"device": "cuda:99999999999"}, None, "device"),
    ({"tensor": 0}, {"t0": torch.ones(2, dtype=torch.float8_e4m3fn)}, "dtype"),
    ({"tensor": 0}, {"t0": torch.ones(2, dtype=torch.uint16)}, "dtype"),
    ({"tensor": True}, {"t0": torch.ones(2)}, "names tensor"),
    ({"dtype": "complex64"}, None, "unexpected"),
])
def test_a_dtype_or_device_the_grader_refuses_is_a_value_error(structure, tensors, reason):
    with pytest.raises(ValueError, match=reason):
        wire.decode(blob(structure, tensors))


def test_a_structure_too_large_to_hold_is_refused_before_it_is_parsed():
    with pytest.raises(ValueError, match="structure larger"):
        wire.decode(blob("x" * wire.MAX_STRUCTURE_BYTES))


def test_an_ordinary_call_copies_back_caches_but_never_tensors():
    v = torch.randn(3)
    wire.update_in_place(v, torch.zeros(3))
    assert v.abs().sum() > 0                                        # left as the caller made it
    wire.update_in_place([v], [torch.zeros(3)])
    assert v.abs().sum() > 0
    wire.update_in_place(v, torch.zeros(3), tensors=True)           # a kernel launch's output
    assert v.abs().sum() == 0
    cache, grown = KVCache(), KVCache()
    grown.append(torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4))
    wire.update_in_place([cache], [wire.cache_state(grown)])
    assert len(cache) == 2
    for bad in ({"length": 5}, {"length": "2"}, {"length": 3, "keys": torch.ones(1, 1, 3), "values": None}, [1]):
        with pytest.raises(ValueError):
            wire.update_in_place(KVCache(), bad)


# --- submissions: the attacks as cells --------------------------------------------------------------

RUNNER_CELLS = ['''
import signal, torch
handler_has_globals = hasattr(signal.getsignal(signal.SIGALRM), "__globals__")

def zeroes_in_place(q, k, v):
    v.zero_()
    q.fill_(1.0)
    return torch.zeros_like(q)

def appends(caches):
    for cache in caches:
        cache.append(torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4))
    return len(caches[0])

class Launcher:                       # what the runner takes for a Triton kernel: kernel[grid](...)
    fn = run = None
    def __getitem__(self, grid):
        def launch(out, value):
            out.fill_(value)
        return launch

kernel = Launcher()

def raises_surrogates():
    raise ValueError("\\ud800" * 10)

def raises_huge():
    raise type("E" * 10**6, (Exception,), {})("m" * 10**6)

def returns_surrogates():
    return {"k\\ud800": ["v\\udfff" * 3]}
''', 'raise ValueError("\\ud800 a lone surrogate")\n', 'raise type("E" * 10**6, (Exception,), {})("m" * 10**6)\n',
    "import time\ntime.sleep(30)\n"]
RUNNER_ANSWERS = ["handler_has_globals", "zeroes_in_place", "appends", "kernel", "raises_surrogates", "raises_huge",
                  "returns_surrogates"]


@pytest.fixture(scope="module")
def runner():
    with Submission(RUNNER_CELLS, RUNNER_ANSWERS, LIMITS, sandboxed=False) as submission:
        yield submission, answer_values(submission)


def test_cell_errors_cross_safe_and_bounded(runner):
    submission, _ = runner
    errors = {event["cell"]: event["error"] for event in submission.events}
    assert errors[1] == "ValueError: \\ud800 a lone surrogate"                       # attack 2, in a cell
    assert errors[2].startswith("E" * replies.MAX_TYPE_CHARS + ": mmm")               # attack 11, in a cell
    assert all(len(text) <= replies.MAX_TEXT_CHARS for text in errors.values()) and writable(submission.events)
    assert submission.stopped is None


def test_the_cell_timer_works_and_its_handler_leads_nowhere(runner):
    submission, answers = runner
    assert answers["handler_has_globals"] is False        # attack 1's way into the runner is closed
    errors = {event["cell"]: event["error"] for event in submission.events}
    assert errors[3] == "CellTimedOut: stopped after 2 s, the time limit of one cell"


def test_exceptions_cross_safe_and_bounded(runner):
    _, answers = runner
    with pytest.raises(ValueError) as raised:
        answers["raises_surrogates"]()
    assert str(raised.value) == "\\ud800" * 10 and writable(str(raised.value))
    with pytest.raises(SubmissionError) as raised:
        answers["raises_huge"]()
    assert type(raised.value).__name__ == "E" * replies.MAX_TYPE_CHARS
    assert len(str(raised.value)) == replies.MAX_TEXT_CHARS
    assert writable(answers["returns_surrogates"]())


def test_an_ordinary_call_cannot_change_the_graders_tensors(runner):
    _, answers = runner
    q, k, v = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)
    originals = [t.clone() for t in (q, k, v)]
    assert torch.equal(answers["zeroes_in_place"](q, k, v), torch.zeros(2, 3))
    assert all(torch.equal(t, original) for t, original in zip((q, k, v), originals))


def test_a_decoding_step_appends_to_the_graders_caches(runner):
    _, answers = runner
    caches = [KVCache(), KVCache()]
    assert answers["appends"](caches) == 2
    assert [len(cache) for cache in caches] == [2, 2] and torch.equal(caches[1].keys, torch.ones(1, 1, 2, 4))


def test_a_kernel_launch_writes_its_outputs_back(runner):
    submission, answers = runner
    assert submission.kinds["kernel"] == "kernel"
    out = torch.zeros(4)
    answers["kernel"][(1,)](out, 2.5)
    assert torch.equal(out, torch.full((4,), 2.5))


def test_a_submission_that_stops_reading_is_stopped_by_the_writes_deadline():
    # Attack 1: its request pipe shrunk to a page and the runner stopped, the call's 1 MiB request
    # cannot be written. Before writes had deadlines the call never returned.
    submission = Submission([BLOCKS_THE_PIPE, "def f(x):\n    return x.sum()\n"], ["f"], LIMITS, sandboxed=False)
    outcome: list = []

    def call_it():
        started = time.monotonic()
        try:
            answer_values(submission)["f"](torch.zeros(2**18))
        except SubmissionStopped as error:
            outcome.append((error, time.monotonic() - started))

    caller = threading.Thread(target=call_it, daemon=True)
    try:
        assert submission.stopped is None, submission.stopped
        caller.start()
        caller.join(timeout=LIMITS.call_seconds + 10)
        hung = caller.is_alive()
    finally:
        submission.close()                          # a hung write ends here, its pipe's reader killed
    assert not hung, "the grader's write to a submission that stopped reading did not return"
    ((error, seconds),) = outcome
    assert "it stopped reading the grader's requests: a call of f ran past 2 s" in str(error)
    assert seconds < LIMITS.call_seconds + 3


CHILDREN = '''
_children = []
for _ in range(2):
    _pid = _os.fork()
    if _pid == 0:
        _time.sleep(600)
        _os._exit(0)
    _children.append(_pid)
print("CHILDREN", *_children, flush=True)
'''


def alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")                  # a zombie is dead, only not yet collected by its parent


@pytest.mark.parametrize("events, tensors", [
    ("None", "None"),                                       # attack 3
    (TENSOR_EVENT, '{"t0": torch.ones(3)}'),                # attack 2: a tensor in the events
], ids=["events-none", "tensor-in-events"])
def test_a_malformed_setup_reply_stops_that_notebook_and_all_its_processes(events, tensors):
    cell = "import torch\n" + forged_setup(events, tensors=tensors, children=CHILDREN)
    with Submission([cell], ["f"], LIMITS, sandboxed=False) as submission:     # raises nothing
        assert MALFORMED in submission.stopped and submission.kinds == {} and answer_values(submission) == {}
    (line,) = [line for line in submission.output.splitlines() if line.startswith("CHILDREN")]
    children = [int(pid) for pid in line.split()[1:]]
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(children) == 2 and not any(alive(pid) for pid in children)


def test_a_malformed_call_reply_is_a_stop_not_an_exception_of_the_grader():
    # A device tag the grader refuses, in a call's reply forged by the answer itself.
    cell = FORGES_A_REPLY + ('import time\n'
                             'def f():\n'
                             '    forge({"dict": [["value", {"device": "warp:9"}], ["after", {"list": []}],'
                             ' ["forbidden", {"list": []}]]})\n'
                             '    time.sleep(600)\n')
    with Submission([cell], ["f"], LIMITS, sandboxed=False) as submission:
        f = answer_values(submission)["f"]
        with pytest.raises(SubmissionStopped, match="malformed reply"):
            f()
        assert "device" in submission.stopped and writable(submission.stopped)


def test_a_constructor_that_fails_leaves_no_process_behind(monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("the setup message could not be made")

    before = set(process_tree(os.getpid()))
    monkeypatch.setattr(wire, "encode", fails)          # fails after the process started
    with pytest.raises(RuntimeError, match="could not be made"):
        Submission(["x = 1"], ["x"], LIMITS, sandboxed=False)
    assert set(process_tree(os.getpid())) - before == set()
