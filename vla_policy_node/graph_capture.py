"""One CUDA graph capture and what the graph holds: the capture the fast path (fast_path.py) runs at warm-up.

``GraphCapturer(device).capture(fn, inputs)`` runs ``fn(inputs)`` once eagerly on a side stream (lazy
initialisation, allocations: PyTorch's CUDA-graph notes ask for that warm-up), then captures a second call
with ``torch.cuda.graph`` into a private memory pool of its own. Three things a bare ``torch.cuda.graph``
does not do, each a defect a device would show:

- the device: the capture, its side stream and its pool are made under ``torch.cuda.device(device)``. The
  current device is otherwise cuda:0 whatever ``device`` says, and a capture on a stream of another device
  than the tensors' records nothing: an empty graph whose replays leave the outputs stale.
- a failed capture leaves the thread and the allocator as they were: torch's ``graph.__exit__`` raises from
  ``capture_end()`` before it restores the stream (torch/cuda/graphs.py), and ``CUDAGraph::capture_end``
  throws before it stops routing allocations into the graph's pool, which ``reset()`` then never releases
  (aten/src/ATen/cuda/CUDAGraph.cpp). The capturer puts the thread back on its stream and ends and releases
  the pool, as ``torch.cuda.use_mem_pool`` does on its way out.
- the bytes: a graph holds its private pool's reserved segments (``torch.cuda.memory_snapshot`` by
  ``segment_pool_id``), which an allocated-bytes delta misses; where torch reports no pool ids, the reserved
  delta across the capture stands in (the cached blocks are emptied first, so the delta is the pool's).

On the CPU, test/capture_standin.py replaces the ``torch.cuda`` calls used here with a strict stand-in and adds
'cpu' to ``CAPTURE_DEVICE_TYPES``, so this code, unchanged, is what the CPU suite captures through.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import torch

# Device types a graph is captured on: CUDA. The CPU suite's capture stand-in adds 'cpu'; nothing else does.
CAPTURE_DEVICE_TYPES: Tuple[str, ...] = ('cuda',)


@dataclass
class CapturedGraph:
    graph: Any                   # torch.cuda.CUDAGraph (or a stand-in with .replay())
    inputs: Any                  # the static chunk / prefix inputs the graph reads
    output: Any                  # graph-owned output tensor(s)
    nbytes: int                  # what the graph holds: its pool's reserved bytes (+ its static inputs: fast_path)


def root_cause(exc: BaseException) -> BaseException:
    """The first exception of a chain: a failed capture raises from ``capture_end`` while the operation that
    broke the capture (a host read, a copy from the host) is its ``__context__``."""
    seen = {id(exc)}
    while True:
        inner = exc.__cause__ or exc.__context__
        if inner is None or id(inner) in seen:
            return exc
        seen.add(id(inner))
        exc = inner


def failure_reason(exc: BaseException, limit: int = 160) -> str:
    """'<Type>: <message>' of what broke a capture (the root cause), on one line, at most ``limit`` characters."""
    cause = root_cause(exc)
    text = ' '.join(f'{type(cause).__name__}: {cause}'.split())
    return text if len(text) <= limit else text[:limit - 3] + '...'


def pool_reserved_bytes(pool: Any, device_index: int) -> Optional[int]:
    """Bytes the allocator has reserved for the private pool ``pool`` on a device (its segments, free blocks
    included), or None where torch's memory snapshot does not say which pool a segment belongs to."""
    try:
        segments = torch.cuda.memory_snapshot()
    except Exception:  # noqa: BLE001 - no snapshot: the caller measures the reserved delta
        return None
    if any('segment_pool_id' not in segment for segment in segments):
        return None
    return sum(int(segment['total_size']) for segment in segments
               if tuple(segment['segment_pool_id']) == tuple(pool) and segment.get('device') == device_index)


def release_failed_pool(device_index: int, pool: Any) -> None:
    """After a capture that did not end: stop routing allocations into ``pool`` and release it. Where
    ``capture_end`` got that far, ending fails and the graph's own ``reset()`` releases the pool instead."""
    end = getattr(torch._C, '_cuda_endAllocateToPool', None)
    release = getattr(torch._C, '_cuda_releasePool', None)
    if end is None or release is None:
        return
    try:
        end(device_index, pool)
    except Exception:  # noqa: BLE001 - not recording to that pool: nothing of ours to release
        return
    release(device_index, pool)


class GraphCapturer:
    """Captures ``fn(inputs) -> output`` as a CUDA graph on ``device`` (None: the current CUDA device), each
    graph in a private memory pool of its own; the CPU tests run it through test/capture_standin.py."""

    def __init__(self, device: Optional[torch.device] = None) -> None:
        self.device = device

    def capture(self, fn: Callable[[Any], Any], inputs: Any) -> CapturedGraph:
        """The graph of ``fn(inputs)``, whose ``nbytes`` are its pool's reserved bytes. On failure it raises
        and the thread is on the stream it was on, the pool released."""
        with torch.cuda.device(self.device):
            index = torch.cuda.current_device()
            previous = torch.cuda.current_stream()
            side = torch.cuda.Stream()
            side.wait_stream(previous)
            with torch.cuda.stream(side):
                fn(inputs)                                   # warm-up: lazy inits, allocations, not captured
            previous.wait_stream(side)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()                         # the reserved delta below is then the pool's
            reserved = torch.cuda.memory_reserved()
            pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            ended = False
            try:
                with torch.cuda.graph(graph, pool=pool, stream=side):
                    output = fn(inputs)
                ended = True
            finally:
                torch.cuda.set_stream(previous)              # graph.__exit__ skips this when capture_end raises
                if not ended:
                    release_failed_pool(index, pool)
            torch.cuda.synchronize()
            nbytes = pool_reserved_bytes(pool, index)
            if nbytes is None:
                nbytes = max(torch.cuda.memory_reserved() - reserved, 0)
        return CapturedGraph(graph, inputs, output, nbytes)
