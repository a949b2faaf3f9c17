"""FlashAttention: exact attention computed tile by tile, never storing the N × N matrix.

* :mod:`attn_course.flash.tiled`: the algorithm in plain PyTorch (``online_softmax``,
  ``tiled_attention``), to read and to check against, and
  ``TiledAttentionFunction`` (the ``torch.autograd.Function`` that ``tiled_attention`` uses in training);
* :mod:`attn_course.flash.tiled_backward`: its backward pass (``tiled_attention_backward``),
  recomputing the weights tile by tile from the log-sum-exp.
* :mod:`attn_course.flash.kernels`: the same algorithm as Triton GPU kernels, forward and
  backward, and flash-decoding for a few queries against a long cache;
  :mod:`attn_course.flash.triton_attention` launches them (``flash_attention``,
  ``decode_attention``), on a GPU or, without one, in Triton's interpreter.
* :mod:`attn_course.flash.kernels_tma`: the forward over tensor descriptors (TMA), which
  ``flash_attention`` takes by itself on a Hopper GPU;
  :mod:`attn_course.flash.aot` compiles every kernel for sm_80 and sm_90 without a GPU.
"""

from attn_course.flash.tiled import TiledAttentionFunction, merge_softmax_blocks, online_softmax, tiled_attention
from attn_course.flash.tiled_backward import tiled_attention_backward
from attn_course.flash.triton_attention import decode_attention, flash_attention

__all__ = ["online_softmax", "merge_softmax_blocks", "tiled_attention", "TiledAttentionFunction",
           "tiled_attention_backward", "flash_attention", "decode_attention"]
