"""Exact-match prefix cache: the context (a named mapping of tensors), its key and the byte-bounded LRU."""
from .context import (KV, KV_AXES, MASK_AXES, PAD_MASK, PREFIX, ContextAxes, PrefixContext, can_stack,
                      context_row, kv_prefix_context, stack_contexts)
from .key import PREFIX_LAYOUT_VERSION, PrefixKeyBuilder
from .lru import CacheStats, PrefixCache

__all__ = ['ContextAxes', 'KV', 'KV_AXES', 'MASK_AXES', 'PAD_MASK', 'PREFIX', 'PrefixContext', 'PrefixCache',
           'CacheStats', 'PrefixKeyBuilder', 'PREFIX_LAYOUT_VERSION', 'can_stack', 'context_row',
           'kv_prefix_context', 'stack_contexts']
