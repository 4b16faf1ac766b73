"""SmolVLA configuration: lerobot's SmolVLAConfig, every field classified, plus the backbone's sizes.

Fields of ``SmolVLAConfig`` (src/lerobot/policies/smolvla/configuration_smolvla.py) and ``PreTrainedConfig``
at huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b; test/test_smolvla_family.py holds the list
and fails when one is missing here. The backbone comes from ``vlm_config.json`` in the folder or the table of
known backbones keyed by ``vlm_model_name`` (smolvlm.py in this folder).

Layers: VLM layer i is a self-attention layer when ``attention_mode`` has no "cross" or
``self_attn_every_n_layers`` > 0 divides i; the others are cross-attention layers. Expert layer e sits at VLM
layer e * (num_vlm_layers / num_expert_layers); the VLM layers in between have no expert layer (lerobot's
get_model_layers). Plans on which lerobot itself fails (an expert layer of the other kind, or a self layer
without one) are refused at load.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from ...config_fields import (DEFAULT_ONLY, IMPLEMENTED, METADATA, PRETRAINED_CONFIG_FIELDS, TRAINING,
                              TRAINING_PRESET_FIELDS, ConfigError, ConfigField, check_fields, feature_documents,
                              features, normalization_mapping, table)
from ...family import EMPTY_CAMERA_PREFIX, PolicyLevelConfig
from ...siglip import VisionSize
from .smolvlm import KNOWN_BACKBONES, LlamaSize, SmolVLMBackbone, expert_size

SMOLVLA_TYPE = 'smolvla'
DEFAULT_BACKBONE = 'HuggingFaceTB/SmolVLM2-500M-Video-Instruct'
PAD_LANGUAGE_TO = ('longest', 'max_length')

SMOLVLA_CONFIG_FIELDS: Dict[str, ConfigField] = table((
    ConfigField('type', IMPLEMENTED, 'smolvla'),
    *PRETRAINED_CONFIG_FIELDS,
    ConfigField('chunk_size', IMPLEMENTED, 'actions per chunk'),
    ConfigField('n_action_steps', IMPLEMENTED, "checked <= chunk_size; the node's execute_steps publishes"),
    ConfigField('normalization_mapping', IMPLEMENTED, 'VISUAL IDENTITY; STATE and ACTION any lerobot mode'),
    ConfigField('max_state_dim', IMPLEMENTED, 'state_proj input width (the state is zero-padded to it)'),
    ConfigField('max_action_dim', IMPLEMENTED, 'noise and action projection width'),
    ConfigField('resize_imgs_with_padding', IMPLEMENTED, 'model image size (width, height), padding left and top'),
    ConfigField('empty_cameras', IMPLEMENTED, 'masked placeholder cameras'),
    ConfigField('adapt_to_pi_aloha', DEFAULT_ONLY, 'the Aloha joint/gripper conversion is not implemented',
                accepted=(False,)),
    ConfigField('use_delta_joint_actions_aloha', DEFAULT_ONLY, 'not implemented (lerobot refuses it too)',
                accepted=(False,)),
    ConfigField('tokenizer_max_length', IMPLEMENTED, 'prompt length (truncation)'),
    ConfigField('num_steps', IMPLEMENTED, "Euler steps (the node's num_steps parameter overrides)"),
    ConfigField('use_cache', DEFAULT_ONLY, 'without the K/V cache lerobot lets the actions see only themselves; '
                'the cached prefix is what the model was trained with', accepted=(True,)),
    ConfigField('freeze_vision_encoder', TRAINING, 'fine-tuning'),
    ConfigField('train_expert_only', TRAINING, 'fine-tuning'),
    ConfigField('train_state_proj', TRAINING, 'fine-tuning'),
    *TRAINING_PRESET_FIELDS,
    ConfigField('vlm_model_name', IMPLEMENTED, 'backbone sizes from the table of known backbones '
                '(or vlm_config.json in the folder)'),
    ConfigField('load_vlm_weights', METADATA, 'training initialisation; the weights are model.safetensors'),
    ConfigField('add_image_special_tokens', DEFAULT_ONLY, 'image start/end tokens around each camera are not '
                'implemented', accepted=(False,)),
    ConfigField('attention_mode', IMPLEMENTED, 'cross or self attention expert layers'),
    ConfigField('prefix_length', METADATA, 'pads the prefix after the state token with masked tokens nothing '
                'attends to: no effect on the actions'),
    ConfigField('pad_language_to', IMPLEMENTED, 'longest or max_length; the runtime pads to '
                'tokenizer_max_length with masked tokens either way (same actions)'),
    ConfigField('num_expert_layers', IMPLEMENTED, 'expert depth (<= 0: as many as VLM layers)'),
    ConfigField('num_vlm_layers', IMPLEMENTED, 'the first num_vlm_layers text layers'),
    ConfigField('self_attn_every_n_layers', IMPLEMENTED, 'self-attention layer period'),
    ConfigField('expert_width_multiplier', IMPLEMENTED, 'expert width = int(text width x multiplier)'),
    ConfigField('min_period', IMPLEMENTED, 'time embedding'),
    ConfigField('max_period', IMPLEMENTED, 'time embedding'),
    ConfigField('rtc_config', METADATA, "lerobot's rollout-time RTC settings; the node's chunking and rtc_* "
                'parameters decide'),
))


@dataclass(frozen=True, kw_only=True)
class SmolVLAConfig(PolicyLevelConfig):
    """Everything needed to build a SmolVLA model and its pre/post-processing; the policy-level fields are
    PolicyLevelConfig's, with SmolVLA's defaults here (lerobot's SmolVLA has no trained RTC and no relative
    actions: those stay at their off values)."""

    backbone: SmolVLMBackbone
    vlm_model_name: str = DEFAULT_BACKBONE
    policy_type: str = SMOLVLA_TYPE
    camera_names: Tuple[str, ...] = ('camera1', 'camera2')
    image_resolution: Tuple[int, int] = (512, 512)
    state_dim: int = 6
    action_dim: int = 6
    pad_language_to: str = 'longest'
    num_vlm_layers: int = 16
    num_expert_layers: int = -1
    self_attn_every_n_layers: int = 2
    attention_mode: str = 'cross_attn'
    expert_width_multiplier: float = 0.75
    min_period: float = 4e-3
    max_period: float = 4.0

    def __post_init__(self) -> None:
        problem = self.policy_level_problems() or self._architecture_problem()
        if problem:
            raise ConfigError(problem)

    def _architecture_problem(self) -> Optional[str]:
        text, vision = self.backbone.text, self.backbone.vision
        if not 0 < self.num_vlm_layers <= text.depth:
            return f'num_vlm_layers {self.num_vlm_layers} must be in [1, {text.depth}] (the backbone\'s text layers)'
        if self.num_vlm_layers % self.expert_depth:
            return (f'num_vlm_layers {self.num_vlm_layers} is not a multiple of num_expert_layers '
                    f'{self.expert_depth}')
        if self.pad_language_to not in PAD_LANGUAGE_TO:
            return f'pad_language_to must be one of {PAD_LANGUAGE_TO}, got {self.pad_language_to!r}'
        if text.num_heads % text.num_kv_heads:
            return 'num_attention_heads must be a multiple of num_key_value_heads'
        height, width = self.image_resolution
        if (height, width) != (self.backbone.vision_image_size,) * 2:
            # The learned position table covers image_size / patch patches per side; other sizes would need
            # SmolVLM's bucketed position ids, which this runtime does not implement.
            return (f'resize_imgs_with_padding {[width, height]} differs from the vision image_size '
                    f'{self.backbone.vision_image_size}; only the backbone\'s own image size is implemented')
        side = height // vision.patch_size
        if height % vision.patch_size or side % self.backbone.scale_factor:
            return f'image size {height} does not divide into patches {vision.patch_size} x scale ' \
                   f'{self.backbone.scale_factor}'
        if self.expert.width % 2:
            return f'the expert width {self.expert.width} must be even (sin-cos time embedding)'
        for i, (expert_index, self_attn) in enumerate(self.layer_plan):
            if expert_index is None:
                if self_attn:
                    return f'VLM layer {i} is a self-attention layer without an expert layer (lerobot fails there)'
                continue
            if self_attn == self.expert_cross_layers[expert_index]:
                return (f'VLM layer {i} is a {"self" if self_attn else "cross"}-attention layer but its expert layer '
                        f'{expert_index} was built for the other kind (lerobot fails there)')
        return None

    # ---- derived sizes -----------------------------------------------------------------
    @property
    def text(self) -> LlamaSize:
        return self.backbone.text

    @property
    def num_prefix_layers(self) -> int:
        """Layers of the stack the prefix runs through (the VLM's first num_vlm_layers)."""
        return self.num_vlm_layers

    @property
    def vocab_size(self) -> int:
        return self.backbone.vocab_size

    @property
    def expert_depth(self) -> int:
        return self.num_expert_layers if self.num_expert_layers > 0 else self.num_vlm_layers

    @property
    def expert(self) -> LlamaSize:
        return expert_size(self.backbone.text, self.expert_width_multiplier, self.expert_depth)

    @property
    def cross_mode(self) -> bool:
        return 'cross' in self.attention_mode

    def is_self_attn_layer(self, index: int) -> bool:
        every = self.self_attn_every_n_layers
        return not self.cross_mode or (every > 0 and index % every == 0)

    @property
    def expert_cross_layers(self) -> Tuple[bool, ...]:
        """Per expert layer: built with K*D-wide k/v inputs (lerobot's __init__ decides on the expert index)."""
        return tuple(self.cross_mode and not self.is_self_attn_layer(e) for e in range(self.expert_depth))

    @property
    def layer_plan(self) -> Tuple[Tuple[Optional[int], bool], ...]:
        """Per VLM layer: (expert layer index or None, self-attention?)."""
        step = self.num_vlm_layers // self.expert_depth
        return tuple((None if (i % step) else i // step, self.is_self_attn_layer(i))
                     for i in range(self.num_vlm_layers))

    @property
    def cross_layer_count(self) -> int:
        return sum(1 for expert_index, self_attn in self.layer_plan if expert_index is not None and not self_attn)

    @property
    def tokens_per_image(self) -> int:
        side = self.image_resolution[0] // self.backbone.vision.patch_size
        return (side // self.backbone.scale_factor) ** 2

    @property
    def prefix_len(self) -> int:
        """The cached prefix: image tokens of every slot + language tokens (the state token is per chunk)."""
        return len(self.all_camera_names) * self.tokens_per_image + self.tokenizer_max_length

    def kv_entry_bytes(self, dtype_bytes: int) -> int:
        """K/V of every VLM layer over the prefix (compute dtype) + the cross layers' projected K/V (the
        expert's heads; fp32 always, as their fp32 k/v_proj give them)."""
        text, expert = self.text, self.expert
        vlm = 2 * self.num_vlm_layers * text.num_kv_heads * text.head_dim
        cross = 2 * self.cross_layer_count * expert.num_kv_heads * expert.head_dim
        return (vlm * dtype_bytes + cross * 4) * self.prefix_len

    # ---- lerobot config.json ----------------------------------------------------------------
    def to_lerobot_dict(self) -> Dict[str, Any]:
        height, width = self.image_resolution
        document: Dict[str, Any] = {
            'type': self.policy_type, 'n_obs_steps': 1,
            **feature_documents(self.camera_names, self.image_resolution, self.state_dim, self.action_dim),
            'device': 'cpu', 'use_amp': False, 'use_peft': False, 'push_to_hub': False, 'repo_id': None,
            'private': None, 'tags': None, 'license': None, 'pretrained_path': None,
            'chunk_size': self.chunk_size, 'n_action_steps': self.n_action_steps,
            'normalization_mapping': dict(self.normalization_mapping),
            'max_state_dim': self.max_state_dim, 'max_action_dim': self.max_action_dim,
            'resize_imgs_with_padding': [width, height], 'empty_cameras': self.empty_cameras,
            'adapt_to_pi_aloha': False, 'use_delta_joint_actions_aloha': False,
            'tokenizer_max_length': self.tokenizer_max_length, 'num_steps': self.num_inference_steps,
            'use_cache': True, 'freeze_vision_encoder': True, 'train_expert_only': True, 'train_state_proj': True,
            'vlm_model_name': self.vlm_model_name, 'load_vlm_weights': True, 'add_image_special_tokens': False,
            'attention_mode': self.attention_mode, 'prefix_length': -1, 'pad_language_to': self.pad_language_to,
            'num_expert_layers': self.num_expert_layers, 'num_vlm_layers': self.num_vlm_layers,
            'self_attn_every_n_layers': self.self_attn_every_n_layers,
            'expert_width_multiplier': self.expert_width_multiplier,
            'min_period': self.min_period, 'max_period': self.max_period, 'rtc_config': None,
            'compile_model': False, 'compile_mode': 'max-autotune',
        }
        return document

    @classmethod
    def from_lerobot_dict(cls, raw: Mapping[str, Any], vlm_config: Optional[Mapping[str, Any]] = None,
                          vlm_config_source: str = 'vlm_config.json') -> 'SmolVLAConfig':
        """config.json (+ the folder's vlm_config.json, if any) -> config; unknown or unimplemented fields refused."""
        from .smolvlm import resolve_backbone
        if raw.get('type') != SMOLVLA_TYPE:
            raise ConfigError(f'config.json "type" must be {SMOLVLA_TYPE!r}, got {raw.get("type")!r}')
        check_fields(raw, SMOLVLA_CONFIG_FIELDS, SMOLVLA_TYPE, 'SmolVLAConfig')
        name = str(raw.get('vlm_model_name', DEFAULT_BACKBONE))
        backbone = resolve_backbone(name, vlm_config, vlm_config_source)
        cameras, state_dim, action_dim = features(raw, EMPTY_CAMERA_PREFIX)
        size = raw.get('resize_imgs_with_padding', [512, 512])
        if not (isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(v, int) for v in size)):
            raise ConfigError(f'config.json resize_imgs_with_padding = {json.dumps(size)} is not implemented '
                              '(a [width, height] pair is needed: the model cannot take unresized frames)')
        for name_, ok in (('attention_mode', isinstance(raw.get('attention_mode', ''), str)),
                          ('expert_width_multiplier', isinstance(raw.get('expert_width_multiplier', 0.75),
                                                                 (int, float)))):
            if not ok:
                raise ConfigError(f'config.json {name_} is malformed: {json.dumps(raw.get(name_))}')
        try:
            return cls(
                backbone=backbone, vlm_model_name=name, camera_names=tuple(cameras),
                empty_cameras=int(raw.get('empty_cameras', 0)),
                image_resolution=(int(size[1]), int(size[0])),            # lerobot stores (width, height)
                chunk_size=int(raw.get('chunk_size', 50)),
                n_action_steps=int(raw.get('n_action_steps', raw.get('chunk_size', 50))),
                max_state_dim=int(raw.get('max_state_dim', 32)), max_action_dim=int(raw.get('max_action_dim', 32)),
                state_dim=state_dim, action_dim=action_dim,
                num_inference_steps=int(raw.get('num_steps', 10)),
                tokenizer_max_length=int(raw.get('tokenizer_max_length', 48)),
                pad_language_to=str(raw.get('pad_language_to', 'longest')),
                normalization_mapping=normalization_mapping(raw.get('normalization_mapping') or {
                    'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'}),
                num_vlm_layers=int(raw.get('num_vlm_layers', 16)),
                num_expert_layers=int(raw.get('num_expert_layers', -1)),
                self_attn_every_n_layers=int(raw.get('self_attn_every_n_layers', 2)),
                attention_mode=str(raw.get('attention_mode', 'cross_attn')),
                expert_width_multiplier=float(raw.get('expert_width_multiplier', 0.75)),
                min_period=float(raw.get('min_period', 4e-3)), max_period=float(raw.get('max_period', 4.0)),
            )
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f'config.json is malformed: {exc!r}') from exc


def smolvla_preset(name: str, **overrides: Any) -> SmolVLAConfig:
    """``tiny`` (tests, the demo) or ``smolvla`` (the real shape: SmolVLM2-500M cut to 16 layers, 2 cameras)."""
    if name == 'smolvla':
        return SmolVLAConfig(**dict(dict(backbone=KNOWN_BACKBONES[DEFAULT_BACKBONE]), **overrides))
    if name == 'tiny':
        backbone = SmolVLMBackbone(
            vision=VisionSize(width=32, depth=2, mlp_dim=64, num_heads=4, patch_size=8), vision_image_size=32,
            vision_eps=1e-6, scale_factor=2,
            text=LlamaSize(width=64, depth=6, mlp_dim=128, num_heads=4, num_kv_heads=2, head_dim=16,
                           rms_norm_eps=1e-5),
            vocab_size=512)
        # The cameras of pi0's tiny default and the sample bags; chunk 10 as theirs.
        defaults = dict(backbone=backbone, vlm_model_name='vla_policy_node/tiny-smolvlm',
                        camera_names=('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb'), empty_cameras=0,
                        image_resolution=(32, 32), chunk_size=10, n_action_steps=10, num_vlm_layers=4)
        return SmolVLAConfig(**dict(defaults, **overrides))
    raise ConfigError(f'unknown smolvla preset {name!r}; known: tiny, smolvla')
