"""GR00T N1.7's named configurations: ``groot_tiny`` (tests, random-weight checkpoints) and ``groot`` (the real shape:
Cosmos-Reason2-2B cut at layer 16 and the 32-layer AlternateVLDiT, about 3.1B parameters, two 256 x 256 cameras)."""
from __future__ import annotations

from typing import Any

from ...config_fields import ConfigError
from .config import GrootConfig, GrootHead
from .dit import DiTSize, SelfAttentionSize
from .images import ImageGeometry
from .qwen3vl import KNOWN_BACKBONES, COSMOS_REASON2_2B, Qwen3VLBackbone, QwenTextSize, QwenVisionSize

# The tiny backbone keeps Qwen's vocabulary size: its special tokens sit at Qwen's ids (151643-151656).
TINY_BACKBONE = Qwen3VLBackbone(
    vision=QwenVisionSize(width=32, depth=3, num_heads=4, mlp_dim=64, patch_size=16, temporal_patch_size=2,
                          merge_size=2, out_width=32, num_position_embeddings=36, deepstack_indexes=(0, 2)),
    text=QwenTextSize(width=32, depth=4, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=64, vocab_size=151936,
                      rope_theta=5_000_000.0, mrope_section=(4, 2, 2)))
TINY_HEAD = GrootHead(model_name='vla_policy_node/tiny-qwen3-vl', select_layer=3, backbone_embedding_dim=32,
                      hidden_size=24, input_embedding_dim=16, action_horizon=10, max_state_dim=12, max_action_dim=12,
                      max_num_embodiments=12, max_seq_len=16,
                      dit=DiTSize(num_layers=4, num_heads=2, head_dim=8, output_dim=24),
                      vl_self_attention=SelfAttentionSize(num_layers=2, num_heads=4, head_dim=8))
# 64 x 64 frames: 4 x 4 patches of 16, 4 LLM tokens per camera. min_pixels (1024) keeps smart_resize a no-op.
TINY_GEOMETRY = ImageGeometry(target_size=(64, 64), crop_size=(58, 58), min_pixels=1024, max_pixels=16777216)


def groot_preset(name: str, **overrides: Any) -> GrootConfig:
    if name == 'groot_tiny':
        defaults = dict(backbone=TINY_BACKBONE, head=TINY_HEAD, geometry=TINY_GEOMETRY,
                        # two of the sample bags' cameras: GR00T has no masked slots, so a tiny checkpoint
                        # names only cameras every test observation sends
                        camera_names=('base_0_rgb', 'left_wrist_0_rgb'),
                        image_resolution=TINY_GEOMETRY.model_size, chunk_size=10, n_action_steps=10, max_state_dim=12,
                        max_action_dim=12, num_inference_steps=4, tokenizer_name='vla_policy_node/tiny-qwen3-vl')
        return GrootConfig(**dict(defaults, **overrides))
    if name == 'groot':
        geometry = ImageGeometry(target_size=(256, 256), crop_size=(230, 230), min_pixels=65536, max_pixels=16777216)
        defaults = dict(backbone=KNOWN_BACKBONES[COSMOS_REASON2_2B], head=GrootHead(), geometry=geometry,
                        camera_names=('front', 'wrist'), image_resolution=geometry.model_size)
        return GrootConfig(**dict(defaults, **overrides))
    raise ConfigError(f'unknown GR00T preset {name!r}; known: groot_tiny, groot')
