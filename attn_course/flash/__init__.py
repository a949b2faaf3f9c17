"""FlashAttention: exact attention computed tile by tile, never storing the N × N matrix.

* :mod:`attn_course.flash.tiled`: the algorithm in plain PyTorch (``online_softmax``,
  ``tiled_attention``), to read and to check against.
"""

from attn_course.flash.tiled import merge_softmax_blocks, online_softmax, tiled_attention

__all__ = ["online_softmax", "merge_softmax_blocks", "tiled_attention"]
