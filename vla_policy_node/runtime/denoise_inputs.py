"""What a chunk's denoise takes besides the prefix: the step count, the noise, the state row, the
real-time-chunking leftover and the embodiment. Each is checked (ObservationError naming it) before the cache is
looked at."""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np
import torch

from ..observation import ObservationError
from ..policy.rtc import RTCSettings, resolved


def checked_steps(steps: int) -> int:
    if steps < 1:
        raise ObservationError('num_steps', f'must be >= 1, got {steps}')
    return steps


def noise_tensor(noise: Optional[np.ndarray], seed: Optional[int], shape: Tuple[int, int, int],
                 device: torch.device) -> torch.Tensor:
    """The given noise ([H, A] or [1, H, A]) or noise drawn from ``seed`` (None: unseeded), as [1, H, A]."""
    if noise is not None:
        array = np.asarray(noise, dtype=np.float32)
        if array.shape not in (shape, shape[1:]):
            raise ObservationError('noise', f'expected shape {list(shape[1:])}, got {list(array.shape)}')
        return torch.from_numpy(array.reshape(shape).copy()).to(device)
    # Drawn on the CPU so a seed gives the same noise on every device.
    generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
    return torch.randn(shape, generator=generator).to(device)


def state_row(normalized_state: np.ndarray, max_state_dim: int, device: torch.device) -> torch.Tensor:
    """The normalised state [state_dim] as the model reads it: [1, max_state_dim], zero-padded as lerobot's
    pad_vector."""
    state = np.zeros(max_state_dim, dtype=np.float32)
    state[:len(normalized_state)] = normalized_state
    return torch.from_numpy(state)[None].to(device)


def leftover_tensor(prev_chunk_left_over: Optional[np.ndarray], prev_actions: Optional[np.ndarray],
                    raw_state: np.ndarray, config: Any, to_model_space: Callable[[np.ndarray, np.ndarray], np.ndarray],
                    device: torch.device) -> Optional[torch.Tensor]:
    """The previous chunk's unexecuted actions in the model's space [T, A], or None.

    prev_chunk_left_over is already normalised ([T, <= max_action_dim]); prev_actions are robot
    units ([T, action_dim]), absolute, brought to the model's space against this observation's raw
    state by the family (``to_model_space``: PolicyFamily.to_model_space).
    """
    if prev_chunk_left_over is not None and prev_actions is not None:
        raise ObservationError('prev_actions', 'give prev_chunk_left_over or prev_actions, not both')
    name, array = (('prev_actions', prev_actions) if prev_actions is not None
                   else ('prev_chunk_left_over', prev_chunk_left_over))
    if array is None:
        return None
    array = np.asarray(array, dtype=np.float64)
    width = config.action_dim if name == 'prev_actions' else config.max_action_dim
    if array.ndim != 2 or not 0 < array.shape[1] <= width or (name == 'prev_actions' and array.shape[1] != width):
        raise ObservationError(name, f'expected [T, {width}], got {list(array.shape)}')
    if not np.all(np.isfinite(array)):
        raise ObservationError(name, 'non-finite value(s)')
    if name == 'prev_actions':
        array = to_model_space(array, raw_state)
    return torch.from_numpy(np.asarray(array, dtype=np.float32)).to(device)


def resolved_rtc(rtc: Optional[RTCSettings], modes: Sequence[str]) -> Optional[RTCSettings]:
    """The settings with mode "auto" as the family's first RTC mode (policy/rtc.py ``resolved``)."""
    try:
        return resolved(rtc, modes)
    except ValueError as exc:
        raise ObservationError('rtc', str(exc)) from exc


def check_rtc(rtc: Optional[RTCSettings], inference_delay: int, training_max_delay: int, capabilities: Any) -> None:
    """The delay is >= 0; the mode is one the family honours (``capabilities.rtc_modes``); trained RTC needs a
    checkpoint trained for it, up to its ``rtc_training_max_delay``."""
    if inference_delay < 0:
        raise ObservationError('inference_delay', f'must be >= 0, got {inference_delay}')
    if rtc is not None and rtc.mode not in capabilities.rtc_modes:
        raise ObservationError('rtc', f'mode "{rtc.mode}" is not one this policy family continues a chunk with '
                               f'(its modes: {", ".join(capabilities.rtc_modes) or "none"})')
    if rtc is None or rtc.mode != 'trained':
        return
    if training_max_delay <= 0:
        raise ObservationError('rtc', 'mode "trained" needs a checkpoint with rtc_training_max_delay > 0')
    if inference_delay > training_max_delay:
        raise ObservationError('inference_delay', f'{inference_delay} exceeds the checkpoint '
                               f'rtc_training_max_delay {training_max_delay}')


def embodiment_tensor(embodiment_id: Optional[int], device: torch.device) -> Optional[torch.Tensor]:
    """The family's embodiment as the denoise takes it ([1] int64, one robot), or None for a family with one
    set of action weights."""
    return None if embodiment_id is None else torch.tensor([int(embodiment_id)], dtype=torch.int64, device=device)
