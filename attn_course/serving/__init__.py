"""Serving attention (chapter 14).

``block_manager``: the paged KV cache's bookkeeping (the free list, a block table per request,
reference counts and the names of cached prefixes).
"""

from attn_course.serving.block_manager import Block, BlockManager, prefix_hash

__all__ = ["Block", "BlockManager", "prefix_hash"]
