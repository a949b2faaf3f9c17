"""Gemma 3's text model (Gemma Team, 2025) built from the course's blocks, and a loader for Hugging Face checkpoints.

    x = embedding[input_ids] · sqrt(E)                                  # [B, N, E], in the embedding's dtype
    for each block:
        x = x + Norm(Attention(Norm(x)))     # Gemma's QK-norm, scale query_pre_attn_scalar^-1/2, sliding or global
        x = x + Norm(GeGLU(Norm(x)))         # down(gelu_tanh(gate(x)) ⊙ up(x))
    logits = lm_head(Norm(x))                                           # [B, N, V], the head tied to the embedding
    logits = c · tanh(logits / c)                                       # only with final_logit_softcapping = c

Every ``Norm`` is :class:`~attn_course.core.norms.GemmaRMSNorm` (a weight of ``1 + w``, computed in float32):
four in each block, the attention's and the feed-forward network's outputs normalised *before* they are added
to the residual stream. The attention is chapter 12's
:class:`~attn_course.models.decoder_attention.DecoderAttention`, one config per layer, read from ``config.json``
by :func:`~attn_course.models.hugging_face.layers.decoder_config_from_hugging_face` as
:func:`~attn_course.models.hugging_face.convert_layer` reads Hugging Face's ``Gemma3Attention``: the layers
``layer_types`` marks as sliding see their last ``sliding_window`` keys and rotate with ``rope_local_base_freq``,
the global ones see every earlier key and rotate with ``rope_theta`` and its scaling.

:func:`load_pretrained` reads a ``"gemma3_text"`` folder, or the language model of a ``"gemma3"`` one (its
``text_config``; the vision tower is not read), and agrees with ``transformers``' ``Gemma3ForCausalLM`` to float32
round-off (``tests/models/test_loading_gemma3.py``). No KV cache: :meth:`Gemma3ForCausalLM.generate` runs the
whole sequence again at every step, the simplest decoding that is surely right.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.core.norms import GemmaRMSNorm
from attn_course.models.decoder_attention import DecoderAttention, DecoderAttentionConfig
from attn_course.models.hugging_face.checkpoint import checkpoint_folder, read_checkpoint
from attn_course.models.hugging_face.config import HuggingFaceConfig
from attn_course.models.hugging_face.gemma3 import match_gemma3, text_config_values
from attn_course.models.hugging_face.layers import decoder_config_from_hugging_face
from attn_course.models.llama.model import CausalLMOutput, GreedyOutput

__all__ = ["MODEL_TYPES", "Gemma3Config", "GeGLU", "Gemma3DecoderBlock", "Gemma3ForCausalLM", "load_pretrained"]

#: The Hugging Face ``model_type`` values :meth:`Gemma3Config.from_dict` reads (``"gemma3"``: its ``text_config``).
MODEL_TYPES = ("gemma3_text", "gemma3")


@dataclasses.dataclass(frozen=True)
class Gemma3Config(HuggingFaceConfig):
    """The sizes of a Gemma 3 text model, and each layer's attention.

    Args:
        vocab_size: ``V``.
        hidden_size: ``E``.
        intermediate_size: ``F``, the hidden width of each GeGLU network.
        attention: one :class:`~attn_course.models.decoder_attention.DecoderAttentionConfig` per layer (its
            window, rotary base and scaling, head sizes, score scale); ``L = len(attention)``.
        rms_norm_eps: the GemmaRMSNorms' ``eps``.
        tie_word_embeddings: the LM head reuses the embedding matrix.
        final_logit_softcapping: ``c`` in ``c · tanh(logits / c)``, or None (Gemma 3) for no capping.

    Raises:
        TypeError: a field of the wrong kind.
        ValueError: sizes below 1, no layers, a layer whose ``hidden_size`` is not ``E``, a non-positive
            ``rms_norm_eps`` or ``final_logit_softcapping``.

    Example:
        >>> layer = DecoderAttentionConfig(16, 4, 2, 8, scale=0.25, window=4, qk_norm="gemma")
        >>> config = Gemma3Config(vocab_size=10, hidden_size=16, intermediate_size=32, attention=(layer, layer))
        >>> config.num_hidden_layers, config.layer_types
        (2, ('sliding_attention', 'sliding_attention'))
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    attention: tuple[DecoderAttentionConfig, ...]
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        where = "Gemma3Config"
        _validate.integers(where, minimum=1, vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size)
        attention = tuple(_validate.sequence(where, "attention", self.attention, of="DecoderAttentionConfig"))
        if not attention:
            raise ValueError(f"{where}: attention must hold one DecoderAttentionConfig per layer, got none")
        for index, layer in enumerate(attention):
            _validate.instance(where, f"attention[{index}]", layer, DecoderAttentionConfig)
            if layer.hidden_size != self.hidden_size:
                raise ValueError(f"{where}: attention[{index}].hidden_size={layer.hidden_size} must be "
                                 f"hidden_size={self.hidden_size}")
        object.__setattr__(self, "attention", attention)
        object.__setattr__(self, "rms_norm_eps", _validate.positive_finite(where, "rms_norm_eps", self.rms_norm_eps))
        _validate.boolean(where, "tie_word_embeddings", self.tie_word_embeddings)
        if self.final_logit_softcapping is not None:
            object.__setattr__(self, "final_logit_softcapping", _validate.positive_finite(
                where, "final_logit_softcapping", self.final_logit_softcapping))

    @property
    def num_hidden_layers(self) -> int:
        """``L``, the number of blocks."""
        return len(self.attention)

    @property
    def layer_types(self) -> tuple[str, ...]:
        """Hugging Face's ``layer_types``: ``"sliding_attention"`` where a layer has a window."""
        return tuple("full_attention" if layer.window is None else "sliding_attention" for layer in self.attention)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, source: str = "config") -> Gemma3Config:
        """Read a Hugging Face Gemma 3 ``config.json`` (``"gemma3_text"``, or ``"gemma3"``'s ``text_config``).

        The file is filled in as transformers 5.25's ``Gemma3TextConfig`` fills it in (defaults, ``layer_types``
        from ``sliding_window_pattern``, the rotary settings of each layer type:
        :func:`~attn_course.models.hugging_face.gemma3.text_config_values`), and each layer's attention read by
        :func:`~attn_course.models.hugging_face.layers.decoder_config_from_hugging_face`, as ``convert_layer``
        reads a ``Gemma3Attention``.

        Args:
            values: the parsed ``config.json``.
            source: where it came from, for error messages.

        Returns:
            the :class:`Gemma3Config`.

        Raises:
            TypeError: ``values`` not a mapping, or a field of the wrong type (named).
            ValueError: what :func:`~attn_course.models.hugging_face.gemma3.text_config_values` refuses (a
                ``model_type`` not in :data:`MODEL_TYPES`, another ``hidden_activation``, ...), or what the
                attention's reading refuses (``attn_logit_softcapping``, bidirectional attention, an unknown
                rotary type, ...): each named.

        Example:
            >>> config = Gemma3Config.from_dict({"model_type": "gemma3_text", "vocab_size": 10, "hidden_size": 16,
            ...     "intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
            ...     "num_key_value_heads": 1, "head_dim": 8, "sliding_window": 4, "sliding_window_pattern": 3})
            >>> config.layer_types, [layer.rope_base for layer in config.attention]
            (('sliding_attention', 'sliding_attention', 'full_attention'), [10000.0, 10000.0, 1000000.0])
        """
        where = "Gemma3Config.from_dict"
        text, source = text_config_values(values, source=source, caller=where)
        try:
            attention = tuple(decoder_config_from_hugging_face(text, "Gemma3Attention", index)
                              for index in range(len(text["layer_types"])))
            return cls(vocab_size=text["vocab_size"], hidden_size=text["hidden_size"],
                       intermediate_size=text["intermediate_size"], attention=attention,
                       rms_norm_eps=text["rms_norm_eps"], tie_word_embeddings=text["tie_word_embeddings"],
                       final_logit_softcapping=text.get("final_logit_softcapping"))
        except (TypeError, ValueError) as error:
            message = str(error)
            for prefix in ("decoder_config_from_hugging_face: ", "rope_from_hugging_face: ",
                           "DecoderAttentionConfig: ", "Gemma3Config: "):
                message = message.removeprefix(prefix)
            raise type(error)(f"{where}: unsupported config in {source}: {message}") from None


class GeGLU(nn.Module):
    """``down(gelu_tanh(gate(x)) * up(x))``: Gemma's gated MLP (SwiGLU with GELU's tanh form for SiLU), no biases.

    Args:
        embed_dim: ``E``.
        hidden_dim: ``F`` (``intermediate_size``).

    Raises:
        TypeError, ValueError: sizes that are not positive ints.

    Example:
        >>> GeGLU(8, 16)(torch.randn(2, 5, 8)).shape
        torch.Size([2, 5, 8])
    """

    def __init__(self, embed_dim: int, hidden_dim: int) -> None:
        super().__init__()
        embed_dim, hidden_dim = _validate.integers("GeGLU", minimum=1, embed_dim=embed_dim, hidden_dim=hidden_dim)
        self.gate = nn.Linear(embed_dim, hidden_dim, bias=False)
        self.up = nn.Linear(embed_dim, hidden_dim, bias=False)
        self.down = nn.Linear(hidden_dim, embed_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., E]`` to ``[..., E]``."""
        hidden = F.gelu(self.gate(x), approximate="tanh") * self.up(x)           # [..., F]
        return self.down(hidden)                                                 # [..., E]


class Gemma3DecoderBlock(nn.Module):
    """One Gemma 3 block: norm, attention, norm, residual; norm, GeGLU, norm, residual.

    Args:
        config: the model's :class:`Gemma3Config`.
        layer_index: which layer; it picks the attention's config (window, rotary base).

    Raises:
        TypeError: ``config`` not a :class:`Gemma3Config`, ``layer_index`` not an int.
        ValueError: ``layer_index`` outside the config's layers.

    Example:
        >>> layer = DecoderAttentionConfig(16, 4, 2, 8, qk_norm="gemma")
        >>> config = Gemma3Config(vocab_size=10, hidden_size=16, intermediate_size=32, attention=(layer,))
        >>> out, weights = Gemma3DecoderBlock(config, 0)(torch.randn(2, 5, 16))
        >>> out.shape, weights.shape
        (torch.Size([2, 5, 16]), torch.Size([2, 4, 5, 5]))
    """

    def __init__(self, config: Gemma3Config, layer_index: int) -> None:
        super().__init__()
        where = "Gemma3DecoderBlock"
        _validate.instance(where, "config", config, Gemma3Config)
        layer_index = _validate.integer(where, "layer_index", layer_index, minimum=0)
        if layer_index >= config.num_hidden_layers:
            raise ValueError(f"{where}: layer_index must be < num_hidden_layers={config.num_hidden_layers}, "
                             f"got {layer_index}")
        width, eps = config.hidden_size, config.rms_norm_eps
        self.attention_norm = GemmaRMSNorm(width, eps=eps)
        self.attention = DecoderAttention(config.attention[layer_index])
        self.attention_output_norm = GemmaRMSNorm(width, eps=eps)
        self.feed_forward_norm = GemmaRMSNorm(width, eps=eps)
        self.feed_forward = GeGLU(width, config.intermediate_size)
        self.feed_forward_output_norm = GemmaRMSNorm(width, eps=eps)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [B, N, E], attention weights [B, H, N, N])`` over positions ``0 .. N-1``."""
        attended, weights = self.attention(self.attention_norm(x))              # RoPE inside; [B, N, E]
        x = x + self.attention_output_norm(attended)                            # normalised before the add
        x = x + self.feed_forward_output_norm(self.feed_forward(self.feed_forward_norm(x)))   # [B, N, E]
        return x, weights


class Gemma3ForCausalLM(nn.Module):
    """Gemma 3's text model: scaled embedding, ``L`` :class:`Gemma3DecoderBlock` s, a final norm, the LM head.

    Args:
        config: a :class:`Gemma3Config`; with ``tie_word_embeddings`` the head's weight *is* the embedding matrix.

    Raises:
        TypeError: ``config`` not a :class:`Gemma3Config`.

    Example:
        >>> layer = DecoderAttentionConfig(16, 4, 2, 8, qk_norm="gemma")
        >>> model = Gemma3ForCausalLM(Gemma3Config(vocab_size=10, hidden_size=16, intermediate_size=32,
        ...                                        attention=(layer, layer)))
        >>> model.lm_head.weight is model.embedding.weight, model(torch.tensor([[1, 2, 3]])).logits.shape
        (True, torch.Size([1, 3, 10]))
    """

    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.config = _validate.instance("Gemma3ForCausalLM", "config", config, Gemma3Config)
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(Gemma3DecoderBlock(config, index) for index in range(config.num_hidden_layers))
        self.final_norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embedding.weight                               # [V, E], one tensor

    def forward(self, input_ids: torch.Tensor, *, output_hidden_states: bool = False,
                output_attentions: bool = False) -> CausalLMOutput:
        """Next-token logits for every position (no padding, no cache: positions ``0 .. N-1``).

        Args:
            input_ids: ``[B, N]`` token ids.
            output_hidden_states: also return the scaled embeddings and every block's output.
            output_attentions: also return every block's attention weights.

        Returns:
            :class:`~attn_course.models.llama.CausalLMOutput`: ``logits [B, N, V]``, ``hidden_states [B, N, E]``
            (after the final norm), and with the flags ``L + 1`` tensors ``[B, N, E]`` and ``L`` tensors
            ``[B, H, N, N]``.

        Raises:
            TypeError: ``input_ids`` not an integer tensor, flags not bool.
            ValueError: ``input_ids`` not ``[B, N]`` with ``N >= 1``, or ids outside ``0 .. V-1``.
        """
        where = "Gemma3ForCausalLM.forward"
        output_hidden_states = _validate.boolean(where, "output_hidden_states", output_hidden_states)
        output_attentions = _validate.boolean(where, "output_attentions", output_attentions)
        input_ids = self._check_ids(where, input_ids)
        # sqrt(E) rounded to float32 and then to the weights' dtype, as Hugging Face keeps it (a bfloat16
        # model multiplies by 55.5, not 55.43, for E = 3072).
        weight = self.embedding.weight
        scale = torch.tensor(math.sqrt(self.config.hidden_size), dtype=torch.float32).to(weight.dtype)
        x = self.embedding(input_ids) * scale.to(weight.device)                       # [B, N, E]
        all_hidden_states, attentions = [x], []
        for block in self.blocks:
            x, weights = block(x)                                                      # [B, N, E]
            all_hidden_states.append(x)
            attentions.append(weights)                                                 # [B, H, N, N]
        hidden_states = self.final_norm(x)                                             # [B, N, E]
        logits = self.lm_head(hidden_states)                                           # [B, N, V]
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap                                    # in (-c, c)
        return CausalLMOutput(logits, hidden_states, tuple(all_hidden_states) if output_hidden_states else None,
                              tuple(attentions) if output_attentions else None)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> GreedyOutput:
        """Greedy decoding: append the most likely token ``max_new_tokens`` times.

        No KV cache: each step runs the whole sequence again (``T`` forward passes over up to ``N + T``
        tokens), the simplest decoding that is surely right; no padding and no end-of-sequence handling (as
        Hugging Face's ``generate(do_sample=False)`` with no ``eos_token_id``).

        Args:
            input_ids: ``[B, N]`` prompt ids.
            max_new_tokens: ``T`` (0 returns the prompt).

        Returns:
            :class:`~attn_course.models.llama.GreedyOutput`: ``sequences [B, N + T]`` and the ``logits [B, T, V]``
            each new token was chosen from.

        Raises:
            TypeError, ValueError: as :meth:`forward`, or a ``max_new_tokens`` that is not an int ``>= 0``.

        Example:
            >>> layer = DecoderAttentionConfig(16, 4, 2, 8, qk_norm="gemma")
            >>> model = Gemma3ForCausalLM(Gemma3Config(vocab_size=10, hidden_size=16, intermediate_size=32,
            ...                                        attention=(layer,))).eval()
            >>> model.generate(torch.tensor([[1, 2, 3]]), 4).sequences.shape
            torch.Size([1, 7])
        """
        where = "Gemma3ForCausalLM.generate"
        max_new_tokens = _validate.integer(where, "max_new_tokens", max_new_tokens, minimum=0)
        sequences = self._check_ids(where, input_ids)
        step_logits = [self.lm_head.weight.new_zeros(sequences.shape[0], 0, self.config.vocab_size)]   # [B, 0, V]
        for _ in range(max_new_tokens):
            logits = self(sequences).logits[:, -1:]                                    # [B, 1, V]
            step_logits.append(logits)
            sequences = torch.cat([sequences, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)   # [B, N + t]
        return GreedyOutput(sequences, torch.cat(step_logits, dim=1))                  # [B, N+T], [B, T, V]

    def _check_ids(self, where: str, input_ids: object) -> torch.Tensor:
        """``input_ids`` as a ``[B, N]`` integer tensor, ``N >= 1``, every id in ``0 .. V-1``."""
        input_ids = _validate.integer_tensor(where, "input_ids", input_ids)
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"{where}: input_ids must be [B, N] with N >= 1, got shape "
                             f"{_validate.shape_str(input_ids)}")
        vocab = self.config.vocab_size
        if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= vocab):
            raise ValueError(f"{where}: input_ids must lie in 0..{vocab - 1}, got values from "
                             f"{int(input_ids.min())} to {int(input_ids.max())}")
        return input_ids


def load_pretrained(folder: str | os.PathLike, *, dtype: torch.dtype = torch.float32) -> Gemma3ForCausalLM:
    """Load a Hugging Face Gemma 3 folder's text model into a :class:`Gemma3ForCausalLM`, offline.

    ``model_type`` ``"gemma3_text"`` (a ``Gemma3ForCausalLM`` checkpoint) or ``"gemma3"`` (a
    ``Gemma3ForConditionalGeneration`` one: its ``text_config`` and language model are read, its vision tower
    and projector are not). :func:`attn_course.models.load_pretrained` picks this loader by ``model_type``.

    Args:
        folder: holds ``config.json`` and ``model.safetensors`` (or ``model.safetensors.index.json`` and its
            shards), as ``save_pretrained(folder, safe_serialization=True)`` writes them.
        dtype: the model's floating dtype; stored weights are converted to it.

    Returns:
        the model, in eval mode.

    Raises:
        TypeError: ``folder`` not a str or path, ``dtype`` not a floating ``torch.dtype``.
        FileNotFoundError: no such folder, or a file missing (named).
        NotADirectoryError: ``folder`` is a file.
        ValueError: a config setting this implementation does not reproduce (named, see
            :meth:`Gemma3Config.from_dict`), or weights whose names or shapes do not fit it (all listed, see
            :func:`~attn_course.models.hugging_face.gemma3.match_gemma3`).
    """
    where = "load_pretrained"
    dtype = _validate.floating_dtype(where, "dtype", dtype)
    folder = checkpoint_folder(folder, caller=where)
    config = Gemma3Config.from_json_file(folder / "config.json")
    stored, source = read_checkpoint(folder, caller=where)
    model = Gemma3ForCausalLM(config).to(dtype)
    state = model.state_dict()
    matched = match_gemma3(stored, state, tied=config.tie_word_embeddings, source=source, caller=where)
    with torch.no_grad():
        for name, tensor in matched.items():
            state[name].copy_(tensor)                                                  # into the model's dtype
    return model.eval()
