"""FLOP count of one inference, per stage, from the config alone (so a GFLOP/s figure can be checked by hand).

Counted: every matrix product the implementation runs, 2 FLOPs per multiply-add:
projections, MLPs, both attention products (QK^T and PV over all keys, padded
ones included, as SDPA computes them), the patch embedding, the projector and
the small suffix projections. Not counted: norms, RoPE, softmax, GELU and
other elementwise work (well under 1% of the total at pi0 sizes).

    prefix  = SigLIP over every camera slot + projector + language model over P tokens
              (the last language layer only projects K/V: nothing reads its output)
    denoise = once per chunk: pi0's state token through the expert (its K/V do not depend on the
              step; the last layer only projects K/V) and the time terms of every step
              + num_steps x (action embedding + expert over H action tokens against all
              P (+1) + H keys + output projection)

SmolVLA (``smolvla_stage_flops``): prefix = SigLIP + connector + the VLM layers over P image and
language tokens + the cross layers' K/V projections of the prefix; denoise = once per chunk the
state token through the VLM layers (against P + 1 keys) and its cross K/V projections, then per
step the expert's self layers (P + 1 + H keys) and cross layers (P + 1 keys, queries only).
"""
from __future__ import annotations

from typing import Dict

from vla_policy_node.policy.families.pi0.config import GemmaSize, PolicyConfig, VisionSize
from vla_policy_node.policy.families.smolvla.config import SmolVLAConfig


def _linear(rows: int, fan_in: int, fan_out: int) -> int:
    return 2 * rows * fan_in * fan_out


def _qkv(rows: int, size: GemmaSize) -> int:
    return _linear(rows, size.width, (size.num_heads + 2 * size.num_kv_heads) * size.head_dim)


def _gemma_block(rows: int, keys: int, size: GemmaSize) -> int:
    """One decoder block on ``rows`` queries attending to ``keys`` keys."""
    inner = size.num_heads * size.head_dim
    return (_qkv(rows, size)
            + 2 * _linear(rows, keys, inner)              # QK^T and PV, all heads
            + _linear(rows, inner, size.width)            # o_proj
            + 3 * _linear(rows, size.width, size.mlp_dim))  # gate, up, down


def _siglip(vision: VisionSize, patches: int) -> int:
    """One image through SigLIP: patch embedding and the encoder layers."""
    per_layer = (4 * _linear(patches, vision.width, vision.width)
                 + 2 * _linear(patches, patches, vision.width)
                 + 2 * _linear(patches, vision.width, vision.mlp_dim))
    return _linear(patches, 3 * vision.patch_size ** 2, vision.width) + vision.depth * per_layer


def vision_flops(config: PolicyConfig) -> int:
    """SigLIP over every camera slot (masked ones are computed too) plus the projector."""
    vision = config.vision
    tokens = config.tokens_per_image
    per_image = _siglip(vision, tokens) + _linear(tokens, vision.width, config.language.width)
    return len(config.all_camera_names) * per_image


def prefix_flops(config: PolicyConfig) -> int:
    lm = config.language
    prefix = config.prefix_len
    return vision_flops(config) + (lm.depth - 1) * _gemma_block(prefix, prefix, lm) + _qkv(prefix, lm)


def denoise_flops(config: PolicyConfig, num_steps: int) -> int:
    ex = config.expert
    horizon, width, prefix = config.chunk_size, ex.width, config.prefix_len
    state = int(config.traits.state_token)
    per_step = ex.depth * _gemma_block(horizon, prefix + state + horizon, ex)
    per_step += _linear(horizon, config.max_action_dim, width) + _linear(horizon, width, config.max_action_dim)
    if config.traits.state_token:
        per_step += 2 * _linear(horizon, width, width)      # action half of the action-time MLP, and its output
        once = (ex.depth - 1) * _gemma_block(1, prefix + 1, ex) + _qkv(1, ex)   # the state token
        once += _linear(1, config.max_state_dim, width) + _linear(num_steps + 1, width, width)   # time halves
    else:
        per_step += (2 * ex.depth + 1) * _linear(1, width, 3 * width)   # one adaptive-norm dense layer per norm
        once = 2 * _linear(num_steps + 1, width, width)                  # the time MLP, every step's condition
    return once + num_steps * per_step


def _pi_stage_flops(config: PolicyConfig, num_steps: int) -> Dict[str, int]:
    return {'prefix': prefix_flops(config), 'denoise': denoise_flops(config, num_steps)}


def smolvla_stage_flops(config: SmolVLAConfig, num_steps: int) -> Dict[str, int]:
    backbone, text, ex = config.backbone, config.text, config.expert
    side = config.image_resolution[0] // backbone.vision.patch_size
    tokens = config.tokens_per_image
    vision = _siglip(backbone.vision, side * side) + _linear(tokens, backbone.vision.width * backbone.scale_factor ** 2,
                                                             text.width)
    prefix, layers, horizon = config.prefix_len, config.num_vlm_layers, config.chunk_size
    kv_width = text.num_kv_heads * text.head_dim
    cross_kv = 2 * config.cross_layer_count * _linear(prefix + 1, kv_width, ex.num_kv_heads * ex.head_dim)
    prefix_total = (len(config.all_camera_names) * vision + (layers - 1) * _gemma_block(prefix, prefix, text)
                    + _qkv(prefix, text) + cross_kv * prefix // (prefix + 1))
    once = ((layers - 1) * _gemma_block(1, prefix + 1, text) + _qkv(1, text)
            + _linear(1, config.max_state_dim, text.width))
    once += cross_kv // (prefix + 1) + _linear(num_steps + 1, ex.width, ex.width)   # state cross K/V, time halves
    inner = ex.num_heads * ex.head_dim
    per_step = (_linear(horizon, config.max_action_dim, ex.width) + 2 * _linear(horizon, ex.width, ex.width)
                + _linear(horizon, ex.width, config.max_action_dim))
    for expert_index, self_attn in config.layer_plan:
        if expert_index is None:
            continue
        if self_attn:
            per_step += _gemma_block(horizon, prefix + 1 + horizon, ex)
        else:   # queries only against the projected prefix + state
            per_step += (_linear(horizon, ex.width, inner) + 2 * _linear(horizon, prefix + 1, inner)
                         + _linear(horizon, inner, ex.width) + 3 * _linear(horizon, ex.width, ex.mlp_dim))
    return {'prefix': prefix_total, 'denoise': once + num_steps * per_step}


# FLOP counters by config class (a new family's config adds its counter here).
_COUNTERS = {PolicyConfig: _pi_stage_flops, SmolVLAConfig: smolvla_stage_flops}


def stage_flops(config, num_steps: int) -> Dict[str, int]:
    """{'prefix': FLOPs of a miss's prefix, 'denoise': FLOPs of one chunk's denoise} for any family's config."""
    return _COUNTERS[type(config)](config, num_steps)
