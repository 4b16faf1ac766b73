"""What one inference returns: ``ActionChunk``, the stages it is timed in and the clocks that time them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

STAGES = ('hash', 'preprocess', 'prefix', 'denoise')
# ActionChunk.timings_clock: how the stage timings were measured.
HOST_CLOCK = 'host'                  # time.perf_counter around each stage (CPU)
CUDA_EVENTS_CLOCK = 'cuda_events'    # CUDA events on the stream at the stage boundaries (GPU-true)


def stages_total_ms(timings_ms: Mapping[str, float]) -> float:
    """A chunk's latency: its STAGES added up. Other figures beside them are not stages: a remote chunk's
    ``server_ms`` is the server's own time, already inside the round trip its ``denoise`` stage measures."""
    return sum(timings_ms.get(stage, 0.0) for stage in STAGES)


@dataclass
class ActionChunk:
    """Unnormalised actions [horizon, action_dim] and how they were made."""

    actions: np.ndarray
    cache_hit: bool
    timings_ms: Dict[str, float]
    key: Optional[str]
    num_steps: int
    camera_slots: Tuple[str, ...] = field(default_factory=tuple)
    normalized: Optional[np.ndarray] = None     # [horizon, action_dim] in the model's space (an RTC leftover)
    continued: bool = False                     # steered by a previous chunk's leftover (real-time chunking)
    timings_clock: str = HOST_CLOCK             # what measured timings_ms: 'cuda_events' (GPU-true) or 'host'

    @property
    def total_ms(self) -> float:
        return stages_total_ms(self.timings_ms)
