"""GR00T N1.7's action head blocks, inference only, pure torch, with lerobot's module names.

lerobot ``policies/groot/action_head/cross_attention_dit.py`` (AlternateVLDiT, DiT, SelfAttentionTransformer,
BasicTransformerBlock, AdaLayerNorm, TimestepEncoder) and ``policies/groot/groot_n1_7.py`` (CategorySpecificLinear /
MLP, SinusoidalPositionalEncoding, MultiEmbodimentActionEncoder) at 7427f318, over diffusers 0.39's ``Attention``
(AttnProcessor2_0: to_q / to_k / to_v, SDPA at 1/sqrt(head_dim), to_out.0), ``FeedForward`` ("gelu-approximate":
net.0.proj, tanh GELU, net.2), ``Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1)`` and
``TimestepEmbedding`` (linear_1, SiLU, linear_2).

    BasicTransformerBlock   x += attn1(norm1(x)) ; x += ff(norm3(x))      (vl_self_attention: affine LayerNorms)
    DiT block (ada_norm)    norm1 = AdaLayerNorm: LN(x) * (1 + scale) + shift, (scale, shift) = linear(silu(temb));
                            norm3 a non-affine LayerNorm; even blocks cross-attend (K/V: Linear from the backbone
                            width), odd blocks self-attend over the state and action tokens
    AlternateVLDiT          even block i attends to the non-image tokens when i % (2 * attend_text_every_n_blocks)
                            == 0, else to the image tokens (each with the attention mask); the output stage is
                            LN(x) * (1 + scale) + shift with (shift, scale) = proj_out_1(silu(temb)) -- the other
                            order than AdaLayerNorm -- then proj_out_2

The cross blocks' K/V depend only on the backbone features: ``cross_kv`` computes them once per observation for the
token subset the block reads (the prefix cache stores them), where lerobot recomputes them over every token at every
Euler step. Dropouts are inference no-ops and are not built.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ...layers import apply_linear


@dataclass(frozen=True)
class DiTSize:
    """diffusion_model_cfg (AlternateVLDiT) of a GR00T N1.7 base config."""

    num_layers: int = 32
    num_heads: int = 32
    head_dim: int = 48
    output_dim: int = 1024
    attend_text_every_n_blocks: int = 2

    @property
    def width(self) -> int:
        return self.num_heads * self.head_dim

    def attends_text(self, index: int) -> bool:
        """Block ``index`` (even: a cross block) reads the non-image tokens (else the image tokens)."""
        return index % (2 * self.attend_text_every_n_blocks) == 0

    @property
    def cross_blocks(self) -> Tuple[int, ...]:
        return tuple(range(0, self.num_layers, 2))


@dataclass(frozen=True)
class SelfAttentionSize:
    """vl_self_attention_cfg of a GR00T N1.7 base config (0 layers: nn.Identity)."""

    num_layers: int = 4
    num_heads: int = 32
    head_dim: int = 64

    @property
    def width(self) -> int:
        return self.num_heads * self.head_dim


# ---- diffusers' pieces ------------------------------------------------------------------------------------------

class Attention(nn.Module):
    """diffusers Attention as these blocks build it (bias on every projection, one to_out Linear)."""

    def __init__(self, query_dim: int, heads: int, head_dim: int, kv_dim: Optional[int] = None) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner, bias=True)
        self.to_k = nn.Linear(kv_dim or query_dim, inner, bias=True)
        self.to_v = nn.Linear(kv_dim or query_dim, inner, bias=True)
        self.to_out = nn.ModuleList([nn.Linear(inner, query_dim, bias=True)])

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], self.heads, -1).transpose(1, 2)       # [B, heads, S, Dh]

    def kv(self, source: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """source [B, T, kv_dim] -> K, V [B, heads, T, Dh]."""
        return self.split_heads(self.to_k(source)), self.split_heads(self.to_v(source))

    def attend(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """queries from x [B, S, D] against K, V [B, heads, T, Dh]; mask bool [B, 1, 1, T] (True: attend)."""
        q = self.split_heads(apply_linear(self.to_q, x))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1).to(q.dtype)
        return apply_linear(self.to_out[0], out)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Self-attention over x [B, S, D]; mask bool [B, 1, 1, S] on the keys."""
        k, v = self.split_heads(apply_linear(self.to_k, x)), self.split_heads(apply_linear(self.to_v, x))
        return self.attend(x, k, v, mask)


class GELUProj(nn.Module):
    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(apply_linear(self.proj, x), approximate='tanh')


class FeedForward(nn.Module):
    """diffusers FeedForward("gelu-approximate", mult 4): net.0 (proj + tanh GELU), net.1 dropout, net.2 Linear."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.net = nn.ModuleList([GELUProj(dim, 4 * dim), nn.Identity(), nn.Linear(4 * dim, dim, bias=True)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return apply_linear(self.net[2], self.net[0](x))


class AdaLayerNorm(nn.Module):
    """lerobot AdaLayerNorm: the non-affine LN(x) * (1 + scale) + shift, (scale, shift) = linear(silu(temb))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)
        self.dim = dim

    def modulation(self, temb: torch.Tensor) -> torch.Tensor:
        """temb [N, D] -> [N, 2D] = (scale, shift): depends on the time step only."""
        return self.linear(F.silu(temb))

    def apply(self, x: torch.Tensor, modulation: torch.Tensor) -> torch.Tensor:
        scale, shift = modulation.chunk(2, dim=-1)
        return F.layer_norm(x, (self.dim,), eps=1e-5) * (1 + scale[:, None]) + shift[:, None]


class BasicTransformerBlock(nn.Module):
    """vl_self_attention's block: affine LayerNorms (eps 1e-5), self-attention with bias, FF."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn1 = Attention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim, eps=1e-5)
        self.ff = FeedForward(dim)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        x = self.attn1(self.norm1(x), mask) + x
        return self.ff(self.norm3(x)) + x


class SelfAttentionTransformer(nn.Module):
    """lerobot SelfAttentionTransformer (``vl_self_attention``): no attention mask in lerobot; here the keys are
    masked to the valid tokens, which is the same for an unpadded prompt (lerobot's batch of one) and keeps right
    padding out of the valid tokens' features."""

    def __init__(self, size: SelfAttentionSize) -> None:
        super().__init__()
        self.transformer_blocks = nn.ModuleList([BasicTransformerBlock(size.width, size.num_heads, size.head_dim)
                                                 for _ in range(size.num_layers)])

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        for block in self.transformer_blocks:
            x = block(x, mask)
        return x


class DiTBlock(nn.Module):
    """A DiT BasicTransformerBlock with norm_type ada_norm (AdaLayerNorm, non-affine norm3)."""

    def __init__(self, size: DiTSize, kv_dim: Optional[int]) -> None:
        super().__init__()
        self.norm1 = AdaLayerNorm(size.width)
        self.attn1 = Attention(size.width, size.num_heads, size.head_dim, kv_dim)
        self.ff = FeedForward(size.width)
        self.width = size.width

    def forward(self, x: torch.Tensor, modulation: torch.Tensor, kv: Optional[Tuple[torch.Tensor, torch.Tensor]],
                mask: Optional[torch.Tensor]) -> torch.Tensor:
        """kv None: self-attention over x; else cross-attention into the given K/V (mask bool [B, 1, 1, T])."""
        normed = self.norm1.apply(x, modulation)
        if kv is None:
            attn = self.attn1(normed)
        else:
            attn = self.attn1.attend(normed, kv[0], kv[1], mask)
        x = attn + x
        return self.ff(F.layer_norm(x, (self.width,), eps=1e-5)) + x


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


def diffusers_timestep_sinusoid(timesteps: torch.Tensor, channels: int = 256) -> torch.Tensor:
    """diffusers get_timestep_embedding(t, 256, flip_sin_to_cos=True, downscale_freq_shift=1): [N, 256] (cos | sin)."""
    half = channels // 2
    exponent = -math.log(10000) * torch.arange(0, half, dtype=torch.float32, device=timesteps.device)
    exponent = exponent / (half - 1)
    angles = timesteps[:, None].float() * torch.exp(exponent)[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class TimestepEncoder(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.timestep_embedder = TimestepEmbedding(256, dim)

    def forward(self, timesteps: torch.Tensor) -> torch.Tensor:
        projected = diffusers_timestep_sinusoid(timesteps).to(self.timestep_embedder.linear_1.weight.dtype)
        return self.timestep_embedder(projected)


class AlternateVLDiT(nn.Module):
    """lerobot AlternateVLDiT (interleave_self_attention, norm_type ada_norm, no positional embeddings)."""

    def __init__(self, size: DiTSize, cross_attention_dim: int) -> None:
        super().__init__()
        self.size = size
        self.timestep_encoder = TimestepEncoder(size.width)
        self.transformer_blocks = nn.ModuleList([DiTBlock(size, None if i % 2 else cross_attention_dim)
                                                 for i in range(size.num_layers)])
        self.proj_out_1 = nn.Linear(size.width, 2 * size.width)
        self.proj_out_2 = nn.Linear(size.width, size.output_dim)

    def time_terms(self, timesteps: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """timesteps [N] (discretised) -> per block (scale, shift) [L, N, 2W] and the output stage's (shift, scale)
        [N, 2W]: everything that depends on the time step alone, once per step instead of once per block call."""
        temb = self.timestep_encoder(timesteps)
        blocks = torch.stack([block.norm1.modulation(temb) for block in self.transformer_blocks])
        return blocks, self.proj_out_1(F.silu(temb))

    def forward(self, x: torch.Tensor, block_terms: torch.Tensor, out_terms: torch.Tensor,
                cross_kv: Tuple[Tuple[torch.Tensor, torch.Tensor], ...],
                cross_masks: Tuple[Optional[torch.Tensor], ...]) -> torch.Tensor:
        """x [B, 1 + H, W] (state token, action tokens); block_terms [L, B, 2W], out_terms [B, 2W] for this step;
        cross_kv / cross_masks: per cross block (even index), its K/V and key mask."""
        cross = 0
        for index, block in enumerate(self.transformer_blocks):
            if index % 2:
                x = block(x, block_terms[index], None, None)
            else:
                x = block(x, block_terms[index], cross_kv[cross], cross_masks[cross])
                cross += 1
        shift, scale = out_terms.chunk(2, dim=-1)
        x = F.layer_norm(x, (self.size.width,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        return apply_linear(self.proj_out_2, x)


# ---- lerobot groot_n1_7.py's own pieces -------------------------------------------------------------------------

class CategorySpecificLinear(nn.Module):
    """W [E, in, out], b [E, out]: the embodiment's slice, ``bmm(x, W[e]) + b[e]``."""

    def __init__(self, categories: int, dim_in: int, dim_out: int) -> None:
        super().__init__()
        # lerobot starts training from 0.02 * randn; a loaded checkpoint replaces it. Scaled by fan-in here, so a
        # random-weight checkpoint (tests, the demo) carries the state and the actions through to its output.
        self.W = nn.Parameter(torch.randn(categories, dim_in, dim_out) / math.sqrt(dim_in))
        self.b = nn.Parameter(torch.zeros(categories, dim_out))

    def forward(self, x: torch.Tensor, category) -> torch.Tensor:
        """x [B, S, in]; category [B] long (lerobot's per-row slices), or one embodiment id for every row: its
        slice is a view, one GEMM over every row (the same products, no per-call copy of W[e])."""
        if isinstance(category, int):
            return torch.matmul(x, self.W[category]) + self.b[category]
        return torch.bmm(x, self.W[category]) + self.b[category].unsqueeze(1)


class CategorySpecificMLP(nn.Module):
    def __init__(self, categories: int, dim_in: int, hidden: int, dim_out: int) -> None:
        super().__init__()
        self.layer1 = CategorySpecificLinear(categories, dim_in, hidden)
        self.layer2 = CategorySpecificLinear(categories, hidden, dim_out)

    def forward(self, x: torch.Tensor, category) -> torch.Tensor:
        return self.layer2(F.relu(self.layer1(x, category)), category)


def action_time_sinusoid(timesteps: torch.Tensor, dim: int) -> torch.Tensor:
    """lerobot SinusoidalPositionalEncoding: timesteps [...] -> [..., dim] (sin | cos), exponent
    -arange(half) * ln(1e4) / half with ln(1e4) a float32 tensor."""
    half = dim // 2
    exponent = -torch.arange(half, dtype=torch.float, device=timesteps.device) * (
        torch.log(torch.tensor(10000.0)) / half).to(timesteps.device)
    freqs = timesteps.float().unsqueeze(-1) * exponent.exp()
    return torch.cat([torch.sin(freqs), torch.cos(freqs)], dim=-1)


class MultiEmbodimentActionEncoder(nn.Module):
    def __init__(self, action_dim: int, hidden: int, categories: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.W1 = CategorySpecificLinear(categories, action_dim, hidden)
        self.W2 = CategorySpecificLinear(categories, 2 * hidden, hidden)
        self.W3 = CategorySpecificLinear(categories, hidden, hidden)

    def forward(self, actions: torch.Tensor, time_embedding: torch.Tensor, category) -> torch.Tensor:
        """actions [B, H, A]; time_embedding [B, H, hidden] (``action_time_sinusoid`` of the step's bucket)."""
        embedded = self.W1(actions, category)
        x = self.W2(torch.cat([embedded, time_embedding.to(embedded.dtype)], dim=-1), category)
        return self.W3(x * torch.sigmoid(x), category)
