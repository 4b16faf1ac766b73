"""A GR00T N1.7 fine-tune on disk: finding its parts without the network, building its config, writing one.

Reading (lerobot 7427f318 ``policies/groot/``; nothing is downloaded):

    <folder>/config.json, model.safetensors, policy_{pre,post}processor.json and their state files
    base_model_path      a folder, or a Hub id found in the Hugging Face cache (``$HF_HUB_CACHE``, else
                         ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``); only its config.json is read (the
                         fine-tune's model.safetensors holds every weight); its processor_config.json, when present,
                         caps the returned horizon as lerobot's _resolve_prediction_horizon does
    model_name           nvidia/Cosmos-Reason2-2B: lerobot's built-in config; else a folder (or cached Hub id) with
                         the Qwen3-VL config.json
    the processor folder the VLM-encode step's model_name, or the ``tokenizer_path`` given: tokenizer.json,
                         tokenizer_config.json (chat template), preprocessor_config.json (image processor)

A Hub id that is not on disk is refused with the folder to pass. Writing (``write_groot_folder``) produces what
lerobot's GrootPolicy.save_pretrained and the processors' save_pretrained write, plus the base model folder
(config.json and model.safetensors, as GR00TN17.save_pretrained) and the processor folder it points at.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy_file
from safetensors.torch import save_file as save_torch_file

from ...checkpoint import (CONFIG_FILE, POSTPROCESSOR_FILE, PREPROCESSOR_FILE, WEIGHTS_FILE, WeightKeys,
                           read_json_object)
from ...config_fields import ConfigError, check_fields, feature_documents, features
from ...family import EMPTY_CAMERA_PREFIX
from ...normalize import flatten_stats
from ...tokenizer import HF_TOKENIZER_FILE
from .config import (GROOT_CONFIG_FIELDS, GROOT_TYPE, ActionDecode, GrootConfig, GrootHead)
from .images import ImageGeometry
from .processor import (DEVICE_STEP, ENCODE_STEP, FLAT_DECODE_STEP, LIBERO, PACK_STEP, GrootProcessors,
                        read_processors)
from .qwen3vl import KNOWN_BACKBONES, Qwen3VLBackbone
from .tiny_tokenizer import PREPROCESSOR_CONFIG_FILE, TOKENIZER_CONFIG_FILE

WEIGHT_PREFIX = '_groot_model.'
EMBED_KEY = 'backbone.model.model.language_model.embed_tokens.weight'
LM_HEAD_KEY = 'backbone.model.lm_head.weight'
FINAL_NORM_KEY = 'backbone.model.model.language_model.norm.weight'
BASE_PROCESSOR_CONFIG = 'processor_config.json'
# Where the node also looks for the processor folder (the doctor's fetch command writes there), as for the other
# families' tokenizer/.
TOKENIZER_SUBFOLDER = 'tokenizer'
# lerobot saves the policy with safetensors' save_model: the tied embedding is kept once, under the lm_head's name.
WEIGHT_KEYS = WeightKeys(renames=((r'^_groot_model\.', ''),),
                         known_unused=lambda key: key in (LM_HEAD_KEY, FINAL_NORM_KEY),
                         stand_ins={EMBED_KEY: LM_HEAD_KEY})
# lerobot processor_groot.py N1_7_EMBODIMENT_MAPPING (what the pack step saves by default).
EMBODIMENT_MAPPING = {
    'oxe_droid_relative_eef_relative_joint': 24, 'xdof_relative_eef_relative_joint': 27,
    'xdof_relative_eef_relative_joint_subtask': 27, 'real_g1_relative_eef_relative_joints': 25,
    'real_r1_pro_sharpa_relative_eef': 26, 'real_r1_pro_sharpa_relative_eef_human': 26,
    'real_r1_pro_sharpa_relative_eef_maxinsights': 26, 'real_r1_pro_sharpa_relative_eef_mecka': 26,
    'unitree_g1_full_body_with_waist_height_nav_cmd': 25, 'simpler_env_google': 0, 'simpler_env_widowx': 1,
    'libero_sim': 2, 'new_embodiment': 10}
# Qwen/Qwen3-VL-2B-Instruct's preprocessor_config.json: what the doctor assumes when the processor folder is absent.
DEFAULT_IMAGE_PROCESSOR = {'patch_size': 16, 'merge_size': 2, 'temporal_patch_size': 2,
                           'size': {'shortest_edge': 65536, 'longest_edge': 16777216},
                           'image_mean': [0.5, 0.5, 0.5], 'image_std': [0.5, 0.5, 0.5]}


# ---- finding things on disk -------------------------------------------------------------------------------------

def hub_cache(environ: Optional[Mapping[str, str]] = None) -> Path:
    """huggingface_hub's cache folder (constants.HF_HUB_CACHE's rule)."""
    environ = os.environ if environ is None else environ
    if environ.get('HF_HUB_CACHE'):
        return Path(environ['HF_HUB_CACHE']).expanduser()
    home = environ.get('HF_HOME') or str(Path(environ.get('XDG_CACHE_HOME') or '~/.cache') / 'huggingface')
    return Path(home).expanduser() / 'hub'


def cached_snapshot(repo_id: str, environ: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """The snapshot folder of ``repo_id`` in the Hub cache (refs/main, else the only snapshot), or None."""
    repo = hub_cache(environ) / ('models--' + repo_id.replace('/', '--'))
    ref = repo / 'refs' / 'main'
    if ref.is_file():
        snapshot = repo / 'snapshots' / ref.read_text().strip()
        return snapshot if snapshot.is_dir() else None
    snapshots = sorted(p for p in (repo / 'snapshots').glob('*') if p.is_dir()) if repo.is_dir() else []
    return snapshots[0] if len(snapshots) == 1 else None


def local_folder(name: str, what: str, needs: str, how: str) -> Path:
    """``name`` as a folder on disk (a path, or a Hub id in the cache); ConfigError saying which folder to pass."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    snapshot = cached_snapshot(name) if '/' in name and not name.startswith(('/', '.')) else None
    if snapshot is not None:
        return snapshot
    raise ConfigError(f'{what} {name!r} is not a folder on this machine and not in the Hugging Face cache '
                      f'({hub_cache()}); nothing is downloaded. Fetch it ({needs}) and {how}')


def base_folder(raw: Mapping[str, Any]) -> Path:
    name = str(raw.get('base_model_path') or 'nvidia/GR00T-N1.7-3B')
    return local_folder(name, 'base_model_path', f'`hf download {name} config.json` is enough: only its '
                        'config.json is read', 'set base_model_path in config.json to its folder (absolute path)')


def backbone_config(model_name: str) -> Qwen3VLBackbone:
    if model_name.rstrip('/') in KNOWN_BACKBONES:
        return KNOWN_BACKBONES[model_name.rstrip('/')]
    folder = local_folder(model_name, 'the base model\'s model_name', f'`hf download {model_name} config.json`',
                          'set model_name in the base model\'s config.json to its folder (absolute path)')
    return Qwen3VLBackbone.from_hf_config(read_json_object(folder / CONFIG_FILE), str(folder / CONFIG_FILE))


def find_processor_folder(folder: Path, processors: GrootProcessors) -> Optional[Path]:
    """The VLM-encode step's model_name as a folder on disk (a path, or a Hub id in the Hugging Face cache), else
    <folder>/tokenizer/ when it holds a tokenizer.json (where the doctor's fetch command puts the files); None."""
    try:
        return local_folder(processors.tokenizer_name, '', '', '')
    except ConfigError:
        pass
    local = Path(folder) / TOKENIZER_SUBFOLDER
    return local if (local / HF_TOKENIZER_FILE).is_file() else None


def processor_folder_problem(folder: Path, processors: GrootProcessors) -> str:
    """Why no processor folder was found: where it was looked for, and the fetch."""
    name = processors.tokenizer_name
    return (f'the {ENCODE_STEP} model_name {name!r} is not a folder on this machine nor in the Hugging Face cache '
            f'({hub_cache()}), and {Path(folder) / TOKENIZER_SUBFOLDER} holds no {HF_TOKENIZER_FILE}; nothing is '
            f'downloaded. {name} is the backbone\'s processor folder (tokenizer.json, tokenizer_config.json with the '
            'chat template, preprocessor_config.json): a gated repository (accept its licence on huggingface.co); '
            f'fetch it into {Path(folder) / TOKENIZER_SUBFOLDER}')


def image_processor_settings(folder: Optional[Path]) -> Dict[str, Any]:
    """preprocessor_config.json of the processor folder (Qwen3-VL's defaults when ``folder`` is None)."""
    if folder is None:
        return dict(DEFAULT_IMAGE_PROCESSOR)
    return read_json_object(folder / PREPROCESSOR_CONFIG_FILE)


def checkpoint_horizon(base: Path, embodiment_tag: str) -> Optional[int]:
    """infer_groot_n1_7_action_horizon: len(action delta_indices) of the base folder's processor_config.json."""
    path = base / BASE_PROCESSOR_CONFIG
    if not path.is_file():
        return None
    try:
        kwargs = json.loads(path.read_text()).get('processor_kwargs', {})
        deltas = kwargs['modality_configs'][embodiment_tag]['action']['delta_indices']
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return len(deltas) if isinstance(deltas, list) and deltas else None


# ---- the config -------------------------------------------------------------------------------------------------

def ordered_cameras(cameras: List[str], keys: Optional[Tuple[str, ...]]) -> Tuple[str, ...]:
    """GrootN17PackInputsStep._ordered_image_keys: the checkpoint's video modality keys in order (``wrist_image``
    also matches ``image2``), cameras matching none dropped; without keys, or when none matches, alphabetical."""
    if not keys:
        return tuple(sorted(cameras))
    ordered = []
    for key in keys:
        candidates = [key] + (['image2'] if key == 'wrist_image' else [])
        match = next((name for name in candidates if name in cameras), None)
        if match is not None:
            ordered.append(match)
    return tuple(ordered) if ordered else tuple(sorted(cameras))


def geometry_from(processors: GrootProcessors, settings: Mapping[str, Any]) -> ImageGeometry:
    if processors.target_size is None:
        raise ConfigError(f'{ENCODE_STEP} image_target_size is null: the frames would reach the model unresized; '
                          'not implemented')
    size = dict(settings.get('size') or {})
    min_pixels = settings.get('min_pixels', size.get('shortest_edge', 56 * 56))
    max_pixels = settings.get('max_pixels', size.get('longest_edge', 28 * 28 * 1280))
    if settings.get('resample', 3) != 3:
        raise ConfigError(f'{PREPROCESSOR_CONFIG_FILE} resample {settings.get("resample")} is not implemented '
                          '(bicubic, 3)')
    if not settings.get('do_rescale', True) or not settings.get('do_normalize', True):
        raise ConfigError(f'{PREPROCESSOR_CONFIG_FILE}: do_rescale and do_normalize off are not implemented')
    return ImageGeometry(
        target_size=processors.target_size, crop_size=processors.crop_size,
        shortest_image_edge=processors.shortest_image_edge, crop_fraction=processors.crop_fraction,
        patch_size=int(settings.get('patch_size', 14)), merge_size=int(settings.get('merge_size', 2)),
        temporal_patch_size=int(settings.get('temporal_patch_size', 2)), min_pixels=int(min_pixels),
        max_pixels=int(max_pixels), do_resize=bool(settings.get('do_resize', True)),
        image_mean=tuple(float(v) for v in settings.get('image_mean', (0.48145466, 0.4578275, 0.40821073))),
        image_std=tuple(float(v) for v in settings.get('image_std', (0.26862954, 0.26130258, 0.27577711))),
        rescale_factor=float(settings.get('rescale_factor', 1 / 255)))


def decode_transform(raw: Mapping[str, Any], tag: str) -> Optional[str]:
    """GrootConfig's action_decode_transform as lerobot resolves it ('auto': libero for libero_sim)."""
    value = raw.get('action_decode_transform', 'auto')
    name = None if value is None else str(value).lower()
    if name in (None, 'none', ''):
        return None
    if name == 'auto':
        return LIBERO if tag == 'libero_sim' else None
    if name == LIBERO:
        return LIBERO
    raise ConfigError(f'config.json action_decode_transform {json.dumps(value)} is not a GR00T N1.7 transform '
                      '(none, auto, libero)')


def build_config(folder: Path, raw: Mapping[str, Any], processor_dir: Optional[Path]) -> GrootConfig:
    """config.json + the base config + the backbone config + the processor files (+ the processor folder's image
    settings; Qwen3-VL's defaults when ``processor_dir`` is None) -> GrootConfig."""
    if raw.get('type') != GROOT_TYPE:
        raise ConfigError(f'config.json "type" must be {GROOT_TYPE!r}, got {raw.get("type")!r}')
    check_fields(raw, GROOT_CONFIG_FIELDS, GROOT_TYPE, 'GrootConfig')
    processors = read_processors(folder)
    base = base_folder(raw)
    head = GrootHead.from_base_config(read_json_object(base / CONFIG_FILE), str(base / CONFIG_FILE))
    backbone = backbone_config(head.model_name)
    geometry = geometry_from(processors, image_processor_settings(processor_dir))
    cameras, state_dim, action_dim = features(raw, EMPTY_CAMERA_PREFIX)
    tag = str(raw.get('embodiment_tag', 'new_embodiment'))
    if tag != processors.embodiment_tag:
        raise ConfigError(f'config.json embodiment_tag {tag!r} differs from the pre-processor\'s '
                          f'{processors.embodiment_tag!r}; lerobot would follow the pre-processor, so this checkpoint '
                          'is ambiguous')
    transform = decode_transform(raw, tag)
    if 0 < processors.env_action_dim < action_dim:
        raise ConfigError(f'the post-processor cuts actions to env_action_dim {processors.env_action_dim}, fewer than '
                          f'config.json\'s {action_dim}: not implemented')
    if processors.max_state_dim != head.max_state_dim:
        raise ConfigError(f'{PACK_STEP} max_state_dim {processors.max_state_dim} differs from the base model\'s '
                          f'{head.max_state_dim}')
    horizons = [head.action_horizon, int(raw.get('chunk_size', 40)), int(raw.get('n_action_steps', 40))]
    horizons += [h for h in (checkpoint_horizon(base, tag), processors.valid_horizon) if h is not None]
    steps = raw.get('num_inference_timesteps')
    ramp = raw.get('rtc_ramp_rate')
    gripper = None
    if transform == LIBERO:
        gripper = _libero_column(processors, action_dim)
    try:
        return GrootConfig(
            backbone=backbone, head=head, geometry=geometry,
            camera_names=ordered_cameras(cameras, processors.video_modality_keys),
            image_resolution=geometry.model_size, state_dim=state_dim, action_dim=action_dim,
            chunk_size=head.action_horizon, n_action_steps=max(1, min(h for h in horizons if h > 0)),
            max_state_dim=int(raw.get('max_state_dim', 132)), max_action_dim=int(raw.get('max_action_dim', 132)),
            num_inference_steps=int(steps) if steps is not None else head.num_inference_timesteps,
            base_model_path=str(raw.get('base_model_path')), tokenizer_name=processors.tokenizer_name,
            embodiment_tag=tag, embodiment_id=processors.embodiment_id,
            formalize_language=processors.formalize_language,
            rtc_ramp_rate=float(ramp) if ramp is not None else head.rtc_ramp_rate,
            decode=ActionDecode(clip=processors.clip_action, normalize=processors.normalize_action,
                                libero_gripper=transform == LIBERO, libero_binarize=processors.libero_binarize,
                                gripper_index=-1 if gripper is None else gripper),
            action_decode_transform=transform)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f'config.json is malformed: {exc!r}') from exc


def _libero_column(processors: GrootProcessors, action_dim: int) -> int:
    """The column the LIBERO transform rewrites: the last (flat decode, 7 columns or more) or the 'gripper' group."""
    if processors.gripper_group is None:
        if action_dim < 7:
            raise ConfigError('action_decode_transform libero needs at least 7 action columns')
        return action_dim - 1
    start, end = processors.gripper_group
    if end - start != 1 or end > action_dim:
        raise ConfigError('action_decode_transform libero needs a scalar gripper group within the action')
    return start


# ---- writing -------------------------------------------------------------------------------------------------

def groot_config_document(config: GrootConfig) -> Dict[str, Any]:
    """config.json as lerobot 0.6.2 writes a GrootConfig (GrootPolicy.save_pretrained)."""
    height, width = config.image_resolution
    return {
        'type': GROOT_TYPE, 'n_obs_steps': 1,
        **feature_documents(config.camera_names, (height, width), config.state_dim, config.action_dim),
        'device': 'cpu', 'use_amp': False, 'use_peft': False, 'push_to_hub': True, 'repo_id': None,
        'private': None, 'tags': None, 'license': None, 'pretrained_path': None, 'pretrained_revision': None,
        'chunk_size': config.n_action_steps, 'n_action_steps': config.n_action_steps,
        'max_state_dim': config.max_state_dim, 'max_action_dim': config.max_action_dim,
        'normalization_mapping': dict(config.normalization_mapping), 'base_model_path': config.base_model_path,
        'action_decode_transform': config.action_decode_transform, 'embodiment_tag': config.embodiment_tag,
        'tune_llm': False, 'tune_visual': False, 'tune_projector': True, 'tune_diffusion_model': True,
        'tune_vlln': True, 'tune_top_llm_layers': 0, 'num_inference_timesteps': None, 'rtc_ramp_rate': None,
        'use_flash_attention': False, 'use_relative_actions': False, 'relative_exclude_joints': [],
        'optimizer_lr': 0.0001, 'optimizer_betas': [0.9, 0.999], 'optimizer_eps': 1e-08,
        'optimizer_weight_decay': 1e-05, 'warmup_ratio': 0.05, 'use_bf16': True, 'model_params_fp32': True,
        'image_size': [256, 256], 'tokenizer_assets_repo': None, 'lora_rank': 0, 'lora_alpha': 16,
        'lora_dropout': 0.1, 'lora_full_model': False, 'video_backend': 'decord', 'balance_dataset_weights': True,
        'balance_trajectory_weights': True, 'dataset_paths': None, 'output_dir': './tmp/gr00t', 'save_steps': 1000,
        'max_steps': 10000, 'batch_size': 32, 'dataloader_num_workers': 8, 'report_to': 'wandb', 'resume': False,
    }


def processor_documents(config: GrootConfig, tokenizer_dir: Path) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """policy_preprocessor.json and policy_postprocessor.json as make_groot_pre_post_processors(config,
    dataset_stats) saves them (the VLM step's model_name set to the processor folder)."""
    geometry = config.geometry
    pack = {'state_horizon': 1, 'action_horizon': config.chunk_size, 'valid_action_horizon': config.chunk_size,
            'video_horizon': None, 'max_state_dim': config.max_state_dim, 'max_action_dim': config.max_action_dim,
            'language_key': 'task', 'formalize_language': config.formalize_language,
            'embodiment_tag': config.embodiment_tag, 'embodiment_mapping': dict(EMBODIMENT_MAPPING),
            'normalize_min_max': True, 'state_dropout_prob': 0.0, 'clip_outliers': True, 'use_percentiles': False,
            'video_modality_keys': None, 'raw_stats': {}, 'modality_config': {}}
    encode = {'model_name': str(tokenizer_dir), 'image_crop_size': list(geometry.crop_size or ()) or None,
              'image_target_size': list(geometry.target_size), 'shortest_image_edge': geometry.shortest_image_edge,
              'crop_fraction': geometry.crop_fraction, 'use_albumentations': False, 'letter_box_transform': False,
              'device': 'cpu'}
    device = {'registry_name': DEVICE_STEP, 'config': {'device': 'cpu', 'float_dtype': None}}
    pre = {'name': 'policy_preprocessor', 'steps': [
        {'registry_name': 'rename_observations_processor', 'config': {'rename_map': {}}},
        {'registry_name': 'to_batch_processor', 'config': {}},
        {'registry_name': PACK_STEP, 'config': pack,
         'state_file': f'policy_preprocessor_step_2_{PACK_STEP}.safetensors'},
        {'registry_name': ENCODE_STEP, 'config': encode}, device]}
    post = {'name': 'policy_postprocessor', 'steps': [
        {'registry_name': FLAT_DECODE_STEP, 'config': {
            'env_action_dim': config.action_dim, 'normalize_min_max': True, 'clip_normalized_action': True,
            'libero_gripper_action': config.decode.libero_gripper, 'libero_gripper_binarize': True},
         'state_file': f'policy_postprocessor_step_0_{FLAT_DECODE_STEP}.safetensors'}, device]}
    return pre, post


def write_groot_folder(folder: Path, config: GrootConfig, state: Mapping[str, torch.Tensor],
                       state_stats: Mapping[str, np.ndarray], action_stats: Mapping[str, np.ndarray],
                       tokenizer_file: Optional[Path], base_weights: bool = True) -> Path:
    """``folder`` as lerobot writes a GR00T fine-tune of ``config`` with the weights ``state`` (the model's state
    dict keys; their dtype is kept), plus ``folder/base_model`` (config.json and model.safetensors as
    GR00TN17.save_pretrained; ``backbone/config.json`` for a backbone other than Cosmos') and ``folder/processor``
    (the tokenizer folder of ``tokenizer_file``), both named by absolute path. ``base_weights`` False writes the
    base model's state-encoder bias alone (lerobot then initialises the rest, which the fine-tune's file replaces:
    the big benchmark shapes, where a second full copy would only cost disk and time)."""
    folder = Path(folder).resolve()
    base = folder / 'base_model'
    base.mkdir(parents=True, exist_ok=True)
    processor = folder / 'processor'
    model_name = config.head.model_name
    if model_name not in KNOWN_BACKBONES:
        (base / 'backbone').mkdir(exist_ok=True)
        (base / 'backbone' / CONFIG_FILE).write_text(json.dumps(config.backbone.to_hf_config(), indent=2) + '\n')
        model_name = str(base / 'backbone')
    head = GrootHead(**{**config.head.__dict__, 'model_name': model_name})
    config = GrootConfig(**{**{f: getattr(config, f) for f in config.__dataclass_fields__},
                            'head': head, 'base_model_path': str(base)})
    (base / CONFIG_FILE).write_text(json.dumps(head.to_base_config(), indent=2, sort_keys=True) + '\n')
    state = {key: value.detach().to('cpu').contiguous() for key, value in state.items()}
    state[FINAL_NORM_KEY] = torch.ones(config.backbone.text.width, dtype=state[EMBED_KEY].dtype)
    # GR00TN17.save_pretrained keeps the tied embedding under embed_tokens; the policy's safetensors save_model
    # keeps it under the lm_head's name (and records the alias in the metadata).
    stub = 'action_head.state_encoder.layer1.b'
    save_torch_file(state if base_weights else {stub: state[stub]}, str(base / WEIGHTS_FILE), metadata={'format': 'pt'})
    policy = {WEIGHT_PREFIX + (LM_HEAD_KEY if key == EMBED_KEY else key): value for key, value in state.items()}
    del state
    save_torch_file(policy, str(folder / WEIGHTS_FILE),
                    metadata={'format': 'pt', WEIGHT_PREFIX + EMBED_KEY: WEIGHT_PREFIX + LM_HEAD_KEY})
    del policy
    if tokenizer_file is not None:
        processor.mkdir(exist_ok=True)
        source = Path(tokenizer_file).parent
        for name in (HF_TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, PREPROCESSOR_CONFIG_FILE):
            if (source / name).is_file():
                (processor / name).write_bytes((source / name).read_bytes())
    (folder / CONFIG_FILE).write_text(json.dumps(groot_config_document(config), indent=4) + '\n')
    pre, post = processor_documents(config, processor)
    stats = flatten_stats({'observation.state': state_stats, 'action': action_stats})
    save_numpy_file(stats, str(folder / pre['steps'][2]['state_file']))
    save_numpy_file(stats, str(folder / post['steps'][0]['state_file']))
    (folder / PREPROCESSOR_FILE).write_text(json.dumps(pre, indent=2) + '\n')
    (folder / POSTPROCESSOR_FILE).write_text(json.dumps(post, indent=2) + '\n')
    return folder
