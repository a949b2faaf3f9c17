"""FlashAttention: exact attention computed tile by tile, never storing the N × N matrix.

* :mod:`attn_course.flash.tiled`: the algorithm in plain PyTorch (``online_softmax``,
  ``tiled_attention``), to read and to check against, and
  ``TiledAttentionFunction`` (the ``torch.autograd.Function`` that ``tiled_attention`` uses in training);
* :mod:`attn_course.flash.tiled_backward`: its backward pass (``tiled_attention_backward``),
  recomputing the weights tile by tile from the log-sum-exp.
* :mod:`attn_course.flash.kernels` and :mod:`~attn_course.flash.kernels_backward`: the same
  algorithm as Triton GPU kernels, forward, flash-decoding for a few queries against a long
  cache, and backward; :mod:`attn_course.flash.triton_attention` launches them
  (``flash_attention``, ``decode_attention``; :mod:`~attn_course.flash.decode` for
  flash-decoding), with the launch configurations of :mod:`~attn_course.flash.configs` and the
  checks of :mod:`~attn_course.flash.launch`, on a GPU or, without one, in Triton's interpreter
  (:mod:`~attn_course.flash.triton_mode`; ``use_interpreter_without_gpu()`` for a notebook that
  writes its own kernels).
* :mod:`attn_course.flash.kernels_tma`: the forward over tensor descriptors (TMA), which
  ``flash_attention`` takes by itself on a Hopper GPU (:mod:`~attn_course.flash.tma_attention`, tuned
  over the candidates :mod:`~attn_course.flash.tma_configs` keeps). Compiling every kernel for sm_80
  and sm_90 without a GPU is a tool apart from the course: ``python -m gpu_tools.aot``.
* :mod:`attn_course.flash.accuracy`: the FlashAttention rule and the one float64 reference
  (grouped-query heads, bottom-right causal) that the tests, the GPU self-check and chapter 07 use.
* :mod:`attn_course.flash.backend`: registers the kernel as ``MultiHeadAttention``'s ``"flash"`` backend.

Importing this package imports no Triton and changes no environment variable.
"""

from attn_course.flash import backend  # noqa: F401  (registers the "flash" attention backend)
from attn_course.flash.tiled import TiledAttentionFunction, merge_softmax_blocks, online_softmax, tiled_attention
from attn_course.flash.tiled_backward import tiled_attention_backward
from attn_course.flash.triton_attention import decode_attention, flash_attention
from attn_course.flash.triton_mode import use_interpreter_without_gpu

__all__ = ["online_softmax", "merge_softmax_blocks", "tiled_attention", "TiledAttentionFunction",
           "tiled_attention_backward", "flash_attention", "decode_attention", "use_interpreter_without_gpu"]
