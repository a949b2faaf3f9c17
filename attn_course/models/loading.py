"""One entry point for a Hugging Face decoder checkpoint: :func:`load_pretrained` reads the folder's
``model_type`` and builds the course's own model of that family.

- ``"llama"``, ``"mistral"``, ``"qwen3"``: a :class:`~attn_course.models.llama.LlamaForCausalLM`, by
  :func:`attn_course.models.llama.load_pretrained`;
- ``"gemma3_text"``, ``"gemma3"`` (its language model only): a :class:`~attn_course.models.gemma3.Gemma3ForCausalLM`,
  by :func:`attn_course.models.gemma3.load_pretrained`.

Each family keeps its loader, which checks the config field by field and the weights name by name; this
module only chooses among them (:data:`LOADERS`), as ``transformers``' ``AutoModelForCausalLM`` chooses by
``model_type``. Every model it returns takes ``model(input_ids)`` and returns an object whose ``.logits`` are
``[B, N, V]``, and decodes greedily with ``model.generate(input_ids, max_new_tokens)`` (a Llama with a KV cache
and left padding; a Gemma 3 without either).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import torch
from torch import nn

from attn_course import _validate
from attn_course.models import gemma3, llama
from attn_course.models.hugging_face.checkpoint import checkpoint_folder

__all__ = ["LOADERS", "load_pretrained"]

#: The ``model_type`` values :func:`load_pretrained` reads, and the loader each goes to.
LOADERS: dict[str, Callable[..., nn.Module]] = {**dict.fromkeys(llama.MODEL_TYPES, llama.load_pretrained),
                                                **dict.fromkeys(gemma3.MODEL_TYPES, gemma3.load_pretrained)}


def load_pretrained(folder: str | os.PathLike, *, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Load a Hugging Face decoder checkpoint into the course's model of its family, chosen by ``model_type``.

    Offline: nothing is read from the network.

    Args:
        folder: holds ``config.json`` and ``model.safetensors`` (or ``model.safetensors.index.json`` and its
            shards), as ``save_pretrained(folder, safe_serialization=True)`` writes them.
        dtype: the model's floating dtype; stored weights are converted to it.

    Returns:
        the model, in eval mode: a :class:`~attn_course.models.llama.LlamaForCausalLM` for ``"llama"``,
        ``"mistral"`` and ``"qwen3"``; a :class:`~attn_course.models.gemma3.Gemma3ForCausalLM` for
        ``"gemma3_text"``, and for ``"gemma3"`` (a multimodal checkpoint: its ``text_config`` and language model,
        not its vision tower).

    Raises:
        TypeError: ``folder`` not a str or path, ``dtype`` not a floating ``torch.dtype``.
        FileNotFoundError: no such folder, or no ``config.json`` (or weights) in it.
        NotADirectoryError: ``folder`` is a file.
        ValueError: a ``config.json`` that is not a JSON object, a ``model_type`` that is not a key of
            :data:`LOADERS` (they are listed), or what the family's loader refuses (a setting it does not
            reproduce, weights that do not fit; each named).

    Example:
        >>> import contextlib, io, tempfile, transformers
        >>> folder = tempfile.mkdtemp()
        >>> reference = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        ...     vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        ...     num_attention_heads=4, num_key_value_heads=2, head_dim=16))
        >>> with contextlib.redirect_stderr(io.StringIO()):            # the progress bar
        ...     reference.save_pretrained(folder, safe_serialization=True)
        >>> model = load_pretrained(folder)
        >>> type(model).__name__, model.config.qk_norm, model(torch.tensor([[1, 2, 3]])).logits.shape
        ('LlamaForCausalLM', True, torch.Size([1, 3, 50]))
    """
    where = "load_pretrained"
    dtype = _validate.floating_dtype(where, "dtype", dtype)
    config_file = checkpoint_folder(folder, caller=where) / "config.json"
    try:
        values = json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: {config_file} is not valid JSON: {error}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{where}: {config_file} must hold a JSON object, got {type(values).__name__}")
    model_type = values.get("model_type")
    if not isinstance(model_type, str) or model_type not in LOADERS:
        raise ValueError(f"{where}: {config_file} has model_type={model_type!r}; this course loads model_type "
                         f"{', '.join(map(repr, LOADERS))}")
    return LOADERS[model_type](config_file.parent, dtype=dtype)
