"""Loading Hugging Face checkpoints into the course's models: one place for BERT, Llama/Mistral, Gemma 3 and
DeepSeek-V2's latent attention, kept apart from the models themselves (as Hugging Face's own modelling files keep
loading apart).

- ``checkpoint``: :func:`checkpoint_folder` (a folder holding ``config.json``), :func:`read_safetensors` and
  :func:`read_checkpoint` (``safetensors`` only, never pickle),
  :class:`NameMap` (our parameter names to theirs), :func:`match_hugging_face` and :func:`check_weights`
  (every name and shape checked one by one, every problem named);
- ``config``: :class:`HuggingFaceConfig` (``from_json_file``), :func:`check_supported`, :func:`check_required`,
  and the rotary settings, :func:`rope_parameters` and :func:`rope_from_hugging_face`;
- ``bert``, ``llama``, ``gemma3``: each model's table of names (:data:`~attn_course.models.hugging_face.bert.NAMES`,
  :data:`~attn_course.models.hugging_face.llama.NAMES`, :data:`~attn_course.models.hugging_face.gemma3.NAMES`) and
  what else its checkpoints hold (Gemma 3: a multimodal checkpoint's language model, and its ``config.json`` filled
  in as ``transformers`` fills it in, :func:`~attn_course.models.hugging_face.gemma3.text_config_values`);
- ``latent_attention``: :func:`mla_config_from_hugging_face` and :func:`from_hugging_face_weights`, which cut
  ``DeepseekV2Attention``'s fused matrices apart;
- ``layers``: :func:`convert_layer`, one attention layer of Llama, Mistral, Qwen3, Gemma 3, gpt-oss, Qwen3-Next
  or DeepSeek-V2/V3 into the course's module with its weights (chapter 12), and
  :func:`decoder_config_from_hugging_face`, the layer's
  :class:`~attn_course.models.decoder_attention.DecoderAttentionConfig`.

The loaders that build a model from a folder are the models' own: :func:`attn_course.models.bert.load_pretrained`,
:func:`attn_course.models.llama.load_pretrained` (Llama, Mistral, Qwen3),
:func:`attn_course.models.gemma3.load_pretrained` (Gemma 3's text model); :func:`attn_course.models.load_pretrained`
picks a decoder's by the folder's ``model_type``.
"""

from attn_course.models.hugging_face.checkpoint import (
    NameMap,
    check_weights,
    checkpoint_folder,
    match_hugging_face,
    read_checkpoint,
    read_safetensors,
)
from attn_course.models.hugging_face.config import (
    ROPE_TYPES,
    HuggingFaceConfig,
    check_required,
    check_supported,
    rope_from_hugging_face,
    rope_parameters,
)
from attn_course.models.hugging_face.latent_attention import (
    from_hugging_face_weights,
    hugging_face_shapes,
    mla_config_from_hugging_face,
)
from attn_course.models.hugging_face.layers import (
    ARCHITECTURES,
    LATENT_ATTENTIONS,
    convert_layer,
    decoder_config_from_hugging_face,
)

__all__ = ["NameMap", "checkpoint_folder", "read_safetensors", "read_checkpoint", "check_weights", "match_hugging_face",
           "HuggingFaceConfig", "check_supported", "check_required", "ROPE_TYPES", "rope_parameters",
           "rope_from_hugging_face", "mla_config_from_hugging_face", "hugging_face_shapes", "from_hugging_face_weights",
           "ARCHITECTURES", "LATENT_ATTENTIONS", "decoder_config_from_hugging_face", "convert_layer"]
