"""Building blocks shared by the vision tower and the two Gemma streams.

Shapes use B batch, S query length, T key length, H query heads, K kv heads,
G = H // K queries per kv head, D head dim, W width.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# Finite "minus infinity" for additive attention masks. A fully masked row (a
# padded query) then gets a uniform softmax instead of NaN, and a NaN never
# reaches the K/V of the next layer. Same value as the reference implementations.
ATTENTION_MASK_VALUE = -2.3819763e38


class RMSNorm(nn.Module):
    """Gemma RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)


class AdaptiveRMSNorm(nn.Module):
    """pi0.5 expert norm: RMSNorm whose scale and shift come from the time condition.

    One dense layer maps the condition [B, W_cond] (or per token [B, S, W_cond]) to
    (scale, shift, gate), each [B, 1 or S, W]. Returns the modulated activations
    and the gate for the residual that follows.
    """

    def __init__(self, dim: int, cond_dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        modulation = self.dense(cond.to(self.dense.weight.dtype)).float()  # [B, 3W] or [B, S, 3W]
        if modulation.dim() == 2:
            modulation = modulation[:, None, :]
        scale, shift, gate = modulation.chunk(3, dim=-1)                     # each [B, 1 or S, W]
        out = normed * (1.0 + scale) + shift
        return out.type_as(x), gate.type_as(x)


class GemmaMLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x))."""

    def __init__(self, width: int, mlp_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, mlp_dim, bias=False)
        self.up_proj = nn.Linear(width, mlp_dim, bias=False)
        self.down_proj = nn.Linear(mlp_dim, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate='tanh') * self.up_proj(x))


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for integer positions [B, S] -> cos, sin [B, 1, S, D] in fp32."""
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, device=positions.device, dtype=torch.float32) * 2.0 / head_dim))
    angles = positions.float()[..., None] * inv_freq                 # [B, S, D/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]            # [B, 1, S, D]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on [B, heads, S, D], in fp32, result in x's dtype."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (xf * cos + rotated * sin).type_as(x)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean "may attend" [B, 1, S, T] -> additive float mask."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.tensor(ATTENTION_MASK_VALUE, dtype=dtype, device=allowed.device))


def fold_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """Additive mask [B, 1, S, T] -> [B, 1, G*S, T] for grouped_query_attention (once per pass, not per layer)."""
    batch, _, seq, keys = mask.shape
    return mask.unsqueeze(2).expand(batch, 1, groups, seq, keys).reshape(batch, 1, groups * seq, keys)


def grouped_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            folded_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Multi-query / grouped-query attention without repeating K/V.

    q [B, H, S, D]; k, v [B, K, T, D]; folded_mask from ``fold_mask`` [B, 1, G*S, T] or None.
    The G query heads that share one kv head are folded into the query length,
    so K/V are read in place (never expanded to H heads): [B, K, G*S, D].
    Returns [B, H, S, D]. Query head h uses kv head h // G, as in Gemma.
    """
    batch, heads, seq, dim = q.shape
    kv_heads = k.shape[1]
    q_folded = q.reshape(batch, kv_heads, (heads // kv_heads) * seq, dim)
    out = F.scaled_dot_product_attention(q_folded, k, v, attn_mask=folded_mask, scale=1.0 / math.sqrt(dim))
    return out.reshape(batch, heads, seq, dim)


def sincos_time_embedding(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """Sinusoidal embedding of flow-matching time t [N] -> [N, dim], computed in float64.

    Periods are geometric from min_period to max_period; output is [sin, cos].
    """
    if dim % 2:
        raise ValueError(f'time embedding width must be even, got {dim}')
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64)
    period = min_period * (max_period / min_period) ** fraction
    angular_rate = 2.0 * math.pi / period                              # [dim/2]
    angles = t.to(torch.float64)[:, None] * angular_rate[None, :]      # [N, dim/2]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)
