"""Per-stage milliseconds of one inference (``ActionChunk.timings_ms``), on the clock that tells the truth."""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Tuple

import torch

from .chunk import CUDA_EVENTS_CLOCK, HOST_CLOCK, STAGES


class StageTimer:
    """CUDA events on a CUDA device (GPU-true: each stage is the time between events recorded on the stream
    at its boundaries, no synchronize inside the chunk, one wait in ``ms``), ``time.perf_counter`` on the
    CPU. ``clock`` labels which one made the figures. Starting a stage stops the running one."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == 'cuda'
        self._device = device
        self.clock = CUDA_EVENTS_CLOCK if self._cuda else HOST_CLOCK
        self._host_ms: Dict[str, float] = {stage: 0.0 for stage in STAGES}
        self._events: List[Tuple[str, object, object]] = []     # (stage, start event, end event) on CUDA
        self._stage: Optional[str] = None
        self._start: object = 0.0

    def _mark(self) -> object:
        if self._cuda:
            # On the runtime's device: an event recorded on another device's stream times nothing of ours.
            with torch.cuda.device(self._device):
                event = torch.cuda.Event(enable_timing=True)
                event.record()
            return event
        return time.perf_counter()

    def start(self, stage: str) -> None:
        self.stop()
        self._stage, self._start = stage, self._mark()

    def stop(self) -> None:
        if self._stage is None:
            return
        end = self._mark()
        if self._cuda:
            self._events.append((self._stage, self._start, end))
        else:
            self._host_ms[self._stage] += (end - self._start) * 1e3
        self._stage = None

    @property
    def ms(self) -> Dict[str, float]:
        """Milliseconds per stage (on CUDA this waits for the last event, once per chunk)."""
        self.stop()
        if not self._cuda:
            return dict(self._host_ms)
        totals = {stage: 0.0 for stage in STAGES}
        if self._events:
            self._events[-1][2].synchronize()
        for stage, start, end in self._events:
            totals[stage] += start.elapsed_time(end)
        return totals
