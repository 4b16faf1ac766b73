"""pi0's configuration: sizes of the three PaliGemma towers plus the policy-level settings.

A config comes from a lerobot ``config.json`` (``type`` pi0, named variants)
or from a named preset. Named variants follow openpi's ``gemma.py`` and
PaliGemma's SigLIP So400m/14. A checkpoint may carry a ``model_sizes`` block
(this project's extension, ignored by lerobot's fields) that overrides the
sizes of any tower; the tiny preset and the bench configs use it.

pi0.5 is built on this (``families/pi05/config.py``: a subclass with its own
traits, field table and presets). What the model does differently is data,
not a test of the type: the config class's ``TRAITS`` (a ``PaliGemmaTraits``:
state token or state in the prompt, adaptive expert norms, defaults), as
openpi's ``Pi0Config`` does with its ``pi05`` flag.

Nothing in a config.json is ignored silently: ``LEROBOT_CONFIG_FIELDS`` says
for every field of lerobot's ``PI0Config`` whether we implement it, accept it
because only training reads it, accept it as metadata, or load it only at
the values we reproduce (policy/config_fields.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Mapping, Optional, Sequence, Tuple

from ...config_fields import (ACTION_FEATURE, DEFAULT_ONLY, IMAGE_FEATURE_PREFIX, IMPLEMENTED, METADATA,  # noqa: F401
                              PRETRAINED_CONFIG_FIELDS, STATE_FEATURE, TRAINING, TRAINING_PRESET_FIELDS, ConfigError,
                              ConfigField, bool_field, check_fields, feature_documents, features, names_field,
                              normalization_mapping, table)
from ...family import EMPTY_CAMERA_PREFIX, PolicyLevelConfig  # noqa: F401
from ...gemma import GemmaSize
from ...siglip import VisionSize


@dataclass(frozen=True)
class PaliGemmaTraits:
    """What a PaliGemma type does differently (its config class's ``TRAITS``, never a test of the type)."""

    policy_type: str                # lerobot's config.json type
    lerobot_class: str              # lerobot's config class, for the refusals
    state_token: bool               # pi0: the state is one suffix token (state_proj); pi0.5: in the prompt
    adaptive_expert: bool           # pi0.5: time enters the expert through adaptive RMSNorm (time_mlp_*)
    tokenizer_max_length: int       # lerobot's default prompt length
    normalization_mapping: Mapping[str, str]
    tiny_tokenizer_max_length: int  # the tiny preset's prompt length


PI0_TRAITS = PaliGemmaTraits(policy_type='pi0', lerobot_class='PI0Config', state_token=True, adaptive_expert=False,
                             tokenizer_max_length=48, tiny_tokenizer_max_length=16,
                             normalization_mapping={'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'})


GEMMA_VARIANTS: Dict[str, GemmaSize] = {
    'gemma_2b': GemmaSize(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
    'gemma_300m': GemmaSize(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
    'dummy': GemmaSize(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16),
}
SIGLIP_SO400M_14 = VisionSize(width=1152, depth=27, mlp_dim=4304, num_heads=16, patch_size=14)
PALIGEMMA_VOCAB_SIZE = 257152


@dataclass(frozen=True, kw_only=True)
class PolicyConfig(PolicyLevelConfig):
    """Everything needed to build a pi0 model and its pre/post-processing; the policy-level fields are
    PolicyLevelConfig's, with pi0's defaults here. A PaliGemma type built on pi0 subclasses it with its own
    ``TRAITS`` and ``field_table`` (families/pi05/config.py)."""

    TRAITS: ClassVar[PaliGemmaTraits] = PI0_TRAITS

    policy_type: str = 'pi0'
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

    @property
    def traits(self) -> PaliGemmaTraits:
        return self.TRAITS

    @classmethod
    def field_table(cls) -> Dict[str, ConfigField]:
        """Every field of lerobot's config class for this type, classified."""
        return CONFIG_FIELDS

    def __post_init__(self) -> None:
        if self.policy_type != self.TRAITS.policy_type:
            raise ConfigError(f'a {type(self).__name__} is type {self.TRAITS.policy_type!r}, got {self.policy_type!r}')
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
        if 'rtc_training_max_delay' in self.field_table():
            document['rtc_training_max_delay'] = self.rtc_training_max_delay   # not a PI0Config field
        return document

    @classmethod
    def from_lerobot_dict(cls, raw: Mapping[str, Any]) -> 'PolicyConfig':
        traits = cls.TRAITS
        policy_type = raw.get('type')
        if policy_type != traits.policy_type:
            raise ConfigError(f'config.json "type" must be {traits.policy_type!r} for {traits.lerobot_class}, '
                              f'got {policy_type!r}')
        check_fields(raw, cls.field_table(), policy_type, traits.lerobot_class)
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
# The fields of lerobot's PreTrainedConfig and PI0Config at huggingface/lerobot
# 7427f31801f944f5ec9ce53cda02862ce7d1638b (src/lerobot/configs/policies.py,
# src/lerobot/policies/pi0/configuration_pi0.py), plus the draccus choice key "type" and this project's
# "model_sizes". PI05Config shares all of them and adds a few: ``paligemma_fields`` inserts those where
# pi0.5's table (families/pi05/config.py) has them. test/test_config_fields.py holds lerobot's lists and
# fails when a field is missing.

def paligemma_fields(type_row: ConfigField,
                     inserted: Mapping[str, Sequence[ConfigField]] = {}) -> Tuple[ConfigField, ...]:
    """The rows every PaliGemma type's table has, its own ``type`` row first and ``inserted[name]`` after
    the row ``name`` (pi0.5's own fields)."""
    rows = (
        type_row,
        ConfigField('model_sizes', IMPLEMENTED, "this project's extension: explicit tower sizes (tiny and bench "
                    'models)'),
        # ---- PreTrainedConfig ----
        *PRETRAINED_CONFIG_FIELDS,
        # ---- PI0Config ----
        ConfigField('paligemma_variant', IMPLEMENTED, 'language model size'),
        ConfigField('action_expert_variant', IMPLEMENTED, 'action expert size'),
        ConfigField('dtype', METADATA, "lerobot's precision; the node's dtype parameter sets ours (bf16 keeps the "
                    'same modules in fp32 as lerobot)'),
        ConfigField('chunk_size', IMPLEMENTED, 'actions per chunk'),
        ConfigField('n_action_steps', IMPLEMENTED, "checked <= chunk_size; the node's execute_steps publishes"),
        ConfigField('max_state_dim', IMPLEMENTED, 'pi0 state projection width (pi0.5: the padded legacy prompt)'),
        ConfigField('max_action_dim', IMPLEMENTED, 'noise and action projection width'),
        ConfigField('num_inference_steps', IMPLEMENTED, "Euler steps (the node's num_steps parameter overrides)"),
        ConfigField('time_sampling_beta_alpha', TRAINING, 'flow-matching time sampling'),
        ConfigField('time_sampling_beta_beta', TRAINING, 'flow-matching time sampling'),
        ConfigField('time_sampling_scale', TRAINING, 'flow-matching time sampling'),
        ConfigField('time_sampling_offset', TRAINING, 'flow-matching time sampling'),
        ConfigField('min_period', IMPLEMENTED, 'time embedding'),
        ConfigField('max_period', IMPLEMENTED, 'time embedding'),
        ConfigField('use_relative_actions', IMPLEMENTED, 'raw state added back to masked joints'),
        ConfigField('relative_exclude_joints', IMPLEMENTED, 'joints kept absolute (substring match on names)'),
        ConfigField('action_feature_names', IMPLEMENTED, 'names the exclusions are matched against'),
        ConfigField('rtc_config', METADATA, "lerobot's rollout-time RTC settings (null in trained checkpoints); the "
                    "node's chunking and rtc_* parameters decide"),
        ConfigField('image_resolution', IMPLEMENTED, 'model image size (resize with pad)'),
        ConfigField('empty_cameras', IMPLEMENTED, 'masked placeholder cameras'),
        ConfigField('tokenizer_max_length', IMPLEMENTED, 'prompt length'),
        ConfigField('normalization_mapping', IMPLEMENTED, 'VISUAL IDENTITY; STATE and ACTION any lerobot mode'),
        ConfigField('gradient_checkpointing', TRAINING, 'memory saving in training'),
        ConfigField('freeze_vision_encoder', TRAINING, 'fine-tuning'),
        ConfigField('train_expert_only', TRAINING, 'fine-tuning'),
        *TRAINING_PRESET_FIELDS,
    )
    return tuple(row for entry in rows for row in (entry, *inserted.get(entry.name, ())))


LEROBOT_CONFIG_FIELDS: Tuple[ConfigField, ...] = paligemma_fields(
    ConfigField('type', IMPLEMENTED, 'pi0; any other type is another family (or refused)'))
CONFIG_FIELDS: Dict[str, ConfigField] = table(LEROBOT_CONFIG_FIELDS)


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


def paligemma_preset(config_class: type, name: str, **overrides: Any) -> PolicyConfig:
    """The sizes a PaliGemma type's presets share, as ``config_class`` (pi0's or a type built on it).

    - ``tiny``: a few hundred thousand parameters; tests and the demo.
    - ``shallow``: the real widths (So400m, gemma_2b, gemma_300m) with ``depth`` layers per tower, for CPU
      benchmarks with realistic shapes.
    - ``full``: the real sizes.
    """
    traits = config_class.TRAITS
    common: Dict[str, Any] = dict(tokenizer_max_length=traits.tokenizer_max_length,
                                  normalization_mapping=traits.normalization_mapping)
    if name == 'tiny':
        cfg = dict(common, vision=TINY_VISION, language=TINY_LANGUAGE, expert=TINY_EXPERT, vocab_size=512,
                   image_resolution=(32, 32), chunk_size=10, n_action_steps=10, state_dim=6, action_dim=6,
                   tokenizer_max_length=traits.tiny_tokenizer_max_length)
    elif name == 'shallow':
        depth = int(overrides.pop('depth', 2))
        lm, ex = GEMMA_VARIANTS['gemma_2b'], GEMMA_VARIANTS['gemma_300m']
        cfg = dict(common, vision=dataclasses.replace(SIGLIP_SO400M_14, depth=depth),
                   language=dataclasses.replace(lm, depth=depth), expert=dataclasses.replace(ex, depth=depth),
                   # The embedding table is the one tensor whose size does not scale with depth.
                   vocab_size=overrides.pop('vocab_size', 4096))
    elif name == 'full':
        cfg = dict(common, vision=SIGLIP_SO400M_14,
                   language=GEMMA_VARIANTS['gemma_2b'], expert=GEMMA_VARIANTS['gemma_300m'])
    else:
        raise ConfigError(f'unknown PaliGemma preset {name!r}; known: tiny, shallow, full')
    cfg.update(overrides)
    return config_class(**cfg)


PRESETS = {'tiny': 'tiny', 'pi0_shallow': 'shallow', 'pi0': 'full'}


def preset(name: str, **overrides: Any) -> PolicyConfig:
    """pi0's named configurations: ``tiny``, ``pi0_shallow`` (real widths, ``depth`` layers), ``pi0``."""
    if name not in PRESETS:
        raise ConfigError(f'unknown pi0 preset {name!r}; known: {", ".join(PRESETS)}')
    return paligemma_preset(PolicyConfig, PRESETS[name], **overrides)
