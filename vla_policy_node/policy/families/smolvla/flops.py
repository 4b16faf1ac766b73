"""FLOPs of one SmolVLA inference per stage, from the config alone (policy/flops.py says what is counted).

    prefix  = SigLIP + connector + the VLM layers over P image and language tokens + the cross layers'
              K/V projections of the prefix
    denoise = once per chunk the state token through the VLM layers (against P + 1 keys) and its cross K/V
              projections, then per step the expert's self layers (P + 1 + H keys) and cross layers
              (P + 1 keys, queries only)
"""
from __future__ import annotations

from typing import Dict

from ...flops import decoder_block, linear, qkv, siglip
from .config import SmolVLAConfig


def stage_flops(config: SmolVLAConfig, num_steps: int) -> Dict[str, int]:
    backbone, text, ex = config.backbone, config.text, config.expert
    side = config.image_resolution[0] // backbone.vision.patch_size
    tokens = config.tokens_per_image
    vision = siglip(backbone.vision, side * side) + linear(tokens, backbone.vision.width * backbone.scale_factor ** 2,
                                                           text.width)
    prefix, layers, horizon = config.prefix_len, config.num_vlm_layers, config.chunk_size
    kv_width = text.num_kv_heads * text.head_dim
    cross_kv = 2 * config.cross_layer_count * linear(prefix + 1, kv_width, ex.num_kv_heads * ex.head_dim)
    prefix_total = (len(config.all_camera_names) * vision + (layers - 1) * decoder_block(prefix, prefix, text)
                    + qkv(prefix, text) + cross_kv * prefix // (prefix + 1))
    once = ((layers - 1) * decoder_block(1, prefix + 1, text) + qkv(1, text)
            + linear(1, config.max_state_dim, text.width))
    once += cross_kv // (prefix + 1) + linear(num_steps + 1, ex.width, ex.width)   # state cross K/V, time halves
    inner = ex.num_heads * ex.head_dim
    per_step = (linear(horizon, config.max_action_dim, ex.width) + 2 * linear(horizon, ex.width, ex.width)
                + linear(horizon, ex.width, config.max_action_dim))
    for expert_index, self_attn in config.layer_plan:
        if expert_index is None:
            continue
        if self_attn:
            per_step += decoder_block(horizon, prefix + 1 + horizon, ex)
        else:   # queries only against the projected prefix + state
            per_step += (linear(horizon, ex.width, inner) + 2 * linear(horizon, prefix + 1, inner)
                         + linear(horizon, inner, ex.width) + 3 * linear(horizon, ex.width, ex.mlp_dim))
    return {'prefix': prefix_total, 'denoise': once + num_steps * per_step}
