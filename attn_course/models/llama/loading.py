"""Hugging Face Llama, Mistral and Qwen3 checkpoints into a :class:`~attn_course.models.llama.LlamaForCausalLM`,
checked by name.

Mistral's weights have Llama's names and shapes; its config adds ``sliding_window``, which the
model applies in every block (``tests/variants/test_sliding_window.py`` checks it against
``MistralForCausalLM``). Qwen3's add a norm of each head's query and key, and its config a head size,
attention biases and the layers that slide (``tests/models/test_loading.py`` checks it against
``Qwen3ForCausalLM``).

A checkpoint folder holds ``config.json`` and ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``). The config is checked field by field
(:meth:`LlamaConfig.from_dict <attn_course.models.llama.LlamaConfig.from_dict>`); the weights are read
with ``safetensors`` only, never with pickle, and every name and shape must match the model
before anything is copied (:func:`~attn_course.models.hugging_face.llama.match_llama`). All problems
are listed at once, by name.
"""

from __future__ import annotations

import os

import torch

from attn_course import _validate
from attn_course.models.hugging_face.checkpoint import checkpoint_folder, read_checkpoint
from attn_course.models.hugging_face.llama import match_llama
from attn_course.models.llama.config import LlamaConfig
from attn_course.models.llama.model import LlamaForCausalLM

__all__ = ["load_pretrained"]


def load_pretrained(folder: str | os.PathLike, *, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """Load a Hugging Face Llama, Mistral or Qwen3 checkpoint folder into a
    :class:`~attn_course.models.llama.LlamaForCausalLM`.

    Offline: nothing is read from the network. A Mistral folder (``model_type`` ``"mistral"``)
    gives a model whose ``config.sliding_window`` is the checkpoint's window (None for full causal
    attention); a Qwen3 folder (``"qwen3"``) one with ``config.qk_norm`` and the checkpoint's
    ``head_dim``, ``attention_bias`` and ``layer_types``. :func:`attn_course.models.load_pretrained`
    picks this loader by the folder's ``model_type``.

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
            whose names or shapes do not fit the config (all listed, see
            :func:`~attn_course.models.hugging_face.llama.match_llama`).

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
    dtype = _validate.floating_dtype(where, "dtype", dtype)
    folder = checkpoint_folder(folder, caller=where)
    config = LlamaConfig.from_json_file(folder / "config.json")
    stored, source = read_checkpoint(folder, caller=where)

    model = LlamaForCausalLM(config).to(dtype)
    state = model.state_dict()
    matched = match_llama(stored, state, tied=config.tie_word_embeddings, source=source, caller=where)
    with torch.no_grad():
        for name, tensor in matched.items():
            state[name].copy_(tensor)                                  # converts to the model's dtype
    return model.eval()
