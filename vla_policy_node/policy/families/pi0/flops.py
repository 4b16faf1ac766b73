"""FLOPs of one pi0 / pi0.5 inference per stage, from the config alone (policy/flops.py says what is counted).

    prefix  = SigLIP over every camera slot + projector + language model over P tokens
              (the last language layer only projects K/V: nothing reads its output)
    denoise = once per chunk: pi0's state token through the expert (its K/V do not depend on the
              step; the last layer only projects K/V) and the time terms of every step
              + num_steps x (action embedding + expert over H action tokens against all
              P (+1) + H keys + output projection)
"""
from __future__ import annotations

from typing import Dict

from ...flops import decoder_block, linear, qkv, siglip
from .config import PolicyConfig


def vision_flops(config: PolicyConfig) -> int:
    """SigLIP over every camera slot (masked ones are computed too) plus the projector."""
    vision = config.vision
    tokens = config.tokens_per_image
    per_image = siglip(vision, tokens) + linear(tokens, vision.width, config.language.width)
    return len(config.all_camera_names) * per_image


def prefix_flops(config: PolicyConfig) -> int:
    lm = config.language
    prefix = config.prefix_len
    return vision_flops(config) + (lm.depth - 1) * decoder_block(prefix, prefix, lm) + qkv(prefix, lm)


def denoise_flops(config: PolicyConfig, num_steps: int) -> int:
    ex = config.expert
    horizon, width, prefix = config.chunk_size, ex.width, config.prefix_len
    state = int(config.traits.state_token)
    per_step = ex.depth * decoder_block(horizon, prefix + state + horizon, ex)
    per_step += linear(horizon, config.max_action_dim, width) + linear(horizon, width, config.max_action_dim)
    if config.traits.state_token:
        per_step += 2 * linear(horizon, width, width)      # action half of the action-time MLP, and its output
        once = (ex.depth - 1) * decoder_block(1, prefix + 1, ex) + qkv(1, ex)   # the state token
        once += linear(1, config.max_state_dim, width) + linear(num_steps + 1, width, width)   # time halves
    else:
        per_step += (2 * ex.depth + 1) * linear(1, width, 3 * width)   # one adaptive-norm dense layer per norm
        once = 2 * linear(num_steps + 1, width, width)                  # the time MLP, every step's condition
    return once + num_steps * per_step


def stage_flops(config: PolicyConfig, num_steps: int) -> Dict[str, int]:
    return {'prefix': prefix_flops(config), 'denoise': denoise_flops(config, num_steps)}
