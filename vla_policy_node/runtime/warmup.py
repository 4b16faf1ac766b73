"""The warm-up: one inference before the first real tick, so that tick is not the slow one."""
from __future__ import annotations

import numpy as np

from ..observation import Observation
from ..policy.rtc import RTCSettings
from .chunk import ActionChunk
from .view import RuntimeView


def neutral_state(runtime: RuntimeView) -> np.ndarray:
    """A state that normalises to zero."""
    return runtime.state_normalizer.unnormalize(np.zeros(runtime.config.state_dim, dtype=np.float32))


def warm_up(runtime: RuntimeView) -> ActionChunk:
    """One inference on a blank observation, outside the cache.

    With CUDA graphs this captures the prefix graph and the plain and guided-RTC denoise graphs; under
    ``cuda_graphs: on`` a capture failure here raises FastPathError (a configure error). Shapes first seen
    later (trained RTC, another prompt bucket) are captured then and fall back to eager, logged, on failure:
    a tick never fails on a capture."""
    cfg = runtime.config
    height, width = cfg.image_resolution
    blank = {name: np.zeros((height, width, 3), dtype=np.uint8) for name in cfg.camera_names}
    observation = Observation(blank, neutral_state(runtime), 'warm up')
    denoiser = runtime._fast
    runners = [runner for runner in (denoiser, runtime._prefix_graphs) if runner is not None]
    strict = runtime.cuda_graphs == 'on'
    try:
        for runner in runners:
            runner.strict = strict
        chunk = runtime.infer(observation, seed=0, use_cache=False)
        if denoiser is not None and denoiser.graphs:
            runtime.infer(observation, seed=0, use_cache=False, prev_chunk_left_over=np.zeros((1, 1)),
                          inference_delay=0, rtc=RTCSettings())
    finally:
        for runner in runners:
            runner.strict = False
    return chunk
