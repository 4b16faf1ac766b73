"""SmolVLM, the backbone of SmolVLA: sizes (a table of known backbones, or the folder's vlm_config.json) and modules.

lerobot builds it with ``AutoConfig.from_pretrained(vlm_model_name)`` (``smolvlm_with_expert.py`` at
huggingface/lerobot 7427f318), which needs the hub; a robot reads the sizes from ``KNOWN_BACKBONES`` or from
``vlm_config.json`` (the HF ``config.json`` of the backbone: ``text_config``, ``vision_config``,
``scale_factor``) instead. Module names mirror transformers' ``SmolVLMModel`` so lerobot's keys
(``vlm_with_expert.vlm.model.{vision_model, connector, text_model}.*``) load one to one.

    vision   SigLIP (SmolVLMVisionTransformer): patches + learned positions, pre-LN layers, post_layernorm
    connector pixel shuffle by scale_factor (s x s neighbouring patches -> one token), Linear without bias
    text     Llama decoder (SmolLM2): RMSNorm x*w, GQA attention, SiLU-gated MLP
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
from torch import nn

from ...config_fields import ConfigError
from ...gemma import GemmaSize
from ...layers import FusedProjection, GemmaMLP, LlamaRMSNorm, apply_linear, apply_rope
from ...quant import input_dtype
from ...siglip import SiglipVisionTransformer, VisionSize


@dataclass(frozen=True)
class LlamaSize(GemmaSize):
    """One Llama stack (SmolVLM's text model, or SmolVLA's expert at its own width): a decoder of the same
    shape fields as a Gemma stream, with its own norm epsilon."""

    rms_norm_eps: float


@dataclass(frozen=True)
class SmolVLMBackbone:
    """The backbone sizes lerobot reads from the hub config (text stack at its full depth)."""

    vision: VisionSize
    vision_image_size: int          # the position table covers (image_size / patch)^2 patches
    vision_eps: float
    scale_factor: int               # pixel shuffle: tokens per image = patches / scale_factor^2
    text: LlamaSize
    vocab_size: int

    def to_hf_config(self) -> Dict[str, Any]:
        """vlm_config.json content (the HF SmolVLMConfig layout)."""
        vision, text = self.vision, self.text
        return {
            'architectures': ['SmolVLMForConditionalGeneration'], 'model_type': 'smolvlm',
            'scale_factor': self.scale_factor,
            'vision_config': {'model_type': 'smolvlm_vision', 'hidden_size': vision.width,
                              'intermediate_size': vision.mlp_dim, 'num_hidden_layers': vision.depth,
                              'num_attention_heads': vision.num_heads, 'num_channels': 3,
                              'image_size': self.vision_image_size, 'patch_size': vision.patch_size,
                              'hidden_act': 'gelu_pytorch_tanh', 'layer_norm_eps': self.vision_eps},
            'text_config': {'model_type': 'llama', 'hidden_size': text.width, 'intermediate_size': text.mlp_dim,
                            'num_hidden_layers': text.depth, 'num_attention_heads': text.num_heads,
                            'num_key_value_heads': text.num_kv_heads, 'head_dim': text.head_dim,
                            'hidden_act': 'silu', 'rms_norm_eps': text.rms_norm_eps, 'vocab_size': self.vocab_size,
                            'attention_bias': False, 'mlp_bias': False, 'torch_dtype': 'bfloat16'},
        }


# SmolVLM2-500M-Video-Instruct's config.json (vision SigLIP-B/16 at 512, SmolLM2-360M text), as
# ../shared/reference/smolvla.md lists it.
KNOWN_BACKBONES: Dict[str, SmolVLMBackbone] = {
    'HuggingFaceTB/SmolVLM2-500M-Video-Instruct': SmolVLMBackbone(
        vision=VisionSize(width=768, depth=12, mlp_dim=3072, num_heads=12, patch_size=16), vision_image_size=512,
        vision_eps=1e-6, scale_factor=4,
        text=LlamaSize(width=960, depth=32, mlp_dim=2560, num_heads=15, num_kv_heads=5, head_dim=64,
                       rms_norm_eps=1e-5),
        vocab_size=49280),
}


def _require(section: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in section:
        raise ConfigError(f'{where} has no {name}')
    return section[name]


def backbone_from_hf_config(document: Mapping[str, Any], source: str) -> SmolVLMBackbone:
    """A SmolVLM HF config.json (``vlm_config.json``) -> sizes; every size is required, named when missing."""
    try:
        vision = dict(_require(document, 'vision_config', source))
        text = dict(_require(document, 'text_config', source))
        for section, name, act in ((vision, 'vision_config', 'gelu_pytorch_tanh'), (text, 'text_config', 'silu')):
            if section.get('hidden_act', act) != act:
                raise ConfigError(f'{source} {name}.hidden_act = {section["hidden_act"]!r} is not implemented '
                                  f'(only {act!r})')
        for flag in ('attention_bias', 'mlp_bias'):
            if text.get(flag, False):
                raise ConfigError(f'{source} text_config.{flag} = true is not implemented')
        width, heads = int(_require(text, 'hidden_size', f'{source} text_config')), \
            int(_require(text, 'num_attention_heads', f'{source} text_config'))
        return SmolVLMBackbone(
            vision=VisionSize(width=int(_require(vision, 'hidden_size', f'{source} vision_config')),
                              depth=int(_require(vision, 'num_hidden_layers', f'{source} vision_config')),
                              mlp_dim=int(_require(vision, 'intermediate_size', f'{source} vision_config')),
                              num_heads=int(_require(vision, 'num_attention_heads', f'{source} vision_config')),
                              patch_size=int(_require(vision, 'patch_size', f'{source} vision_config'))),
            vision_image_size=int(_require(vision, 'image_size', f'{source} vision_config')),
            vision_eps=float(vision.get('layer_norm_eps', 1e-6)),
            scale_factor=int(_require(document, 'scale_factor', source)),
            text=LlamaSize(width=width, depth=int(_require(text, 'num_hidden_layers', f'{source} text_config')),
                           mlp_dim=int(_require(text, 'intermediate_size', f'{source} text_config')),
                           num_heads=heads,
                           num_kv_heads=int(text.get('num_key_value_heads') or heads),
                           head_dim=int(text.get('head_dim') or width // heads),
                           rms_norm_eps=float(text.get('rms_norm_eps', 1e-6))),   # LlamaConfig's default
            vocab_size=int(_require(text, 'vocab_size', f'{source} text_config')))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f'{source} is malformed: {exc!r}') from exc


def resolve_backbone(vlm_model_name: str, local_config: Optional[Mapping[str, Any]],
                     source: str) -> SmolVLMBackbone:
    """The folder's vlm_config.json when there is one, else the table; an unknown id without it is refused."""
    if local_config is not None:
        return backbone_from_hf_config(local_config, source)
    if vlm_model_name in KNOWN_BACKBONES:
        return KNOWN_BACKBONES[vlm_model_name]
    raise ConfigError(f'config.json vlm_model_name {vlm_model_name!r} is not a known backbone '
                      f'({", ".join(sorted(KNOWN_BACKBONES))}) and the folder has no {source}; put the backbone\'s '
                      'HF config.json there as vlm_config.json')


def expert_size(text: LlamaSize, width_multiplier: float, depth: int) -> LlamaSize:
    """lerobot's expert: a copy of the text config at int(width * multiplier), MLP get_intermediate_size."""
    width = int(text.width * width_multiplier)
    return dataclasses.replace(text, width=width, depth=depth, mlp_dim=intermediate_size(width))


def intermediate_size(hidden_dim: int, ffn_dim_multiplier: int = 4, multiple_of: int = 256) -> int:
    """smolvlm_with_expert.get_intermediate_size."""
    hidden_dim = int(2 * hidden_dim / 3)
    hidden_dim = int(ffn_dim_multiplier * hidden_dim)
    return multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)


# ---- modules -------------------------------------------------------------------------------------------------

class LlamaAttention(nn.Module):
    """q/k/v/o without biases; ``kv_input``: the k/v input width when it is not the layer's (a cross layer
    projects the VLM's K/V, K*D wide)."""

    def __init__(self, size: LlamaSize, kv_input: Optional[int] = None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = size.num_heads, size.num_kv_heads, size.head_dim
        inner, kv_inner = size.num_heads * size.head_dim, size.num_kv_heads * size.head_dim
        self.q_proj = nn.Linear(size.width, inner, bias=False)
        self.k_proj = nn.Linear(kv_input or size.width, kv_inner, bias=False)
        self.v_proj = nn.Linear(kv_input or size.width, kv_inner, bias=False)
        self.o_proj = nn.Linear(inner, size.width, bias=False)
        self.qkv = FusedProjection(self.q_proj, self.k_proj, self.v_proj) if kv_input is None else None


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + o(attn(norm(x))), then x + mlp(norm(x)); the attention itself is the caller's
    (which keys a layer sees depends on the pass), so the block offers its halves.

    The residual stream keeps the dtype it arrives in (SmolVLA feeds fp32): norms compute in fp32 and the
    projections run in their weights' dtype (bf16 under a bf16 model), their outputs added back in fp32.
    lerobot's bf16 recipe instead rounds the residual stream to bf16 after the first layer."""

    def __init__(self, size: LlamaSize, kv_input: Optional[int] = None) -> None:
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(size.width, size.rms_norm_eps)
        self.self_attn = LlamaAttention(size, kv_input)
        self.post_attention_layernorm = LlamaRMSNorm(size.width, size.rms_norm_eps)
        self.mlp = GemmaMLP(size.width, size.mlp_dim, activation='silu')

    def project_qkv(self, x: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, S, W]; cos, sin [B, S, 1, D] -> q [B, H, S, D], k and v [B, K, S, D], RoPE on q and k."""
        attn = self.self_attn
        batch, seq, _ = x.shape
        heads, kv_heads = attn.num_heads, attn.num_kv_heads
        h = self.input_layernorm(x).to(input_dtype(attn.q_proj))
        qkv = attn.qkv(h).view(batch, seq, heads + 2 * kv_heads, attn.head_dim)
        qk = apply_rope(qkv[:, :, :heads + kv_heads], cos, sin)
        q, k = qk.transpose(1, 2).split([heads, kv_heads], dim=1)
        return q, k, qkv[:, :, heads + kv_heads:].transpose(1, 2)

    def project_q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """A cross layer's queries only: x [B, S, W] -> q [B, H, S, D] (RoPE'd)."""
        attn = self.self_attn
        batch, seq, _ = x.shape
        h = self.input_layernorm(x).to(input_dtype(attn.q_proj))
        q = apply_linear(attn.q_proj, h).view(batch, seq, attn.num_heads, attn.head_dim)
        return apply_rope(q, cos, sin).transpose(1, 2)

    def cross_kv(self, keys: torch.Tensor, values: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The VLM's K and V of this layer [B, K, T, D] (post-RoPE K) through k_proj / v_proj -> [B, K', T, D'].

        As lerobot's forward_cross_attn_layer: each token's heads side by side ([B, T, K*D]) are the input;
        no RoPE on the result."""
        attn = self.self_attn
        batch, _, tokens, _ = keys.shape
        weight_dtype = input_dtype(attn.k_proj)

        def project(t: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
            flat = t.transpose(1, 2).reshape(batch, tokens, -1).to(weight_dtype)     # [B, T, K*D]
            return linear(flat).view(batch, tokens, attn.num_kv_heads, attn.head_dim).transpose(1, 2)

        return project(keys, attn.k_proj), project(values, attn.v_proj)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """attn [B, H, S, D] -> o_proj, residual, post-attention norm, MLP, residual -> x [B, S, W]."""
        batch, _, seq, _ = attn.shape
        o_proj = self.self_attn.o_proj
        dtype = input_dtype(o_proj)
        x = x + apply_linear(o_proj, attn.transpose(1, 2).reshape(batch, seq, -1).to(dtype))
        return x + self.mlp(self.post_attention_layernorm(x).to(dtype))


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """transformers SmolVLMConnector.pixel_shuffle: [N, S, D] (S a square grid) -> [N, S / s^2, D * s^2]."""
    batch, seq, dim = x.shape
    side = int(seq ** 0.5)
    x = x.view(batch, side, side, dim).view(batch, side, side // scale, dim * scale).permute(0, 2, 1, 3)
    x = x.reshape(batch, side // scale, side // scale, dim * scale * scale).permute(0, 2, 1, 3)
    return x.reshape(batch, seq // (scale * scale), dim * scale * scale)


class ModalityProjection(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_dim, out_dim, bias=False)


class SmolVLMConnector(nn.Module):
    def __init__(self, backbone: SmolVLMBackbone) -> None:
        super().__init__()
        self.scale_factor = backbone.scale_factor
        self.modality_projection = ModalityProjection(backbone.vision.width * backbone.scale_factor ** 2,
                                                      backbone.text.width)

    def forward(self, image_tokens: torch.Tensor) -> torch.Tensor:
        """[N, patches, W_vis] -> [N, patches / s^2, W_text]."""
        return self.modality_projection.proj(pixel_shuffle(image_tokens, self.scale_factor))


class SmolVLMTextModel(nn.Module):
    """The text decoder cut to its first ``depth`` layers (lerobot's num_vlm_layers)."""

    def __init__(self, text: LlamaSize, vocab_size: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, text.width)
        self.layers = nn.ModuleList(LlamaDecoderLayer(text) for _ in range(text.depth))
        self.norm = LlamaRMSNorm(text.width, text.rms_norm_eps)   # saved; only the expert's output is normed


class SmolVLMModel(nn.Module):
    def __init__(self, backbone: SmolVLMBackbone, num_layers: int) -> None:
        super().__init__()
        patches = (backbone.vision_image_size // backbone.vision.patch_size) ** 2
        self.vision_model = SiglipVisionTransformer(backbone.vision, patches, backbone.vision_eps)
        self.connector = SmolVLMConnector(backbone)
        self.text_model = SmolVLMTextModel(dataclasses.replace(backbone.text, depth=num_layers),
                                           backbone.vocab_size)


class SmolVLM(nn.Module):
    """Holder that gives the checkpoint prefix ``vlm.model.`` (``vlm.lm_head`` is saved but never read)."""

    def __init__(self, backbone: SmolVLMBackbone, num_layers: int) -> None:
        super().__init__()
        self.model = SmolVLMModel(backbone, num_layers)


class LlamaExpert(nn.Module):
    """SmolVLA's action expert: Llama layers (cross layers with K*D-wide k/v inputs) and a final norm."""

    def __init__(self, size: LlamaSize, cross_layers: Tuple[bool, ...], vlm_kv_width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(LlamaDecoderLayer(size, vlm_kv_width if cross else None)
                                    for cross in cross_layers)
        self.norm = LlamaRMSNorm(size.width, size.rms_norm_eps)
