"""Hugging Face Gemma 3 checkpoints (the text model): our parameter names to theirs (:data:`NAMES`), the language
model of a multimodal checkpoint, and the tied head.

A ``Gemma3ForCausalLM`` checkpoint (``model_type`` ``"gemma3_text"``) names its tensors ``model.layers.{i}...``.
A ``Gemma3ForConditionalGeneration`` one (``"gemma3"``) holds the same language model under
``language_model.model.`` (as transformers 5.25 writes it, and the Hub's files store it) or
``model.language_model.`` (transformers 5's names in memory), beside a vision tower and a projector that the
text model does not read. With tied embeddings (Gemma 3 always ties them) Hugging Face leaves
``lm_head.weight`` out. :func:`text_config_values` brings either model's ``config.json`` into the one layout
that :func:`~attn_course.models.hugging_face.layers.decoder_config_from_hugging_face` reads.

Example:
    >>> hugging_face_name("blocks.3.attention_output_norm.weight")
    'model.layers.3.post_attention_layernorm.weight'
    >>> hugging_face_name("blocks.0.attention.q_proj.norm.weight")
    'model.layers.0.self_attn.q_norm.weight'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attn_course import _validate
from attn_course.models.hugging_face.checkpoint import NameMap, match_hugging_face
from attn_course.models.hugging_face.config import check_supported

__all__ = ["NAMES", "hugging_face_name", "match_gemma3", "text_config_values"]

#: Our parameter names to Hugging Face's: outside the blocks, then each block's four norms, attention and MLP.
NAMES = NameMap(
    "Gemma3ForCausalLM",
    top={"embedding": "model.embed_tokens", "final_norm": "model.norm", "lm_head": "lm_head"},
    layer={"attention_norm": "input_layernorm", "attention.q_proj": "self_attn.q_proj",
           "attention.k_proj": "self_attn.k_proj", "attention.v_proj": "self_attn.v_proj",
           "attention.o_proj": "self_attn.o_proj", "attention.q_proj.norm": "self_attn.q_norm",
           "attention.k_proj.norm": "self_attn.k_norm", "attention_output_norm": "post_attention_layernorm",
           "feed_forward_norm": "pre_feedforward_layernorm", "feed_forward.gate": "mlp.gate_proj",
           "feed_forward.up": "mlp.up_proj", "feed_forward.down": "mlp.down_proj",
           "feed_forward_output_norm": "post_feedforward_layernorm"},
    ours_layers="blocks", theirs_layers="model.layers", parameters=("weight", "bias"))

#: ``hugging_face_name(name)``: the Hugging Face name of a ``Gemma3ForCausalLM`` parameter (example above).
hugging_face_name = NAMES.hugging_face_name

#: A multimodal checkpoint's prefixes of the language model, and what a text-only checkpoint calls them.
LANGUAGE_MODEL_PREFIXES = {"language_model.model.": "model.", "model.language_model.": "model.",
                           "language_model.lm_head.": "lm_head."}
#: What a multimodal checkpoint holds beside the language model (not read).
NOT_TEXT_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def match_gemma3(
    stored: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    *,
    tied: bool,
    source: str,
    caller: str = "match_gemma3",
) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face Gemma 3 checkpoint's text-model tensors to our names, checking every name and shape.

    A checkpoint with a multimodal model's language-model names (:data:`LANGUAGE_MODEL_PREFIXES`) is read as
    the text model they hold; its vision tower and projector are then left out. With tied embeddings an
    ``lm_head.weight`` equal to the embedding matrix is accepted (equal, it says nothing new).

    Args:
        stored, expected, source, caller: as in
            :func:`~attn_course.models.hugging_face.checkpoint.match_hugging_face`; ``expected`` is
            ``Gemma3ForCausalLM.state_dict()``.
        tied: whether the config ties the LM head to the embedding (then ``lm_head.weight`` is not read).

    Returns:
        ``{our name: stored tensor}``, every parameter but ``lm_head.weight`` when tied.

    Raises:
        TypeError: ``tied`` not a bool.
        ValueError: what :func:`~attn_course.models.hugging_face.checkpoint.check_weights` finds, and an
            ``lm_head.weight`` that differs from the embedding of a tied model; all of them listed.

    Example:
        >>> expected = {"final_norm.weight": torch.zeros(4)}
        >>> match_gemma3({"language_model.model.norm.weight": torch.ones(4), "vision_tower.w": torch.ones(2)},
        ...              expected, tied=True, source="file")
        {'final_norm.weight': tensor([1., 1., 1., 1.])}
    """
    tied = _validate.boolean(caller, "tied", tied)
    if any(name.startswith(tuple(LANGUAGE_MODEL_PREFIXES)) for name in stored):      # a multimodal checkpoint
        text = {}
        for name, tensor in stored.items():
            if name.startswith(NOT_TEXT_PREFIXES):
                continue
            prefix = next((p for p in LANGUAGE_MODEL_PREFIXES if name.startswith(p)), "")
            text[LANGUAGE_MODEL_PREFIXES.get(prefix, "") + name.removeprefix(prefix)] = tensor
        stored = text
    problems = []
    if tied:
        expected = {ours: tensor for ours, tensor in expected.items() if ours != "lm_head.weight"}
        if "lm_head.weight" in stored:
            embedding = stored.get("model.embed_tokens.weight")
            if embedding is None or not torch.equal(stored["lm_head.weight"], embedding):
                problems.append("tie_word_embeddings is true but lm_head.weight differs from "
                                "model.embed_tokens.weight")
            stored = {name: tensor for name, tensor in stored.items() if name != "lm_head.weight"}
    return match_hugging_face(stored, expected, NAMES, source=source, model="this Gemma3ForCausalLM",
                              problems=problems, caller=caller)


# transformers 5.25's Gemma3TextConfig defaults, for the keys a config.json leaves out (the Hub's multimodal
# configs keep only a few in text_config). The rotary bases are filled in with the rotary settings.
_DEFAULTS = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
             "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
             "query_pre_attn_scalar": 256, "sliding_window": 4096, "max_position_embeddings": 131_072,
             "tie_word_embeddings": True}


def text_config_values(values: Mapping[str, Any], *, source: str,
                       caller: str = "text_config_values") -> tuple[dict[str, Any], str]:
    """A Gemma 3 ``config.json`` as its text model's settings, filled in as transformers 5.25's ``Gemma3TextConfig``.

    ``"gemma3"`` (multimodal): its ``text_config``, with the model's ``tie_word_embeddings`` (the one Hugging Face
    ties by). Absent keys take ``Gemma3TextConfig``'s defaults; without ``layer_types``, every
    ``sliding_window_pattern``-th layer (default 6) is global and the others slide; the rotary settings, in either
    layout (``rope_parameters`` per layer type, or ``rope_theta`` and ``rope_scaling`` for the global layers with
    ``rope_local_base_freq`` for the sliding ones), become ``rope_parameters`` per layer type.

    Args:
        values: the parsed ``config.json``.
        source: where it came from, for error messages.
        caller: the name that error messages start with.

    Returns:
        ``(settings, source)``: the text model's settings with ``layer_types`` and ``rope_parameters`` filled in,
        and where they came from (``"... (text_config)"`` for a multimodal config).

    Raises:
        TypeError: ``values`` not a mapping, a field of the wrong type (named).
        ValueError: a ``model_type`` other than ``"gemma3_text"`` and ``"gemma3"``, a ``"gemma3"`` config without
            a ``text_config`` or with a ``final_logit_softcapping`` (transformers 5.25's
            ``Gemma3ForConditionalGeneration`` does not apply it, its ``Gemma3ForCausalLM`` does: neither reading
            is chosen), a ``hidden_activation`` other than ``"gelu_pytorch_tanh"``, a non-positive
            ``query_pre_attn_scalar``, ``layer_types`` of another length than the layers or marking sliding layers
            without a ``sliding_window``, ``rope_parameters`` not keyed by layer type.

    Example:
        >>> text, _ = text_config_values({"model_type": "gemma3_text", "num_hidden_layers": 2, "rope_theta": 5e5,
        ...                               "sliding_window_pattern": 2}, source="config.json")
        >>> text["layer_types"], text["rope_parameters"]["full_attention"]
        (['sliding_attention', 'full_attention'], {'rope_theta': 500000.0})
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"{caller}: {source} must be a JSON object, got {type(values).__name__}")
    if values.get("model_type") == "gemma3":
        text = values.get("text_config")
        if not isinstance(text, Mapping):
            raise ValueError(f"{caller}: {source} has model_type='gemma3' but text_config={text!r}; the course "
                             "loads the language model of a Gemma 3 checkpoint, described by its text_config")
        values, source = ({**text, "model_type": "gemma3_text",
                           "tie_word_embeddings": values.get("tie_word_embeddings", True)}, f"{source} (text_config)")
        if values.get("final_logit_softcapping") is not None:
            raise ValueError(f"{caller}: unsupported config in {source}: final_logit_softcapping="
                             f"{values['final_logit_softcapping']!r} (Hugging Face's Gemma3ForConditionalGeneration "
                             "does not apply it, its Gemma3ForCausalLM does)")
    check_supported(values, {"model_type": (None, ("gemma3_text", None)),
                             "hidden_activation": ("gelu_pytorch_tanh", ("gelu_pytorch_tanh",))},
                    model="Gemma 3", source=source, where=caller)
    text = {**_DEFAULTS, **values}
    try:
        _validate.positive_finite(caller, "query_pre_attn_scalar", text["query_pre_attn_scalar"])
        text.update(layer_types=_layer_types(text, caller), rope_parameters=_rope_by_layer_type(text, caller))
    except (TypeError, ValueError) as error:
        raise type(error)(f"{caller}: unsupported config in {source}: {str(error).removeprefix(caller + ': ')}") \
            from None
    return text, source


def _layer_types(values: Mapping[str, Any], where: str) -> list[str]:
    """``layer_types``, or as Hugging Face derives it: every ``sliding_window_pattern``-th layer global."""
    layers = _validate.integer(where, "num_hidden_layers", values["num_hidden_layers"], minimum=1)
    layer_types = values.get("layer_types")
    if layer_types is None:
        pattern = _validate.integer(where, "sliding_window_pattern", values.get("sliding_window_pattern", 6), minimum=1)
        layer_types = ["sliding_attention" if (index + 1) % pattern else "full_attention" for index in range(layers)]
    layer_types = _validate.labels(where, "layer_types", layer_types)
    if len(layer_types) != layers:
        raise ValueError(f"layer_types must have one entry per layer (num_hidden_layers={layers}), "
                         f"got {len(layer_types)}")
    if "sliding_attention" in layer_types and values.get("sliding_window") is None:
        raise ValueError("layer_types marks sliding layers but sliding_window is None")
    return layer_types


def _rope_by_layer_type(values: Mapping[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """Each layer type's rotary settings, as ``Gemma3TextConfig`` fills them in: the file's ``rope_parameters[type]``,
    and ``rope_scaling`` merged into the global layers'; a base from ``rope_theta`` (default 1e6, global layers) or
    ``rope_local_base_freq`` (default 1e4, sliding layers) where none is given."""
    per_type = values.get("rope_parameters") or {}
    scaling = values.get("rope_scaling") or {}
    if not isinstance(per_type, Mapping) or not set(per_type) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"rope_parameters must map 'full_attention' and 'sliding_attention' to their rotary "
                         f"settings, got {per_type!r}")
    if not isinstance(scaling, Mapping):
        raise TypeError(f"{where}: rope_scaling must be a JSON object, got {type(scaling).__name__}")
    full = {**(per_type.get("full_attention") or {}), **scaling}
    full.setdefault("rope_theta", values.get("rope_theta", 1_000_000.0))
    sliding = dict(per_type.get("sliding_attention") or {})
    sliding.setdefault("rope_theta", values.get("rope_local_base_freq", 10_000.0))
    return {"full_attention": full, "sliding_attention": sliding}
