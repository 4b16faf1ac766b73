"""The server's request queue: requests from any connection, run in batches on one worker thread.

    submit(item) --> queue (at most max_queue waiting or running; one more: QueueFull)
    collector:  the first waiting request opens a batch; it closes after window_sec from that request's arrival,
                as soon as max_batch requests are in it, or as soon as every client that could send has a
                request in it (``clients()``: the wire has one request in flight per connection, so a lone
                robot never waits for the window); a request that already waited for the worker longer than
                the window closes it at once -> run_batch(items) on the worker thread
                -> each request's own outcome to its own caller

``max_batch`` 1 is the serial server (each request alone, as PolicyRuntime.infer runs it). Each caller awaits
a future of its own that only its batch row resolves, so no reply can reach another request's connection.
Memory is bounded by ``max_queue`` requests and one batch in flight.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time
from dataclasses import dataclass
from typing import Any, Callable, Deque, List, Optional, Sequence

DEFAULT_MAX_QUEUE = 8
DEFAULT_MAX_BATCH = 1
DEFAULT_WINDOW_MS = 0.0


class QueueFull(RuntimeError):
    """``max_queue`` requests are already waiting or running."""


@dataclass
class BatchStats:
    """What the queue did so far (vla_policy_serve's and the fleet replicas' statistics)."""

    batches: int = 0
    requests: int = 0
    refused_busy: int = 0
    largest_batch: int = 0
    pending: int = 0

    @property
    def mean_batch(self) -> float:
        return self.requests / self.batches if self.batches else 0.0


class BatchingQueue:
    """``await submit(item)`` -> ``run_batch([...item...])``'s entry for that item. Lives on one event loop."""

    def __init__(self, run_batch: Callable[[Sequence[Any]], List[Any]], max_batch: int = DEFAULT_MAX_BATCH,
                 window_sec: float = DEFAULT_WINDOW_MS / 1e3, max_queue: int = DEFAULT_MAX_QUEUE,
                 thread_name: str = 'vla_serve_infer',
                 clients: Optional[Callable[[], Optional[int]]] = None) -> None:
        """``clients``: how many clients could send a request now (None, or a call returning None: unknown; then
        only the window and max_batch close a batch)."""
        if max_batch < 1 or max_queue < 1 or not window_sec >= 0:
            raise ValueError('max_batch and max_queue must be >= 1 and the window >= 0')
        self._run_batch = run_batch
        self.clients = clients
        self.max_batch = int(max_batch)
        self.window_sec = float(window_sec)
        self.max_queue = int(max_queue)
        self.stats = BatchStats()
        self.on_batch: Optional[Callable[[int], None]] = None     # called with each batch's size (metrics)
        self._waiting: Deque[_Waiting] = collections.deque()
        self._arrived: Optional[asyncio.Event] = None
        self._collector: Optional[asyncio.Task] = None
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)

    @property
    def pending(self) -> int:
        return self.stats.pending

    async def submit(self, item: Any) -> Any:
        """The outcome ``run_batch`` gave ``item``; QueueFull at once when ``max_queue`` are already pending."""
        if self.stats.pending >= self.max_queue:
            self.stats.refused_busy += 1
            raise QueueFull(f'{self.stats.pending} requests already queued (max_queue {self.max_queue})')
        loop = asyncio.get_running_loop()
        if self._collector is None or self._collector.done():
            self._arrived = asyncio.Event()
            self._collector = loop.create_task(self._collect())
        waiting = _Waiting(item, loop.create_future(), time.monotonic())
        self.stats.pending += 1          # until its batch is done (or it is dropped, cancelled, before one)
        self._waiting.append(waiting)
        self._arrived.set()
        return await waiting.future

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
            closes = self._waiting[0].arrived + self.window_sec
            while len(self._waiting) < self._batch_target() and time.monotonic() < closes:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), max(0.0, closes - time.monotonic()))
                except asyncio.TimeoutError:
                    break
            batch = []
            while self._waiting and len(batch) < self.max_batch:
                waiting = self._waiting.popleft()
                if waiting.future.done():        # its caller went away (cancelled) before it ran
                    self.stats.pending -= 1
                else:
                    batch.append(waiting)
            if not batch:
                continue
            self.stats.batches += 1
            self.stats.requests += len(batch)
            self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
            if self.on_batch is not None:
                self.on_batch(len(batch))
            try:
                outcomes = await loop.run_in_executor(self._worker, self._run_batch, [w.item for w in batch])
                if len(outcomes) != len(batch):
                    raise RuntimeError(f'run_batch returned {len(outcomes)} outcomes for {len(batch)} requests')
            except Exception as exc:    # a failure of the whole batch reaches every request in it
                outcomes = [_Failed(exc)] * len(batch)
            finally:
                self.stats.pending -= len(batch)
            for waiting, outcome in zip(batch, outcomes):
                if waiting.future.done():
                    continue
                if isinstance(outcome, _Failed):
                    waiting.future.set_exception(outcome.exc)
                else:
                    waiting.future.set_result(outcome)

    def _batch_target(self) -> int:
        """How many requests close a batch: max_batch, or fewer when fewer clients could send one."""
        clients = self.clients() if self.clients is not None else None
        return self.max_batch if clients is None else max(1, min(self.max_batch, int(clients)))

    def close(self) -> None:
        """Stop collecting and wait for the batch in flight."""
        if self._collector is not None:
            self._collector.cancel()
        self._worker.shutdown(wait=True)


@dataclass
class _Failed:
    exc: BaseException


@dataclass
class _Waiting:
    item: Any
    future: asyncio.Future
    arrived: float
