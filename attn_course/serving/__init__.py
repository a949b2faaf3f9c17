"""Serving attention (chapter 14).

``block_manager``: the paged KV cache's bookkeeping (the free list, a block table per request,
reference counts and the names of cached prefixes). ``paged_cache``: the cache's tensors, and each
layer's view of them for one forward pass, a ``KVCache`` the course's models run on unchanged.
``scheduler``: continuous batching with chunked prefill and preemption. ``engine``: the loop.
``speculative``: which of a draft model's tokens the target keeps (greedy, and rejection sampling).
"""

from attn_course.serving.block_manager import Block, BlockManager, prefix_hash
from attn_course.serving.engine import Engine, StepRecord
from attn_course.serving.paged_cache import KVPool, PagedKVCache
from attn_course.serving.scheduler import Request, Scheduler, Step
from attn_course.serving.speculative import verify_greedy, verify_sampled

__all__ = ["Block", "BlockManager", "Engine", "KVPool", "PagedKVCache", "Request", "Scheduler", "Step", "StepRecord",
           "prefix_hash", "verify_greedy", "verify_sampled"]
