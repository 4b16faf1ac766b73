"""Camera images -> model input: resize-with-pad to the model resolution, scale to [-1, 1].

Follows lerobot's pi0 preprocessing: aspect-preserving bilinear resize
(align_corners=False, no antialias) in [0, 1], centred zero padding, then
x * 2 - 1, so the padding ends up at -1. A missing camera is an all -1 image
with its mask off. SmolVLA's variant (lerobot policies/common/vla_utils.py
``resize_with_pad``) pads on the left and top instead and does not clamp.

``ImagePromptInputs`` is the prefix input of the families that see every camera at one resolution beside a
padded prompt (pi0, pi0.5, SmolVLA): ``image_prompt_inputs`` builds it from decoded frames with the family's
own per-frame transform, ``check_prefix_inputs`` checks it against a config.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple

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


class ImagePromptInputs(NamedTuple):
    """images [B, N, 3, H, W] in [-1, 1]; image_masks [B, N] bool; tokens [B, L] int64; token_masks [B, L] bool."""

    images: torch.Tensor
    image_masks: torch.Tensor
    tokens: torch.Tensor
    token_masks: torch.Tensor


def image_prompt_inputs(frames: Sequence[Tuple[str, Optional[np.ndarray]]], tokens: np.ndarray, token_mask: np.ndarray,
                        to_model: Callable[[torch.Tensor], torch.Tensor], size: Tuple[int, int],
                        device: torch.device) -> ImagePromptInputs:
    """Decoded frames in slot order (uint8 [H, W, 3], None: masked) -> each through ``to_model`` ([3, H, W] in
    [0, 1] -> [3, h, w] in [-1, 1]) or the empty image at ``size``; the prompt as [1, L] tensors."""
    images, masks = [], []
    for _, pixels in frames:
        if pixels is None:
            images.append(empty_camera_image(size, device))
            masks.append(False)
        else:
            images.append(to_model(image_to_unit_tensor(pixels, device)))
            masks.append(True)
    return ImagePromptInputs(torch.stack(images)[None], torch.tensor([masks], device=device),
                             torch.from_numpy(tokens)[None].to(device), torch.from_numpy(token_mask)[None].to(device))


def check_prefix_inputs(config: Any, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                        token_masks: torch.Tensor) -> None:
    """ImagePromptInputs against the config: images [B, N, 3, H, W], image_masks [B, N], tokens [B, L]."""
    cameras = len(config.all_camera_names)
    height, width = config.image_resolution
    if images.dim() != 5 or tuple(images.shape[1:]) != (cameras, 3, height, width):
        raise ValueError(f'images must be [B, {cameras}, 3, {height}, {width}], got {tuple(images.shape)}')
    if tuple(image_masks.shape) != (images.shape[0], cameras):
        raise ValueError(f'image_masks must be [B, {cameras}], got {tuple(image_masks.shape)}')
    # Up to tokenizer_max_length: a prompt bucket (fast_path.fit_to_bucket) drops masked padding only.
    if tokens.shape != token_masks.shape or not 0 < tokens.shape[1] <= config.tokenizer_max_length:
        raise ValueError(f'tokens and token_masks must be [B, <= {config.tokenizer_max_length}], '
                         f'got {tuple(tokens.shape)} and {tuple(token_masks.shape)}')
