"""FLOP counting from a config alone, the shared pieces: a linear layer, a decoder block, a SigLIP tower.

Counted: every matrix product the implementation runs, 2 FLOPs per multiply-add: projections, MLPs, both
attention products (QK^T and PV over all keys, padded ones included, as SDPA computes them), the patch
embedding. Not counted: norms, RoPE, softmax, GELU and other elementwise work (well under 1% of the total
at real sizes). Each family adds up its stages from these (``PolicyFamily.stage_flops``; bench/flops.py).
``size`` is any decoder size with width, mlp_dim, num_heads, num_kv_heads and head_dim.
"""
from __future__ import annotations

from typing import Any

from .siglip import VisionSize


def linear(rows: int, fan_in: int, fan_out: int) -> int:
    return 2 * rows * fan_in * fan_out


def qkv(rows: int, size: Any) -> int:
    """The fused q, k and v projections of ``rows`` tokens."""
    return linear(rows, size.width, (size.num_heads + 2 * size.num_kv_heads) * size.head_dim)


def decoder_block(rows: int, keys: int, size: Any) -> int:
    """One decoder block (attention with a gated MLP) on ``rows`` queries attending to ``keys`` keys."""
    inner = size.num_heads * size.head_dim
    return (qkv(rows, size)
            + 2 * linear(rows, keys, inner)              # QK^T and PV, all heads
            + linear(rows, inner, size.width)            # o_proj
            + 3 * linear(rows, size.width, size.mlp_dim))  # gate, up, down


def siglip(vision: VisionSize, patches: int) -> int:
    """One image through SigLIP: patch embedding and the encoder layers."""
    per_layer = (4 * linear(patches, vision.width, vision.width)
                 + 2 * linear(patches, patches, vision.width)
                 + 2 * linear(patches, vision.width, vision.mlp_dim))
    return linear(patches, 3 * vision.patch_size ** 2, vision.width) + vision.depth * per_layer
