"""Notebook cells that attack the grader's side of the sandbox protocol (issue 31), for a hostile class.

Each attack is code a student can hand in. The cells are written against the protocol, not
against how the runner (attn_course_grading/in_sandbox.py) happens to look today: they find the
pipes through ``/proc/self/fd``, and where a route into the runner is closed they take another.

- :data:`BLOCKS_THE_PIPE`: shrinks the request pipe to one page and stops the runner reading it
  at the first request too large to be written then (through the runner's globals, by the routes
  that once worked, and else by stopping its own process). The grader's write must have a deadline.
- :data:`FORGES_A_REPLY`: defines ``forge(structure, tensors)``, which writes a reply of its own
  making on the reply pipe (the JSON structure of :mod:`attn_course_grading.wire` as it is,
  so that it can hold what the encoder would refuse). The attacks below forge setup replies
  (``events: None``, a tensor in the events, a bfloat16 array, a device tag) and call replies
  (a flood of forbidden calls).

:data:`ATTACKS` gives them in the format of the end-to-end hostile class
(tests/grading/test_sandbox_grading.py's ``attacks()``: ``cell`` inserted after the imports,
``replace`` answers, ``after`` a cell after it, ``first`` prepended to the first cell) for
chapter 03, whose right answers score 11, with what grading each must give: ``score`` (the
total), ``stopped`` (a substring of the run's ``stopped``, or None for a run that must not be
stopped) and, for some, ``feedback_bytes_below`` (the size of the student's results file).
tests/grading/test_hostile_protocol.py runs the same cells against a :class:`Submission` directly.
"""

from __future__ import annotations

#: Finds the runner's pipes by what they are: the request pipe is the one pipe opened read-only,
#: the reply pipe the one opened write-only that is not standard error's.
FINDS_THE_PIPES = '''
import fcntl as _fcntl, os as _os, stat as _stat

def _pipes(mode):
    found, stderr = [], _os.fstat(2).st_ino
    for name in _os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            info = _os.fstat(fd)
            if (_stat.S_ISFIFO(info.st_mode) and info.st_ino != stderr
                    and _fcntl.fcntl(fd, _fcntl.F_GETFL) & _os.O_ACCMODE == mode):
                found.append(fd)
        except OSError:
            pass
    return found
'''

#: Attack 1: the request pipe shrunk to one page (F_SETPIPE_SZ); every request that fits in it
#: answered, and nothing read of the first that does not. That request then cannot be written:
#: before writes had deadlines, the grader blocked in its write forever (holding the lock under
#: which every submission's tests ran), and the whole class with it.
BLOCKS_THE_PIPE = FINDS_THE_PIPES + '''
import signal as _signal, sys as _sys, time as _time
from attn_course_grading import wire as _wire

_PAGE = 4096
# What a request must exceed to block its writer: the page, and the 8 KiB that the runner's
# buffered reader may already have taken from the pipe when it read the 8-byte length.
_BLOCKS = _PAGE + 8192 + 8
for _fd in _pipes(_os.O_RDONLY):
    try:
        _fcntl.fcntl(_fd, 1031, _PAGE)               # F_SETPIPE_SZ: one page
    except OSError:
        pass

def _big(header):
    """Whether ``header`` is a request's 8-byte length, of a request too large to be written."""
    return type(header) is bytes and len(header) == 8 and int.from_bytes(header, "little") > _BLOCKS

# Route 1, the one that worked: the runner's globals, through the cell timer's handler, through
# __main__ or up the frames; its read_message replaced by one that stops at a big request.
def _reads_until_a_big_request(stream):
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError
    if _big(header):
        _time.sleep(10**6)
    return _wire.decode(stream.read(int.from_bytes(header, "little")), objects=True)

_places = [getattr(_signal.getsignal(_signal.SIGALRM), "__globals__", None),
           getattr(_sys.modules.get("__main__"), "__dict__", None)]
_frame = _sys._getframe()
while _frame is not None:
    _places.append(_frame.f_globals)
    _frame = _frame.f_back
hijacked = 0
for _place in _places:
    if isinstance(_place, dict) and callable(_place.get("read_message")):
        _place["read_message"] = _reads_until_a_big_request
        hijacked += 1

# Route 2, whatever the runner binds where: once it has sent its setup reply (its first os.write),
# the process stops itself at the first C call it makes holding a big request's header. A process
# can always stop itself; only the grader's deadline helps then.
_replied = []

def _stop_at_a_big_request(frame, event, arg):
    if event != "c_call":
        return
    if not _replied:
        if arg is _os.write:
            _replied.append(True)
    elif any(_big(value) for value in frame.f_locals.values()):
        _sys.setprofile(None)
        _os.kill(_os.getpid(), _signal.SIGSTOP)

_sys.setprofile(_stop_at_a_big_request)
'''

#: Defines ``forge(structure, tensors=None)``: a reply of the student's own making on the reply pipe.
FORGES_A_REPLY = FINDS_THE_PIPES + '''
import json as _json
import safetensors.torch as _safetensors

def forge(structure, tensors=None):
    blob = _safetensors.save(tensors or {}, metadata={"structure": _json.dumps(structure)})
    (fd,) = _pipes(_os.O_WRONLY)
    _os.write(fd, len(blob).to_bytes(8, "little") + blob)
'''


def forged_setup(events: str, kinds: str = '{"dict": []}', tensors: str = "None", children: str = "",
                 wait: str = "_time.sleep(600)") -> str:
    """A cell that forges the setup reply ``{"events": <events>, "kinds": <kinds>}`` (wire
    structures, as Python source: ``None``, ``{"list": [...]}``...; ``tensors`` the source of the
    blob's ``{"t0": tensor}``), after running ``children`` (source that forks), then waits
    (``wait``) for the grader to read its reply."""
    return FORGES_A_REPLY + f'''
import time as _time
{children}
forge({{"dict": [["events", {events}], ["kinds", {kinds}]]}}, {tensors})
{wait}
'''


#: Two children that each keep a core busy: they starved the classmate graded alongside while the
#: grader, its constructor raised, left the sandbox running until it exited.
CPU_BURNERS = '''
for _ in range(2):
    if _os.fork() == 0:
        while True:
            pass
'''

#: A call reply reporting a flood of forbidden calls (attack 11: they were kept whole).
FLOODS_FORBIDDEN = FORGES_A_REPLY + '''
import time as _time

def split_fused_qkv(qkv, num_heads, num_kv_heads):
    forge({"dict": [["value", None], ["after", {"list": []}],
                    ["forbidden", {"list": [{"list": ["torch.softmax" * 10, "rule"]}] * 20000}]]})
    _time.sleep(600)
'''

#: Lone surrogates in a cell's error and in an answer's exception: they crashed writing the results.
LONE_SURROGATES = 'raise ValueError("\\ud800 a lone surrogate \\udfff")\n'
RAISES_LONE_SURROGATES = ('def split_fused_qkv(qkv, num_heads, num_kv_heads):\n'
                          '    raise ValueError("\\ud800" * 100)\n')

#: Exception type names and messages of megabytes (attack 11: a 290 MB results file).
HUGE_EXCEPTION = ('_Huge = type("E" * 10**6, (Exception,), {})\n'
                  'raise _Huge("m" * 10**7)\n')
RAISES_HUGE_EXCEPTION = ('def split_fused_qkv(qkv, num_heads, num_kv_heads):\n'
                         '    raise type("E" * 10**6, (Exception,), {})("m" * 10**7)\n')

#: Changes an argument in place and returns what the changed arguments make right: chapter 03's
#: hidden grouped-query test computes its reference from _v after the call.
ZEROES_V_IN_PLACE = ('def grouped_query_attention(q, k, v):\n'
                     '    v.zero_()\n'
                     '    return torch.zeros_like(q)\n')

#: Events whose one error is a tensor (the blob's t0).
TENSOR_EVENT = '{"list": [{"dict": [["cell", 0], ["error", {"tensor": 0}]]}]}'

CHAPTER = "03_multi_head"
HONEST = 11.0
#: Points of the questions the attacks below replace an answer of.
Q1_POINTS, Q4_POINTS = 2.0, 2.0
MALFORMED = "it sent a malformed reply"

ATTACKS = {
    # 1: the class finishes (before writes had deadlines, tools/grade.py never returned); the
    # attacker answers every request under 12 KiB and is stopped by the deadline of the write of
    # the first larger one, q5's hidden test's (chapter 03's checks today: 9.5 points before it).
    "blocks_the_request_pipe": {"chapter": CHAPTER, "cell": BLOCKS_THE_PIPE,
                                "expect": {"score": 9.5, "stopped": "it stopped reading the grader's requests"}},
    # 2: strings that are not UTF-8 are escaped, not fatal: the run and its results are written,
    # and only the answer that raised loses its points.
    "lone_surrogates": {"chapter": CHAPTER, "cell": LONE_SURROGATES,
                        "replace": {"split_fused_qkv": RAISES_LONE_SURROGATES},
                        "expect": {"score": HONEST - Q1_POINTS, "stopped": None}},
    # (the grader kept an event's error as it came: a tensor, which no JSON writer takes)
    "tensor_in_setup_events": {"chapter": CHAPTER,
                               "cell": forged_setup(TENSOR_EVENT, tensors='{"t0": torch.ones(3)}'),
                               "expect": {"score": 0.0, "stopped": MALFORMED}},
    # 3: a malformed setup reply stops that notebook at once (its CPU burners with it): the
    # classmate graded alongside (the class's honest student) keeps full marks.
    "setup_events_none_and_cpu_burners": {"chapter": CHAPTER, "cell": forged_setup("None", children=CPU_BURNERS),
                                          "expect": {"score": 0.0, "stopped": MALFORMED}},
    "bfloat16_array_in_setup": {"chapter": CHAPTER,
                                "cell": forged_setup('{"list": []}', kinds='{"ndarray": 0}',
                                                     tensors='{"t0": torch.ones(2, dtype=torch.bfloat16)}'),
                                "expect": {"score": 0.0, "stopped": MALFORMED}},
    "device_tag_in_setup": {"chapter": CHAPTER, "cell": forged_setup('{"list": []}', kinds='{"device": "warp:9"}'),
                            "expect": {"score": 0.0, "stopped": MALFORMED}},
    # 11: every string that crosses back is bounded: the results file stays small.
    "floods_the_feedback": {"chapter": CHAPTER, "cell": HUGE_EXCEPTION,
                            "replace": {"split_fused_qkv": RAISES_HUGE_EXCEPTION},
                            "expect": {"score": HONEST - Q1_POINTS, "stopped": None, "feedback_bytes_below": 200_000}},
    "floods_forbidden_calls": {"chapter": CHAPTER, "replace": {"split_fused_qkv": FLOODS_FORBIDDEN},
                               "expect": {"score": 0.0, "stopped": MALFORMED, "feedback_bytes_below": 200_000}},
    # Mutation: an ordinary function's in-place change stays in the sandbox, so the hidden test's
    # reference is computed from the _v it drew, and the zeros are wrong.
    "zeroes_v_in_place": {"chapter": CHAPTER, "replace": {"grouped_query_attention": ZEROES_V_IN_PLACE},
                          "expect": {"score": HONEST - Q4_POINTS, "stopped": None}},
}
