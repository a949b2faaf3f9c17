"""Attention across processes on ``torch.distributed``: the launcher and the sequence layouts.

- ``launch``: :func:`launch` runs a function on ``P`` fresh processes joined in a gloo (CPU) or
  NCCL (GPU) process group and returns their results; a failing rank ends the run with its error.
- ``layout``: :func:`shard` / :func:`unshard` and :func:`token_positions` for the contiguous,
  zig-zag and striped layouts of a sequence over ranks.
- ``communication``: the ring transfer and the all-to-all the algorithms use.
- ``ring``: :func:`ring_attention`, exact attention over a sequence sharded across ranks by passing
  K/V blocks around a ring (forward and backward, in any of the three layouts); ``ring_work``:
  :func:`ring_work`, the chunk pairs each rank computes, predicted.
- ``ulysses``: :func:`ulysses_attention`, DeepSpeed-Ulysses: all-to-all from a slice of the tokens
  to a slice of the heads, ordinary attention, all-to-all back; :func:`ulysses_bytes` its traffic.
- ``wiretap``: the bytes read off the tensors handed to ``torch.distributed``, knowing no algorithm.
- ``torchrun_demo``: both algorithms under ``torchrun --standalone --nproc-per-node P -m
  attn_course.distributed.torchrun_demo``, checked against one process.

What the algorithms do is counted from outside, by :mod:`attn_course.measure.distributed`.
"""

from attn_course.distributed.launch import RankFailed, launch
from attn_course.distributed.layout import LAYOUTS, chunk_count, shard, token_positions, unshard
from attn_course.distributed.ring import RingAttentionFunction, ring_attention, ring_attention_on_rank
from attn_course.distributed.ring_work import ring_work
from attn_course.distributed.ulysses import ulysses_attention, ulysses_bytes

__all__ = ["launch", "RankFailed", "shard", "unshard", "token_positions", "chunk_count", "LAYOUTS",
           "ring_attention", "RingAttentionFunction", "ring_work", "ring_attention_on_rank", "ulysses_attention",
           "ulysses_bytes"]
