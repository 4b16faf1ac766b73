"""Camera frames as the wire carries them: RGB uint8, resized with padding on the robot, or raw.

openpi's clients resize on the robot to save bandwidth (openpi's own ``docs/remote_inference.md``) with
``image_tools.resize_with_pad(img, 224, 224)`` (packages/openpi-client/src/openpi_client/image_tools.py,
openpi 15a9616): PIL bilinear to ``int(side / ratio)`` with ``ratio = max(w / W, h / H)``, pasted at
``int((W - w) / 2), int((H - h) / 2)`` on a zero image; a frame already at the size is sent as is.
The same arithmetic is done here so a server trained on openpi's clients sees what it expects.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from ..images import ImageDecodeError, decode_frame
from ..observation import ObservationError, SkipReason
from ..observation_checks import checked_frame


def rgb_frame(name: str, frame: Any, max_pixels: int) -> np.ndarray:
    """A camera input (ROS message, RawImage, CompressedFrame or RGB array) -> uint8 [H, W, 3], checked
    before anything is decoded (ObservationError bad_image otherwise)."""
    checked = checked_frame(name, frame, max_pixels)
    if isinstance(checked, np.ndarray):
        return checked
    try:
        pixels = decode_frame(checked)
    except ImageDecodeError as exc:
        raise ObservationError(f'images.{name}', str(exc), SkipReason.BAD_IMAGE) from exc
    return np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels


def resize_with_pad(pixels: np.ndarray, size: int) -> np.ndarray:
    """uint8 [H, W, 3] -> [size, size, 3], aspect kept, zero padded (openpi image_tools, see above)."""
    height, width = pixels.shape[:2]
    if (height, width) == (size, size):
        return pixels
    ratio = max(width / size, height / size)
    new_height, new_width = int(height / ratio), int(width / ratio)
    resized = Image.fromarray(np.ascontiguousarray(pixels)).resize((new_width, new_height), resample=Image.BILINEAR)
    canvas = np.zeros((size, size, 3), dtype=np.uint8)
    top, left = max(0, int((size - new_height) / 2)), max(0, int((size - new_width) / 2))
    canvas[top:top + new_height, left:left + new_width] = np.asarray(resized)
    return canvas


def wire_frame(name: str, frame: Any, size: int, channels_first: bool, max_pixels: int) -> np.ndarray:
    """What one camera sends: resized to ``size`` (0: the raw frame), HWC or CHW (ALOHA)."""
    pixels = rgb_frame(name, frame, max_pixels)
    if size > 0:
        pixels = resize_with_pad(pixels, size)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1) if channels_first else pixels)
