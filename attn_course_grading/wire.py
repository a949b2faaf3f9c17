"""What crosses between a sandboxed submission and the grader: data, never code.

Every message is one safetensors blob: the tensors as raw bytes, the structure around them as JSON
in its metadata. Nothing is unpickled, so reading a message can run no code. Two course objects may
also travel *to* a submission, since chapter 04's exercise is called with them (a
:class:`~attn_course.models.tiny_language_model.TinyLanguageModel` and a
:class:`~attn_course.core.kv_cache.KVCache`), rebuilt from their data; the grader never accepts them
back (``objects=False``).

    structure := null | true | false | number | string            (JSON as it is)
               | {"tensor": i} | {"leaf": i}                       (the i-th tensor of the blob;
                                                                     a leaf requires grad)
               | {"list": [...]} | {"tuple": [...]} | {"dict": [[key, value], ...]}
               | {"float": "nan" | "inf" | "-inf"} | {"ellipsis": true}
               | {"dtype": "float32"} | {"device": "cpu"} | {"ndarray": i}
               | {"kv_cache": {...}} | {"tiny_language_model": {...}}

Example:
    >>> blob = encode({"q": torch.ones(2, 3), "n": 4, "dtype": torch.float64})
    >>> decoded = decode(blob)
    >>> decoded["q"].shape, decoded["n"], decoded["dtype"]
    (torch.Size([2, 3]), 4, torch.float64)
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import safetensors.torch
import torch

#: The largest message either side reads: far above any exercise's tensors, far below a machine.
MAX_MESSAGE_BYTES = 256 * 2**20
#: Nesting deeper than this is refused, so that a reply cannot exhaust the reader's stack.
MAX_DEPTH = 32
#: The largest structure (the JSON around the tensors) a message may hold: an exercise's needs a few
#: kilobytes, and 16 MiB of JSON can already become more than a gigabyte of Python objects.
MAX_STRUCTURE_BYTES = 16 * 2**20
#: The devices a message may name (a device tag is data, never a way to reach a device's code).
_DEVICE = re.compile(r"(cpu|cuda|meta)(:[0-9]{1,3})?")

_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
    torch.int32, torch.int64, torch.bool,
)}


class NotData(TypeError):
    """A value that cannot cross as data (a function, a module, an open file, a complex tensor...)."""


def encode(value: object, *, objects: bool = False) -> bytes:
    """Turn ``value`` into one message.

    Args:
        value: nested lists, tuples, dicts (str or int keys) of tensors, NumPy arrays, numbers,
            strings, bools, None, ``...``, dtypes and devices.
        objects: also allow ``KVCache`` and ``TinyLanguageModel`` (only the grader sends these).

    Raises:
        NotData: ``value`` holds something else (named in the message).
    """
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(value, tensors, objects, depth=0)
    metadata = {"structure": json.dumps(structure, allow_nan=False)}
    return safetensors.torch.save(tensors, metadata=metadata)


def decode(blob: bytes, *, objects: bool = False) -> object:
    """The value :func:`encode` turned into ``blob``.

    Args:
        blob: one message.
        objects: rebuild ``KVCache`` and ``TinyLanguageModel``; otherwise a message holding one is
            refused (the grader reads a submission's replies so).

    Raises:
        TypeError: ``blob`` is not bytes.
        ValueError: every problem with the bytes (not a message; too large, deep or malformed; a
            dtype that does not cross, a device that does not exist), so a reader catches only it.
    """
    if not isinstance(blob, (bytes, bytearray)):
        raise TypeError(f"decode: blob must be bytes, got {type(blob).__name__}")
    if len(blob) > MAX_MESSAGE_BYTES:
        raise ValueError(f"decode: a message of {len(blob)} bytes is larger than {MAX_MESSAGE_BYTES}")
    try:
        tensors = safetensors.torch.load(bytes(blob))
        header_length = int.from_bytes(blob[:8], "little")
        metadata = json.loads(bytes(blob[8:8 + header_length])).get("__metadata__", {})
        text = metadata["structure"]
        if not isinstance(text, str) or len(text) > MAX_STRUCTURE_BYTES:
            raise ValueError(f"a structure larger than {MAX_STRUCTURE_BYTES} bytes")
        structure = json.loads(text)
    except Exception as error:  # noqa: BLE001 - whatever is wrong with the bytes, say so plainly
        raise ValueError(f"decode: not a grading message ({type(error).__name__}: {str(error)[:200]})") from None
    try:
        return _decode(structure, tensors, objects, depth=0)
    except ValueError:
        raise
    except Exception as error:  # noqa: BLE001 - a tensor or object that will not rebuild is malformed too
        raise ValueError(f"decode: a value that does not rebuild ({type(error).__name__}: "
                         f"{str(error)[:200]})") from None


def _encode(value, tensors, objects, depth):
    if depth > MAX_DEPTH:
        raise NotData(f"a value nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, np.bool_):
        return bool(value)
    if value is Ellipsis:
        return {"ellipsis": True}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.Tensor):   # a tensor that requires grad stays one on the other side
        return {"leaf" if value.requires_grad else "tensor": _add_tensor(value, tensors)}
    if isinstance(value, np.ndarray):
        return {"ndarray": _add_tensor(torch.from_numpy(np.ascontiguousarray(value)), tensors)}
    if isinstance(value, (list, tuple)):   # torch.Size is a tuple
        items = [_encode(item, tensors, objects, depth + 1) for item in value]
        return {"list": items} if isinstance(value, list) else {"tuple": items}
    if isinstance(value, dict):
        if not all(isinstance(key, (str, int)) for key in value):
            raise NotData("a dict whose keys are not all strings or ints")
        return {"dict": [[key, _encode(item, tensors, objects, depth + 1)] for key, item in value.items()]}
    if objects:
        from attn_course.core.kv_cache import KVCache
        from attn_course.models.tiny_language_model import TinyLanguageModel

        if type(value) is KVCache:
            state = {"max_length": value.max_length, "length": len(value)}
            if len(value):
                state["keys"] = _add_tensor(value.keys, tensors)
                state["values"] = _add_tensor(value.values, tensors)
            return {"kv_cache": state}
        if type(value) is TinyLanguageModel:
            weights = {name: _add_tensor(t, tensors) for name, t in value.state_dict().items()}
            return {"tiny_language_model": {"config": dataclasses.asdict(value.config),
                                            "training": value.training, "weights": weights}}
    raise NotData(f"a {type(value).__module__}.{type(value).__qualname__}, which is not data "
                  "(tensors, arrays, numbers, strings, lists, tuples and dicts of them)")


def _add_tensor(tensor: torch.Tensor, tensors: dict) -> int:
    if tensor.is_complex() or tensor.is_sparse or tensor.dtype not in _DTYPES.values():
        raise NotData(f"a tensor of dtype {tensor.dtype}{' (sparse)' if tensor.is_sparse else ''}; "
                      f"only {', '.join(_DTYPES)} cross")
    index = len(tensors)
    tensors[f"t{index}"] = tensor.detach().to("cpu").contiguous().clone()
    return index


def _decode(structure, tensors, objects, depth):
    if depth > MAX_DEPTH:
        raise ValueError(f"decode: nested more than {MAX_DEPTH} levels deep")
    if structure is None or isinstance(structure, (bool, int, float, str)):
        return structure
    if isinstance(structure, dict) and len(structure) == 1:
        ((tag, body),) = structure.items()
        if tag == "tensor":
            return _tensor(tensors, body)
        if tag == "leaf":
            tensor = _tensor(tensors, body)
            return tensor.requires_grad_() if tensor.is_floating_point() else tensor
        if tag == "ndarray":
            tensor = _tensor(tensors, body)
            if tensor.dtype == torch.bfloat16:
                raise ValueError("decode: a NumPy array of dtype bfloat16, which NumPy does not have")
            return tensor.numpy()
        if tag in ("list", "tuple") and isinstance(body, list):
            items = [_decode(item, tensors, objects, depth + 1) for item in body]
            return items if tag == "list" else tuple(items)
        if tag == "dict" and isinstance(body, list):
            pairs = {}
            for pair in body:
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (str, int))):
                    raise ValueError("decode: a dict entry that is not [key, value]")
                pairs[pair[0]] = _decode(pair[1], tensors, objects, depth + 1)
            return pairs
        if tag == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "ellipsis":
            return Ellipsis
        if tag == "dtype" and body in _DTYPES:
            return _DTYPES[body]
        if tag == "device" and isinstance(body, str):
            if not _DEVICE.fullmatch(body):
                raise ValueError(f"decode: a device {body[:40]!r}; only cpu, cuda and meta are named")
            return torch.device(body)
        if tag in ("kv_cache", "tiny_language_model") and objects and isinstance(body, dict):
            return _object(tag, body, tensors)
    raise ValueError(f"decode: unexpected {str(structure)[:80]!r} in a message")


def _tensor(tensors: dict, index: object) -> torch.Tensor:
    if type(index) is not int or f"t{index}" not in tensors:
        raise ValueError(f"decode: a message names tensor {str(index)[:40]!r}, which it does not hold")
    tensor = tensors[f"t{index}"]
    if tensor.dtype not in _DTYPES.values():
        # safetensors reads more dtypes (float8, uint16...): refused as the encoder refuses them.
        raise ValueError(f"decode: a tensor of dtype {tensor.dtype}; only {', '.join(_DTYPES)} cross")
    return tensor


def _object(tag: str, body: dict, tensors: dict) -> object:
    from attn_course.core.kv_cache import KVCache
    from attn_course.models.tiny_language_model import LanguageModelConfig, TinyLanguageModel

    if tag == "kv_cache":
        cache = KVCache(body["max_length"])
        if body["length"]:
            cache.append(_tensor(tensors, body["keys"]), _tensor(tensors, body["values"]))
        return cache
    model = TinyLanguageModel(LanguageModelConfig(**body["config"]))
    model.load_state_dict({name: _tensor(tensors, index) for name, index in body["weights"].items()})
    return model.train(body["training"])


def update_in_place(original: object, after: object, *, tensors: bool = False) -> None:
    """Make ``original`` (an argument the grader passed) what the submission's call left it as,
    where changing it is the call's job: a Triton kernel's outputs, a decoding step's caches (chapter
    04). Any other change stays in the sandbox (:class:`~attn_course_grading.proxies.RemoteFunction`).

    Args:
        original: a tensor, a :class:`~attn_course.core.kv_cache.KVCache`, or a list or tuple of
            them; anything else is left as it is.
        after: what the submission sent back for it: a tensor, :func:`cache_state`'s dict, a list
            of those (None for an item left unchanged), or None.
        tensors: copy tensors too (a kernel launch); otherwise only caches are updated.

    Raises:
        ValueError: ``after`` does not fit ``original`` (another type, shape or length), or changes
            a cache other than by appending to it.
    """
    from attn_course.core.kv_cache import KVCache

    if after is None:
        return
    if isinstance(original, torch.Tensor):
        if not tensors:
            return                        # an ordinary call's change of a tensor stays in the sandbox
        if not isinstance(after, torch.Tensor) or after.shape != original.shape:
            raise ValueError("the submission sent back a changed argument of another type or shape")
        with torch.no_grad():
            original.copy_(after.to(original.dtype))
    elif isinstance(original, (list, tuple)):
        if not isinstance(after, (list, tuple)) or len(after) != len(original):
            raise ValueError("the submission sent back a changed list of another length")
        for item, item_after in zip(original, after):
            update_in_place(item, item_after, tensors=tensors)
    elif type(original) is KVCache:
        _append_to_cache(original, after)


def _append_to_cache(cache, after: object) -> None:
    """Append to ``cache`` the tokens ``after`` (a cache's state, as data) holds beyond it."""
    if not (isinstance(after, dict) and type(after.get("length")) is int and after["length"] >= 0
            and set(after) <= {"length", "keys", "values"}):
        raise ValueError("the submission sent back a cache that is not a cache")
    old, new = len(cache), after["length"]
    if new < old:
        raise ValueError("your function changed the tokens already in a cache; it may only append to it")
    if new == old:
        return
    keys, values = after.get("keys"), after.get("values")
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[2] == new for t in (keys, values)):
        raise ValueError("the submission sent back a cache whose keys and values do not hold its length")
    if old and not (keys.shape[:2] == cache.keys.shape[:2] and keys.shape[3] == cache.keys.shape[3]
                    and values.shape[:2] == cache.values.shape[:2] and values.shape[3] == cache.values.shape[3]
                    and torch.equal(keys[:, :, :old].to(cache.keys.dtype), cache.keys)
                    and torch.equal(values[:, :, :old].to(cache.values.dtype), cache.values)):
        raise ValueError("your function changed the tokens already in a cache; it may only append to it")
    try:
        cache.append(keys[:, :, old:], values[:, :, old:])
    except (TypeError, ValueError) as error:
        raise ValueError(f"the submission sent back a cache that cannot be appended to ({error})") from None


def cache_state(cache: object) -> dict:
    """A :class:`~attn_course.core.kv_cache.KVCache` as data: ``{"length", "keys", "values"}``.

    Raises:
        TypeError: ``cache`` is not a cache (it has no length, keys and values).
    """
    if not all(hasattr(cache, name) for name in ("__len__", "keys", "values")):
        raise TypeError(f"cache_state: cache must be a KVCache, got {type(cache).__name__}")
    state: dict = {"length": len(cache)}
    if len(cache):
        state.update(keys=cache.keys, values=cache.values)
    return state
