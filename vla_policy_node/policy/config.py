"""Model configuration: sizes of the three towers plus the policy-level settings.

A config comes from a lerobot ``config.json`` (``type`` pi0 or pi05, named
variants) or from a named preset. Named variants follow openpi's ``gemma.py``
and PaliGemma's SigLIP So400m/14. A checkpoint may carry a ``model_sizes``
block (this project's extension, ignored by lerobot's fields) that overrides
the sizes of any tower; the tiny preset and the bench configs use it.

Nothing in a config.json is ignored silently: ``LEROBOT_CONFIG_FIELDS`` says
for every field of lerobot's ``PI0Config`` / ``PI05Config`` whether we
implement it, accept it because only training reads it, accept it as
metadata, or load it only at the values we reproduce. Any other key, and a
field we do not implement set to something else, refuses the checkpoint with
the field and its value named.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from .normalize import NORM_MODES

POLICY_TYPES = ('pi0', 'pi05')
IMAGE_FEATURE_PREFIX = 'observation.images.'
STATE_FEATURE = 'observation.state'
ACTION_FEATURE = 'action'
# lerobot names the padding cameras it adds for `empty_cameras` like this.
EMPTY_CAMERA_PREFIX = 'empty_camera_'


class ConfigError(ValueError):
    """A config.json or preset that cannot describe a model."""


@dataclass(frozen=True)
class GemmaSize:
    """One Gemma stream: the language model or the action expert."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class VisionSize:
    """SigLIP ViT without pooling head (PaliGemma's vision tower)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int


GEMMA_VARIANTS: Dict[str, GemmaSize] = {
    'gemma_2b': GemmaSize(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
    'gemma_300m': GemmaSize(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
    'dummy': GemmaSize(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16),
}
SIGLIP_SO400M_14 = VisionSize(width=1152, depth=27, mlp_dim=4304, num_heads=16, patch_size=14)
PALIGEMMA_VOCAB_SIZE = 257152


@dataclass(frozen=True)
class PolicyConfig:
    """Everything needed to build the model and its pre/post-processing."""

    policy_type: str  # 'pi0' | 'pi05'
    vision: VisionSize
    language: GemmaSize
    expert: GemmaSize
    vocab_size: int = PALIGEMMA_VOCAB_SIZE
    camera_names: Tuple[str, ...] = ('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb')
    empty_cameras: int = 0
    image_resolution: Tuple[int, int] = (224, 224)  # (height, width)
    chunk_size: int = 50
    n_action_steps: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    state_dim: int = 32
    action_dim: int = 32
    num_inference_steps: int = 10
    min_period: float = 4e-3
    max_period: float = 4.0
    tokenizer_max_length: int = 48
    normalization_mapping: Mapping[str, str] = field(
        default_factory=lambda: {'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'})
    rms_norm_eps: float = 1e-6
    layer_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    dtype: str = 'float32'
    # Trained real-time chunking: the checkpoint learned to continue a clean prefix of up to this many
    # actions (lerobot PI05Config.rtc_training_max_delay); 0: only guided RTC.
    rtc_training_max_delay: int = 0
    # lerobot relative actions (policy/relative_actions.py): offsets from the raw state on masked joints.
    use_relative_actions: bool = False
    relative_exclude_joints: Tuple[str, ...] = ('gripper',)
    action_feature_names: Optional[Tuple[str, ...]] = None

    def __post_init__(self) -> None:
        if self.policy_type not in POLICY_TYPES:
            raise ConfigError(f'type must be one of {POLICY_TYPES}, got {self.policy_type!r}')
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
        if self.state_dim > self.max_state_dim or self.action_dim > self.max_action_dim:
            raise ConfigError('state_dim/action_dim exceed max_state_dim/max_action_dim')
        if self.n_action_steps > self.chunk_size:
            raise ConfigError('n_action_steps must not exceed chunk_size')
        if not 0 <= self.rtc_training_max_delay < self.chunk_size:
            raise ConfigError(f'rtc_training_max_delay must be in [0, chunk_size), got {self.rtc_training_max_delay}')
        if self.use_relative_actions and self.state_dim < self.action_dim:
            # lerobot adds state[:action_dim] back (to_absolute_actions); a shorter state fails there
            # with a broadcast error at the first chunk. Refuse at load instead.
            raise ConfigError(f'use_relative_actions needs a state at least as long as the action: state_dim '
                              f'{self.state_dim} < action_dim {self.action_dim}')

    # ---- derived sizes -------------------------------------------------
    @property
    def all_camera_names(self) -> Tuple[str, ...]:
        """Image slots in model order: the configured cameras, then the empty ones."""
        return self.camera_names + tuple(f'{EMPTY_CAMERA_PREFIX}{i}' for i in range(self.empty_cameras))

    @property
    def tokens_per_image(self) -> int:
        height, width = self.image_resolution
        return (height // self.vision.patch_size) * (width // self.vision.patch_size)

    @property
    def prefix_len(self) -> int:
        return len(self.all_camera_names) * self.tokens_per_image + self.tokenizer_max_length

    @property
    def suffix_len(self) -> int:
        # pi0: one state token then the action tokens; pi0.5: the action tokens only.
        return self.chunk_size + (1 if self.policy_type == 'pi0' else 0)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Analytic K/V size of one prefix token: 2 x layers x kv_heads x head_dim x bytes."""
        lm = self.language
        return 2 * lm.depth * lm.num_kv_heads * lm.head_dim * dtype_bytes

    # ---- lerobot config.json ----------------------------------------------
    def to_lerobot_dict(self, variant_names: Optional[Tuple[str, str]] = None) -> Dict[str, Any]:
        """config.json content in lerobot's layout, plus our `model_sizes` block."""
        height, width = self.image_resolution
        input_features: Dict[str, Any] = {
            IMAGE_FEATURE_PREFIX + name: {'type': 'VISUAL', 'shape': [3, height, width]}
            for name in self.camera_names
        }
        input_features[STATE_FEATURE] = {'type': 'STATE', 'shape': [self.state_dim]}
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
            'input_features': input_features,
            'output_features': {ACTION_FEATURE: {'type': 'ACTION', 'shape': [self.action_dim]}},
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
        if self.policy_type == 'pi05':
            document['rtc_training_max_delay'] = self.rtc_training_max_delay   # a PI05Config field only
        return document

    @classmethod
    def from_lerobot_dict(cls, raw: Mapping[str, Any]) -> 'PolicyConfig':
        policy_type = raw.get('type')
        if policy_type not in POLICY_TYPES:
            raise ConfigError(f'config.json "type" must be one of {POLICY_TYPES}, got {policy_type!r}')
        check_lerobot_fields(raw)
        sizes = raw.get('model_sizes') or {}
        language = _gemma_size(sizes.get('language'), raw.get('paligemma_variant', 'gemma_2b'), 'paligemma_variant')
        expert = _gemma_size(sizes.get('expert'), raw.get('action_expert_variant', 'gemma_300m'),
                             'action_expert_variant')
        vision = VisionSize(**sizes['vision']) if 'vision' in sizes else SIGLIP_SO400M_14
        features = raw.get('input_features') or {}
        cameras = [key[len(IMAGE_FEATURE_PREFIX):] for key, feat in features.items()
                   if key.startswith(IMAGE_FEATURE_PREFIX) and feat.get('type') == 'VISUAL'
                   and not key[len(IMAGE_FEATURE_PREFIX):].startswith(EMPTY_CAMERA_PREFIX)]
        if not cameras:
            raise ConfigError('config.json input_features lists no VISUAL observation.images.* camera')
        state_feat = features.get(STATE_FEATURE)
        action_feat = (raw.get('output_features') or {}).get(ACTION_FEATURE)
        if state_feat is None or action_feat is None:
            raise ConfigError('config.json needs input_features.observation.state and output_features.action')
        policy_defaults = _POLICY_TYPE_DEFAULTS[policy_type]
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
                state_dim=int(state_feat['shape'][0]),
                action_dim=int(action_feat['shape'][0]),
                num_inference_steps=int(raw.get('num_inference_steps', 10)),
                min_period=float(raw.get('min_period', 4e-3)),
                max_period=float(raw.get('max_period', 4.0)),
                tokenizer_max_length=int(raw.get('tokenizer_max_length', policy_defaults['tokenizer_max_length'])),
                normalization_mapping=_normalization_mapping(raw.get('normalization_mapping')
                                                             or policy_defaults['normalization_mapping']),
                dtype=str(raw.get('dtype', 'float32')),
                rtc_training_max_delay=int(raw.get('rtc_training_max_delay', 0)),
                use_relative_actions=_bool_field(raw, 'use_relative_actions', False),
                relative_exclude_joints=_names_field(raw, 'relative_exclude_joints', ('gripper',)) or (),
                action_feature_names=_names_field(raw, 'action_feature_names', None),
            )
        except (KeyError, TypeError, IndexError) as exc:
            raise ConfigError(f'config.json is malformed: {exc!r}') from exc

    @classmethod
    def from_json_file(cls, path: Path) -> 'PolicyConfig':
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f'no config.json at {path}') from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f'{path} is not valid JSON: {exc}') from exc
        return cls.from_lerobot_dict(raw)


_POLICY_TYPE_DEFAULTS: Dict[str, Dict[str, Any]] = {
    'pi0': {'tokenizer_max_length': 48,
            'normalization_mapping': {'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'}},
    'pi05': {'tokenizer_max_length': 200,
             'normalization_mapping': {'VISUAL': 'IDENTITY', 'STATE': 'QUANTILES', 'ACTION': 'QUANTILES'}},
}


# ---- every config.json field, classified ---------------------------------------------------------
#
# The fields of lerobot's PreTrainedConfig, PI0Config and PI05Config at huggingface/lerobot
# 7427f31801f944f5ec9ce53cda02862ce7d1638b (src/lerobot/configs/policies.py,
# src/lerobot/policies/pi0/configuration_pi0.py, src/lerobot/policies/pi05/configuration_pi05.py), plus the
# draccus choice key "type" and this project's "model_sizes". test/test_config_fields.py holds those lists
# and fails when a field is missing here.

IMPLEMENTED = 'implemented'      # read and reproduced
TRAINING = 'training'            # only training reads it: accepted with any value
METADATA = 'metadata'            # bookkeeping or another component's setting: accepted with any value
DEFAULT_ONLY = 'default_only'    # changes inference and is not implemented: loads only at `accepted` values
PI05_ONLY = ('pi05',)


@dataclass(frozen=True)
class ConfigField:
    name: str
    handling: str
    why: str
    accepted: Tuple[Any, ...] = ()               # DEFAULT_ONLY: the values that load (JSON values)
    policy_types: Tuple[str, ...] = POLICY_TYPES  # the lerobot config types that have this field


LEROBOT_CONFIG_FIELDS: Tuple[ConfigField, ...] = (
    ConfigField('type', IMPLEMENTED, 'pi0 or pi05; any other policy is refused'),
    ConfigField('model_sizes', IMPLEMENTED, "this project's extension: explicit tower sizes (tiny and bench models)"),
    # ---- PreTrainedConfig ----
    ConfigField('n_obs_steps', DEFAULT_ONLY, 'observation history is not implemented (one observation per chunk)',
                accepted=(1,)),
    ConfigField('input_features', IMPLEMENTED, 'camera names and order, state dimension'),
    ConfigField('output_features', IMPLEMENTED, 'action dimension'),
    ConfigField('device', METADATA, "where lerobot ran; the node's device parameter decides"),
    ConfigField('use_amp', METADATA, "lerobot's autocast switch; the node's dtype parameter sets the precision"),
    ConfigField('use_peft', DEFAULT_ONLY,
                'PEFT adapters are not loaded (merge the adapter into model.safetensors first)', accepted=(False,)),
    ConfigField('push_to_hub', METADATA, 'Hub upload'),
    ConfigField('repo_id', METADATA, 'Hub upload'),
    ConfigField('private', METADATA, 'Hub upload'),
    ConfigField('tags', METADATA, 'Hub upload'),
    ConfigField('license', METADATA, 'Hub upload'),
    ConfigField('pretrained_path', METADATA, 'where training started from'),
    ConfigField('pretrained_revision', METADATA, 'where training started from'),
    # ---- PI0Config / PI05Config ----
    ConfigField('paligemma_variant', IMPLEMENTED, 'language model size'),
    ConfigField('action_expert_variant', IMPLEMENTED, 'action expert size'),
    ConfigField('dtype', METADATA, "lerobot's precision; the node's dtype parameter sets ours (bf16 keeps the same "
                'modules in fp32 as lerobot)'),
    ConfigField('chunk_size', IMPLEMENTED, 'actions per chunk'),
    ConfigField('n_action_steps', IMPLEMENTED, "checked <= chunk_size; the node's execute_steps publishes"),
    ConfigField('use_visual_memory', DEFAULT_ONLY, 'MEM video memory is not implemented', accepted=(False,),
                policy_types=PI05_ONLY),
    ConfigField('use_proprioceptive_memory', DEFAULT_ONLY, 'MEM state memory is not implemented', accepted=(False,),
                policy_types=PI05_ONLY),
    ConfigField('memory_frames', METADATA, 'read only with MEM, which loads only when off', policy_types=PI05_ONLY),
    ConfigField('memory_stride', METADATA, 'read only with MEM, which loads only when off', policy_types=PI05_ONLY),
    ConfigField('memory_temporal_attention_every', METADATA, 'read only with MEM, which loads only when off',
                policy_types=PI05_ONLY),
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
    ConfigField('rtc_training_max_delay', IMPLEMENTED, 'trained real-time chunking: the largest clamped prefix '
                '(rtc_mode trained)', policy_types=PI05_ONLY),
    ConfigField('image_resolution', IMPLEMENTED, 'model image size (resize with pad)'),
    ConfigField('empty_cameras', IMPLEMENTED, 'masked placeholder cameras'),
    ConfigField('tokenizer_max_length', IMPLEMENTED, 'prompt length'),
    ConfigField('normalization_mapping', IMPLEMENTED, 'VISUAL IDENTITY; STATE and ACTION any lerobot mode'),
    ConfigField('gradient_checkpointing', TRAINING, 'memory saving in training'),
    ConfigField('compile_model', TRAINING, 'torch.compile (speed only)'),
    ConfigField('compile_mode', TRAINING, 'torch.compile (speed only)'),
    ConfigField('freeze_vision_encoder', TRAINING, 'fine-tuning'),
    ConfigField('train_expert_only', TRAINING, 'fine-tuning'),
    ConfigField('optimizer_lr', TRAINING, 'optimizer'),
    ConfigField('optimizer_betas', TRAINING, 'optimizer'),
    ConfigField('optimizer_eps', TRAINING, 'optimizer'),
    ConfigField('optimizer_weight_decay', TRAINING, 'optimizer'),
    ConfigField('optimizer_grad_clip_norm', TRAINING, 'optimizer'),
    ConfigField('scheduler_warmup_steps', TRAINING, 'learning-rate schedule'),
    ConfigField('scheduler_decay_steps', TRAINING, 'learning-rate schedule'),
    ConfigField('scheduler_decay_lr', TRAINING, 'learning-rate schedule'),
)
CONFIG_FIELDS: Dict[str, ConfigField] = {entry.name: entry for entry in LEROBOT_CONFIG_FIELDS}


def check_lerobot_fields(raw: Mapping[str, Any]) -> None:
    """Refuse keys the table does not know for this type, and unimplemented fields away from their accepted values."""
    policy_type = raw.get('type')
    known = {name for name, entry in CONFIG_FIELDS.items() if policy_type in entry.policy_types}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f'config.json has field(s) {unknown} that a lerobot {policy_type} config '
                          '(lerobot 7427f318) does not have; refusing rather than ignoring them')
    for name, value in raw.items():
        entry = CONFIG_FIELDS[name]
        if entry.handling == DEFAULT_ONLY and not any(_same_json(value, ok) for ok in entry.accepted):
            allowed = ' or '.join(json.dumps(ok) for ok in entry.accepted)
            raise ConfigError(f'config.json sets {name} = {json.dumps(value)}: {entry.why}; vla_policy_node '
                              f'loads it only with {name} = {allowed}')


def _same_json(value: Any, accepted: Any) -> bool:
    # 1 == True in Python; a config value must also have the accepted value's JSON type.
    return type(value) is type(accepted) and value == accepted


def _normalization_mapping(raw: Any) -> Dict[str, str]:
    """lerobot's normalization_mapping, refused where we would compute something else."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f'config.json normalization_mapping must be an object, got {json.dumps(raw)}')
    for feature_type, mode in raw.items():
        if mode not in NORM_MODES:
            raise ConfigError(f'config.json normalization_mapping.{feature_type} = {json.dumps(mode)} is not '
                              f'implemented (known modes: {", ".join(NORM_MODES)})')
        if feature_type == 'VISUAL' and mode != 'IDENTITY':
            # Images go to the vision tower as [-1, 1] pixels; no image statistics are applied.
            raise ConfigError(f'config.json normalization_mapping.VISUAL = {json.dumps(mode)} is not '
                              'implemented (only IDENTITY)')
    return dict(raw)


def _bool_field(raw: Mapping[str, Any], name: str, default: bool) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise ConfigError(f'config.json {name} must be true or false, got {json.dumps(value)}')
    return value


def _names_field(raw: Mapping[str, Any], name: str,
                 default: Optional[Tuple[str, ...]]) -> Optional[Tuple[str, ...]]:
    value = raw.get(name, default)
    if value is None or isinstance(value, tuple):
        return value
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f'config.json {name} must be a list of strings or null, got {json.dumps(value)}')
    return tuple(value)


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
    defaults = _POLICY_TYPE_DEFAULTS[policy_type]
    common: Dict[str, Any] = dict(policy_type=policy_type,
                                  tokenizer_max_length=defaults['tokenizer_max_length'],
                                  normalization_mapping=defaults['normalization_mapping'])
    if name == 'tiny':
        cfg = dict(common, vision=TINY_VISION, language=TINY_LANGUAGE, expert=TINY_EXPERT, vocab_size=512,
                   image_resolution=(32, 32), chunk_size=10, n_action_steps=10, state_dim=6, action_dim=6,
                   tokenizer_max_length=16 if policy_type == 'pi0' else 200)
    elif name == 'pi0_shallow':
        depth = int(overrides.pop('depth', 2))
        lm, ex = GEMMA_VARIANTS['gemma_2b'], GEMMA_VARIANTS['gemma_300m']
        cfg = dict(common, vision=dataclasses.replace(SIGLIP_SO400M_14, depth=depth),
                   language=dataclasses.replace(lm, depth=depth), expert=dataclasses.replace(ex, depth=depth),
                   # The embedding table is the one tensor whose size does not scale with depth.
                   vocab_size=overrides.pop('vocab_size', 4096))
    elif name in POLICY_TYPES:
        cfg = dict(common, policy_type=name, vision=SIGLIP_SO400M_14,
                   language=GEMMA_VARIANTS['gemma_2b'], expert=GEMMA_VARIANTS['gemma_300m'])
    else:
        raise ConfigError(f'unknown preset {name!r}; known: tiny, pi0_shallow, pi0, pi05')
    cfg.update(overrides)
    return PolicyConfig(**cfg)
