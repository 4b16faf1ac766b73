"""SigLIP vision tower as PaliGemma uses it: ViT, no pooling head.

Module names mirror transformers' ``SiglipVisionModel`` (``vision_model.*``)
so checkpoint keys map one to one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .layers import FusedProjection


@dataclass(frozen=True)
class VisionSize:
    """SigLIP ViT without pooling head (PaliGemma's vision tower)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int


class SiglipEmbeddings(nn.Module):
    """Non-overlapping patches -> linear embedding + learned absolute positions."""

    def __init__(self, size: VisionSize, num_patches: int) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, size.width, kernel_size=size.patch_size, stride=size.patch_size)
        self.position_embedding = nn.Embedding(num_patches, size.width)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        # pixels [N, 3, H, W] -> patches [N, width, H/p, W/p] -> tokens [N, P, width]
        weight = self.patch_embedding.weight
        patches = self.patch_embedding(pixels.to(weight.dtype))
        # contiguous: the sum would otherwise keep the transposed layout (elementwise ops follow their first
        # input's strides), and every LayerNorm of the tower would copy the residual stream to contiguous
        # (about 10% of SigLIP's time at 1024 patches on a CPU). Same values either way.
        tokens = patches.flatten(2).transpose(1, 2).contiguous()
        return tokens + self.position_embedding.weight[None].to(tokens.dtype)


class SiglipAttention(nn.Module):
    def __init__(self, size: VisionSize) -> None:
        super().__init__()
        self.num_heads = size.num_heads
        self.q_proj = nn.Linear(size.width, size.width)
        self.k_proj = nn.Linear(size.width, size.width)
        self.v_proj = nn.Linear(size.width, size.width)
        self.out_proj = nn.Linear(size.width, size.width)
        self.qkv = FusedProjection(self.q_proj, self.k_proj, self.v_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        head_dim = width // self.num_heads

        def heads(t: torch.Tensor) -> torch.Tensor:  # [N, P, W] -> [N, heads, P, head_dim]
            return t.view(batch, tokens, self.num_heads, head_dim).transpose(1, 2)

        q, k, v = self.qkv(x).chunk(3, dim=-1)                          # each [N, P, W]
        out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), scale=head_dim ** -0.5)
        return self.out_proj(out.transpose(1, 2).reshape(batch, tokens, width))


class SiglipMLP(nn.Module):
    def __init__(self, size: VisionSize) -> None:
        super().__init__()
        self.fc1 = nn.Linear(size.width, size.mlp_dim)
        self.fc2 = nn.Linear(size.mlp_dim, size.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate='tanh'))


class SiglipEncoderLayer(nn.Module):
    """Pre-norm block: x + attn(LN(x)), then x + mlp(LN(x))."""

    def __init__(self, size: VisionSize, eps: float) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(size.width, eps=eps)
        self.self_attn = SiglipAttention(size)
        self.layer_norm2 = nn.LayerNorm(size.width, eps=eps)
        self.mlp = SiglipMLP(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(_layer_norm(self.layer_norm1, x))
        return x + self.mlp(_layer_norm(self.layer_norm2, x))


class SiglipEncoder(nn.Module):
    def __init__(self, size: VisionSize, eps: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(size, eps) for _ in range(size.depth))


class SiglipVisionTransformer(nn.Module):
    def __init__(self, size: VisionSize, num_patches: int, eps: float) -> None:
        super().__init__()
        self.embeddings = SiglipEmbeddings(size, num_patches)
        self.encoder = SiglipEncoder(size, eps)
        self.post_layernorm = nn.LayerNorm(size.width, eps=eps)

    def forward(self, pixels: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
        """pixels [N, 3, H, W] in [-1, 1] -> image tokens [N, P, width] in compute_dtype."""
        x = self.embeddings(pixels).to(compute_dtype)
        for layer in self.encoder.layers:
            x = layer(x)
        return _layer_norm(self.post_layernorm, x)


class SiglipVisionTower(nn.Module):
    """Holder that gives the checkpoint prefix ``vision_tower.vision_model.``."""

    def __init__(self, size: VisionSize, num_patches: int, eps: float) -> None:
        super().__init__()
        self.vision_model = SiglipVisionTransformer(size, num_patches, eps)

    def forward(self, pixels: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
        return self.vision_model(pixels, compute_dtype)


def _layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm in fp32 (its parameters stay fp32 under bf16), result in x's dtype."""
    return F.layer_norm(x.float(), norm.normalized_shape, norm.weight.float(), norm.bias.float(),
                        norm.eps).type_as(x)
