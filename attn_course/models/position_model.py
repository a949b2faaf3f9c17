"""A small causal character model, one per position scheme: chapter 05's and chapter 09's position experiments.

:class:`PositionLanguageModel`'s variants differ only in where a token's position enters
(:data:`POSITION_SCHEMES`): a learned embedding, RoPE on queries and keys, ALiBi's bias on the scores,
or nothing. :func:`train_position_model` trains one on windows of ``L`` characters, with chapter 04's
loop (:func:`~attn_course.models.training.train_language_model`). With ``first_token=True`` it puts one
fixed token before every training window, as a beginning-of-sequence token is in a real model's
training texts. The experiments that compare the schemes live in :mod:`attn_course.teaching.experiments`:
their learning curves (chapter 05), their losses on inputs longer than training's, and whether attention
sinks form (chapter 09).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from attn_course import _validate
from attn_course.core.kv_cache import KVCache
from attn_course.core.multihead import MultiHeadAttention
from attn_course.core.transformer import DecoderBlock
from attn_course.data.rhymes import load_rhymes
from attn_course.data.tokenizers import CharTokenizer
from attn_course.models.tiny_language_model import check_ids_and_caches
from attn_course.models.training import train_language_model
from attn_course.positions.alibi import alibi_bias, alibi_slopes
from attn_course.positions.rope import RotaryEmbedding

__all__ = ["POSITION_SCHEMES", "PositionConfig", "PositionLanguageModel", "train_position_model"]

POSITION_SCHEMES = ("learned", "rope", "alibi", "none")


@dataclasses.dataclass(frozen=True)
class PositionConfig:
    """Sizes and position scheme of a :class:`PositionLanguageModel`.

    Args:
        vocab_size: number of token ids ``V``.
        position: one of :data:`POSITION_SCHEMES`: ``"learned"``, ``"rope"``, ``"alibi"``, ``"none"``.
        max_length: ``"learned"`` only: the number of position embeddings, the longest input
            (cache included) the model accepts; allocate it for the longest evaluation length.
            The other schemes take any length and ignore it.
        embed_dim: model width ``E``.
        num_heads: ``H``; must divide ``E`` (with ``"rope"``, ``E / H`` must be even).
        num_layers: number of decoder blocks.
        first_token: the last id, ``vocab_size - 1``, is a fixed first token that no character maps
            to (:func:`train_position_model` with ``first_token=True`` starts every training window
            with it); its id is :attr:`first_token_id`.

    Raises:
        TypeError, ValueError: an unknown ``position``, sizes that are not positive ints, ``E``
            not divisible by ``H``, or ``first_token`` not a bool (with ``vocab_size`` < 2).
    """

    vocab_size: int
    position: str
    max_length: int = 256
    embed_dim: int = 32
    num_heads: int = 4
    num_layers: int = 2
    first_token: bool = False

    def __post_init__(self) -> None:
        where = "PositionConfig"
        if not isinstance(self.position, str):
            raise TypeError(f"{where}: position must be a str, one of {POSITION_SCHEMES}, "
                            f"got {type(self.position).__name__}")
        if self.position not in POSITION_SCHEMES:
            raise ValueError(f"{where}: position must be one of {POSITION_SCHEMES}, got {self.position!r}")
        for field in ("vocab_size", "max_length", "embed_dim", "num_heads", "num_layers"):
            _validate.integer(where, field, getattr(self, field), minimum=1)
        if self.embed_dim % self.num_heads:
            raise ValueError(f"{where}: embed_dim={self.embed_dim} must be divisible by num_heads={self.num_heads}")
        if self.position == "rope" and (self.embed_dim // self.num_heads) % 2:
            raise ValueError(f"{where}: position='rope' needs an even head size, got embed_dim / num_heads = "
                             f"{self.embed_dim // self.num_heads}")
        _validate.boolean(where, "first_token", self.first_token)
        if self.first_token and self.vocab_size < 2:
            raise ValueError(f"{where}: first_token=True takes the last id for the first token, so vocab_size "
                             f"must be >= 2 (a character and the first token), got {self.vocab_size}")

    @property
    def first_token_id(self) -> int | None:
        """The fixed first token's id, ``vocab_size - 1``, or None for a model trained without one."""
        return self.vocab_size - 1 if self.first_token else None


class PositionLanguageModel(nn.Module):
    """A causal character model whose only difference between variants is its position scheme.

    Token embedding, (``"learned"`` only) position embedding, ``num_layers`` pre-LayerNorm
    :class:`~attn_course.core.transformer.DecoderBlock` s, a final LayerNorm and a linear head. With
    ``"rope"`` each block's self-attention is a ``MultiHeadAttention(rope=RotaryEmbedding(d))``, which rotates
    the new tokens by their positions, ``len(kv_cache)`` onwards. With ``"alibi"`` every block adds
    the bias ``m_h · (j - i)`` of :func:`~attn_course.positions.alibi.alibi_bias` to its scores as an
    additive mask, with query ``i`` and key ``j`` at their absolute positions (the cached tokens
    first).

    Args:
        config: a :class:`PositionConfig`.

    Raises:
        TypeError: ``config`` not a PositionConfig.

    Example:
        >>> model = PositionLanguageModel(PositionConfig(vocab_size=10, position="alibi"))
        >>> model(torch.zeros(2, 5, dtype=torch.long)).shape
        torch.Size([2, 5, 10])
    """

    def __init__(self, config: PositionConfig) -> None:
        super().__init__()
        _validate.instance("PositionLanguageModel", "config", config, PositionConfig)
        self.config = config
        E, H = config.embed_dim, config.num_heads
        self.token_embedding = nn.Embedding(config.vocab_size, E)
        self.position_embedding = nn.Embedding(config.max_length, E) if config.position == "learned" else None
        self.blocks = nn.ModuleList(DecoderBlock(E, H) for _ in range(config.num_layers))
        if config.position == "rope":
            for block in self.blocks:                       # the same block, its attention rotary
                block.self_attention = MultiHeadAttention(E, H, rope=RotaryEmbedding(E // H))
        self.final_norm = nn.LayerNorm(E)
        self.head = nn.Linear(E, config.vocab_size)
        slopes = alibi_slopes(H) if config.position == "alibi" else torch.zeros(0)
        self.register_buffer("alibi_slopes", slopes, persistent=False)    # [H] (alibi) or [0]

    def forward(self, ids: torch.Tensor, *, kv_caches: list[KVCache] | None = None) -> torch.Tensor:
        """Next-token logits for every position.

        Args:
            ids: ``[B, N]`` token ids; with caches, only the new tokens, which sit at positions
                ``len(kv_caches[0])`` onwards.
            kv_caches: one :class:`~attn_course.core.kv_cache.KVCache` (or subclass) per block, or None.
                ``"alibi"`` takes plain :class:`KVCache` s only: its bias assumes the cache returns
                every earlier token, in order; a cache that forgets some (a rolling or
                attention-sink cache) raises instead of silently using wrong distances.

        Returns:
            ``[B, N, V]`` logits; position ``i`` predicts token ``i + 1``.

        Raises:
            TypeError, ValueError: ids that are not a 2-D integer tensor of ids below ``V``, the
                wrong number or kind of caches, or (``"learned"``) positions beyond ``max_length``.
        """
        return self._forward(ids, kv_caches, need_weights=False)

    def _forward(self, ids: torch.Tensor, kv_caches: list[KVCache] | None, *, need_weights: bool):
        where = "PositionLanguageModel.forward"
        ids, start = check_ids_and_caches(where, ids, kv_caches, vocab_size=self.config.vocab_size,
                                          num_blocks=len(self.blocks))
        if kv_caches is not None and self.config.position == "alibi" and any(type(c) is not KVCache for c in kv_caches):
            kinds = sorted({type(c).__name__ for c in kv_caches})
            raise ValueError(f"{where}: position='alibi' needs plain KVCache caches (its bias assumes "
                             f"every earlier key is returned, in order), got {kinds}")
        n = ids.shape[1]
        x = self.token_embedding(ids)                                          # [B, N, E]
        if self.position_embedding is not None:
            if start + n > self.config.max_length:
                raise ValueError(f"{where}: positions up to {start + n} exceed max_length={self.config.max_length} "
                                 f"(the learned position embeddings)")
            x = x + self.position_embedding(torch.arange(start, start + n, device=ids.device))  # [B, N, E]
        mask = None
        if self.config.position == "alibi":
            # Queries at start .. start+N-1, keys at 0 .. start+N-1: the bias m_h · (j - i).
            mask = alibi_bias(self.config.num_heads, n, start + n, offset=start, slopes=self.alibi_slopes,
                              dtype=x.dtype, device=x.device)[None]          # [1, H, N, N_k]
        weights = []
        for index, block in enumerate(self.blocks):
            x, block_weights = block(x, mask=mask, kv_cache=None if kv_caches is None else kv_caches[index],
                                     need_weights=need_weights)
            weights.append(block_weights)                                      # [B, H, N, N_k] or None
        logits = self.head(self.final_norm(x))                                 # [B, N, V]
        return (logits, weights) if need_weights else logits

    def attention_weights(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """Every block's attention weights over ``ids`` (one pass, no cache, no gradients).

        Args:
            ids: ``[B, N]`` token ids, at positions ``0 .. N - 1``.

        Returns:
            One ``[B, H, N, N]`` tensor per block: row ``i`` of head ``h`` is how query ``i`` spreads
            its attention over keys ``0 .. i``.

        Raises:
            TypeError, ValueError: as :meth:`forward`.

        Example:
            >>> model = PositionLanguageModel(PositionConfig(vocab_size=10, position="rope", num_layers=2))
            >>> [tuple(w.shape) for w in model.attention_weights(torch.zeros(1, 5, dtype=torch.long))]
            [(1, 4, 5, 5), (1, 4, 5, 5)]
        """
        with torch.no_grad():
            return self._forward(ids, None, need_weights=True)[1]


def train_position_model(
    position: str,
    text: str | None = None,
    *,
    train_length: int = 32,
    max_length: int = 256,
    embed_dim: int = 32,
    num_heads: int = 4,
    num_layers: int = 2,
    steps: int = 200,
    batch_size: int = 16,
    learning_rate: float = 5e-3,
    seed: int = 0,
    first_token: bool = False,
) -> tuple[PositionLanguageModel, CharTokenizer]:
    """Train a :class:`PositionLanguageModel` on random windows of ``train_length`` characters.

    The loop is chapter 04's :func:`~attn_course.models.training.train_language_model` (AdamW,
    cosine-decayed learning rate, clipped gradients, one CPU thread), on all of ``text`` with
    nothing held out: the held-out text of this experiment is another file.

    With ``first_token=True`` every training window is a fixed token that no character maps to
    (id ``tokenizer.vocab_size``, :attr:`PositionConfig.first_token_id`) followed by a random crop
    of ``train_length - 1`` characters, so that the model still sees ``train_length`` positions and
    the fixed token is at position 0 of every window, as a beginning-of-sequence token is in the
    training texts of large models. Each character of the crop after its first is a target; the
    logits at the fixed token itself (a guess of the crop's first character from nothing) are not
    trained.

    Args:
        position: one of :data:`POSITION_SCHEMES`.
        text: the training text (default: chapter 04's :func:`~attn_course.data.rhymes.load_rhymes`).
        train_length: ``L``, the characters per training window.
        max_length: ``"learned"`` only, the number of position embeddings (``>= L``); only the
            first ``L`` are trained.
        embed_dim, num_heads, num_layers: the model's sizes, see :class:`PositionConfig`.
        steps: optimisation steps.
        batch_size: windows per step.
        learning_rate: peak learning rate.
        seed: seeds the weights and the batches; the same arguments give the same model.
        first_token: start every training window with the fixed first token (see above).

    Returns:
        ``(model, tokenizer)``: the model in eval mode, and the tokenizer of ``text`` (which has no
        id for the first token: ``model.config.vocab_size`` is one more than its ``vocab_size``).

    Raises:
        TypeError, ValueError: an unknown ``position``, ``train_length`` < 1 (< 2 with a first
            token) or above ``max_length``, sizes or ``steps`` that are not positive ints,
            ``first_token`` not a bool, or a text not longer than ``train_length + 1``.

    Example:
        >>> model, tokenizer = train_position_model("rope", steps=2)
        >>> model.config.position, tokenizer.vocab_size
        ('rope', 57)
        >>> model, tokenizer = train_position_model("rope", steps=2, first_token=True)
        >>> model.config.vocab_size, model.config.first_token_id
        (58, 57)
    """
    where = "train_position_model"
    text = load_rhymes() if text is None else text
    first_token = _validate.boolean(where, "first_token", first_token)
    train_length = _validate.integer(where, "train_length", train_length, minimum=1 + first_token)
    max_length = _validate.integer(where, "max_length", max_length, minimum=1)
    if train_length > max_length:
        raise ValueError(f"{where}: train_length={train_length} must be <= max_length={max_length}")
    PositionConfig(2, position, max_length, embed_dim, num_heads, num_layers, first_token)   # check before training

    def make_model(vocab_size: int) -> nn.Module:
        model = PositionLanguageModel(PositionConfig(vocab_size + first_token, position, max_length, embed_dim,
                                                     num_heads, num_layers, first_token))
        return _AfterFirstToken(model) if first_token else model

    model, tokenizer, _ = train_language_model(
        text, steps=steps, batch_size=batch_size, sequence_length=train_length - first_token,
        learning_rate=learning_rate, validation_fraction=0.0, patience=None, seed=seed, progress=False,
        make_model=make_model,
    )
    return (model.model if first_token else model), tokenizer


class _AfterFirstToken(nn.Module):
    """What the training loop sees of a model trained with a first token: ``[B, N]`` characters in,
    the fixed token put before them (``N + 1`` positions), the ``N`` logits after it out."""

    def __init__(self, model: PositionLanguageModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        first = ids.new_full((ids.shape[0], 1), self.model.config.first_token_id)         # [B, 1]
        return self.model(torch.cat([first, ids], dim=1))[:, 1:]                          # [B, N, V]
