"""GR00T N1.7 configuration: lerobot's GrootConfig (config.json), the base model's GR00TN17Config, the processors.

A lerobot GR00T fine-tune is read from four places (lerobot 7427f318, ``policies/groot/``):

    config.json                 GrootConfig (configuration_groot.py), ``type: groot``: cameras, state and action
                                sizes, the prediction horizon, base_model_path, embodiment_tag, the inference knobs
    <base_model_path>/config.json
                                GR00TN17Config (groot_n1_7.py GR00T_N1_7_DEFAULTS): the action head's architecture,
                                select_layer, model_name (the backbone)
    the backbone's config       lerobot's hard-coded Cosmos-Reason2-2B config when model_name is that id, else
                                <model_name>/config.json (a Qwen3-VL config)
    the processor files         the pack, VLM-encode and action-decode steps (processor.py)

Every config.json field is classified (``GROOT_CONFIG_FIELDS``: implemented, training-only, metadata, or loaded only
at the values reproduced). The base config's fields lerobot's model reads are classified in ``BASE_CONFIG_FIELDS``;
a base-config key lerobot never reads changes nothing (GR00TN17Config keeps unknown keys as attributes nobody
reads) and is accepted.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from ...config_fields import (DEFAULT_ONLY, IMPLEMENTED, METADATA, PRETRAINED_CONFIG_FIELDS, TRAINING, ConfigError,
                              ConfigField, check_fields, table)
from ...family import PolicyLevelConfig
from .dit import DiTSize, SelfAttentionSize
from .images import ImageGeometry
from .qwen3vl import COSMOS_REASON2_2B, Qwen3VLBackbone

GROOT_TYPE = 'groot'
GROOT_N1_7_BASE_MODEL = 'nvidia/GR00T-N1.7-3B'
BASE_MODEL_TYPE = 'Gr00tN1d7'
# Text tokens a prompt may have besides the image tokens (chat template + task): bounds the prefix (and its memory)
# for any instruction; a longer prompt is refused, never truncated (lerobot does not truncate).
MAX_TEXT_TOKENS = 512
# Text tokens (chat template + task) of the default prompt buckets (GrootFamily.default_prompt_buckets), the last
# the longest prompt taken: the text subset's cross K/V is padded to the first that holds the prompt.
TEXT_BUCKETS = (64, 128, MAX_TEXT_TOKENS)

GROOT_CONFIG_FIELDS: Dict[str, ConfigField] = table((
    ConfigField('type', IMPLEMENTED, 'groot'),
    *PRETRAINED_CONFIG_FIELDS,
    ConfigField('chunk_size', IMPLEMENTED, 'caps the returned horizon (with n_action_steps and the checkpoint '
                'horizon; modeling_groot _resolve_prediction_horizon); the noise is the model\'s action_horizon'),
    ConfigField('n_action_steps', IMPLEMENTED, 'caps the returned horizon; <= chunk_size'),
    ConfigField('max_state_dim', IMPLEMENTED, 'the state is zero-padded to it; must equal the base model\'s'),
    ConfigField('max_action_dim', IMPLEMENTED, 'the action width; must equal the base model\'s'),
    ConfigField('normalization_mapping', METADATA, 'not consulted: GR00T normalises in its own processor steps'),
    ConfigField('base_model_path', IMPLEMENTED, 'the base model folder: its config.json is the architecture'),
    ConfigField('action_decode_transform', IMPLEMENTED, "none, or 'libero' (the LIBERO gripper sign), "
                "'auto' as lerobot resolves it"),
    ConfigField('embodiment_tag', IMPLEMENTED, 'selects the embodiment\'s encoder/decoder weights; must be in the '
                'pre-processor\'s embodiment_mapping'),
    ConfigField('tune_llm', TRAINING, 'fine-tuning'),
    ConfigField('tune_visual', TRAINING, 'fine-tuning'),
    ConfigField('tune_projector', TRAINING, 'fine-tuning'),
    ConfigField('tune_diffusion_model', TRAINING, 'fine-tuning'),
    ConfigField('tune_vlln', TRAINING, 'fine-tuning'),
    ConfigField('tune_top_llm_layers', TRAINING, 'fine-tuning'),
    ConfigField('num_inference_timesteps', IMPLEMENTED, "Euler steps (null: the base model's; the node's "
                'num_steps parameter overrides)'),
    ConfigField('rtc_ramp_rate', IMPLEMENTED, "GR00T's real-time chunking ramp (null: the base model's)"),
    ConfigField('use_flash_attention', METADATA, 'an attention kernel lerobot treats as numerically SDPA'),
    ConfigField('use_relative_actions', DEFAULT_ONLY, 'relative actions are not implemented for GR00T',
                accepted=(False,)),
    ConfigField('relative_exclude_joints', METADATA, 'read only with use_relative_actions (refused)'),
    ConfigField('optimizer_lr', TRAINING, 'optimizer'),
    ConfigField('optimizer_betas', TRAINING, 'optimizer'),
    ConfigField('optimizer_eps', TRAINING, 'optimizer'),
    ConfigField('optimizer_weight_decay', TRAINING, 'optimizer'),
    ConfigField('warmup_ratio', TRAINING, 'learning-rate schedule'),
    ConfigField('use_bf16', METADATA, "lerobot's bf16 autocast switch; the node's dtype parameter sets the "
                'precision (bfloat16 is that autocast recipe)'),
    ConfigField('model_params_fp32', METADATA, 'parameters are held in fp32 here in every dtype, as this does'),
    ConfigField('image_size', METADATA, 'deprecated; the pre-processor\'s geometry decides'),
    ConfigField('tokenizer_assets_repo', DEFAULT_ONLY, 'a GR00T N1.5 field (lerobot refuses it too)',
                accepted=(None,)),
    ConfigField('lora_rank', METADATA, 'never wired in lerobot (deprecated)'),
    ConfigField('lora_alpha', METADATA, 'never wired in lerobot (deprecated)'),
    ConfigField('lora_dropout', METADATA, 'never wired in lerobot (deprecated)'),
    ConfigField('lora_full_model', METADATA, 'never wired in lerobot (deprecated)'),
    *(ConfigField(name, TRAINING, 'Isaac-GR00T runner setting (deprecated)')
      for name in ('video_backend', 'balance_dataset_weights', 'balance_trajectory_weights', 'dataset_paths',
                   'output_dir', 'save_steps', 'max_steps', 'batch_size', 'dataloader_num_workers', 'report_to',
                   'resume')),
))

# The GR00TN17Config keys lerobot's N1.7 model reads (groot_n1_7.py), and what they do here.
BASE_CONFIG_FIELDS: Dict[str, ConfigField] = table((
    ConfigField('model_type', DEFAULT_ONLY, 'a GR00T N1.7 base config', accepted=(BASE_MODEL_TYPE,)),
    ConfigField('model_name', IMPLEMENTED, 'the backbone: the built-in Cosmos-Reason2-2B config or a local folder'),
    ConfigField('backbone_model_type', DEFAULT_ONLY, 'a Qwen3-VL backbone', accepted=('qwen',)),
    ConfigField('select_layer', IMPLEMENTED, 'text layers kept'),
    ConfigField('backbone_embedding_dim', IMPLEMENTED, 'the backbone width (must be the text width)'),
    ConfigField('max_state_dim', IMPLEMENTED, 'state encoder input'),
    ConfigField('max_action_dim', IMPLEMENTED, 'action width'),
    ConfigField('action_horizon', IMPLEMENTED, 'actions per chunk (the noise shape)'),
    ConfigField('hidden_size', IMPLEMENTED, 'state encoder / action decoder hidden width'),
    ConfigField('input_embedding_dim', IMPLEMENTED, 'action token width'),
    ConfigField('state_history_length', DEFAULT_ONLY, 'one state per observation', accepted=(1,)),
    ConfigField('add_pos_embed', IMPLEMENTED, 'learned position embedding of the action tokens'),
    ConfigField('use_vlln', IMPLEMENTED, 'LayerNorm on the backbone features'),
    ConfigField('max_seq_len', IMPLEMENTED, 'position embedding rows'),
    ConfigField('use_alternate_vl_dit', DEFAULT_ONLY, 'only the AlternateVLDiT is implemented', accepted=(True,)),
    ConfigField('attend_text_every_n_blocks', IMPLEMENTED, 'text / image cross blocks'),
    ConfigField('diffusion_model_cfg', IMPLEMENTED, 'the DiT (checked field by field)'),
    ConfigField('vl_self_attention_cfg', IMPLEMENTED, 'the self-attention over the backbone features'),
    ConfigField('num_inference_timesteps', IMPLEMENTED, 'Euler steps'),
    ConfigField('num_timestep_buckets', IMPLEMENTED, 'time discretisation'),
    ConfigField('max_num_embodiments', IMPLEMENTED, 'embodiment slices of the category-specific weights'),
    ConfigField('rtc_ramp_rate', IMPLEMENTED, "GR00T's real-time chunking ramp"),
))


@dataclass(frozen=True)
class GrootHead:
    """The action head and backbone cut of a GR00T N1.7 base config (GR00T_N1_7_DEFAULTS)."""

    model_name: str = COSMOS_REASON2_2B
    select_layer: int = 16
    backbone_embedding_dim: int = 2048
    hidden_size: int = 1024
    input_embedding_dim: int = 1536
    action_horizon: int = 40
    max_state_dim: int = 132
    max_action_dim: int = 132
    max_num_embodiments: int = 32
    max_seq_len: int = 1024
    add_pos_embed: bool = True
    use_vlln: bool = True
    dit: DiTSize = DiTSize()
    vl_self_attention: SelfAttentionSize = SelfAttentionSize()
    num_inference_timesteps: int = 4
    num_timestep_buckets: int = 1000
    rtc_ramp_rate: float = 6.0

    @classmethod
    def from_base_config(cls, raw: Mapping[str, Any], source: str) -> 'GrootHead':
        check_fields({k: v for k, v in raw.items() if k in BASE_CONFIG_FIELDS}, BASE_CONFIG_FIELDS, 'GR00T N1.7 base',
                     'GR00TN17Config')
        dit_raw = dict(raw.get('diffusion_model_cfg') or {})
        vl_raw = dict(raw.get('vl_self_attention_cfg') or {})
        for name, block, wanted in (('diffusion_model_cfg', dit_raw, {'positional_embeddings': None,
                                                                      'norm_type': 'ada_norm',
                                                                      'interleave_self_attention': True}),
                                    ('vl_self_attention_cfg', vl_raw, {'positional_embeddings': None})):
            for key, value in wanted.items():
                if block.get(key, value) != value:
                    raise ConfigError(f'{source}: {name}.{key} = {json.dumps(block.get(key))} is not implemented '
                                      f'(only {json.dumps(value)})')
        try:
            head = cls(
                model_name=str(raw.get('model_name', COSMOS_REASON2_2B)),
                select_layer=int(raw.get('select_layer', 16)),
                backbone_embedding_dim=int(raw.get('backbone_embedding_dim', 2048)),
                hidden_size=int(raw.get('hidden_size', 1024)),
                input_embedding_dim=int(raw.get('input_embedding_dim', 1536)),
                action_horizon=int(raw.get('action_horizon', 40)),
                max_state_dim=int(raw.get('max_state_dim', 132)), max_action_dim=int(raw.get('max_action_dim', 132)),
                max_num_embodiments=int(raw.get('max_num_embodiments', 32)),
                max_seq_len=int(raw.get('max_seq_len', 1024)),
                add_pos_embed=bool(raw.get('add_pos_embed', True)), use_vlln=bool(raw.get('use_vlln', True)),
                dit=DiTSize(num_layers=int(dit_raw.get('num_layers', 32)),
                            num_heads=int(dit_raw.get('num_attention_heads', 32)),
                            head_dim=int(dit_raw.get('attention_head_dim', 48)),
                            output_dim=int(dit_raw.get('output_dim', 1024)),
                            attend_text_every_n_blocks=int(raw.get('attend_text_every_n_blocks', 2))),
                vl_self_attention=SelfAttentionSize(num_layers=int(vl_raw.get('num_layers', 4)),
                                                    num_heads=int(vl_raw.get('num_attention_heads', 32)),
                                                    head_dim=int(vl_raw.get('attention_head_dim', 64))),
                num_inference_timesteps=int(raw.get('num_inference_timesteps', 4)),
                num_timestep_buckets=int(raw.get('num_timestep_buckets', 1000)),
                rtc_ramp_rate=float(raw.get('rtc_ramp_rate', 6.0)))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f'{source} is malformed: {exc!r}') from exc
        return head

    def to_base_config(self) -> Dict[str, Any]:
        """A base config.json as GR00TN17.save_pretrained writes it (GR00T_N1_7_DEFAULTS with these sizes)."""
        return {
            'action_horizon': self.action_horizon, 'add_pos_embed': self.add_pos_embed,
            'apply_sincos_state_encoding': False, 'architectures': ['GR00TN17'], 'attend_text_every_n_blocks':
            self.dit.attend_text_every_n_blocks, 'attn_dropout': 0.2,
            'backbone_embedding_dim': self.backbone_embedding_dim, 'backbone_model_type': 'qwen',
            'backbone_trainable_params_fp32': True, 'color_jitter_params': None, 'crop_fraction': None,
            'diffusion_model_cfg': {'attention_head_dim': self.dit.head_dim, 'dropout': 0.2, 'final_dropout': True,
                                    'interleave_self_attention': True, 'norm_type': 'ada_norm',
                                    'num_attention_heads': self.dit.num_heads, 'num_layers': self.dit.num_layers,
                                    'output_dim': self.dit.output_dim, 'positional_embeddings': None},
            'dtype': 'float32', 'exclude_state': False, 'extra_augmentation_config': None,
            'formalize_language': True, 'hidden_size': self.hidden_size, 'image_crop_size': [230, 230],
            'image_target_size': [256, 256], 'input_embedding_dim': self.input_embedding_dim, 'load_bf16': False,
            'max_action_dim': self.max_action_dim, 'max_num_embodiments': self.max_num_embodiments,
            'max_seq_len': self.max_seq_len, 'max_state_dim': self.max_state_dim, 'model_dtype': 'bfloat16',
            'model_name': self.model_name, 'model_revision': None, 'model_type': BASE_MODEL_TYPE,
            'noise_beta_alpha': 1.5, 'noise_beta_beta': 1.0, 'noise_s': 0.999,
            'num_inference_timesteps': self.num_inference_timesteps,
            'num_timestep_buckets': self.num_timestep_buckets, 'random_rotation_angle': None,
            'reproject_vision': False, 'rtc_ramp_rate': self.rtc_ramp_rate, 'select_layer': self.select_layer,
            'shortest_image_edge': None, 'state_dropout_prob': 0.2, 'state_history_length': 1,
            'tune_diffusion_model': True, 'tune_llm': False, 'tune_projector': True, 'tune_top_llm_layers': 0,
            'tune_visual': False, 'tune_vlln': True, 'use_albumentations_transforms': True,
            'use_alternate_vl_dit': True, 'use_flash_attention': False, 'use_mean_std': False,
            'use_percentiles': True, 'use_relative_action': False, 'use_vlln': self.use_vlln,
            'vl_self_attention_cfg': {'attention_head_dim': self.vl_self_attention.head_dim, 'dropout': 0.2,
                                      'final_dropout': True, 'num_attention_heads': self.vl_self_attention.num_heads,
                                      'num_layers': self.vl_self_attention.num_layers, 'positional_embeddings': None},
        }


@dataclass(frozen=True)
class ActionDecode:
    """The post-processor's decode (processor.py): clip to [-1, 1], inverse min/max, cut to env_action_dim, the
    optional LIBERO gripper sign."""

    clip: bool = True
    normalize: bool = True
    libero_gripper: bool = False
    libero_binarize: bool = True
    gripper_index: int = -1                     # the gripper column of the decoded action (LIBERO transform)


@dataclass(frozen=True, kw_only=True)
class GrootConfig(PolicyLevelConfig):
    """Everything to build a GR00T N1.7 model and its pre/post-processing. ``camera_names`` are in the model's
    order (the checkpoint's video modality keys); ``image_resolution`` is the model image (after smart_resize);
    ``chunk_size`` is the model's action horizon (the noise [1, chunk_size, max_action_dim]) and
    ``n_action_steps`` the horizon lerobot returns."""

    backbone: Qwen3VLBackbone
    head: GrootHead
    geometry: ImageGeometry = ImageGeometry()
    policy_type: str = GROOT_TYPE
    camera_names: Tuple[str, ...] = ('front', 'wrist')
    image_resolution: Tuple[int, int] = (256, 256)
    state_dim: int = 6
    action_dim: int = 6
    chunk_size: int = 40
    n_action_steps: int = 40
    max_state_dim: int = 132
    max_action_dim: int = 132
    num_inference_steps: int = 4
    normalization_mapping: Mapping[str, str] = field(default_factory=lambda: {
        'VISUAL': 'IDENTITY', 'STATE': 'IDENTITY', 'ACTION': 'IDENTITY'})
    base_model_path: str = GROOT_N1_7_BASE_MODEL
    tokenizer_name: str = COSMOS_REASON2_2B     # the VLM-encode step's model_name (the tokenizer folder)
    embodiment_tag: str = 'new_embodiment'
    embodiment_id: int = 10
    formalize_language: bool = True
    rtc_ramp_rate: float = 6.0
    decode: ActionDecode = ActionDecode()
    action_decode_transform: Optional[str] = None

    def __post_init__(self) -> None:
        if self.tokenizer_max_length != self.prompt_capacity:
            object.__setattr__(self, 'tokenizer_max_length', self.prompt_capacity)
        problem = self.policy_level_problems() or self._architecture_problem()
        if problem:
            raise ConfigError(problem)

    def _architecture_problem(self) -> Optional[str]:
        head, text = self.head, self.backbone.text
        if not 0 < head.select_layer <= text.depth:
            return f'select_layer {head.select_layer} must be in [1, {text.depth}] (the backbone\'s text layers)'
        if head.backbone_embedding_dim != text.width:
            return (f'backbone_embedding_dim {head.backbone_embedding_dim} differs from the backbone width '
                    f'{text.width} (lerobot has no projection between them)')
        if head.vl_self_attention.num_layers and head.vl_self_attention.width != head.backbone_embedding_dim:
            return (f'vl_self_attention width {head.vl_self_attention.width} differs from backbone_embedding_dim '
                    f'{head.backbone_embedding_dim}')
        if head.dit.output_dim != head.hidden_size:
            return f'diffusion_model_cfg.output_dim {head.dit.output_dim} must be hidden_size {head.hidden_size}'
        if head.dit.width != head.input_embedding_dim or head.input_embedding_dim % 2:
            return (f'the DiT width {head.dit.width} must be input_embedding_dim {head.input_embedding_dim} '
                    '(and even: sin-cos time encoding)')
        if head.dit.num_layers % 2 or head.dit.num_layers < 2:
            return 'the AlternateVLDiT needs an even number of layers'
        if head.add_pos_embed and head.action_horizon > head.max_seq_len:
            return f'action_horizon {head.action_horizon} exceeds max_seq_len {head.max_seq_len}'
        if (self.chunk_size, self.max_state_dim, self.max_action_dim) != (head.action_horizon, head.max_state_dim,
                                                                          head.max_action_dim):
            return ('config.json max_state_dim / max_action_dim must be the base model\'s '
                    f'({head.max_state_dim} / {head.max_action_dim}); the chunk is its action_horizon '
                    f'{head.action_horizon}')
        if not 0 <= self.embodiment_id < head.max_num_embodiments:
            return (f'embodiment {self.embodiment_tag!r} has id {self.embodiment_id}, outside the model\'s '
                    f'{head.max_num_embodiments} embodiments')
        vision = self.backbone.vision
        geometry = self.geometry
        if (geometry.patch_size, geometry.merge_size, geometry.temporal_patch_size) != (
                vision.patch_size, vision.merge_size, vision.temporal_patch_size):
            return (f'the image processor cuts {geometry.patch_size}-pixel patches (merge {geometry.merge_size}, '
                    f'temporal {geometry.temporal_patch_size}) but the ViT takes {vision.patch_size} (merge '
                    f'{vision.merge_size}, temporal {vision.temporal_patch_size})')
        if self.image_resolution != geometry.model_size:
            return f'image_resolution {self.image_resolution} is not the processor\'s {geometry.model_size}'
        if self.empty_cameras:
            return 'GR00T has no empty cameras'
        return geometry.problem()

    # ---- derived sizes ---------------------------------------------------------------------------
    @property
    def text(self):
        return self.backbone.text

    @property
    def tokens_per_image(self) -> int:
        return self.geometry.tokens_per_image

    @property
    def image_tokens(self) -> int:
        """Image tokens of one prompt (every camera, one frame each)."""
        return len(self.camera_names) * self.tokens_per_image

    @property
    def prompt_capacity(self) -> int:
        """The longest prompt taken: the image tokens and MAX_TEXT_TOKENS of template and task."""
        return self.image_tokens + MAX_TEXT_TOKENS

    @property
    def prefix_len(self) -> int:
        """The longest cached prefix: the whole prompt (images are tokens of it)."""
        return self.tokenizer_max_length

    @property
    def num_prefix_layers(self) -> int:
        return self.head.select_layer

    @property
    def vocab_size(self) -> int:
        return self.backbone.text.vocab_size

    @property
    def cross_blocks(self) -> Tuple[int, ...]:
        return self.head.dit.cross_blocks

    def kv_entry_bytes(self, dtype_bytes: int) -> int:
        """One cache entry at the longest prompt bucket, every tensor but its masks (model.py's context): each cross
        block's K/V over its token subset (the compute dtype; the text subset padded to the bucket) and the
        processed features (fp32: vlln and vl_self_attention keep the residual stream fp32 under autocast)."""
        head, prefix = self.head, self.prefix_len
        text_tokens = prefix - self.image_tokens
        cross = 0
        for index in self.cross_blocks:
            tokens = text_tokens if head.dit.attends_text(index) else self.image_tokens
            cross += 2 * tokens * head.dit.width * dtype_bytes
        return cross + prefix * head.backbone_embedding_dim * 4

    def cache_entry_bytes(self, dtype_bytes: int) -> int:
        """kv_entry_bytes and the three bool masks: the prompt's [1, P], the text subset's [1, P - I] and the
        image tokens' [1, I]."""
        return self.kv_entry_bytes(dtype_bytes) + 2 * self.prefix_len
