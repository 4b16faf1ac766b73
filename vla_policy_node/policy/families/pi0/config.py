"""PaliGemma-family configuration (pi0 and pi0.5): sizes of the three towers plus the policy-level settings.

A config comes from a lerobot ``config.json`` (``type`` pi0 or pi05, named
variants) or from a named preset. Named variants follow openpi's ``gemma.py``
and PaliGemma's SigLIP So400m/14. A checkpoint may carry a ``model_sizes``
block (this project's extension, ignored by lerobot's fields) that overrides
the sizes of any tower; the tiny preset and the bench configs use it.

What differs between pi0 and pi0.5 is data, not a test of the type:
``PALIGEMMA_TRAITS`` gives each type's ``PaliGemmaTraits`` (state token or
state in the prompt, adaptive expert norms, defaults). One config class
describes both types, as openpi's ``Pi0Config`` does with its ``pi05`` flag.

Nothing in a config.json is ignored silently: ``LEROBOT_CONFIG_FIELDS`` says
for every field of lerobot's ``PI0Config`` / ``PI05Config`` whether we
implement it, accept it because only training reads it, accept it as
metadata, or load it only at the values we reproduce (policy/config_fields.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from ...config_fields import (ACTION_FEATURE, DEFAULT_ONLY, IMAGE_FEATURE_PREFIX, IMPLEMENTED, METADATA,  # noqa: F401
                              PRETRAINED_CONFIG_FIELDS, STATE_FEATURE, TRAINING, TRAINING_PRESET_FIELDS, ConfigError,
                              ConfigField, bool_field, check_fields, feature_documents, features, names_field,
                              normalization_mapping, table)
from ...family import EMPTY_CAMERA_PREFIX, PolicyLevelConfig  # noqa: F401
from ...gemma import GemmaSize
from ...siglip import VisionSize


@dataclass(frozen=True)
class PaliGemmaTraits:
    """What a PaliGemma type does differently (looked up by type in PALIGEMMA_TRAITS, never tested by name)."""

    state_token: bool               # pi0: the state is one suffix token (state_proj); pi0.5: in the prompt
    adaptive_expert: bool           # pi0.5: time enters the expert through adaptive RMSNorm (time_mlp_*)
    tokenizer_max_length: int       # lerobot's default prompt length
    normalization_mapping: Mapping[str, str]
    tiny_tokenizer_max_length: int  # the tiny preset's prompt length


PALIGEMMA_TRAITS: Dict[str, PaliGemmaTraits] = {
    'pi0': PaliGemmaTraits(state_token=True, adaptive_expert=False, tokenizer_max_length=48,
                           normalization_mapping={'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'},
                           tiny_tokenizer_max_length=16),
    'pi05': PaliGemmaTraits(state_token=False, adaptive_expert=True, tokenizer_max_length=200,
                            normalization_mapping={'VISUAL': 'IDENTITY', 'STATE': 'QUANTILES', 'ACTION': 'QUANTILES'},
                            tiny_tokenizer_max_length=200),
}


def paligemma_traits(policy_type: Any) -> PaliGemmaTraits:
    """The traits of ``policy_type``; ConfigError naming it and the types this config class describes."""
    traits = PALIGEMMA_TRAITS.get(policy_type) if isinstance(policy_type, str) else None
    if traits is None:
        raise ConfigError(f'config.json "type" must be one of {PALIGEMMA_TYPES}, got {policy_type!r}')
    return traits


GEMMA_VARIANTS: Dict[str, GemmaSize] = {
    'gemma_2b': GemmaSize(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
    'gemma_300m': GemmaSize(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
    'dummy': GemmaSize(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16),
}
SIGLIP_SO400M_14 = VisionSize(width=1152, depth=27, mlp_dim=4304, num_heads=16, patch_size=14)
PALIGEMMA_VOCAB_SIZE = 257152


@dataclass(frozen=True, kw_only=True)
class PolicyConfig(PolicyLevelConfig):
    """Everything needed to build a pi0 / pi0.5 model and its pre/post-processing (``policy_type`` one of
    PALIGEMMA_TYPES); the policy-level fields are PolicyLevelConfig's, with pi0's defaults here."""

    vision: VisionSize
    language: GemmaSize
    expert: GemmaSize
    vocab_size: int = PALIGEMMA_VOCAB_SIZE
    camera_names: Tuple[str, ...] = ('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb')
    image_resolution: Tuple[int, int] = (224, 224)
    state_dim: int = 32
    action_dim: int = 32
    relative_exclude_joints: Tuple[str, ...] = ('gripper',)
    min_period: float = 4e-3
    max_period: float = 4.0
    rms_norm_eps: float = 1e-6
    layer_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    dtype: str = 'float32'
    traits: PaliGemmaTraits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, 'traits', paligemma_traits(self.policy_type))
        lm, ex = self.language, self.expert
        # One joint attention per layer: both streams must agree on its shape.
        for name in ('depth', 'num_heads', 'num_kv_heads', 'head_dim'):
            if getattr(lm, name) != getattr(ex, name):
                raise ConfigError(f'language and expert must share {name}: '
                                  f'{getattr(lm, name)} != {getattr(ex, name)}')
        if lm.num_heads % lm.num_kv_heads:
            raise ConfigError('num_heads must be a multiple of num_kv_heads')
        height, width = self.image_resolution
        if height % self.vision.patch_size or width % self.vision.patch_size:
            raise ConfigError(f'image_resolution {self.image_resolution} is not a multiple of '
                              f'patch {self.vision.patch_size}')
        problem = self.policy_level_problems()
        if problem:
            raise ConfigError(problem)

    # ---- derived sizes -------------------------------------------------

    @property
    def tokens_per_image(self) -> int:
        height, width = self.image_resolution
        return (height // self.vision.patch_size) * (width // self.vision.patch_size)

    @property
    def prefix_len(self) -> int:
        return len(self.all_camera_names) * self.tokens_per_image + self.tokenizer_max_length

    @property
    def num_prefix_layers(self) -> int:
        """Layers of the stack the prefix runs through (the language model)."""
        return self.language.depth

    @property
    def suffix_len(self) -> int:
        # pi0: one state token then the action tokens; pi0.5: the action tokens only.
        return self.chunk_size + int(self.traits.state_token)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Analytic K/V size of one prefix token: 2 x layers x kv_heads x head_dim x bytes."""
        lm = self.language
        return 2 * lm.depth * lm.num_kv_heads * lm.head_dim * dtype_bytes

    def kv_entry_bytes(self, dtype_bytes: int) -> int:
        """The K/V of the largest prefix, every language-model layer."""
        return self.kv_bytes_per_token(dtype_bytes) * self.prefix_len

    # ---- lerobot config.json ----------------------------------------------
    def to_lerobot_dict(self, variant_names: Optional[Tuple[str, str]] = None) -> Dict[str, Any]:
        """config.json content in lerobot's layout, plus our `model_sizes` block."""
        height, width = self.image_resolution
        feature_docs = feature_documents(self.camera_names, self.image_resolution, self.state_dim, self.action_dim)
        lm_variant, ex_variant = variant_names or ('custom', 'custom')
        document: Dict[str, Any] = {
            'type': self.policy_type,
            'paligemma_variant': lm_variant,
            'action_expert_variant': ex_variant,
            'dtype': self.dtype,
            'chunk_size': self.chunk_size,
            'n_action_steps': self.n_action_steps,
            'max_state_dim': self.max_state_dim,
            'max_action_dim': self.max_action_dim,
            'num_inference_steps': self.num_inference_steps,
            'min_period': self.min_period,
            'max_period': self.max_period,
            'image_resolution': [height, width],
            'empty_cameras': self.empty_cameras,
            'tokenizer_max_length': self.tokenizer_max_length,
            **feature_docs,
            'normalization_mapping': dict(self.normalization_mapping),
            'use_relative_actions': self.use_relative_actions,
            'relative_exclude_joints': list(self.relative_exclude_joints),
            'action_feature_names': None if self.action_feature_names is None else list(self.action_feature_names),
            'model_sizes': {
                'vision': dataclasses.asdict(self.vision),
                'language': dataclasses.asdict(self.language),
                'expert': dataclasses.asdict(self.expert),
                'vocab_size': self.vocab_size,
            },
        }
        if self.policy_type in CONFIG_FIELDS['rtc_training_max_delay'].policy_types:
            document['rtc_training_max_delay'] = self.rtc_training_max_delay   # a PI05Config field only
        return document

    @classmethod
    def from_lerobot_dict(cls, raw: Mapping[str, Any]) -> 'PolicyConfig':
        policy_type = raw.get('type')
        traits = paligemma_traits(policy_type)
        check_lerobot_fields(raw)
        sizes = raw.get('model_sizes') or {}
        language = _gemma_size(sizes.get('language'), raw.get('paligemma_variant', 'gemma_2b'), 'paligemma_variant')
        expert = _gemma_size(sizes.get('expert'), raw.get('action_expert_variant', 'gemma_300m'),
                             'action_expert_variant')
        vision = VisionSize(**sizes['vision']) if 'vision' in sizes else SIGLIP_SO400M_14
        cameras, state_dim, action_dim = features(raw, EMPTY_CAMERA_PREFIX)
        try:
            return cls(
                policy_type=policy_type,
                vision=vision,
                language=language,
                expert=expert,
                vocab_size=int(sizes.get('vocab_size', PALIGEMMA_VOCAB_SIZE)),
                camera_names=tuple(cameras),
                empty_cameras=int(raw.get('empty_cameras', 0)),
                image_resolution=tuple(int(v) for v in raw.get('image_resolution', (224, 224))),
                chunk_size=int(raw.get('chunk_size', 50)),
                n_action_steps=int(raw.get('n_action_steps', raw.get('chunk_size', 50))),
                max_state_dim=int(raw.get('max_state_dim', 32)),
                max_action_dim=int(raw.get('max_action_dim', 32)),
                state_dim=state_dim,
                action_dim=action_dim,
                num_inference_steps=int(raw.get('num_inference_steps', 10)),
                min_period=float(raw.get('min_period', 4e-3)),
                max_period=float(raw.get('max_period', 4.0)),
                tokenizer_max_length=int(raw.get('tokenizer_max_length', traits.tokenizer_max_length)),
                normalization_mapping=normalization_mapping(raw.get('normalization_mapping')
                                                            or traits.normalization_mapping),
                dtype=str(raw.get('dtype', 'float32')),
                rtc_training_max_delay=int(raw.get('rtc_training_max_delay', 0)),
                use_relative_actions=bool_field(raw, 'use_relative_actions', False),
                relative_exclude_joints=names_field(raw, 'relative_exclude_joints', ('gripper',)) or (),
                action_feature_names=names_field(raw, 'action_feature_names', None),
            )
        except (KeyError, TypeError, IndexError) as exc:
            raise ConfigError(f'config.json is malformed: {exc!r}') from exc


# ---- every config.json field, classified ---------------------------------------------------------
#
# The fields of lerobot's PreTrainedConfig, PI0Config and PI05Config at huggingface/lerobot
# 7427f31801f944f5ec9ce53cda02862ce7d1638b (src/lerobot/configs/policies.py,
# src/lerobot/policies/pi0/configuration_pi0.py, src/lerobot/policies/pi05/configuration_pi05.py), plus the
# draccus choice key "type" and this project's "model_sizes". The two lerobot classes differ in a few
# fields only, so they share one table; ``policy_types`` says which class has a field.
# test/test_config_fields.py holds those lists and fails when a field is missing here.

PALIGEMMA_TYPES = tuple(PALIGEMMA_TRAITS)       # the lerobot types this config class describes
PI05_ONLY = ('pi05',)


def _field(name: str, handling: str, why: str, accepted: Tuple[Any, ...] = (),
           policy_types: Tuple[str, ...] = PALIGEMMA_TYPES) -> ConfigField:
    return ConfigField(name, handling, why, accepted, policy_types)


LEROBOT_CONFIG_FIELDS: Tuple[ConfigField, ...] = (
    _field('type', IMPLEMENTED, 'pi0 or pi05; any other policy is refused'),
    _field('model_sizes', IMPLEMENTED, "this project's extension: explicit tower sizes (tiny and bench models)"),
    # ---- PreTrainedConfig ----
    *(dataclasses.replace(entry, policy_types=PALIGEMMA_TYPES) for entry in PRETRAINED_CONFIG_FIELDS),
    # ---- PI0Config / PI05Config ----
    _field('paligemma_variant', IMPLEMENTED, 'language model size'),
    _field('action_expert_variant', IMPLEMENTED, 'action expert size'),
    _field('dtype', METADATA, "lerobot's precision; the node's dtype parameter sets ours (bf16 keeps the same "
           'modules in fp32 as lerobot)'),
    _field('chunk_size', IMPLEMENTED, 'actions per chunk'),
    _field('n_action_steps', IMPLEMENTED, "checked <= chunk_size; the node's execute_steps publishes"),
    _field('use_visual_memory', DEFAULT_ONLY, 'MEM video memory is not implemented', accepted=(False,),
           policy_types=PI05_ONLY),
    _field('use_proprioceptive_memory', DEFAULT_ONLY, 'MEM state memory is not implemented', accepted=(False,),
           policy_types=PI05_ONLY),
    _field('memory_frames', METADATA, 'read only with MEM, which loads only when off', policy_types=PI05_ONLY),
    _field('memory_stride', METADATA, 'read only with MEM, which loads only when off', policy_types=PI05_ONLY),
    _field('memory_temporal_attention_every', METADATA, 'read only with MEM, which loads only when off',
           policy_types=PI05_ONLY),
    _field('max_state_dim', IMPLEMENTED, 'pi0 state projection width (pi0.5: the padded legacy prompt)'),
    _field('max_action_dim', IMPLEMENTED, 'noise and action projection width'),
    _field('num_inference_steps', IMPLEMENTED, "Euler steps (the node's num_steps parameter overrides)"),
    _field('time_sampling_beta_alpha', TRAINING, 'flow-matching time sampling'),
    _field('time_sampling_beta_beta', TRAINING, 'flow-matching time sampling'),
    _field('time_sampling_scale', TRAINING, 'flow-matching time sampling'),
    _field('time_sampling_offset', TRAINING, 'flow-matching time sampling'),
    _field('min_period', IMPLEMENTED, 'time embedding'),
    _field('max_period', IMPLEMENTED, 'time embedding'),
    _field('use_relative_actions', IMPLEMENTED, 'raw state added back to masked joints'),
    _field('relative_exclude_joints', IMPLEMENTED, 'joints kept absolute (substring match on names)'),
    _field('action_feature_names', IMPLEMENTED, 'names the exclusions are matched against'),
    _field('rtc_config', METADATA, "lerobot's rollout-time RTC settings (null in trained checkpoints); the "
           "node's chunking and rtc_* parameters decide"),
    _field('rtc_training_max_delay', IMPLEMENTED, 'trained real-time chunking: the largest clamped prefix '
           '(rtc_mode trained)', policy_types=PI05_ONLY),
    _field('image_resolution', IMPLEMENTED, 'model image size (resize with pad)'),
    _field('empty_cameras', IMPLEMENTED, 'masked placeholder cameras'),
    _field('tokenizer_max_length', IMPLEMENTED, 'prompt length'),
    _field('normalization_mapping', IMPLEMENTED, 'VISUAL IDENTITY; STATE and ACTION any lerobot mode'),
    _field('gradient_checkpointing', TRAINING, 'memory saving in training'),
    _field('freeze_vision_encoder', TRAINING, 'fine-tuning'),
    _field('train_expert_only', TRAINING, 'fine-tuning'),
    *(dataclasses.replace(entry, policy_types=PALIGEMMA_TYPES) for entry in TRAINING_PRESET_FIELDS),
)
CONFIG_FIELDS: Dict[str, ConfigField] = table(LEROBOT_CONFIG_FIELDS)


def fields_for(policy_type: str) -> Dict[str, ConfigField]:
    """The rows of the table that lerobot's config class for ``policy_type`` has."""
    return {name: entry for name, entry in CONFIG_FIELDS.items() if policy_type in entry.policy_types}


def check_lerobot_fields(raw: Mapping[str, Any]) -> None:
    """Refuse keys the table does not know for this type, and unimplemented fields away from their accepted values."""
    policy_type = str(raw.get('type'))
    check_fields(raw, fields_for(policy_type), policy_type, 'PI0Config/PI05Config')


def _gemma_size(explicit: Optional[Mapping[str, int]], variant: str, field_name: str) -> GemmaSize:
    if explicit:
        return GemmaSize(**explicit)
    try:
        return GEMMA_VARIANTS[variant]
    except KeyError:
        raise ConfigError(f'unknown {field_name} {variant!r}; known: {sorted(GEMMA_VARIANTS)} '
                          '(or give sizes in a model_sizes block)') from None


# ---- presets -----------------------------------------------------------------

TINY_VISION = VisionSize(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8)
TINY_LANGUAGE = GemmaSize(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16)
TINY_EXPERT = GemmaSize(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16)


def preset(name: str, policy_type: str = 'pi0', **overrides: Any) -> PolicyConfig:
    """Named configurations.

    - ``tiny``: a few hundred thousand parameters; tests and the demo.
    - ``pi0_shallow``: full pi0 widths (So400m, gemma_2b, gemma_300m) with
      ``depth`` layers per tower, for CPU benchmarks with realistic shapes.
    - ``pi0`` / ``pi05``: the real sizes.
    """
    if name in PALIGEMMA_TYPES:
        policy_type = name
    traits = paligemma_traits(policy_type)
    common: Dict[str, Any] = dict(policy_type=policy_type,
                                  tokenizer_max_length=traits.tokenizer_max_length,
                                  normalization_mapping=traits.normalization_mapping)
    if name == 'tiny':
        cfg = dict(common, vision=TINY_VISION, language=TINY_LANGUAGE, expert=TINY_EXPERT, vocab_size=512,
                   image_resolution=(32, 32), chunk_size=10, n_action_steps=10, state_dim=6, action_dim=6,
                   tokenizer_max_length=traits.tiny_tokenizer_max_length)
    elif name == 'pi0_shallow':
        depth = int(overrides.pop('depth', 2))
        lm, ex = GEMMA_VARIANTS['gemma_2b'], GEMMA_VARIANTS['gemma_300m']
        cfg = dict(common, vision=dataclasses.replace(SIGLIP_SO400M_14, depth=depth),
                   language=dataclasses.replace(lm, depth=depth), expert=dataclasses.replace(ex, depth=depth),
                   # The embedding table is the one tensor whose size does not scale with depth.
                   vocab_size=overrides.pop('vocab_size', 4096))
    elif name in PALIGEMMA_TYPES:
        cfg = dict(common, vision=SIGLIP_SO400M_14,
                   language=GEMMA_VARIANTS['gemma_2b'], expert=GEMMA_VARIANTS['gemma_300m'])
    else:
        raise ConfigError(f'unknown preset {name!r}; known: tiny, pi0_shallow, pi0, pi05')
    cfg.update(overrides)
    return PolicyConfig(**cfg)
