"""GR00T N1.7's backbone: Qwen3-VL (Cosmos-Reason2-2B) cut at ``select_layer``, inference only, pure torch.

transformers ``models/qwen3_vl/modeling_qwen3_vl.py`` (5.5.4, the version lerobot 7427f318 pins: >=5.4,<5.6), as
lerobot ``policies/groot/groot_n1_7.py`` Qwen3Backbone runs it. Module names are transformers' under lerobot's
``backbone.model.model.`` so ``model.safetensors`` keys load one to one.

    ViT (Qwen3VLVisionModel)   Conv3d patches (as one matmul over the flattened patch), the learned 2D position table
                               bilinearly resized to the grid (fast_pos_embed_interpolate), 2D rotary in merge-block
                               order (rot_pos_emb), attention within each image (cu_seqlens), LayerNorm eps 1e-6,
                               gelu_pytorch_tanh MLP; the merger (LayerNorm, fc1, exact GELU, fc2) per 2x2 block and
                               one DeepStack merger (post-shuffle LayerNorm) per tap in ``deepstack_visual_indexes``
    text (Qwen3VLTextModel)    the image tokens' embeddings replaced by the merger outputs, causal GQA with q/k RMSNorm
                               over the head dim, interleaved mRoPE (sections [t, h, w], apply_interleaved_mrope), SiLU
                               gated MLP; DeepStack: tap j is added at the image positions after layer j; the output is
                               the last kept layer's, before the final norm (lerobot's forward hook) and before that
                               layer's own DeepStack addition (the hook fires first)

Casts follow transformers' (RMSNorm ``w * x_normed.to(input_dtype)``, fp32 rotary, q/k rotated in fp32 in the ViT)
so that the model under ``torch.autocast`` is lerobot's bf16 recipe.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ...config_fields import ConfigError
from ...layers import GemmaMLP, apply_rope, fold_mask, grouped_query_attention

COSMOS_REASON2_2B = 'nvidia/Cosmos-Reason2-2B'


@dataclass(frozen=True)
class QwenVisionSize:
    width: int = 1024
    depth: int = 24
    num_heads: int = 16
    mlp_dim: int = 4096
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    out_width: int = 2048
    num_position_embeddings: int = 2304
    deepstack_indexes: Tuple[int, ...] = (5, 11, 17)
    in_channels: int = 3

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def grid_side(self) -> int:
        """Side of the learned position table (num_grid_per_side)."""
        return int(self.num_position_embeddings ** 0.5)

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size


@dataclass(frozen=True)
class QwenTextSize:
    width: int = 2048
    depth: int = 28
    num_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 128
    mlp_dim: int = 6144
    vocab_size: int = 151936
    rms_norm_eps: float = 1e-6
    rope_theta: float = 5_000_000.0
    mrope_section: Tuple[int, int, int] = (24, 20, 20)
    attention_bias: bool = False


@dataclass(frozen=True)
class Qwen3VLBackbone:
    """The sizes and special ids of a Qwen3-VL checkpoint (its HF config.json)."""

    vision: QwenVisionSize = QwenVisionSize()
    text: QwenTextSize = QwenTextSize()
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653

    @classmethod
    def from_hf_config(cls, raw: Mapping[str, Any], source: str) -> 'Qwen3VLBackbone':
        """A Qwen3-VL config.json (transformers 5 writes ``rope_parameters``, older ones ``rope_scaling``);
        ConfigError naming ``source`` for what this backbone cannot run."""
        if raw.get('model_type') not in (None, 'qwen3_vl'):
            raise ConfigError(f'{source}: model_type {raw.get("model_type")!r} is not a Qwen3-VL config (qwen3_vl)')
        text, vision = raw.get('text_config') or {}, raw.get('vision_config') or {}
        if not isinstance(text, Mapping) or not isinstance(vision, Mapping):
            raise ConfigError(f'{source}: text_config and vision_config must be objects')
        rope = text.get('rope_parameters') or text.get('rope_scaling') or {}
        theta = text.get('rope_theta', rope.get('rope_theta', 5_000_000))
        if rope.get('rope_type', 'default') != 'default' or not rope.get('mrope_interleaved', True):
            raise ConfigError(f'{source}: only the default interleaved mRoPE is implemented, got {dict(rope)}')
        act = text.get('hidden_act', 'silu')
        if act != 'silu' or vision.get('hidden_act', 'gelu_pytorch_tanh') != 'gelu_pytorch_tanh':
            raise ConfigError(f'{source}: activations silu (text) and gelu_pytorch_tanh (vision) are implemented, '
                              f'got {act!r} and {vision.get("hidden_act")!r}')
        try:
            width = int(text['hidden_size'])
            heads = int(text['num_attention_heads'])
            text_size = QwenTextSize(
                width=width, depth=int(text['num_hidden_layers']), num_heads=heads,
                num_kv_heads=int(text.get('num_key_value_heads', heads)),
                head_dim=int(text.get('head_dim') or width // heads), mlp_dim=int(text['intermediate_size']),
                vocab_size=int(text['vocab_size']), rms_norm_eps=float(text.get('rms_norm_eps', 1e-6)),
                rope_theta=float(theta), mrope_section=tuple(int(v) for v in rope.get('mrope_section', (24, 20, 20))),
                attention_bias=bool(text.get('attention_bias', False)))
            vision_size = QwenVisionSize(
                width=int(vision['hidden_size']), depth=int(vision['depth']), num_heads=int(vision['num_heads']),
                mlp_dim=int(vision['intermediate_size']), patch_size=int(vision.get('patch_size', 16)),
                temporal_patch_size=int(vision.get('temporal_patch_size', 2)),
                merge_size=int(vision.get('spatial_merge_size', 2)), out_width=int(vision['out_hidden_size']),
                num_position_embeddings=int(vision['num_position_embeddings']),
                deepstack_indexes=tuple(int(v) for v in vision.get('deepstack_visual_indexes', ())),
                in_channels=int(vision.get('in_channels', 3)))
            backbone = cls(vision=vision_size, text=text_size,
                           image_token_id=int(raw.get('image_token_id', 151655)),
                           video_token_id=int(raw.get('video_token_id', 151656)),
                           vision_start_token_id=int(raw.get('vision_start_token_id', 151652)),
                           vision_end_token_id=int(raw.get('vision_end_token_id', 151653)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f'{source} is not a readable Qwen3-VL config: {exc!r}') from exc
        problem = backbone.problem()
        if problem:
            raise ConfigError(f'{source}: {problem}')
        return backbone

    def problem(self) -> Optional[str]:
        text, vision = self.text, self.vision
        if len(text.mrope_section) != 3 or 2 * sum(text.mrope_section) != text.head_dim:
            return f'mrope_section {list(text.mrope_section)} must be three sections summing to head_dim / 2'
        if text.num_heads % text.num_kv_heads or vision.width % vision.num_heads or vision.head_dim % 4:
            return 'head counts do not divide the widths (or the vision head dim is not a multiple of 4)'
        if vision.grid_side ** 2 != vision.num_position_embeddings:
            return f'num_position_embeddings {vision.num_position_embeddings} is not a square'
        if vision.out_width != text.width:
            return f'vision out_hidden_size {vision.out_width} differs from the text hidden_size {text.width}'
        if any(not 0 <= i < vision.depth for i in vision.deepstack_indexes):
            return f'deepstack_visual_indexes {list(vision.deepstack_indexes)} outside the {vision.depth} ViT layers'
        return None

    def to_hf_config(self) -> Dict[str, Any]:
        """The config.json transformers writes for this backbone (Qwen3VLConfig.save_pretrained, 5.5.4)."""
        text, vision = self.text, self.vision
        return {
            'architectures': ['Qwen3VLForConditionalGeneration'], 'model_type': 'qwen3_vl',
            'image_token_id': self.image_token_id, 'video_token_id': self.video_token_id,
            'vision_start_token_id': self.vision_start_token_id, 'vision_end_token_id': self.vision_end_token_id,
            'tie_word_embeddings': True,
            'text_config': {
                'model_type': 'qwen3_vl_text', 'attention_bias': text.attention_bias, 'attention_dropout': 0.0,
                'head_dim': text.head_dim, 'hidden_act': 'silu', 'hidden_size': text.width,
                'intermediate_size': text.mlp_dim, 'num_attention_heads': text.num_heads,
                'num_hidden_layers': text.depth, 'num_key_value_heads': text.num_kv_heads,
                'rms_norm_eps': text.rms_norm_eps, 'vocab_size': text.vocab_size, 'max_position_embeddings': 262144,
                'rope_parameters': {'mrope_interleaved': True, 'mrope_section': list(text.mrope_section),
                                    'rope_theta': text.rope_theta, 'rope_type': 'default'},
                'tie_word_embeddings': True, 'use_cache': True},
            'vision_config': {
                'model_type': 'qwen3_vl', 'deepstack_visual_indexes': list(vision.deepstack_indexes),
                'depth': vision.depth, 'hidden_act': 'gelu_pytorch_tanh', 'hidden_size': vision.width,
                'in_channels': vision.in_channels, 'intermediate_size': vision.mlp_dim, 'num_heads': vision.num_heads,
                'num_position_embeddings': vision.num_position_embeddings, 'out_hidden_size': vision.out_width,
                'patch_size': vision.patch_size, 'spatial_merge_size': vision.merge_size,
                'temporal_patch_size': vision.temporal_patch_size},
        }


# lerobot groot_n1_7.py _cosmos_reason2_qwen3_vl_config: its hard-coded copy of nvidia/Cosmos-Reason2-2B's config.
KNOWN_BACKBONES: Dict[str, Qwen3VLBackbone] = {COSMOS_REASON2_2B: Qwen3VLBackbone()}


# ---- blocks ---------------------------------------------------------------------------------------------------

class QwenRMSNorm(nn.Module):
    """Qwen3VLTextRMSNorm: ``w * (x32 * rsqrt(mean(x32^2) + eps)).to(input dtype)`` (so bf16 in, fp32 w: fp32 out)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class VisionPatchEmbed(nn.Module):
    def __init__(self, size: QwenVisionSize) -> None:
        super().__init__()
        kernel = (size.temporal_patch_size, size.patch_size, size.patch_size)
        self.proj = nn.Conv3d(size.in_channels, size.width, kernel_size=kernel, stride=kernel, bias=True)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[..., C*T*p*p] (the image processor's flattened patch) -> [..., width]: the Conv3d with kernel = stride
        is one matmul over the flattened patch."""
        return F.linear(patches, self.proj.weight.flatten(1), self.proj.bias)


class VisionAttention(nn.Module):
    def __init__(self, size: QwenVisionSize) -> None:
        super().__init__()
        self.num_heads = size.num_heads
        self.qkv = nn.Linear(size.width, 3 * size.width, bias=True)
        self.proj = nn.Linear(size.width, size.width, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [I, S, W] (images, patches); cos/sin [1, S, 1, Dh]; attention within each image."""
        images, seq, width = x.shape
        q, k, v = self.qkv(x).reshape(images, seq, 3, self.num_heads, -1).unbind(2)     # [I, S, heads, Dh]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.proj(out.transpose(1, 2).reshape(images, seq, width))


class VisionMLP(nn.Module):
    def __init__(self, size: QwenVisionSize) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(size.width, size.mlp_dim, bias=True)
        self.linear_fc2 = nn.Linear(size.mlp_dim, size.width, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate='tanh'))


class VisionBlock(nn.Module):
    def __init__(self, size: QwenVisionSize) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(size.width, eps=1e-6)
        self.norm2 = nn.LayerNorm(size.width, eps=1e-6)
        self.attn = VisionAttention(size)
        self.mlp = VisionMLP(size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Qwen3VLVisionPatchMerger: 2x2 blocks of patches -> one LLM token (LayerNorm before or after the shuffle)."""

    def __init__(self, size: QwenVisionSize, postshuffle_norm: bool) -> None:
        super().__init__()
        self.merged = size.width * size.merge_size ** 2
        self.postshuffle_norm = postshuffle_norm
        self.norm = nn.LayerNorm(self.merged if postshuffle_norm else size.width, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.merged, self.merged)
        self.linear_fc2 = nn.Linear(self.merged, size.out_width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [I, S, W] in merge-block order -> [I, S / merge^2, out_width]."""
        images = x.shape[0]
        x = self.norm(x.reshape(images, -1, self.merged)) if self.postshuffle_norm else \
            self.norm(x).reshape(images, -1, self.merged)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionModel(nn.Module):
    """Qwen3VLVisionModel for equally sized images (every camera at the model resolution)."""

    def __init__(self, size: QwenVisionSize) -> None:
        super().__init__()
        self.size = size
        self.patch_embed = VisionPatchEmbed(size)
        self.pos_embed = nn.Embedding(size.num_position_embeddings, size.width)
        self.blocks = nn.ModuleList([VisionBlock(size) for _ in range(size.depth)])
        self.merger = PatchMerger(size, postshuffle_norm=False)
        self.deepstack_merger_list = nn.ModuleList([PatchMerger(size, postshuffle_norm=True)
                                                    for _ in size.deepstack_indexes])

    def position_embeddings(self, grid_h: int, grid_w: int) -> torch.Tensor:
        """fast_pos_embed_interpolate for one (1, h, w) grid: [h*w, W] in merge-block order."""
        side, merge = self.size.grid_side, self.size.merge_size
        weight = self.pos_embed.weight
        h_pos = torch.linspace(0, side - 1, grid_h)
        w_pos = torch.linspace(0, side - 1, grid_w)
        h_floor, w_floor = h_pos.int(), w_pos.int()
        h_ceil, w_ceil = (h_floor + 1).clip(max=side - 1), (w_floor + 1).clip(max=side - 1)
        dh, dw = h_pos - h_floor, w_pos - w_floor
        corners = ((h_floor, w_floor, (1 - dh)[:, None] * (1 - dw)[None]),
                   (h_floor, w_ceil, (1 - dh)[:, None] * dw[None]),
                   (h_ceil, w_floor, dh[:, None] * (1 - dw)[None]),
                   (h_ceil, w_ceil, dh[:, None] * dw[None]))
        total = None
        for rows, cols, weights in corners:
            index = (rows[:, None] * side + cols[None]).flatten().to(weight.device)
            term = weight[index] * weights.flatten().to(weight.device, weight.dtype)[:, None]
            total = term if total is None else total + term
        return (total.view(grid_h // merge, merge, grid_w // merge, merge, -1)
                .permute(0, 2, 1, 3, 4).reshape(grid_h * grid_w, -1))

    def rotary(self, grid_h: int, grid_w: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """rot_pos_emb for one grid: cos, sin [1, h*w, 1, head_dim] (row angles then column angles, twice)."""
        merge, dim = self.size.merge_size, self.size.head_dim // 2
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
        rows = (torch.arange(grid_h // merge, device=device)[:, None, None, None] * merge
                + torch.arange(merge, device=device)[None, None, :, None])
        cols = (torch.arange(grid_w // merge, device=device)[None, :, None, None] * merge
                + torch.arange(merge, device=device)[None, None, None, :])
        shape = (grid_h // merge, grid_w // merge, merge, merge)
        rows, cols = rows.expand(shape).reshape(-1), cols.expand(shape).reshape(-1)
        angles = torch.cat([rows.float()[:, None] * inv_freq, cols.float()[:, None] * inv_freq], dim=-1)
        angles = torch.cat([angles, angles], dim=-1)[None, :, None]
        return angles.cos(), angles.sin()

    def forward(self, patches: torch.Tensor, grid_h: int, grid_w: int,
                tables: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
                ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """patches [I, h*w, C*T*p*p] (images of one grid) -> merged [I, h*w/4, out], DeepStack taps (same shape).
        ``tables``: (position embeddings, cos, sin) for this grid, made beforehand (they depend on the weights and
        the grid only)."""
        x = self.patch_embed(patches.to(self.patch_embed.proj.weight.dtype))
        if tables is None:
            tables = (self.position_embeddings(grid_h, grid_w),) + self.rotary(grid_h, grid_w, x.device)
        positions, cos, sin = tables
        x = x + positions
        taps: List[torch.Tensor] = []
        for index, block in enumerate(self.blocks):
            x = block(x, cos, sin)
            if index in self.size.deepstack_indexes:
                taps.append(self.deepstack_merger_list[self.size.deepstack_indexes.index(index)](x))
        return self.merger(x), taps


class TextAttention(nn.Module):
    def __init__(self, size: QwenTextSize) -> None:
        super().__init__()
        self.size = size
        bias = size.attention_bias
        self.q_proj = nn.Linear(size.width, size.num_heads * size.head_dim, bias=bias)
        self.k_proj = nn.Linear(size.width, size.num_kv_heads * size.head_dim, bias=bias)
        self.v_proj = nn.Linear(size.width, size.num_kv_heads * size.head_dim, bias=bias)
        self.o_proj = nn.Linear(size.num_heads * size.head_dim, size.width, bias=bias)
        self.q_norm = QwenRMSNorm(size.head_dim, size.rms_norm_eps)
        self.k_norm = QwenRMSNorm(size.head_dim, size.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, S, W]; cos/sin [B, S, 1, D] fp32; mask [B, 1, G*S, S] bool (folded)."""
        batch, seq, _ = x.shape
        size = self.size
        q = self.q_norm(self.q_proj(x).view(batch, seq, size.num_heads, size.head_dim))
        k = self.k_norm(self.k_proj(x).view(batch, seq, size.num_kv_heads, size.head_dim))
        v = self.v_proj(x).view(batch, seq, size.num_kv_heads, size.head_dim)
        # transformers' apply_rotary_pos_emb on (q, cos.to(x.dtype)): fp32 here, as the residual stream is fp32.
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = grouped_query_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class TextDecoderLayer(nn.Module):
    def __init__(self, size: QwenTextSize) -> None:
        super().__init__()
        self.self_attn = TextAttention(size)
        self.mlp = GemmaMLP(size.width, size.mlp_dim, activation='silu')
        self.input_layernorm = QwenRMSNorm(size.width, size.rms_norm_eps)
        self.post_attention_layernorm = QwenRMSNorm(size.width, size.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    """Qwen3VLTextModel's first ``layers`` decoder layers (lerobot pops the rest); the final norm is not run."""

    def __init__(self, size: QwenTextSize, layers: int) -> None:
        super().__init__()
        self.size = size
        self.embed_tokens = nn.Embedding(size.vocab_size, size.width)
        self.layers = nn.ModuleList([TextDecoderLayer(size) for _ in range(layers)])

    def mrope_tables(self, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """positions [3, B, S] (t, h, w) -> cos, sin [B, S, 1, head_dim] fp32 (Qwen3VLTextRotaryEmbedding with
        apply_interleaved_mrope: frequency i takes the h row when i % 3 == 1 and i < 3 * h_section, the w row when
        i % 3 == 2 and i < 3 * w_section, the t row otherwise)."""
        size = self.size
        half = size.head_dim // 2
        exponents = torch.arange(0, size.head_dim, 2, dtype=torch.int64, device=positions.device).float()
        inv_freq = 1.0 / (size.rope_theta ** (exponents / size.head_dim))
        freqs = positions.float()[..., None] * inv_freq                       # [3, B, S, half]
        index = torch.arange(half, device=positions.device)
        row = torch.zeros(half, dtype=torch.long, device=positions.device)
        for axis in (1, 2):
            row = torch.where((index % 3 == axis) & (index < 3 * size.mrope_section[axis]),
                              torch.full_like(row, axis), row)
        freqs = torch.gather(freqs, 0, row.view(1, 1, 1, half).expand(1, *freqs.shape[1:]))[0]
        emb = torch.cat([freqs, freqs], dim=-1)[:, :, None]                   # [B, S, 1, head_dim]
        return emb.cos(), emb.sin()

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, image_index: torch.Tensor,
                deepstack: Sequence[torch.Tensor]) -> torch.Tensor:
        """embeds [B, S, W] (image tokens already replaced); positions [3, B, S]; valid [B, S] bool (right padding);
        image_index [B, N_img] the image tokens' positions; deepstack: per tap [B, N_img, W] -> features [B, S, W]
        of the last layer, before the final norm."""
        size = self.size
        batch, seq, _ = embeds.shape
        cos, sin = self.mrope_tables(positions)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=embeds.device).tril()
        allowed = (causal[None] & valid[:, None, :])[:, None]                 # [B, 1, S, S]
        # A padding query attends to the valid tokens before it (never all masked); nothing reads its output.
        mask = fold_mask(allowed, size.num_heads // size.num_kv_heads)
        x = embeds
        gather = image_index[:, :, None].expand(-1, -1, size.width)
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask)
            if index == len(self.layers) - 1:
                break                      # lerobot's hook takes this output before any DeepStack addition
            if index < len(deepstack):
                # _deepstack_process: hidden[visual] + visual_embeds (in the hidden dtype), scattered back.
                added = torch.gather(x, 1, gather) + deepstack[index].to(x.dtype)
                x = x.scatter(1, gather, added)
        return x


class Qwen3VLInner(nn.Module):
    """Qwen3VLModel: ``visual`` and ``language_model``."""

    def __init__(self, backbone: Qwen3VLBackbone, select_layer: int) -> None:
        super().__init__()
        self.visual = VisionModel(backbone.vision)
        self.language_model = TextModel(backbone.text, select_layer)


class Qwen3VLForConditionalGeneration(nn.Module):
    """The module path lerobot's state dict has (``backbone.model.model.*``); the lm_head is never run (lerobot
    runs it over every token and discards the logits) and not built."""

    def __init__(self, backbone: Qwen3VLBackbone, select_layer: int) -> None:
        super().__init__()
        self.model = Qwen3VLInner(backbone, select_layer)


class Qwen3Backbone(nn.Module):
    """lerobot Qwen3Backbone: ``model`` is the (cut) Qwen3-VL."""

    def __init__(self, backbone: Qwen3VLBackbone, select_layer: int) -> None:
        super().__init__()
        self.model = Qwen3VLForConditionalGeneration(backbone, select_layer)

    @property
    def visual(self) -> VisionModel:
        return self.model.model.visual

    @property
    def language_model(self) -> TextModel:
        return self.model.model.language_model


def mrope_positions(is_image: torch.Tensor, tokens_per_image: int, llm_grid_w: int, advance: int) -> torch.Tensor:
    """get_rope_index without a host synchronisation, for prompts whose image groups are ``tokens_per_image``
    consecutive image tokens (every image at one grid): [3, B, S] (t, h, w).

    Text tokens count on from the previous token; an image group starting at position s gives its k-th token
    (t, h, w) = (s, s + k // llm_grid_w, s + k % llm_grid_w) and moves the next text on to s + ``advance``
    (max(h, w) of the LLM grid). Right padding gets whatever follows; it is masked everywhere."""
    is_image = is_image.long()
    images_before = torch.cumsum(is_image, dim=1) - is_image                # image tokens before this one
    groups_before = images_before // tokens_per_image
    index = torch.arange(is_image.shape[1], device=is_image.device)[None]
    text_pos = index - images_before + groups_before * advance
    within = images_before % tokens_per_image                              # k for an image token
    start = index - within - groups_before * tokens_per_image + groups_before * advance
    image = is_image.bool()
    t = torch.where(image, start, text_pos)
    h = torch.where(image, start + within // llm_grid_w, text_pos)
    w = torch.where(image, start + within % llm_grid_w, text_pos)
    return torch.stack([t, h, w])
