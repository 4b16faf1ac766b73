"""The observation contract's second half: what an observation's *content* must be.

``observation.py`` holds the contract itself and ``InputBuffer``'s timing and topic checks; these are
the checks of what arrived, shared by every backend (the local runtime runs them before the cache
lookup, the remote client before anything is sent):

- cameras: only names the model knows, at least one present; each frame checked *without decoding*
  (``images.check_frame``: 8-bit encodings only, geometry, size against ``max_image_pixels`` from the
  raw message or the JPEG/PNG header), an array as RGB uint8 [H, W, 3];
- float frames (what openpi clients may send ``vla_policy_serve``): every value finite and in [0, 1], then
  scaled to uint8 as openpi does (``rgb_from_float``);
- state: [state_dim], every value finite;
- instruction: not empty, not longer than its bound.

Each refusal is an ``ObservationError`` naming the field and carrying its ``SkipReason``.
"""
from __future__ import annotations

from typing import List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .images import CompressedFrame, ImageDecodeError, RawImage, check_frame, frame_from_msg
from .observation import ObservationError, SkipReason

CameraInput = Union[RawImage, CompressedFrame, np.ndarray, None]


def check_rgb_array(name: str, frame: np.ndarray, max_pixels: int) -> None:
    """An RGB uint8 [H, W, 3] array of at most ``max_pixels`` pixels, or ObservationError (bad_image)."""
    if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8 or 0 in frame.shape:
        raise ObservationError(f'images.{name}', f'arrays must be RGB uint8 [H, W, 3], got '
                               f'{frame.dtype} {list(frame.shape)}', SkipReason.BAD_IMAGE)
    if frame.shape[0] * frame.shape[1] > max_pixels:
        raise ObservationError(f'images.{name}', f'array is {frame.shape[1]}x{frame.shape[0]} pixels, '
                               f'more than max_image_pixels {max_pixels}', SkipReason.BAD_IMAGE)


# A float frame may overshoot [0, 1] by rounding (a resize, a colour conversion); one 8-bit level is rounding,
# more is a frame in other units (0-255 floats, normalised to [-1, 1], HDR) that would wrap around as uint8.
FLOAT_FRAME_TOLERANCE = 1.0 / 255


def rgb_from_float(name: str, frame: np.ndarray) -> np.ndarray:
    """A float image in [0, 1] -> uint8 as openpi's ``_parse_image`` makes it (``(255 * image).astype(np.uint8)``,
    openpi 15a9616 src/openpi/policies/droid_policy.py), after checking what openpi does not look at: every value
    finite and within [0, 1] (FLOAT_FRAME_TOLERANCE for rounding, clipped). ObservationError (bad_image)
    otherwise, naming the camera and what was found."""
    values = np.asarray(frame)
    finite = np.isfinite(values)
    if not finite.all():
        raise ObservationError(f'images.{name}', f'float frame has {int(values.size - finite.sum())} non-finite '
                               f'value(s) (NaN or inf) of {values.size}', SkipReason.BAD_IMAGE)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if low < -FLOAT_FRAME_TOLERANCE or high > 1.0 + FLOAT_FRAME_TOLERANCE:
        raise ObservationError(f'images.{name}', f'float frame values must be in [0, 1] (they are scaled by 255), '
                               f'got [{low:.4g}, {high:.4g}]', SkipReason.BAD_IMAGE)
    return (255 * np.clip(values, 0.0, 1.0)).astype(np.uint8)


def checked_frame(name: str, frame: object, max_pixels: int) -> CameraInput:
    """A camera input as a frame (an RGB array as is, a message as RawImage / CompressedFrame, no copy),
    checked without decoding: a huge frame never allocates its pixels."""
    if isinstance(frame, np.ndarray):
        check_rgb_array(name, frame, max_pixels)
        return frame
    try:
        frame = frame_from_msg(frame)
        check_frame(frame, max_pixels)
    except ImageDecodeError as exc:
        raise ObservationError(f'images.{name}', str(exc), SkipReason.BAD_IMAGE) from exc
    return frame


def camera_slots(images: Mapping[str, object], known: Sequence[str],
                 max_pixels: int) -> List[Tuple[str, CameraInput]]:
    """Model slots as lerobot orders them: the present cameras (in ``known``'s order), then the masked ones."""
    unknown = sorted(set(images) - set(known))
    if unknown:
        raise ObservationError('images', f'unknown camera(s) {unknown}; the model knows {list(known)}',
                               SkipReason.BAD_IMAGE)
    present, absent = [], []
    for name in known:
        frame = images.get(name)
        if frame is None:
            absent.append((name, None))
        else:
            present.append((name, checked_frame(name, frame, max_pixels)))
    if not present:
        raise ObservationError('images', 'no camera image at all; at least one is needed', SkipReason.BAD_IMAGE)
    return present + absent


def checked_state(state: np.ndarray, state_dim: int) -> np.ndarray:
    """The raw state as float64 [state_dim], or ObservationError."""
    state = np.asarray(state, dtype=np.float64)
    if state.shape != (state_dim,):
        raise ObservationError('state', f'expected shape [{state_dim}], got {list(state.shape)}',
                               SkipReason.JOINT_STATE_MALFORMED)
    if not np.all(np.isfinite(state)):
        bad = [int(i) for i in np.flatnonzero(~np.isfinite(state))]
        raise ObservationError('state', f'non-finite value(s) at index {bad}', SkipReason.JOINT_STATE_NONFINITE)
    return state


def checked_instruction(instruction: Optional[str], max_length: int) -> str:
    """The instruction text, not empty and at most ``max_length`` characters, or ObservationError."""
    if not instruction or not instruction.strip():
        raise ObservationError('instruction', 'empty', SkipReason.INSTRUCTION_EMPTY)
    if len(instruction) > max_length:
        raise ObservationError('instruction', f'{len(instruction)} characters, more than {max_length} '
                               '(max_instruction_length)', SkipReason.INSTRUCTION_TOO_LONG)
    return instruction
