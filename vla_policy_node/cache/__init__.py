"""Exact-match prefix K/V cache: the context, its key and the byte-bounded LRU."""
from .context import PrefixContext
from .key import PREFIX_LAYOUT_VERSION, PrefixKeyBuilder
from .lru import CacheStats, PrefixCache

__all__ = ['PrefixContext', 'PrefixCache', 'CacheStats', 'PrefixKeyBuilder', 'PREFIX_LAYOUT_VERSION']
