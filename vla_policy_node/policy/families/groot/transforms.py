"""GR00T N1.7's state normalisation, action decode and real-time chunking, as lerobot computes them.

lerobot ``policies/groot/processor_groot.py`` (7427f318):

    state     GrootN17PackInputsStep._min_max_norm: 2 (x - min) / (max - min) - 1, 0 where max == min, clipped to
              [-1, 1] (clip_outliers); statistics shorter than the state are padded with min 0 / max 1
    action    GrootActionUnpackUnnormalizeStep (flat statistics) or GrootN17ActionDecodeStep (checkpoint groups, all
              absolute): clip to [-1, 1], (a + 1) / 2 (max - min) + min (min where max == min), cut to
              env_action_dim, then the optional LIBERO gripper sign -sign(2 g - 1)

both in float32 in lerobot's order of operations (numpy here gives the same bits). The normalisers have the
runtime's normaliser interface (``normalize`` / ``unnormalize`` / ``dim``): the state one feeds the model, the action
one is the whole post-processor; its ``normalize`` brings robot-unit actions (an RTC leftover given as robot
actions) back into the model's space.

Real-time chunking is GR00T's own (``groot_n1_7.py`` get_action_with_features, ``modeling_groot.py``
_prepare_n1_7_rtc_inputs): ``inpainting`` below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

import numpy as np
import torch

from ...normalize import NormalizationError


def _aligned(values: Optional[np.ndarray], dim: int, default: float) -> np.ndarray:
    """_align_vec: cut or pad (with ``default``) a statistic to ``dim`` values, float32."""
    array = np.zeros(0, np.float32) if values is None else np.asarray(values, np.float32).reshape(-1)
    if array.size >= dim:
        return array[:dim]
    return np.concatenate([array, np.full(dim - array.size, default, np.float32)])


@dataclass(frozen=True)
class MinMaxStateNormalizer:
    """The pack step's state normalisation (``enabled`` False: normalize_min_max off, identity)."""

    feature: str
    stats: Mapping[str, np.ndarray]
    enabled: bool = True
    clip: bool = True
    mode: str = 'MIN_MAX'

    @property
    def dim(self) -> int:
        low = self.stats.get('min')
        return -1 if low is None or not self.enabled else int(np.asarray(low).reshape(-1).size)

    def _range(self, dim: int) -> Tuple[np.ndarray, np.ndarray]:
        return _aligned(self.stats.get('min'), dim, 0.0), _aligned(self.stats.get('max'), dim, 1.0)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if not self.enabled or 'min' not in self.stats and 'max' not in self.stats:
            return x.copy()
        low, high = self._range(x.shape[-1])
        denom = high - low
        mask = denom != 0
        mapped = np.float32(2) * (x - low) / np.where(mask, denom, np.float32(1)) - np.float32(1)
        out = np.where(mask, mapped, np.float32(0)).astype(np.float32)
        return np.clip(out, np.float32(-1), np.float32(1)) if self.clip else out

    def unnormalize(self, y: np.ndarray) -> np.ndarray:
        """The inverse where it exists (the runtime's neutral state for the warm-up)."""
        y = np.asarray(y, np.float32)
        if not self.enabled or 'min' not in self.stats:
            return y.copy()
        low, high = self._range(y.shape[-1])
        return ((y + np.float32(1)) * np.float32(0.5) * (high - low) + low).astype(np.float32)


@dataclass(frozen=True)
class ActionDecoder:
    """The post-processor: clip, inverse min/max, the LIBERO gripper sign; ``normalize`` its inverse (the pack
    step's action normalisation; the LIBERO sign maps back as g = (1 - s) / 2)."""

    feature: str
    stats: Mapping[str, np.ndarray]
    enabled: bool = True
    clip: bool = True
    libero_gripper: Optional[int] = None       # the gripper column the LIBERO transform rewrites
    libero_binarize: bool = True
    mode: str = 'MIN_MAX'

    def __post_init__(self) -> None:
        if self.enabled and ('min' not in self.stats or 'max' not in self.stats):
            raise NormalizationError(f'{self.feature}: the GR00T post-processor needs min and max statistics, '
                                     f'the checkpoint has {sorted(self.stats)}')

    @property
    def dim(self) -> int:
        return int(np.asarray(self.stats['min']).reshape(-1).size) if self.enabled else -1

    def unnormalize(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, np.float32)
        out = y.copy()
        if self.enabled:
            if self.clip:
                out = np.clip(out, np.float32(-1), np.float32(1))
            low, high = (_aligned(self.stats[name], y.shape[-1], 0.0) for name in ('min', 'max'))
            denom = high - low
            mask = denom != 0
            inverse = (out + np.float32(1)) * np.float32(0.5) * np.where(mask, denom, np.float32(1)) + low
            out = np.where(mask, inverse, low).astype(np.float32)
        if self.libero_gripper is not None and out.shape[-1] > self.libero_gripper:
            gripper = out[..., self.libero_gripper]
            signed = np.float32(2) * gripper - np.float32(1)
            out[..., self.libero_gripper] = -np.sign(signed) if self.libero_binarize else -signed
        return out

    def normalize(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32).copy()
        if self.libero_gripper is not None and x.shape[-1] > self.libero_gripper:
            x[..., self.libero_gripper] = (np.float32(1) - x[..., self.libero_gripper]) * np.float32(0.5)
        if not self.enabled:
            return x
        low, high = (_aligned(self.stats[name], x.shape[-1], 0.0) for name in ('min', 'max'))
        denom = high - low
        mask = denom != 0
        mapped = np.float32(2) * (x - low) / np.where(mask, denom, np.float32(1)) - np.float32(1)
        return np.clip(np.where(mask, mapped, np.float32(0)), np.float32(-1), np.float32(1)).astype(np.float32)


@dataclass
class Inpainting:
    """GR00T's RTC for one chunk (rtc mode 'inpainting'), batch-first so that several robots' guides stack by row
    (policy/rtc.py stack_guides): the chunk starts from ``target`` where ``keep`` (the leftover's last ``overlap``
    rows in front) and from the noise elsewhere; each step's velocity is scaled by ``velocity_scale`` (0 for the
    frozen rows, the exponential ramp over the rest of the overlap, then 1)."""

    target: torch.Tensor             # [B, H, A] fp32: the leftover's rows, zeros after them
    keep: torch.Tensor               # [B, H, 1] bool: the rows taken from target
    velocity_scale: torch.Tensor     # [B, H, A] fp32


def inpainting(leftover: Optional[torch.Tensor], noise: torch.Tensor, inference_delay: int,
               execution_horizon: int, ramp_rate: float) -> Optional[Inpainting]:
    """_prepare_n1_7_rtc_inputs + get_action_with_features' RTC part; None when nothing constrains the chunk.

    leftover [T, A'] or [B, T, A'] normalised (the model's space); trailing all-zero rows are padding and dropped
    (lerobot's RTC engine pads short leftovers with them), at most the model horizon of rows is kept (the last),
    widths are cut or zero-padded to the model's. overlap = min(T, execution_horizon), frozen = the delay within it.
    Eager (it reads the leftover's values): chunk_setup's part, never the captured loop's.
    """
    if leftover is None or leftover.numel() == 0:
        return None
    batch, horizon, width = noise.shape
    prev = leftover.to(device=noise.device, dtype=torch.float32)
    prev = prev[None] if prev.dim() == 2 else prev
    if prev.dim() != 3 or prev.shape[0] not in (1, batch):
        raise ValueError(f'prev_chunk_left_over must be [T, A] or [B, T, A], got {list(leftover.shape)}')
    prev = prev.expand(batch, -1, -1)
    if not bool(torch.isfinite(prev).all()):
        raise ValueError('prev_chunk_left_over holds non-finite values')
    rows = (prev.abs().sum(dim=(0, 2)) > 0).nonzero()
    if rows.numel() == 0:
        return None
    prev = prev[:, :int(rows[-1]) + 1][:, -horizon:]
    if prev.shape[2] >= width:
        prev = prev[:, :, :width]
    else:
        prev = torch.cat([prev, prev.new_zeros(batch, prev.shape[1], width - prev.shape[2])], dim=2)
    length = prev.shape[1]
    overlap = max(0, min(length, int(execution_horizon)))
    if overlap == 0:
        return None
    frozen = max(0, min(int(inference_delay), overlap))
    target = noise.new_zeros(batch, horizon, width, dtype=torch.float32)
    target[:, :overlap] = prev[:, length - overlap:length]
    keep = (torch.arange(horizon, device=noise.device) < overlap)[None, :, None].expand(batch, -1, 1).contiguous()
    scale = torch.ones_like(target)
    scale[:, :frozen] = 0.0
    ramp_t = torch.linspace(0.0, 1.0, overlap - frozen + 2, device=noise.device)
    ramp = 1 - torch.exp(-ramp_rate * ramp_t)
    ramp = ramp / ramp[-1].clamp_min(1e-8)
    scale[:, frozen:overlap] = ramp[1:-1][None, :, None]
    return Inpainting(target=target, keep=keep, velocity_scale=scale)
