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
"""
from __future__ import annotations

from typing import Dict

from vla_policy_node.policy.config import GemmaSize, PolicyConfig


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


def vision_flops(config: PolicyConfig) -> int:
    """SigLIP over every camera slot (masked ones are computed too) plus the projector."""
    vision = config.vision
    tokens = config.tokens_per_image
    per_image = _linear(tokens, 3 * vision.patch_size ** 2, vision.width)
    per_layer = (4 * _linear(tokens, vision.width, vision.width)
                 + 2 * _linear(tokens, tokens, vision.width)
                 + 2 * _linear(tokens, vision.width, vision.mlp_dim))
    per_image += vision.depth * per_layer + _linear(tokens, vision.width, config.language.width)
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


def stage_flops(config: PolicyConfig, num_steps: int) -> Dict[str, int]:
    return {'prefix': prefix_flops(config), 'denoise': denoise_flops(config, num_steps)}
