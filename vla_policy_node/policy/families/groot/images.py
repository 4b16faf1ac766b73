"""GR00T N1.7's image path: uint8 frame -> the Qwen3-VL patches, as lerobot's pre-processor makes them.

lerobot ``policies/groot/processor_groot.py`` (7427f318): ``_to_uint8_np_bthwc`` (float frames -> uint8 by
``clamp(0, 1) * 255`` and truncation), ``_transform_n1_7_image_for_vlm_torch`` (the default, non-albumentations
geometry) and ``GrootN17VLMEncodeStep`` (frames handed to the Qwen3-VL processor as uint8 CHW tensors); transformers
5.5.4 ``models/qwen2_vl/image_processing_qwen2_vl.py`` (``smart_resize``, ``Qwen2VLImageProcessor._preprocess``) and
``image_processing_backends.py`` (TorchvisionBackend: resize, fused rescale + normalise).

    square      resize to [e, e], e = shortest_image_edge or target height (the aspect ratio is NOT kept)
    crop        crop_fraction (else image_crop_size / target height): size round(e * f), offset floor((e - s) / 2)
    target      resize to image_target_size unless already there
    smart       smart_resize to multiples of patch * merge within [min_pixels, max_pixels] (no-op at 256 x 256)
    normalise   (x - mean * 255) / (std * 255) in fp32 (the fused rescale + normalise: (x - 127.5) / 127.5 at 0.5)
    patchify    the frame repeated to temporal_patch_size, patches in merge-block order (patchify)

Every resize is torchvision's on a uint8 CHW tensor, bicubic with antialias: on the CPU torch's native uint8 kernel
(torchvision ``_do_native_uint8_resize_on_cpu``), elsewhere in fp32 then clamped and rounded back to uint8, which
``resize_uint8`` calls directly (torch.nn.functional.interpolate; torchvision is not needed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ...config_fields import ConfigError


@dataclass(frozen=True)
class ImageGeometry:
    """GrootN17VLMEncodeStep's geometry settings and the Qwen image processor's (preprocessor_config.json)."""

    target_size: Tuple[int, int] = (256, 256)            # image_target_size (h, w)
    crop_size: Optional[Tuple[int, int]] = (230, 230)     # image_crop_size
    shortest_image_edge: Optional[int] = None
    crop_fraction: Optional[float] = None
    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    do_resize: bool = True
    image_mean: Tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: Tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255

    @property
    def fraction(self) -> Optional[float]:
        if self.crop_fraction is None and self.crop_size is not None:
            return self.crop_size[0] / float(self.target_size[0])
        return self.crop_fraction

    @property
    def model_size(self) -> Tuple[int, int]:
        """(h, w) the patches are cut from: the target size after smart_resize."""
        if not self.do_resize:
            return self.target_size
        return smart_resize(*self.target_size, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)

    @property
    def grid(self) -> Tuple[int, int]:
        """(grid_h, grid_w) in patches."""
        height, width = self.model_size
        return height // self.patch_size, width // self.patch_size

    @property
    def tokens_per_image(self) -> int:
        grid_h, grid_w = self.grid
        return (grid_h // self.merge_size) * (grid_w // self.merge_size)

    def problem(self) -> Optional[str]:
        height, width = self.model_size
        factor = self.patch_size * self.merge_size
        if height % factor or width % factor:
            return (f'the model image size {height}x{width} is not a multiple of patch_size x merge_size {factor} '
                    '(do_resize is off in preprocessor_config.json)')
        if self.temporal_patch_size < 1:
            return 'temporal_patch_size must be >= 1'
        return None


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> Tuple[int, int]:
    """transformers qwen2_vl smart_resize: the nearest multiples of ``factor`` with the pixel count in range."""
    if max(height, width) / min(height, width) > 200:
        ratio = max(height, width) / min(height, width)
        raise ConfigError(f'absolute aspect ratio must be smaller than 200, got {ratio}')
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def unit_to_uint8(unit: torch.Tensor) -> torch.Tensor:
    """A [0, 1] float frame -> uint8 as lerobot's pack step: ``(clamp(0, 1) * 255).to(uint8)`` (truncation)."""
    return (unit.clamp(0, 1) * 255.0).to(torch.uint8)


def resize_uint8(image: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """torchvision v2 resize_image (bicubic, antialias) of a uint8 [C, H, W] tensor; unchanged at its own size."""
    if tuple(image.shape[-2:]) == tuple(size):
        return image
    batch = image[None]
    if image.device.type == 'cpu':
        return F.interpolate(batch, size=list(size), mode='bicubic', align_corners=False, antialias=True)[0]
    out = F.interpolate(batch.float(), size=list(size), mode='bicubic', align_corners=False, antialias=True)
    return out.clamp_(0, 255).round_().to(torch.uint8)[0]


def geometry_uint8(image: torch.Tensor, geometry: ImageGeometry) -> torch.Tensor:
    """_transform_n1_7_image_for_vlm_torch, then the processor's smart_resize: uint8 [3, H, W] -> uint8 [3, h, w]."""
    target_h, target_w = geometry.target_size
    edge = geometry.shortest_image_edge or target_h
    image = resize_uint8(image, (edge, edge))
    fraction = geometry.fraction
    if fraction is not None and 0.0 < fraction < 1.0:
        crop_h = max(1, int(round(image.shape[-2] * fraction)))
        crop_w = max(1, int(round(image.shape[-1] * fraction)))
        top = max(0, (image.shape[-2] - crop_h) // 2)
        left = max(0, (image.shape[-1] - crop_w) // 2)
        image = image[..., top:top + crop_h, left:left + crop_w]
    image = resize_uint8(image, (target_h, target_w))
    if geometry.do_resize:
        image = resize_uint8(image, geometry.model_size)
    return image


def normalize_image(image: torch.Tensor, geometry: ImageGeometry) -> torch.Tensor:
    """The fused rescale + normalise of TorchvisionBackend: (x - mean / rescale) / (std / rescale) in fp32."""
    scale = 1.0 / geometry.rescale_factor
    mean = (torch.tensor(geometry.image_mean, device=image.device) * scale)[:, None, None]
    std = (torch.tensor(geometry.image_std, device=image.device) * scale)[:, None, None]
    return (image.to(torch.float32) - mean) / std


def frame_to_model(unit: torch.Tensor, geometry: ImageGeometry) -> torch.Tensor:
    """A decoded frame [3, H, W] in [0, 1] -> the normalised model image [3, h, w] fp32 (in [-1, 1] at mean/std 0.5)."""
    return normalize_image(geometry_uint8(unit_to_uint8(unit), geometry), geometry)


def patchify(images: torch.Tensor, geometry: ImageGeometry) -> torch.Tensor:
    """Normalised images [I, 3, h, w] -> pixel_values [I, grid_h * grid_w, 3 * T * p * p]: each image repeated to
    temporal_patch_size frames, patches in merge-block order (Qwen2VLImageProcessor._preprocess's view / permute)."""
    count, channels, height, width = images.shape
    patch, merge, temporal = geometry.patch_size, geometry.merge_size, geometry.temporal_patch_size
    frames = images[:, None].expand(count, temporal, channels, height, width)
    grid_h, grid_w = height // patch, width // patch
    blocks = frames.reshape(count, temporal, channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    blocks = blocks.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return blocks.reshape(count, grid_h * grid_w, channels * temporal * patch * patch)
