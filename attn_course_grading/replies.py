"""What a submission may send back: the shape of every reply, checked before the grader reads it.

A reply comes from the student's process, whose code the student can replace, so
:mod:`~attn_course_grading.wire` guarantees only that it is data. This module says which data:

- the **setup** reply, once, after the notebook ran (:func:`setup_reply`)::

      {"events": [{"cell": int, "error": str}, ...],      # at most MAX_EVENTS
       "kinds": {answer: "function" | "kernel" | "value" | "missing"}}

- a **call** reply, to each call of an answer or read of a value (:func:`call_reply`)::

      {"value": data, "after": [data or None, ...], "forbidden": [[called, rule], ...]}
      {"error": {"type": identifier, "message": str}}

Any other shape (a key missing or extra, a list too long, a ``str`` or ``int`` subclass, a tensor
in the events) is :class:`MalformedReply`, and the grader stops that notebook. A string the student's
code may legitimately send (an exception's message) is kept but made valid UTF-8 and cut short, so
that no reply can break the grades' files or blow up their size.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import torch

#: What a name a notebook was asked for can be.
KINDS = ("function", "kernel", "value", "missing")
#: The most failed cells one setup reply may report (the runner reports at most this many).
MAX_EVENTS = 200
#: The longest cell error or exception message kept, in characters.
MAX_TEXT_CHARS = 2000
#: The longest exception type name kept (a longer one is cut; one that is not an identifier is ``Error``).
MAX_TYPE_CHARS = 100
#: The most forbidden calls one call reply may report, and the longest name of one.
MAX_FORBIDDEN = 100
MAX_CALLED_CHARS = 200
#: The longest string kept inside a returned value (no exercise returns text anywhere near it).
MAX_VALUE_TEXT_CHARS = 10_000
#: How deep a returned value may nest (what :mod:`~attn_course_grading.wire` lets through).
_MAX_DEPTH = 40


class MalformedReply(ValueError):
    """A reply that does not have the shape the protocol gives it (the message says where)."""


def safe_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters (a cut text ends with ``…``) and made valid
    UTF-8: a lone surrogate (``"\\ud800"``, which UTF-8 cannot hold) becomes its backslash escape.

    Raises:
        TypeError: ``text`` is not a plain ``str`` (a subclass's methods are the student's), or
            ``limit`` not an int.
        ValueError: ``limit`` is below 1.

    Example:
        >>> safe_text("bad \\ud800 byte", 100)
        'bad \\\\ud800 byte'
        >>> safe_text("x" * 50, 10)
        'xxxxxxxxx…'
    """
    if type(text) is not str:
        raise TypeError(f"safe_text: text must be a str, got {type(text).__name__}")
    if type(limit) is not int:
        raise TypeError(f"safe_text: limit must be an int, got {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"safe_text: limit must be >= 1, got {limit}")
    # Cut first (a reply's string may be hundreds of megabytes), escape, cut again (an escape is longer).
    text = text[:limit + 1].encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def safe_name(name: str) -> str:
    """An exception type's name as it may cross: ``name`` cut to :data:`MAX_TYPE_CHARS`
    characters if it is a plain ``str`` and an identifier (a prefix of one is one), else ``"Error"``.

    Example:
        >>> safe_name("NotMine"), safe_name("not a name"), len(safe_name("E" * 10**6))
        ('NotMine', 'Error', 100)
    """
    if type(name) is not str:
        return "Error"
    name = name[:MAX_TYPE_CHARS]
    return name if name.isidentifier() else "Error"


def setup_reply(reply: object, answers: Collection[str], cells: int) -> tuple[list[dict], dict[str, str]]:
    """The events and the answers' kinds of the setup reply, checked and made safe.

    Args:
        reply: the decoded reply.
        answers: the names the grader asked for (each must have a kind, and nothing else).
        cells: how many cells the notebook has (an event names one of them).

    Returns:
        ``(events, kinds)``, each error made safe (:func:`safe_text`, :data:`MAX_TEXT_CHARS`).

    Raises:
        MalformedReply: ``reply`` is not of that shape (named in the message).
        TypeError: ``answers`` is not a collection of strings, or ``cells`` not an int.

    Example:
        >>> setup_reply({"events": [{"cell": 1, "error": "ValueError: \\ud800"}], "kinds": {"f": "function"}},
        ...             ["f"], cells=3)
        ([{'cell': 1, 'error': 'ValueError: \\\\ud800'}], {'f': 'function'})
    """
    if isinstance(answers, str) or not all(type(name) is str for name in answers):
        raise TypeError("setup_reply: answers must be a collection of strings")
    if type(cells) is not int or cells < 0:
        raise TypeError(f"setup_reply: cells must be an int >= 0, got {cells!r}")
    _keys(reply, {"events", "kinds"}, "the setup reply")
    events, kinds = reply["events"], reply["kinds"]
    if type(events) is not list:
        raise MalformedReply(f"its events are a {_kind(events)}, not a list")
    if len(events) > MAX_EVENTS:
        raise MalformedReply(f"it reported {len(events)} events, more than {MAX_EVENTS}")
    checked = []
    for index, event in enumerate(events):
        _keys(event, {"cell", "error"}, f"events[{index}]")
        cell, error = event["cell"], event["error"]
        if type(cell) is not int or not 0 <= cell < cells:
            raise MalformedReply(f"events[{index}] names cell {_short(cell)}, not one of its {cells} cells")
        checked.append({"cell": cell, "error": _text(error, MAX_TEXT_CHARS, f"events[{index}].error")})
    if type(kinds) is not dict:
        raise MalformedReply(f"its kinds are a {_kind(kinds)}, not a dict")
    names = set(answers)
    if not all(type(name) is str for name in kinds) or set(kinds) != names:
        raise MalformedReply("its kinds are not one for each answer asked for")
    for name, kind in kinds.items():
        if type(kind) is not str or kind not in KINDS:
            raise MalformedReply(f"the kind of {name} is {_short(kind)}, not one of {', '.join(KINDS)}")
    return checked, {name: kinds[name] for name in answers}


def call_reply(reply: object, *, arguments: int, rules: Collection[str] = ()) -> dict:
    """A call reply, checked and made safe.

    Args:
        reply: the decoded reply.
        arguments: how many positional arguments the call was given (``after`` has at most one
            entry for each; 0 for a read of a value).
        rules: the names of the forbidden-call rules the call was watched under (the only ones
            the reply may report).

    Returns:
        The reply, its strings made safe (:data:`MAX_VALUE_TEXT_CHARS`; an error's message
        :data:`MAX_TEXT_CHARS`, its type :func:`safe_name`).

    Raises:
        MalformedReply: ``reply`` is not of either shape (named in the message).
        TypeError: ``arguments`` is not an int >= 0, or ``rules`` not a collection of strings.

    Example:
        >>> call_reply({"error": {"type": "Value Error", "message": "no"}}, arguments=1)
        {'error': {'type': 'Error', 'message': 'no'}}
        >>> call_reply({"value": [1, "two"], "after": [None], "forbidden": []}, arguments=1)["value"]
        [1, 'two']
    """
    if type(arguments) is not int or arguments < 0:
        raise TypeError(f"call_reply: arguments must be an int >= 0, got {arguments!r}")
    if isinstance(rules, str) or not all(type(rule) is str for rule in rules):
        raise TypeError("call_reply: rules must be a collection of strings")
    if type(reply) is dict and set(reply) == {"error"}:
        error = reply["error"]
        _keys(error, {"type", "message"}, "the error")
        if type(error["type"]) is not str:
            raise MalformedReply(f"the error's type is a {_kind(error['type'])}, not a str")
        return {"error": {"type": safe_name(error["type"]),
                          "message": _text(error["message"], MAX_TEXT_CHARS, "the error's message")}}
    _keys(reply, {"value", "after", "forbidden"}, "the reply")
    after, forbidden = reply["after"], reply["forbidden"]
    if type(after) is not list or len(after) > arguments:
        raise MalformedReply(f"its changed arguments are a {_kind(after)} of {_length(after)}, "
                             f"not a list of at most {arguments}")
    if type(forbidden) is not list or len(forbidden) > MAX_FORBIDDEN:
        raise MalformedReply(f"its forbidden calls are a {_kind(forbidden)} of {_length(forbidden)}, "
                             f"not a list of at most {MAX_FORBIDDEN}")
    seen = []
    for index, pair in enumerate(forbidden):
        if type(pair) not in (list, tuple) or len(pair) != 2:
            raise MalformedReply(f"forbidden[{index}] is not a pair [called, rule]")
        called = _text(pair[0], MAX_CALLED_CHARS, f"forbidden[{index}][0]")
        if type(pair[1]) is not str or pair[1] not in rules:
            raise MalformedReply(f"forbidden[{index}] names a rule the call was not watched under")
        seen.append([called, pair[1]])
    return {"value": _safe_value(reply["value"], "the value", 0),
            "after": [_safe_value(item, f"after[{index}]", 0) for index, item in enumerate(after)],
            "forbidden": seen}


def _keys(value: object, keys: set[str], where: str) -> None:
    if type(value) is not dict:
        raise MalformedReply(f"{where} is a {_kind(value)}, not a dict")
    if set(value) != keys:
        raise MalformedReply(f"{where} has the keys {_short(sorted(str(key)[:40] for key in list(value)[:10]))}, "
                             f"not {sorted(keys)}")


def _text(value: object, limit: int, where: str) -> str:
    if type(value) is not str:
        raise MalformedReply(f"{where} is a {_kind(value)}, not a str")
    return safe_text(value, limit)


def _safe_value(value: object, where: str, depth: int) -> object:
    """``value`` with every string made safe; anything but plain data of the wire's types is malformed."""
    if depth > _MAX_DEPTH:
        raise MalformedReply(f"{where} is nested more than {_MAX_DEPTH} levels deep")
    kind = type(value)
    if value is None or value is Ellipsis or kind in (bool, int, float, torch.dtype, torch.device, torch.Tensor,
                                                     np.ndarray):
        return value
    if kind is str:
        return safe_text(value, MAX_VALUE_TEXT_CHARS)
    if kind in (list, tuple):
        items = [_safe_value(item, where, depth + 1) for item in value]
        return items if kind is list else tuple(items)
    if kind is dict:
        if not all(type(key) in (str, int) for key in value):
            raise MalformedReply(f"{where} holds a dict whose keys are not plain strings or ints")
        return {safe_text(key, MAX_VALUE_TEXT_CHARS) if type(key) is str else key: _safe_value(item, where, depth + 1)
                for key, item in value.items()}
    raise MalformedReply(f"{where} holds a {_kind(value)}, which is not data")


def _kind(value: object) -> str:
    """A type's name, for a message: bounded and safe (a type's name is the student's to choose)."""
    return safe_text(type(value).__qualname__, 60) if type(type(value).__qualname__) is str else "value"


def _length(value: object) -> str:
    try:
        return f"length {len(value)}"
    except Exception:  # noqa: BLE001 - a value without a length is described without one
        return "no length"


def _short(value: object) -> str:
    """A value, for a message: only plain numbers and strings are shown, cut short."""
    if type(value) is str:
        return safe_text(repr(value[:80]), 80)
    if type(value) in (bool, int, float) or (type(value) is list and all(type(v) is str for v in value)):
        return safe_text(repr(value), 80)       # (an int's repr is bounded: JSON's ints are under 4300 digits)
    return f"a {_kind(value)}"
