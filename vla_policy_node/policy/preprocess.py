"""Camera images -> model input: resize-with-pad to the model resolution, scale to [-1, 1].

Follows lerobot's pi0 preprocessing: aspect-preserving bilinear resize
(align_corners=False, no antialias) in [0, 1], centred zero padding, then
x * 2 - 1, so the padding ends up at -1. A missing camera is an all -1 image
with its mask off. SmolVLA's variant (lerobot policies/common/vla_utils.py
``resize_with_pad``) pads on the left and top instead and does not clamp.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch
import torch.nn.functional as F


def image_to_unit_tensor(image: np.ndarray, device: torch.device) -> torch.Tensor:
    """Canonical decoded image [H, W, 3|1] uint8 -> [3, H, W] fp32 in [0, 1] on ``device``.

    The uint8-to-float conversion runs on the device, so only the raw bytes cross the bus.
    Camera frames are 8-bit (images.py refuses wider samples before they get here).
    """
    if image.ndim != 3 or image.shape[2] not in (1, 3) or image.dtype != np.uint8:
        raise ValueError(f'expected a uint8 [H, W, 3] or [H, W, 1] image, got {image.dtype} {list(image.shape)}')
    # torch cannot wrap a read-only or negatively strided view (bgr8 is one): one host copy.
    pixels = torch.from_numpy(np.array(image, order='C', copy=True)).to(device, non_blocking=True)
    unit = (pixels.float() / 255.0).permute(2, 0, 1)                                    # [C, H, W]
    return unit.expand(3, -1, -1) if unit.shape[0] == 1 else unit


def _fit(image: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """[C, H, W] -> bilinear resize (keeping aspect) to fit inside size (h, w): [C, h', w']."""
    target_h, target_w = size
    _, height, width = image.shape
    ratio = max(width / target_w, height / target_h)
    resized_h, resized_w = int(height / ratio), int(width / ratio)
    return F.interpolate(image[None], size=(resized_h, resized_w), mode='bilinear', align_corners=False)[0]


def resize_with_pad(image: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """[C, H, W] in [0, 1] -> [C, h, w]: fit inside (h, w) keeping aspect, pad the rest with 0, centred."""
    target_h, target_w = size
    if tuple(image.shape[1:]) == (target_h, target_w):
        return image
    resized = _fit(image, size).clamp(0.0, 1.0)
    resized_h, resized_w = resized.shape[1:]
    top = (target_h - resized_h) // 2
    left = (target_w - resized_w) // 2
    return F.pad(resized, (left, target_w - resized_w - left, top, target_h - resized_h - top), value=0.0)


def resize_with_pad_left_top(image: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """SmolVLA's: fit inside (h, w) keeping aspect (no clamp), zero padding on the left and top only."""
    target_h, target_w = size
    if tuple(image.shape[1:]) == (target_h, target_w):
        return image
    resized = _fit(image, size)
    resized_h, resized_w = resized.shape[1:]
    return F.pad(resized, (max(0, target_w - resized_w), 0, max(0, target_h - resized_h), 0), value=0.0)


def to_model_range(unit: torch.Tensor) -> torch.Tensor:
    return unit * 2.0 - 1.0


def empty_camera_image(size: Tuple[int, int], device: torch.device) -> torch.Tensor:
    """The image a masked camera slot gets: all -1 (black in model range)."""
    return torch.full((3, size[0], size[1]), -1.0, device=device)
