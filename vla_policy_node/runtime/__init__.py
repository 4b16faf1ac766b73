"""The local backend: ``PolicyRuntime``, observation in, ``ActionChunk`` out (no rclpy).

One job per module:
- ``policy_runtime.py``: ``PolicyRuntime`` (the inference pipeline, the prefix cache, the fast path's use);
- ``chunk.py``: ``ActionChunk``, the timed stages and their clocks; ``stage_timer.py``: the timing;
- ``denoise_inputs.py``: steps, noise, state row, RTC leftover, embodiment, checked (the model's action space
  and the robot's units are the family's: ``PolicyFamily.postprocess`` / ``to_model_space``);
- ``warmup.py``: the warm-up; ``report.py``: ``describe`` / ``summary`` / fast-path figures / prefix bytes;
- ``devices.py``: the device, dtype and CPU-thread settings.

The content checks of an observation are ``observation_checks.py``, beside the contract, shared with the
remote backend.
"""
# remote/client.py and remote/frames.py import the content checks from here; their home is observation_checks.
from ..observation_checks import check_rgb_array, checked_instruction, checked_state
from .chunk import CUDA_EVENTS_CLOCK, HOST_CLOCK, STAGES, ActionChunk
from .devices import resolve_device, resolve_dtype, set_cpu_threads
from .policy_runtime import DEFAULT_CACHE_BYTES, DEFAULT_CACHE_ENTRIES, PolicyRuntime

__all__ = ['ActionChunk', 'CUDA_EVENTS_CLOCK', 'DEFAULT_CACHE_BYTES', 'DEFAULT_CACHE_ENTRIES', 'HOST_CLOCK',
           'PolicyRuntime', 'STAGES', 'check_rgb_array', 'checked_instruction', 'checked_state', 'resolve_device',
           'resolve_dtype', 'set_cpu_threads']
