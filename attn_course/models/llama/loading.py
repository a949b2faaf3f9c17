"""Hugging Face Llama and Mistral checkpoints into a :class:`~attn_course.models.llama.LlamaForCausalLM`,
checked by name.

Mistral's weights have Llama's names and shapes; its config adds ``sliding_window``, which the
model applies in every block (``tests/variants/test_sliding_window.py`` checks it against
``MistralForCausalLM``).

A checkpoint folder holds ``config.json`` and ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``). The config is checked field by field
(:meth:`LlamaConfig.from_dict <attn_course.models.llama.LlamaConfig.from_dict>`); the weights are read
with ``safetensors`` only, never with pickle, and every name and shape must match the model
before anything is copied. All problems are listed at once, by name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import torch

from attn_course import _validate
from attn_course.models.bert.weights import read_safetensors
from attn_course.models.llama.config import LlamaConfig
from attn_course.models.llama.model import LlamaForCausalLM

__all__ = ["LAYER_NAMES", "TOP_NAMES", "hugging_face_name", "match_hugging_face", "load_pretrained"]

#: Our module names to Hugging Face's, within one decoder block.
LAYER_NAMES = {
    "attention_norm": "input_layernorm",
    "attention.q_proj": "self_attn.q_proj",
    "attention.k_proj": "self_attn.k_proj",
    "attention.v_proj": "self_attn.v_proj",
    "attention.out_proj": "self_attn.o_proj",
    "feed_forward_norm": "post_attention_layernorm",
    "feed_forward.gate": "mlp.gate_proj",
    "feed_forward.up": "mlp.up_proj",
    "feed_forward.down": "mlp.down_proj",
}

#: Our module names to Hugging Face's, outside the blocks.
TOP_NAMES = {
    "model.embedding": "model.embed_tokens",
    "model.final_norm": "model.norm",
    "lm_head": "lm_head",
}


def hugging_face_name(name: str) -> str:
    """The Hugging Face name of one of :class:`~attn_course.models.llama.LlamaForCausalLM`'s parameters.

    Args:
        name: a key of ``LlamaForCausalLM.state_dict()``.

    Returns:
        the key of the same tensor in a Hugging Face ``LlamaForCausalLM`` checkpoint.

    Raises:
        TypeError: ``name`` not a str.
        ValueError: a name that is not one of ``LlamaForCausalLM``'s parameters.

    Example:
        >>> hugging_face_name("model.blocks.3.feed_forward.gate.weight")
        'model.layers.3.mlp.gate_proj.weight'
        >>> hugging_face_name("model.final_norm.weight")
        'model.norm.weight'
    """
    if not isinstance(name, str):
        raise TypeError(f"hugging_face_name: name must be a str, got {type(name).__name__}")
    module, _, parameter = name.rpartition(".")
    if module in TOP_NAMES and parameter == "weight":
        return f"{TOP_NAMES[module]}.weight"
    parts = module.split(".")
    if parts[:2] == ["model", "blocks"] and len(parts) > 2 and parts[2].isdigit() and parameter == "weight":
        inner = ".".join(parts[3:])
        if inner in LAYER_NAMES:
            return f"model.layers.{parts[2]}.{LAYER_NAMES[inner]}.weight"
    raise ValueError(f"hugging_face_name: {name!r} is not a parameter of LlamaForCausalLM")


def match_hugging_face(
    stored: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    *,
    tied: bool,
    source: str,
    caller: str = "match_hugging_face",
) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face Llama checkpoint's tensors to our names, checking every name and shape.

    Accepted beside the exact names: a bare ``LlamaModel`` checkpoint (names without the
    ``model.`` prefix), the ``rotary_emb.inv_freq`` buffers that old checkpoints stored (ignored:
    the frequencies come from the config), and with tied embeddings an ``lm_head.weight`` equal to
    the embedding matrix (Hugging Face leaves it out; equal, it says nothing new).

    Args:
        stored: the checkpoint, ``{Hugging Face name: tensor}``.
        expected: ``LlamaForCausalLM.state_dict()``, ``{our name: tensor}`` (for names and shapes).
        tied: whether the config ties the LM head to the embedding (then ``lm_head.weight`` is not
            read).
        source: where ``stored`` came from, for error messages.
        caller: the name that error messages start with (the public function that was called).

    Returns:
        ``{our name: stored tensor}`` for every name of ``expected`` (but ``lm_head.weight`` when tied).

    Raises:
        TypeError: ``tied`` not a bool.
        ValueError: missing, unexpected or wrongly shaped weights, non-floating ones, or an
            ``lm_head.weight`` that differs from the embedding of a tied model; all of them listed.

    Example:
        >>> expected = {"model.final_norm.weight": torch.ones(4)}
        >>> match_hugging_face({"model.norm.weight": torch.zeros(4)}, expected, tied=False, source="file")
        {'model.final_norm.weight': tensor([0., 0., 0., 0.])}
    """
    tied = _validate.boolean(caller, "tied", tied)
    if not any(name.startswith("model.") for name in stored) and "embed_tokens.weight" in stored:
        stored = {f"model.{name}": tensor for name, tensor in stored.items()}   # a bare LlamaModel
    stored = {name: tensor for name, tensor in stored.items() if not name.endswith("rotary_emb.inv_freq")}
    theirs_for = {ours: hugging_face_name(ours) for ours in expected if not (tied and ours == "lm_head.weight")}
    problems = []
    if tied and "lm_head.weight" in stored:
        embedding = stored.get("model.embed_tokens.weight")
        if embedding is None or not torch.equal(stored["lm_head.weight"], embedding):
            problems.append("tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight")
        stored = {name: tensor for name, tensor in stored.items() if name != "lm_head.weight"}
    wanted = set(theirs_for.values())
    missing = sorted(wanted - set(stored))
    unexpected = sorted(set(stored) - wanted)
    wrong_shape = [f"{theirs} {list(stored[theirs].shape)} (expected {list(expected[ours].shape)})"
                   for ours, theirs in theirs_for.items()
                   if theirs in stored and stored[theirs].shape != expected[ours].shape]
    not_floating = [f"{name} ({stored[name].dtype})" for name in sorted(wanted & set(stored))
                    if not stored[name].is_floating_point()]
    if missing:
        problems.append(f"missing weight(s): {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected weight(s): {', '.join(unexpected)}")
    if wrong_shape:
        problems.append(f"wrong shape(s): {', '.join(wrong_shape)}")
    if not_floating:
        problems.append(f"non-floating weight(s): {', '.join(not_floating)}")
    if problems:
        raise ValueError(f"{caller}: {source} does not fit the model: " + "; ".join(problems))
    return {ours: stored[theirs] for ours, theirs in theirs_for.items()}


def load_pretrained(folder: str | os.PathLike, *, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """Load a Hugging Face Llama or Mistral checkpoint folder into a
    :class:`~attn_course.models.llama.LlamaForCausalLM`.

    Offline: nothing is read from the network. A Mistral folder (``model_type`` ``"mistral"``)
    gives a model whose ``config.sliding_window`` is the checkpoint's window (None for full causal
    attention).

    Args:
        folder: holds ``config.json`` and ``model.safetensors`` (or ``model.safetensors.index.json``
            and the shards it lists), as ``save_pretrained(folder, safe_serialization=True)`` writes.
        dtype: the model's floating dtype; stored weights (often bfloat16) are converted to it.

    Returns:
        the model, in eval mode.

    Raises:
        TypeError: ``folder`` not a str or path, ``dtype`` not a floating ``torch.dtype``.
        FileNotFoundError: no such folder, or a file missing (named).
        NotADirectoryError: ``folder`` is a file.
        ValueError: a config field this implementation does not support (named, see
            :meth:`LlamaConfig.from_dict <attn_course.models.llama.LlamaConfig.from_dict>`), or weights
            whose names or shapes do not fit the config (all listed, see :func:`match_hugging_face`).

    Example:
        >>> import contextlib, io, tempfile, transformers
        >>> folder = tempfile.mkdtemp()
        >>> reference = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        ...     vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        ...     num_attention_heads=4, num_key_value_heads=2))
        >>> with contextlib.redirect_stderr(io.StringIO()):            # the progress bar
        ...     reference.save_pretrained(folder, safe_serialization=True)
        >>> model = load_pretrained(folder)
        >>> model.config.num_key_value_heads, model.training
        (2, False)
    """
    where = "load_pretrained"
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{where}: dtype must be a floating torch.dtype (e.g. torch.float32), got {dtype!r}")
    folder = _validate.path(where, "folder", folder)
    if not folder.exists():
        raise FileNotFoundError(f"{where}: the model folder {folder} does not exist")
    if not folder.is_dir():
        raise NotADirectoryError(f"{where}: {folder} is not a folder; pass the folder that holds "
                                 "config.json and model.safetensors")
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{where}: {folder} lacks config.json")
    config = LlamaConfig.from_json_file(folder / "config.json")
    stored, source = _read_weights(where, folder)

    model = LlamaForCausalLM(config).to(dtype)
    state = model.state_dict()
    matched = match_hugging_face(stored, state, tied=config.tie_word_embeddings, source=source, caller=where)
    with torch.no_grad():
        for name, tensor in matched.items():
            state[name].copy_(tensor)                                  # converts to the model's dtype
    return model.eval()


def _read_weights(where: str, folder) -> tuple[dict[str, torch.Tensor], str]:
    """Every tensor of the folder's ``model.safetensors``, or of the shards its index lists."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return read_safetensors(single, caller=where), str(single)
    if not index.is_file():
        hint = ""
        if (folder / "pytorch_model.bin").exists():
            hint = (" (pytorch_model.bin is there, but it is a pickle, which this loader never opens; "
                    "convert it to safetensors first)")
        raise FileNotFoundError(f"{where}: {folder} lacks model.safetensors (or model.safetensors.index.json){hint}")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{where}: {index} is not a safetensors index with a weight_map: {error}") from None
    stored = {}
    for shard in sorted(set(weight_map.values())):
        stored.update(read_safetensors(folder / shard, caller=where))
    return stored, f"{folder} (shards of {index.name})"
