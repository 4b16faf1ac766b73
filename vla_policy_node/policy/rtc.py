"""Real-time chunking (RTC): a new chunk that continues the one being executed.

Flow-matching time runs from t = 1 (noise) to t = 0 (actions), as in lerobot.
The previous chunk's not-yet-executed actions Y (``prev_chunk_left_over``,
normalised, [B, T, A]) steer the new chunk; d (``inference_delay``) actions of
the new chunk will have elapsed when it is published, and the steering fades out
by the execution horizon E.

guided (training-free; lerobot ``policies/rtc/modeling_rtc.py`` RTCProcessor.denoise_step
at 7427f31801f944f5ec9ce53cda02862ce7d1638b, after Black et al. 2025):
    x1  = x_t - t * v                    the clean actions the velocity points at
    err = (Y - x1) * W                   W: prefix weights over the horizon [H]
    v  <- v - g(t) * err                 g(t) = min(beta, (t^2 + (1-t)^2) / (t (1-t)))
lerobot obtains the correction with autograd, but computes v before enabling
gradients, so its vector-Jacobian product is the identity: the closed form
above is the same number, needs no autograd (runs under inference mode) and
keeps the loop capturable in a CUDA graph.

trained (checkpoints with ``rtc_training_max_delay`` > 0; lerobot
``policies/common/flow_matching.py`` euler_integrate(hard_prefix=...) and
``policies/pi05/modeling_pi05.py`` _prepare_trained_rtc_prefix): the first d
actions are clamped to Y before and after every Euler step and their tokens see
time 0 (clean), so the time condition becomes per token.

inpainting (a family whose time runs 0 -> 1 and that continues a chunk by
starting from the leftover: GR00T N1.7's get_action_with_features): the
family's own ``rtc_guide`` prepares it (the leftover in the first rows of the
start, frozen rows, a velocity ramp); this module only names the mode.

A family honours some of these modes (``FamilyCapabilities.rtc_modes``);
``AUTO`` asks for the family's first one (``RTCSettings.resolved``), so the
node's rtc_mode default fits every family.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

import torch

RTC_MODES = ('guided', 'trained', 'inpainting')
AUTO = 'auto'
SCHEDULES = ('zeros', 'ones', 'linear', 'exp')


@dataclass(frozen=True)
class RTCSettings:
    """How a chunk follows the previous one; lerobot RTCConfig's defaults. ``mode`` AUTO: the family's first
    mode, resolved by the runtime that runs the chunk (``resolved``)."""

    mode: str = 'guided'
    schedule: str = 'linear'
    max_guidance_weight: float = 10.0
    execution_horizon: int = 10

    def __post_init__(self) -> None:
        if self.mode not in RTC_MODES + (AUTO,):
            raise ValueError(f'rtc mode must be one of {RTC_MODES + (AUTO,)}, got {self.mode!r}')
        if self.schedule not in SCHEDULES:
            raise ValueError(f'rtc schedule must be one of {SCHEDULES}, got {self.schedule!r}')
        if not self.max_guidance_weight > 0:
            raise ValueError(f'max_guidance_weight must be > 0, got {self.max_guidance_weight}')
        if self.execution_horizon < 1:
            raise ValueError(f'execution_horizon must be >= 1, got {self.execution_horizon}')


def resolved(rtc: Optional[RTCSettings], modes: Sequence[str]) -> Optional[RTCSettings]:
    """``rtc`` with AUTO replaced by the first of a family's ``modes`` (its capabilities' rtc_modes); unchanged
    otherwise, also when that mode is not among ``modes`` (the runtime refuses it by name). ValueError for AUTO
    with no modes at all."""
    if rtc is None or rtc.mode != AUTO:
        return rtc
    if not modes:
        raise ValueError('rtc mode "auto": this policy family has no real-time chunking mode')
    return dataclasses.replace(rtc, mode=modes[0])


def prefix_weights(start: int, end: int, total: int, schedule: str) -> torch.Tensor:
    """Weights [total] over the new chunk: 1 for the first ``start`` (delay) actions, fading to 0 by ``end``.

    lerobot get_prefix_weights: start is capped at end; linear fades as
    1 - (i+1)/(n+1) over the n = min(end, total) - start actions between;
    exp scales that ramp r by r * expm1(r) / (e - 1).
    """
    start = min(start, end)
    if schedule == 'zeros':
        weights = torch.zeros(total)
        weights[:start] = 1.0
        return weights
    if schedule == 'ones':
        weights = torch.ones(total)
        weights[end:] = 0.0
        return weights
    ramp_len = max(min(end, total) - start, 0)
    ramp = torch.linspace(1.0, 0.0, ramp_len + 2)[1:-1]
    if schedule == 'exp':
        ramp = ramp * torch.expm1(ramp) / (math.e - 1.0)
    return torch.cat([torch.ones(min(start, total)), ramp, torch.zeros(max(total - end, 0))])


def guidance_weight(t: float, max_weight: float) -> float:
    """g(t) = min(beta, (t^2 + (1-t)^2) / (t (1-t))): beta at t = 1 (lerobot's inf -> beta), 0 at t = 0 (NaN -> 0)."""
    if t >= 1.0:
        return float(max_weight)
    if t <= 0.0:
        return 0.0
    return float(min(max_weight, (t * t + (1.0 - t) ** 2) / (t * (1.0 - t))))


@dataclass
class RTCGuide:
    """What the Euler loop needs for one chunk, prepared once: target, per-step factors, clamp mask.

    target [B, H, A] (the leftover, zero-padded in time and action dims). Guided mode:
    v - g (Y - x + t v) W  =  v * (1 - g t W) + (g W) * (x - Y), so each step k keeps
    scale_k = 1 - g_k t_k W and pull_k = g_k W ([1, H, 1]) and costs three small ops.
    clamp [B, H, 1] bool for the trained prefix, or None.
    """

    target: torch.Tensor
    scales: Optional[List[torch.Tensor]]
    pulls: Optional[List[torch.Tensor]]
    clamp: Optional[torch.Tensor]

    def guide(self, step: int, x_t: torch.Tensor, velocity: torch.Tensor) -> torch.Tensor:
        """Guided velocity at step ``step`` (identity in trained mode)."""
        if self.scales is None:
            return velocity
        return torch.addcmul(velocity * self.scales[step], self.pulls[step], x_t - self.target)

    def clamp_prefix(self, x_t: torch.Tensor) -> torch.Tensor:
        return x_t if self.clamp is None else torch.where(self.clamp, self.target, x_t)


def prepare_guide(prev_chunk_left_over: Optional[torch.Tensor], noise: torch.Tensor, num_steps: int,
                  inference_delay: int, execution_horizon: Optional[int], rtc: Optional[RTCSettings],
                  max_training_delay: int) -> Optional[RTCGuide]:
    """The guide for one chunk, or None (no previous chunk, or RTC off): then denoising is unchanged.

    prev_chunk_left_over [T, A'] or [B, T, A'], normalised, A' <= A; noise [B, H, A].
    Raises ValueError for a delay the mode cannot honour.
    """
    if rtc is None or prev_chunk_left_over is None or prev_chunk_left_over.shape[-2] == 0:
        return None
    if rtc.mode not in ('guided', 'trained'):
        raise ValueError(f'rtc mode {rtc.mode!r} is a family\'s own (its rtc_guide), not guided or trained RTC')
    batch, horizon, action_dim = noise.shape
    prev = prev_chunk_left_over.to(device=noise.device, dtype=torch.float32)
    prev = prev[None] if prev.dim() == 2 else prev
    if prev.dim() != 3 or prev.shape[0] not in (1, batch) or prev.shape[2] > action_dim:
        raise ValueError(f'prev_chunk_left_over must be [T, <={action_dim}] or [B, T, <={action_dim}], '
                         f'got {list(prev_chunk_left_over.shape)}')
    if not bool(torch.isfinite(prev).all()):
        raise ValueError('prev_chunk_left_over holds non-finite values')
    leftover = min(prev.shape[1], horizon)
    target = noise.new_zeros(batch, horizon, action_dim, dtype=torch.float32)
    target[:, :leftover, :prev.shape[2]] = prev[:, :leftover]
    delay = int(inference_delay)
    if delay < 0:
        raise ValueError(f'inference_delay must be >= 0, got {delay}')
    if rtc.mode == 'trained':
        if max_training_delay <= 0:
            raise ValueError('rtc mode "trained" needs a checkpoint trained with rtc_training_max_delay > 0')
        if delay > max_training_delay:
            raise ValueError(f'inference_delay {delay} exceeds the checkpoint rtc_training_max_delay '
                             f'{max_training_delay}; use a faster device, fewer steps, or guided mode')
        delay = min(delay, leftover)
        if delay == 0:
            return None
        clamp = (torch.arange(horizon, device=noise.device) < delay)[None, :, None].expand(batch, -1, 1)
        return RTCGuide(target=target, scales=None, pulls=None, clamp=clamp)
    horizon_end = min(execution_horizon if execution_horizon is not None else rtc.execution_horizon, leftover)
    weights = prefix_weights(delay, horizon_end, horizon, rtc.schedule).to(noise.device)[None, :, None]
    times = step_times(num_steps)
    gains = [guidance_weight(t, rtc.max_guidance_weight) for t in times]
    return RTCGuide(target=target, clamp=None, scales=[1.0 - g * t * weights for g, t in zip(gains, times)],
                    pulls=[g * weights for g in gains])


def stack_guides(guides: Sequence[Any]) -> Optional[Any]:
    """Several chunks' guides, each made for one row (noise [1, H, A]), as one guide over those rows in order, or
    None when they cannot share one Euler loop. A guide is a dataclass, list, tuple or dict of batch-first
    tensors (one row each), None and plain values, as RTCGuide is: guides of one structure, equal plain values
    and equal tensor sizes stack along the first axis, so each row is steered exactly by its own guide (its own
    target, prefix weights, gains and clamp). None among them, or a tensor without a first axis of one row,
    does not stack."""
    if not guides or any(guide is None for guide in guides):
        return None
    try:
        return _stack_rows(list(guides))
    except _Unstackable:
        return None


class _Unstackable(Exception):
    pass


def _stack_rows(items: List[Any]) -> Any:
    first = items[0]
    if isinstance(first, torch.Tensor):
        if any(not isinstance(item, torch.Tensor) or item.dim() == 0 or item.shape[0] != 1
               or item.shape != first.shape or item.dtype != first.dtype or item.device != first.device
               for item in items):
            raise _Unstackable
        return torch.cat(items)
    if any(type(item) is not type(first) for item in items):
        raise _Unstackable
    if dataclasses.is_dataclass(first):
        fields = dataclasses.fields(first)
        if not all(f.init for f in fields):
            raise _Unstackable
        return type(first)(**{f.name: _stack_rows([getattr(item, f.name) for item in items]) for f in fields})
    if isinstance(first, (list, tuple)):
        if any(len(item) != len(first) for item in items):
            raise _Unstackable
        parts = [_stack_rows(list(column)) for column in zip(*items)]
        return type(first)(*parts) if hasattr(first, '_fields') else type(first)(parts)
    if isinstance(first, dict):
        if any(item.keys() != first.keys() for item in items):
            raise _Unstackable
        return {key: _stack_rows([item[key] for item in items]) for key in first}
    if first is None or isinstance(first, (bool, int, float, str)):
        if any(item != first for item in items):
            raise _Unstackable
        return first
    raise _Unstackable


def step_times(num_steps: int) -> List[float]:
    """t_k = 1 + k * dt for k < num_steps, dt = -1 / num_steps (lerobot euler_integrate)."""
    dt = -1.0 / num_steps
    return [1.0 + k * dt for k in range(num_steps)]
