"""Byte- and entry-bounded LRU of prefix contexts, safe to share between threads."""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from .context import PrefixContext


@dataclass(frozen=True)
class CacheStats:
    """A consistent snapshot of the cache counters."""

    hits: int
    misses: int
    insertions: int
    evictions: int
    rejected_oversize: int
    entries: int
    bytes: int
    max_bytes: int
    max_entries: int

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


class PrefixCache:
    """Exact-match LRU: a key either names a stored context or it is a miss.

    Bounded twice: by ``max_entries`` and by ``max_bytes`` of device memory
    (``PrefixContext.nbytes``). A context larger than the whole byte budget
    is not stored at all (``put`` returns False and ``rejected_oversize``
    counts it) rather than flushing everything else for nothing.
    Stored contexts are shared, never copied: callers must treat them as read-only.
    """

    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self._lock = threading.Lock()
        self._entries: 'OrderedDict[str, PrefixContext]' = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._insertions = self._evictions = self._rejected = 0
        self._max_bytes = 0
        self._max_entries = 0
        self.resize(max_bytes, max_entries)

    def get(self, key: str) -> Optional[PrefixContext]:
        with self._lock:
            context = self._entries.get(key)
            if context is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return context

    def put(self, key: str, context: PrefixContext) -> bool:
        """Store ``context`` under ``key``; returns whether it was stored."""
        size = context.nbytes
        with self._lock:
            if self._max_entries == 0 or size > self._max_bytes:
                self._rejected += 1
                return False
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = context
            self._bytes += size
            self._insertions += 1
            self._evict_locked()
            return True

    def resize(self, max_bytes: int, max_entries: int) -> None:
        """Change the bounds (a live parameter change); evicts down to them at once."""
        if max_bytes < 0 or max_entries < 0:
            raise ValueError('cache bounds must be >= 0')
        with self._lock:
            self._max_bytes = int(max_bytes)
            self._max_entries = int(max_entries)
            self._evict_locked()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(hits=self._hits, misses=self._misses, insertions=self._insertions,
                              evictions=self._evictions, rejected_oversize=self._rejected,
                              entries=len(self._entries), bytes=self._bytes,
                              max_bytes=self._max_bytes, max_entries=self._max_entries)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Membership without touching LRU order or counters."""
        with self._lock:
            return key in self._entries

    def _evict_locked(self) -> None:
        while self._entries and (len(self._entries) > self._max_entries or self._bytes > self._max_bytes):
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes
            self._evictions += 1
