"""FLOPs of GR00T N1.7's stages from the config alone (bench/flops.py): 2 per multiply-add of every matrix product
this implementation runs (attention scores and mixes included), for a prompt of the image tokens and
``TYPICAL_TEXT_TOKENS`` of template and task (the real length depends on the task): the prefix at the prompt's own
length, the denoise's text cross-attention over its bucket (the text K/V padded to the first of TEXT_BUCKETS that
holds it). The DiT's time terms depend on the step count alone and are made once, not per chunk."""
from __future__ import annotations

from typing import Dict

from .config import TEXT_BUCKETS, GrootConfig

TYPICAL_TEXT_TOKENS = 32


def _vit(config: GrootConfig) -> int:
    vision = config.backbone.vision
    grid_h, grid_w = config.geometry.grid
    seq, width = grid_h * grid_w, vision.width
    merged, tokens = width * vision.merge_size ** 2, seq // vision.merge_size ** 2
    block = seq * (3 * width * width + width * width + 2 * width * vision.mlp_dim) + 2 * seq * seq * width
    merger = tokens * (merged * merged + merged * vision.out_width)
    per_image = seq * vision.patch_dim * width + vision.depth * block + (1 + len(vision.deepstack_indexes)) * merger
    return 2 * len(config.camera_names) * per_image


def _text(config: GrootConfig, tokens: int) -> int:
    text = config.backbone.text
    projections = text.width * text.head_dim * (2 * text.num_heads + 2 * text.num_kv_heads)
    attention = 2 * tokens * tokens * text.num_heads * text.head_dim
    layer = tokens * (projections + 3 * text.width * text.mlp_dim) + attention
    return 2 * config.head.select_layer * layer


def _head_prefix(config: GrootConfig, tokens: int) -> int:
    head = config.head
    width = head.backbone_embedding_dim
    attention = head.vl_self_attention
    per_layer = tokens * (4 * width * width + 8 * width * width) + 2 * tokens * tokens * attention.width
    kv = 0
    for index in config.cross_blocks:
        subset = tokens - config.image_tokens if head.dit.attends_text(index) else config.image_tokens
        kv += 2 * subset * width * head.dit.width
    return 2 * (attention.num_layers * per_layer + kv)


def _step(config: GrootConfig, tokens: int) -> int:
    head = config.head
    dit, horizon, width = head.dit, head.action_horizon, head.dit.width
    seq = 1 + horizon
    encoder = horizon * (head.max_action_dim * width + 2 * width * width + width * width)
    blocks = 0
    for index in range(dit.num_layers):
        if index % 2:
            blocks += seq * 4 * width * width + 2 * seq * seq * width
        else:
            subset = tokens - config.image_tokens if dit.attends_text(index) else config.image_tokens
            blocks += seq * 2 * width * width + 2 * seq * subset * width
        blocks += seq * 8 * width * width
    decoder = head.hidden_size * head.hidden_size + head.hidden_size * head.max_action_dim
    out = seq * width * dit.output_dim + seq * decoder
    return 2 * (encoder + blocks + out)


def stage_flops(config: GrootConfig, num_steps: int) -> Dict[str, int]:
    tokens = config.image_tokens + TYPICAL_TEXT_TOKENS
    bucket = next(text for text in TEXT_BUCKETS if text >= TYPICAL_TEXT_TOKENS)
    head = config.head
    state = head.max_state_dim * head.hidden_size + head.hidden_size * head.input_embedding_dim
    return {'prefix': _vit(config) + _text(config, tokens) + _head_prefix(config, tokens),
            'denoise': 2 * state + num_steps * _step(config, config.image_tokens + bucket)}
