"""attn_course: the tested code behind the self-attention course.

The names students use most are re-exported here; each idea lives in its own module
(``attention``, ``masks``, ``toy_sentence``, ``widgets``, ``plots``, ...).
"""

# First: on a machine without a CUDA GPU, select Triton's interpreter before anything imports Triton.
from attn_course import _triton_mode  # noqa: F401, I001
from attn_course.attention import classic_self_attention, self_attention
from attn_course.kv_cache import KVCache
from attn_course.masks import causal_mask, padding_mask
from attn_course.multihead import MultiHeadAttention
from attn_course.source import show_source

__all__ = [
    "self_attention",
    "classic_self_attention",
    "causal_mask",
    "padding_mask",
    "MultiHeadAttention",
    "KVCache",
    "show_source",
]

__version__ = "0.1.0"
