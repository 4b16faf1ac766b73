"""The two Gemma streams of pi0: the language model (prefix) and the action expert (suffix).

Both streams share depth, heads and head dim, so layer i of the expert attends
to the K/V that layer i of the language model wrote for the prefix. Weights are
separate per stream. Module names mirror transformers' Gemma so checkpoint keys
map one to one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn

from .layers import (AdaptiveRMSNorm, FusedProjection, GemmaMLP, RMSNorm, apply_rope, fold_mask,
                     grouped_query_attention)


@dataclass(frozen=True)
class GemmaSize:
    """One Gemma stream: the language model or the action expert."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


class GemmaSelfAttention(nn.Module):
    """Projections of one stream's joint attention (no biases)."""

    def __init__(self, size: GemmaSize) -> None:
        super().__init__()
        self.num_heads = size.num_heads
        self.num_kv_heads = size.num_kv_heads
        self.head_dim = size.head_dim
        self.q_proj = nn.Linear(size.width, size.num_heads * size.head_dim, bias=False)
        self.k_proj = nn.Linear(size.width, size.num_kv_heads * size.head_dim, bias=False)
        self.v_proj = nn.Linear(size.width, size.num_kv_heads * size.head_dim, bias=False)
        self.o_proj = nn.Linear(size.num_heads * size.head_dim, size.width, bias=False)
        self.qkv = FusedProjection(self.q_proj, self.k_proj, self.v_proj)

    def project_qkv(self, h: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h [B, S, W]; cos, sin [B, S, 1, D] -> q [B, H, S, D], k and v [B, K, S, D], RoPE on q and k."""
        batch, seq, _ = h.shape
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.qkv(h).view(batch, seq, heads + 2 * kv_heads, self.head_dim)   # [B, S, H+2K, D]
        qk = apply_rope(qkv[:, :, :heads + kv_heads], cos, sin)                   # q and k heads in one pass
        q, k = qk.transpose(1, 2).split([heads, kv_heads], dim=1)
        return q, k, qkv[:, :, heads + kv_heads:].transpose(1, 2)

    def project_out(self, attn: torch.Tensor) -> torch.Tensor:
        """attn [B, H, S, D] -> [B, S, W]."""
        batch, _, seq, _ = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim))


class GemmaDecoderLayer(nn.Module):
    """Pre-norm decoder block; with ``cond_dim`` the norms are adaptive (pi0.5 expert)."""

    def __init__(self, size: GemmaSize, eps: float, cond_dim: Optional[int] = None) -> None:
        super().__init__()
        self.adaptive = cond_dim is not None
        self.input_layernorm = _norm(size.width, eps, cond_dim)
        self.self_attn = GemmaSelfAttention(size)
        self.post_attention_layernorm = _norm(size.width, eps, cond_dim)
        self.mlp = GemmaMLP(size.width, size.mlp_dim)

    def norm(self, which: nn.Module, x: torch.Tensor, cond: Optional[torch.Tensor],
             dtype: torch.dtype) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Returns (normed x rounded once to the compute ``dtype``, residual gate in x's dtype or None)."""
        if self.adaptive:
            normed, gate = which(x, cond)
            return normed.to(dtype), gate
        return which(x).to(dtype), None

    def forward(self, x: torch.Tensor, kv: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor, cond: Optional[torch.Tensor] = None, kv_only: bool = False) -> torch.Tensor:
        """One block, for the prefix and the suffix alike.

        x [B, S, W]; kv [2, B, K, T, D] this layer's K/V buffer: the block writes its own
        k, v at positions [start, start + S) and attends to everything up to there,
        [0, start + S) (the prefix pass: start 0; pi0's state token: start P; the action
        tokens: after the prefix and the state, both already there and never written).
        mask additive, folded [B, 1, G*S, start + S]; cond [B, W] or [B, S, W] for
        adaptive norms. ``kv_only``: stop once K/V are written (a last layer whose output
        nothing reads). Returns x [B, S, W].

        The residual stream x may be wider than the compute dtype (fp32 under bf16, see GemmaStack): the
        norms read it in full precision and round once to the K/V buffer's dtype for the projections.
        """
        end = start + x.shape[1]
        h, gate = self.norm(self.input_layernorm, x, cond, kv.dtype)
        q, k, v = self.self_attn.project_qkv(h, cos, sin)           # q [B, H, S, D]; k, v [B, K, S, D]
        kv[0, :, :, start:end] = k
        kv[1, :, :, start:end] = v
        if kv_only:
            return x
        attn = grouped_query_attention(q, kv[0, :, :, :end], kv[1, :, :, :end], mask)   # [B, H, S, D]
        x = gated_residual(x, self.self_attn.project_out(attn), gate)
        h, gate = self.norm(self.post_attention_layernorm, x, cond, kv.dtype)
        return gated_residual(x, self.mlp(h), gate)


def _norm(width: int, eps: float, cond_dim: Optional[int]) -> nn.Module:
    return AdaptiveRMSNorm(width, cond_dim, eps) if cond_dim is not None else RMSNorm(width, eps)


def gated_residual(x: torch.Tensor, y: torch.Tensor, gate: Optional[torch.Tensor]) -> torch.Tensor:
    """x + y, or x + y * gate under adaptive norms."""
    return x + y if gate is None else x + y * gate


class GemmaStack(nn.Module):
    """Layers + final norm (+ token embedding for the language model).

    ``residual_fp32``: the residual stream between the blocks is kept in fp32 whatever the compute dtype; only
    the projections' inputs (the norm outputs) and outputs are in the compute dtype. Under bf16 that removes
    the rounding of every residual add (two per layer), the error that grows with depth
    (bench/bf16_accuracy.py); lerobot rounds the stream to bf16 after each add. In fp32 it changes nothing.
    """

    residual_fp32 = True

    def __init__(self, size: GemmaSize, eps: float, vocab_size: Optional[int] = None,
                 cond_dim: Optional[int] = None) -> None:
        super().__init__()
        self.size = size
        if vocab_size is not None:
            self.embed_tokens = nn.Embedding(vocab_size, size.width)
        self.layers = nn.ModuleList(GemmaDecoderLayer(size, eps, cond_dim) for _ in range(size.depth))
        self.norm = _norm(size.width, eps, cond_dim)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Gemma scales token embeddings by sqrt(width), the scale rounded to the table's dtype
        (as transformers >= 5.4 and current lerobot do; exact in fp32)."""
        embedded = self.embed_tokens(tokens)        # the table's dtype (an int8 table's: its rows dequantized)
        scale = torch.full((), math.sqrt(self.size.width), dtype=embedded.dtype, device=embedded.device)  # capturable
        return embedded * scale

    def final_norm(self, x: torch.Tensor, cond: Optional[torch.Tensor]) -> torch.Tensor:
        return self.norm(x, cond)[0] if cond is not None else self.norm(x)

    def prefix_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  mask: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """Run the prefix through the stream and keep each layer's K/V.

        x [B, P, W], mask additive [B, 1, P, P] -> kv [L, 2, B, K, P, D] in ``dtype`` (the compute dtype;
        default x's: x may be fp32 under bf16, see ``stream_input``).
        Only K/V leave this function: the last layer's attention output and MLP
        feed nothing the suffix reads, so they are not computed.
        """
        size = self.size
        batch, prefix_len, _ = x.shape
        kv = x.new_empty(size.depth, 2, batch, size.num_kv_heads, prefix_len, size.head_dim,
                         dtype=dtype or x.dtype)
        self.write_kv(x, kv, 0, cos, sin, fold_mask(mask, size.num_heads // size.num_kv_heads))
        return kv

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """The residual stream's dtype for tokens entering the stack (fp32 with ``residual_fp32``)."""
        return x.float() if self.residual_fp32 else x

    def stream_input(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Tokens computed in fp32 outside the stack (image tokens, pi0's state and action-time tokens), as they
        enter it: unrounded with ``residual_fp32``, else rounded to the compute ``dtype`` (lerobot's way).

        With lerobot's initialisation each block adds little to the stream (the weights' gain is 1/sqrt(3)), so
        an input token's own bf16 rounding reaches the final norm nearly whole: rounding it before an fp32
        stream was most of our bf16 action error on lerobot's deep pi0 (bench/compare_lerobot_bf16.py)."""
        return x.float() if self.residual_fp32 else x.to(dtype)

    def write_kv(self, x: torch.Tensor, kv: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor,
                 mask: torch.Tensor) -> None:
        """Tokens x [B, S, W] through every layer, keeping only their K/V at [start, start + S) of
        kv [L, 2, B, K, T, D] (folded mask [B, 1, G*S, start + S]). The last layer's attention output
        and MLP feed nothing, so they are not computed."""
        x = self.residual(x)
        for i, layer in enumerate(self.layers):
            x = layer(x, kv[i], start, cos, sin, mask, kv_only=i == self.size.depth - 1)

    def suffix_forward(self, x: torch.Tensor, kv_workspace: torch.Tensor, start: int,
                       cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                       cond: Optional[torch.Tensor]) -> torch.Tensor:
        """Action tokens attend to [prefix ; (state) ; actions] through a preallocated K/V buffer.

        x [B, S, W] written at [start, start + S) of kv_workspace [L, 2, B, K, start + S, D], whose
        first ``start`` positions (the prefix, and pi0's state token) are written once per chunk,
        never here; folded mask [B, 1, G*S, start + S]; cond [B, W] or [B, S, W] for adaptive norms.
        Returns the final-normed hidden states [B, S, W] (in the residual stream's dtype).
        """
        x = self.residual(x)
        for i, layer in enumerate(self.layers):
            x = layer(x, kv_workspace[i], start, cos, sin, mask, cond)
        return self.final_norm(x, cond)
