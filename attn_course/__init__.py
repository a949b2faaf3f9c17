"""attn_course: the tested code behind the self-attention course.

The names students use most are re-exported here. The folders, in the order the course reads them:

- ``core``: attention, masks, multi-head attention, the KV cache, Transformer blocks;
- ``positions``: RoPE (and its scalings), ALiBi;
- ``variants``: sliding window, attention sinks, latent and linear attention, FlexAttention;
- ``flash``: FlashAttention, tiled in PyTorch and as Triton kernels;
- ``distributed``: ring attention and Ulysses across processes;
- ``models``: the tiny language model, BERT and Llama with their Hugging Face loaders, the attention-only model;
- ``circuits``: what trained heads do (induction and previous-token scores, composition, ablation, patching);
- ``data``: the corpora, tokenizers and the worked example's sentence;
- then what serves the chapters: ``teaching`` (sources, plots, widgets, experiments),
  ``checks`` (the exercises' checks) and ``measure`` (the measurements they show).
"""

from attn_course._threads import one_thread, threads
from attn_course.core.attention import classic_self_attention, self_attention
from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import causal_mask, padding_mask
from attn_course.core.multihead import MultiHeadAttention
from attn_course.teaching.source import show_source

__all__ = [
    "self_attention",
    "classic_self_attention",
    "causal_mask",
    "padding_mask",
    "MultiHeadAttention",
    "KVCache",
    "show_source",
    "one_thread",
    "threads",
]

__version__ = "0.1.0"
