"""What a :class:`~attn_course.recall.models.RecallModel` keeps to decode the next token: a state or a cache.

After ``N`` tokens, each layer keeps (``H`` heads of ``d``; chapter 04's KV cache, chapter 09's linear state):

- ``"softmax"``: every key and value so far, ``2 · H · d · N``: the KV cache, growing with every token;
- ``"linear"``: the state ``S`` ``[H, d, d]`` and the normaliser ``z`` ``[H, d]``, whatever ``N``;
- ``"delta"``: the state ``S`` ``[H, d, d]``, whatever ``N``;

and every layer with a short convolution also its last ``K − 1`` inputs over the ``3 · H · d`` channels of
``q, k, v`` (a fixed buffer). The recurrent layers' fixed size is what makes them cheap to decode, and the
same fixed size is what the recall experiment finds full. (:mod:`~attn_course.variants.layout_cache_size`
counts the same for published models from their configs; Hugging Face keeps ``K`` inputs there, not ``K − 1``.)
"""

from __future__ import annotations

from dataclasses import dataclass

from attn_course import _validate
from attn_course.recall.models import RecallModelConfig

__all__ = ["DecodingMemory", "decoding_memory"]


@dataclass(frozen=True)
class DecodingMemory:
    """What a model keeps per sequence after ``tokens`` tokens, in bytes.

    Attributes:
        tokens: ``N``.
        state_bytes: the fixed part: recurrent states and convolution buffers.
        cache_bytes: the growing part: the softmax layers' keys and values.
    """

    tokens: int
    state_bytes: int
    cache_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.cache_bytes

    @property
    def bytes_per_token(self) -> float:
        """``total_bytes / tokens``: falls as ``1 / N`` for a state, tends to a constant for a cache."""
        return self.total_bytes / self.tokens


def decoding_memory(config: RecallModelConfig, tokens: int, *, bytes_per_element: int = 4) -> DecodingMemory:
    """The bytes ``config``'s model keeps per sequence to decode token ``tokens + 1`` (module docstring).

    Args:
        config: the model's :class:`~attn_course.recall.models.RecallModelConfig`.
        tokens: ``N >= 1``, the tokens seen so far.
        bytes_per_element: 4 for float32 (the course's models), 2 for bfloat16.

    Returns:
        a :class:`DecodingMemory`.

    Raises:
        TypeError: ``config`` not a RecallModelConfig, ``tokens`` or ``bytes_per_element`` not an int.
        ValueError: ``tokens`` or ``bytes_per_element`` below 1.

    Example:
        >>> hybrid = RecallModelConfig(vocab_size=128, mixers=("delta", "softmax"))   # H = 2, d = 16, K = 4
        >>> [decoding_memory(hybrid, n).total_bytes for n in (100, 200)]   # 4 · (2·3·96 + 2·16·16 + 2·2·16·N)
        [29952, 55552]
    """
    where = "decoding_memory"
    config = _validate.instance(where, "config", config, RecallModelConfig)
    tokens = _validate.integer(where, "tokens", tokens, minimum=1)
    size = _validate.integer(where, "bytes_per_element", bytes_per_element, minimum=1)
    heads, d = config.n_heads, config.head_dim
    conv = (config.conv_kernel - 1) * 3 * heads * d                    # last K - 1 inputs of q, k, v
    fixed = {"softmax": 0, "linear": heads * d * d + heads * d, "delta": heads * d * d}
    state = sum(fixed[kind] + conv for kind in config.mixers)
    cache = sum(2 * heads * d * tokens for kind in config.mixers if kind == "softmax")
    return DecodingMemory(tokens, state * size, cache * size)
