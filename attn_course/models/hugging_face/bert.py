"""Hugging Face BERT checkpoints: our parameter names to theirs (:data:`NAMES`), and what else a BERT file holds.

``BertForMaskedLM`` and the other task models store the encoder under ``bert.``; old files call the
LayerNorms' parameters ``gamma``/``beta``; the pooler and the ``embeddings.position_ids`` buffer are
not read (:class:`~attn_course.models.bert.BertModel` has no pooler, and computes the positions).

Example:
    >>> hugging_face_name("layers.3.norm_ffn.weight")
    'encoder.layer.3.output.LayerNorm.weight'
    >>> hugging_face_name("embeddings.word.weight")
    'embeddings.word_embeddings.weight'
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from attn_course.models.hugging_face.checkpoint import NameMap, match_hugging_face

__all__ = ["NAMES", "hugging_face_name", "match_bert"]

#: Our parameter names to Hugging Face's: the embeddings, then each encoder layer's modules, for
#: :func:`~attn_course.models.hugging_face.checkpoint.match_hugging_face`.
NAMES = NameMap(
    "BertModel",
    top={f"embeddings.{ours}": f"embeddings.{theirs}" for ours, theirs in (
        ("word", "word_embeddings"), ("position", "position_embeddings"), ("token_type", "token_type_embeddings"),
        ("norm", "LayerNorm"))},
    layer={"self_attention.q_proj": "attention.self.query", "self_attention.k_proj": "attention.self.key",
           "self_attention.v_proj": "attention.self.value", "self_attention.out_proj": "attention.output.dense",
           "norm_self": "attention.output.LayerNorm", "feed_forward.up": "intermediate.dense",
           "feed_forward.down": "output.dense", "norm_ffn": "output.LayerNorm"},
    ours_layers="layers", theirs_layers="encoder.layer")

#: ``hugging_face_name(name)``: the Hugging Face name of a ``BertModel`` parameter (example above).
hugging_face_name = NAMES.hugging_face_name


def match_bert(
    stored: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    *,
    source: str,
    model: str,
    caller: str = "match_bert",
) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face BERT checkpoint's tensors to our names, checking every name and shape.

    Names may carry the ``bert.`` prefix of task models such as ``BertForMaskedLM``; then only
    those are read and the task heads (``cls.*``, ``classifier.*``, ...) are ignored, as are
    the pooler (``pooler.*``) and the ``embeddings.position_ids`` buffer. Old names
    ``LayerNorm.gamma``/``LayerNorm.beta`` are read as ``weight``/``bias``.

    Args:
        stored, expected, source, caller: as in
            :func:`~attn_course.models.hugging_face.checkpoint.match_hugging_face`; ``expected`` is
            ``BertModel.state_dict()``.
        model: the model's sizes in a few words, for error messages ("this BertModel (...)").

    Returns:
        ``{our name: stored tensor}`` for every parameter of the model.

    Raises:
        ValueError: missing, unexpected, wrongly shaped or non-floating weights, all of them listed.

    Example:
        >>> expected = {"embeddings.norm.weight": torch.ones(4)}
        >>> match_bert({"bert.embeddings.LayerNorm.gamma": torch.zeros(4), "cls.bias": torch.zeros(9)},
        ...            expected, source="file", model="tiny")
        {'embeddings.norm.weight': tensor([0., 0., 0., 0.])}
    """
    if any(name.startswith("bert.") for name in stored):              # BertForMaskedLM & co.
        stored = {name[len("bert."):]: t for name, t in stored.items() if name.startswith("bert.")}
    stored = {name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): t
              for name, t in stored.items()}
    return match_hugging_face(stored, expected, NAMES, source=source, model=f"this BertModel ({model})",
                              ignore=_not_read, caller=caller)


def _not_read(name: str) -> bool:
    """The pooler and the position-ids buffer: in a BERT checkpoint, never needed here."""
    return name.startswith("pooler.") or name == "embeddings.position_ids"
