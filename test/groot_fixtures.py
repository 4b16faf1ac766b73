"""Test-only: a tiny random-weight GR00T N1.7 fine-tune in lerobot's exact layout, written apart from the package.

The layout is what lerobot 0.6.2 (huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b) writes for a GR00T
fine-tune (``GrootPolicy.save_pretrained`` and the processors' ``save_pretrained``, checked against a real save in
bench/compare_lerobot_groot.py), plus the folders it names by absolute path:

    <root>/policy/config.json                     GrootConfig, "type": "groot"
    <root>/policy/model.safetensors               "_groot_model.backbone.model.model.visual...", the tied embedding
                                                  under "_groot_model.backbone.model.lm_head.weight" (save_model)
    <root>/policy/policy_preprocessor.json        rename, to_batch, groot_n1_7_pack_inputs_v1, groot_n1_7_vlm_encode_v1,
                                                  device; the pack step's state file holds every statistic
    <root>/policy/policy_postprocessor.json       groot_action_unpack_unnormalize_v2 (flat) or
                                                  groot_n1_7_action_decode_v1 (the checkpoint's action groups), device
    <root>/base/config.json, model.safetensors    the base model (GR00TN17.save_pretrained: no "_groot_model." prefix)
    <root>/backbone/config.json                   the Qwen3-VL config the base config's model_name names
    <root>/processor/                             tokenizer.json, tokenizer_config.json (chat template),
                                                  preprocessor_config.json: the VLM-encode step's model_name

The tokenizer folder comes from the package's tiny-tokenizer builder (its output is checked against transformers'
AutoTokenizer / Qwen3VLProcessor by the bench). Weights come from numpy's PCG64 (the same on every machine and
torch version), scaled by 1/sqrt(fan_in) so activations stay O(1) and the actions are not all clipped.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy_file
from safetensors.torch import save_file as save_torch_file

from vla_policy_node.policy.families.groot.tiny_tokenizer import build_qwen_test_tokenizer, qwen_image_processor_config

CAMERAS = ('top', 'wrist')          # config.json order; the pack step's video_modality_keys put 'wrist' first
MODALITY_KEYS = ('wrist', 'top')
STATE_DIM = 5
ACTION_DIM = 4
FRAME_SHAPE = (40, 56, 3)

VISION = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=4, num_position_embeddings=36,
              out_hidden_size=32, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
              deepstack_visual_indexes=[0, 2], hidden_act='gelu_pytorch_tanh', in_channels=3)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=151936, rms_norm_eps=1e-6, hidden_act='silu', attention_bias=False,
            rope_parameters={'mrope_interleaved': True, 'mrope_section': [4, 2, 2], 'rope_theta': 5000000,
                             'rope_type': 'default'})
# select_layer 2 with two DeepStack taps: the features are layer 1's output before its tap is added (lerobot's hook).
HEAD = dict(select_layer=2, backbone_embedding_dim=32, hidden_size=24, input_embedding_dim=16, action_horizon=8,
            max_state_dim=12, max_action_dim=12, max_num_embodiments=12, max_seq_len=16,
            attend_text_every_n_blocks=2, num_inference_timesteps=4, rtc_ramp_rate=6.0,
            diffusion_model_cfg={'positional_embeddings': None, 'num_layers': 6, 'num_attention_heads': 2,
                                 'attention_head_dim': 8, 'norm_type': 'ada_norm', 'dropout': 0.2,
                                 'final_dropout': True, 'output_dim': 24, 'interleave_self_attention': True},
            vl_self_attention_cfg={'positional_embeddings': None, 'num_layers': 2, 'num_attention_heads': 4,
                                   'attention_head_dim': 8, 'dropout': 0.2, 'final_dropout': True})
# Image geometry of the VLM-encode step: a non-square target, so mRoPE's h and w differ (4 x 6 patches).
TARGET = [64, 96]
CROP = [57, 57]          # (64 - 57) / 2 is odd: the crop offset is floored, the size rounded

# Variants: name -> (postprocessor kind, embodiment tag, action_decode_transform).
VARIANTS = {'flat': ('flat', 'new_embodiment', None), 'groups': ('groups', 'libero_sim', 'libero')}
EMBODIMENTS = {'simpler_env_google': 0, 'simpler_env_widowx': 1, 'libero_sim': 2, 'new_embodiment': 10}


def base_config(model_name: str) -> Dict:
    """GR00TN17.save_pretrained's config.json with the tiny sizes (GR00T_N1_7_DEFAULTS otherwise)."""
    return dict({
        'model_dtype': 'bfloat16', 'dtype': 'float32', 'model_name': model_name, 'backbone_model_type': 'qwen',
        'model_revision': None, 'tune_top_llm_layers': 0, 'tune_llm': False, 'tune_visual': False,
        'reproject_vision': False, 'use_flash_attention': False, 'load_bf16': False,
        'backbone_trainable_params_fp32': True, 'image_crop_size': [230, 230], 'image_target_size': [256, 256],
        'shortest_image_edge': None, 'crop_fraction': None, 'random_rotation_angle': None,
        'color_jitter_params': None, 'use_albumentations_transforms': True, 'extra_augmentation_config': None,
        'formalize_language': True, 'apply_sincos_state_encoding': False, 'use_percentiles': True,
        'use_relative_action': False, 'state_history_length': 1, 'add_pos_embed': True, 'attn_dropout': 0.2,
        'use_vlln': True, 'use_alternate_vl_dit': True, 'noise_beta_alpha': 1.5, 'noise_beta_beta': 1.0,
        'noise_s': 0.999, 'num_timestep_buckets': 1000, 'tune_projector': True, 'tune_diffusion_model': True,
        'tune_vlln': True, 'state_dropout_prob': 0.2, 'exclude_state': False, 'use_mean_std': False,
        'architectures': ['GR00TN17'], 'model_type': 'Gr00tN1d7', 'transformers_version': '5.5.4'}, **HEAD)


def backbone_config() -> Dict:
    return {'architectures': ['Qwen3VLForConditionalGeneration'], 'model_type': 'qwen3_vl',
            'image_token_id': 151655, 'video_token_id': 151656, 'vision_start_token_id': 151652,
            'vision_end_token_id': 151653, 'tie_word_embeddings': True,
            'text_config': dict(TEXT, model_type='qwen3_vl_text', max_position_embeddings=4096),
            'vision_config': dict(VISION, model_type='qwen3_vl')}


def weight_shapes() -> Dict[str, Tuple[int, ...]]:
    """Every tensor of lerobot's GR00T N1.7 state dict (without the '_groot_model.' prefix) for the tiny sizes,
    spelled out from lerobot's module tree (groot_n1_7.py, cross_attention_dit.py) and transformers' Qwen3-VL."""
    shapes: Dict[str, Tuple[int, ...]] = {}
    v, t = VISION, TEXT
    width, patch = v['hidden_size'], v['patch_size']
    merged = width * v['spatial_merge_size'] ** 2
    visual = 'backbone.model.model.visual.'
    shapes[visual + 'patch_embed.proj.weight'] = (width, 3, v['temporal_patch_size'], patch, patch)
    shapes[visual + 'patch_embed.proj.bias'] = (width,)
    shapes[visual + 'pos_embed.weight'] = (v['num_position_embeddings'], width)
    for i in range(v['depth']):
        block = f'{visual}blocks.{i}.'
        for name, shape in (('norm1.weight', (width,)), ('norm1.bias', (width,)), ('norm2.weight', (width,)),
                            ('norm2.bias', (width,)), ('attn.qkv.weight', (3 * width, width)),
                            ('attn.qkv.bias', (3 * width,)), ('attn.proj.weight', (width, width)),
                            ('attn.proj.bias', (width,)), ('mlp.linear_fc1.weight', (v['intermediate_size'], width)),
                            ('mlp.linear_fc1.bias', (v['intermediate_size'],)),
                            ('mlp.linear_fc2.weight', (width, v['intermediate_size'])),
                            ('mlp.linear_fc2.bias', (width,))):
            shapes[block + name] = shape
    taps = len(v['deepstack_visual_indexes'])
    mergers = [visual + 'merger.'] + [f'{visual}deepstack_merger_list.{j}.' for j in range(taps)]
    for j, prefix in enumerate(mergers):
        norm = width if j == 0 else merged
        for name, shape in (('norm.weight', (norm,)), ('norm.bias', (norm,)), ('linear_fc1.weight', (merged, merged)),
                            ('linear_fc1.bias', (merged,)), ('linear_fc2.weight', (v['out_hidden_size'], merged)),
                            ('linear_fc2.bias', (v['out_hidden_size'],))):
            shapes[prefix + name] = shape
    text = 'backbone.model.model.language_model.'
    tw, hd = t['hidden_size'], t['head_dim']
    shapes['backbone.model.lm_head.weight'] = (t['vocab_size'], tw)      # the tied embedding, as save_model keeps it
    for i in range(HEAD['select_layer']):
        layer = f'{text}layers.{i}.'
        for name, shape in (('self_attn.q_proj.weight', (t['num_attention_heads'] * hd, tw)),
                            ('self_attn.k_proj.weight', (t['num_key_value_heads'] * hd, tw)),
                            ('self_attn.v_proj.weight', (t['num_key_value_heads'] * hd, tw)),
                            ('self_attn.o_proj.weight', (tw, t['num_attention_heads'] * hd)),
                            ('self_attn.q_norm.weight', (hd,)), ('self_attn.k_norm.weight', (hd,)),
                            ('mlp.gate_proj.weight', (t['intermediate_size'], tw)),
                            ('mlp.up_proj.weight', (t['intermediate_size'], tw)),
                            ('mlp.down_proj.weight', (tw, t['intermediate_size'])),
                            ('input_layernorm.weight', (tw,)), ('post_attention_layernorm.weight', (tw,))):
            shapes[layer + name] = shape
    shapes[text + 'norm.weight'] = (tw,)
    head = 'action_head.'
    dit = HEAD['diffusion_model_cfg']
    d = dit['num_attention_heads'] * dit['attention_head_dim']
    cross = HEAD['backbone_embedding_dim']
    shapes[head + 'model.timestep_encoder.timestep_embedder.linear_1.weight'] = (d, 256)
    shapes[head + 'model.timestep_encoder.timestep_embedder.linear_1.bias'] = (d,)
    shapes[head + 'model.timestep_encoder.timestep_embedder.linear_2.weight'] = (d, d)
    shapes[head + 'model.timestep_encoder.timestep_embedder.linear_2.bias'] = (d,)
    for i in range(dit['num_layers']):
        block = f'{head}model.transformer_blocks.{i}.'
        kv_in = d if i % 2 else cross
        for name, shape in (('norm1.linear.weight', (2 * d, d)), ('norm1.linear.bias', (2 * d,)),
                            ('attn1.to_q.weight', (d, d)), ('attn1.to_q.bias', (d,)),
                            ('attn1.to_k.weight', (d, kv_in)), ('attn1.to_k.bias', (d,)),
                            ('attn1.to_v.weight', (d, kv_in)), ('attn1.to_v.bias', (d,)),
                            ('attn1.to_out.0.weight', (d, d)), ('attn1.to_out.0.bias', (d,)),
                            ('ff.net.0.proj.weight', (4 * d, d)), ('ff.net.0.proj.bias', (4 * d,)),
                            ('ff.net.2.weight', (d, 4 * d)), ('ff.net.2.bias', (d,))):
            shapes[block + name] = shape
    shapes[head + 'model.proj_out_1.weight'] = (2 * d, d)
    shapes[head + 'model.proj_out_1.bias'] = (2 * d,)
    shapes[head + 'model.proj_out_2.weight'] = (dit['output_dim'], d)
    shapes[head + 'model.proj_out_2.bias'] = (dit['output_dim'],)
    e, s, a = HEAD['max_num_embodiments'], HEAD['max_state_dim'], HEAD['max_action_dim']
    hid, emb = HEAD['hidden_size'], HEAD['input_embedding_dim']
    for prefix, dims in (('state_encoder.layer1', (s, hid)), ('state_encoder.layer2', (hid, emb)),
                         ('action_encoder.W1', (a, emb)), ('action_encoder.W2', (2 * emb, emb)),
                         ('action_encoder.W3', (emb, emb)), ('action_decoder.layer1', (hid, hid)),
                         ('action_decoder.layer2', (hid, a))):
        shapes[f'{head}{prefix}.W'] = (e,) + dims
        shapes[f'{head}{prefix}.b'] = (e, dims[1])
    shapes[head + 'vlln.weight'] = (cross,)
    shapes[head + 'vlln.bias'] = (cross,)
    vl = HEAD['vl_self_attention_cfg']
    vw = vl['num_attention_heads'] * vl['attention_head_dim']
    for i in range(vl['num_layers']):
        block = f'{head}vl_self_attention.transformer_blocks.{i}.'
        for name, shape in (('norm1.weight', (vw,)), ('norm1.bias', (vw,)), ('attn1.to_q.weight', (vw, vw)),
                            ('attn1.to_q.bias', (vw,)), ('attn1.to_k.weight', (vw, vw)), ('attn1.to_k.bias', (vw,)),
                            ('attn1.to_v.weight', (vw, vw)), ('attn1.to_v.bias', (vw,)),
                            ('attn1.to_out.0.weight', (vw, vw)), ('attn1.to_out.0.bias', (vw,)),
                            ('norm3.weight', (vw,)), ('norm3.bias', (vw,)), ('ff.net.0.proj.weight', (4 * vw, vw)),
                            ('ff.net.0.proj.bias', (4 * vw,)), ('ff.net.2.weight', (vw, 4 * vw)),
                            ('ff.net.2.bias', (vw,))):
            shapes[block + name] = shape
    shapes[head + 'position_embedding.weight'] = (HEAD['max_seq_len'], emb)
    return shapes


def random_weights(seed: int) -> Dict[str, torch.Tensor]:
    """PCG64 normals: matrices / 1/sqrt(fan_in), norm weights 1 + 0.1 n, biases 0.05 n, tables 0.5 n."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes().items():
        noise = rng.standard_normal(shape, dtype=np.float32)
        leaf = name.rsplit('.', 1)[-1]
        if 'norm' in name and leaf == 'weight':
            value = 1.0 + 0.1 * noise
        elif leaf in ('bias', 'b'):
            value = 0.05 * noise
        elif len(shape) == 1:
            value = 0.05 * noise
        elif 'embed' in name or 'lm_head' in name or 'position_embedding' in name:
            value = 0.5 * noise
        else:
            fan_in = int(np.prod(shape[1:])) if not name.endswith('.W') else shape[1]
            # The velocity's last layer small: the actions stay mostly inside the clip range.
            value = noise / np.sqrt(fan_in) * (0.05 if name.endswith('action_decoder.layer2.W') else 1.0)
        out[name] = torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
    return out


def _stats(rng: np.random.Generator, dim: int, spread: float) -> Dict[str, np.ndarray]:
    low = (-spread * (1 + rng.random(dim))).astype(np.float32)
    high = (spread * (1 + rng.random(dim))).astype(np.float32)
    high[-1] = low[-1]                     # a constant dimension: normalised to 0, decoded to min
    return {'min': low, 'max': high, 'mean': ((low + high) / 2).astype(np.float32),
            'std': ((high - low) / 4 + 0.1).astype(np.float32), 'q01': (0.9 * low).astype(np.float32),
            'q99': (0.9 * high).astype(np.float32)}


def write_tiny_groot(root: Path, variant: str = 'flat', seed: int = 0, formalize_language: bool = True) -> Path:
    """The tiny fine-tune and the folders it names, under ``root``; returns the policy folder."""
    kind, tag, transform = VARIANTS[variant]
    root = Path(root).resolve()
    for sub in ('policy', 'base', 'backbone'):
        (root / sub).mkdir(parents=True, exist_ok=True)
    processor = root / 'processor'
    build_qwen_test_tokenizer(processor, image_processor=qwen_image_processor_config())
    (root / 'backbone' / 'config.json').write_text(json.dumps(backbone_config(), indent=2))
    (root / 'base' / 'config.json').write_text(json.dumps(base_config(str(root / 'backbone')), indent=2,
                                                          sort_keys=True))
    weights = random_weights(seed)
    base_weights = {('backbone.model.model.language_model.embed_tokens.weight'
                     if k == 'backbone.model.lm_head.weight' else k): v for k, v in weights.items()}
    save_torch_file(base_weights, str(root / 'base' / 'model.safetensors'), metadata={'format': 'pt'})
    save_torch_file({'_groot_model.' + k: v for k, v in weights.items()}, str(root / 'policy' / 'model.safetensors'),
                    metadata={'format': 'pt', '_groot_model.backbone.model.model.language_model.embed_tokens.weight':
                              '_groot_model.backbone.model.lm_head.weight'})
    policy = root / 'policy'
    inputs = {f'observation.images.{name}': {'type': 'VISUAL', 'shape': [3, FRAME_SHAPE[0], FRAME_SHAPE[1]]}
              for name in CAMERAS}
    inputs['observation.state'] = {'type': 'STATE', 'shape': [STATE_DIM]}
    # Deliberately spelled out apart from the package's writer (groot/folder.py groot_config_document): this is
    # the independent reference of lerobot 0.6.2's config.json that the package's reader is checked against, so a
    # slip in the package's writer cannot hide in both.
    config = {
        'type': 'groot', 'n_obs_steps': 1, 'input_features': inputs,
        'output_features': {'action': {'type': 'ACTION', 'shape': [ACTION_DIM]}}, 'device': 'cpu', 'use_amp': False,
        'use_peft': False, 'push_to_hub': True, 'repo_id': None, 'private': None, 'tags': None, 'license': None,
        'pretrained_path': None, 'pretrained_revision': None, 'chunk_size': 8, 'n_action_steps': 8,
        'max_state_dim': 12, 'max_action_dim': 12,
        'normalization_mapping': {'VISUAL': 'IDENTITY', 'STATE': 'IDENTITY', 'ACTION': 'IDENTITY'},
        'base_model_path': str(root / 'base'), 'action_decode_transform': transform, 'embodiment_tag': tag,
        'tune_llm': False, 'tune_visual': False, 'tune_projector': True, 'tune_diffusion_model': True,
        'tune_vlln': True, 'tune_top_llm_layers': 0, 'num_inference_timesteps': None, 'rtc_ramp_rate': None,
        'use_flash_attention': False, 'use_relative_actions': False, 'relative_exclude_joints': [],
        'optimizer_lr': 0.0001, 'optimizer_betas': [0.9, 0.999], 'optimizer_eps': 1e-08,
        'optimizer_weight_decay': 1e-05, 'warmup_ratio': 0.05, 'use_bf16': True, 'model_params_fp32': True,
        'image_size': [256, 256], 'tokenizer_assets_repo': None, 'lora_rank': 0, 'lora_alpha': 16,
        'lora_dropout': 0.1, 'lora_full_model': False, 'video_backend': 'decord', 'balance_dataset_weights': True,
        'balance_trajectory_weights': True, 'dataset_paths': None, 'output_dir': './tmp/gr00t', 'save_steps': 1000,
        'max_steps': 10000, 'batch_size': 32, 'dataloader_num_workers': 8, 'report_to': 'wandb', 'resume': False}
    (policy / 'config.json').write_text(json.dumps(config, indent=4))
    rng = np.random.default_rng(seed + 1)
    state_stats, action_stats = _stats(rng, STATE_DIM, 1.0), _stats(rng, ACTION_DIM, 0.5)
    flat = {f'observation.state.{k}': v for k, v in state_stats.items()}
    flat.update({f'action.{k}': v for k, v in action_stats.items()})
    pack_file = 'policy_preprocessor_step_2_groot_n1_7_pack_inputs_v1.safetensors'
    save_numpy_file(flat, str(policy / pack_file))
    device = {'registry_name': 'device_processor', 'config': {'device': 'cpu', 'float_dtype': None}}
    pack = {'state_horizon': 1, 'action_horizon': 8, 'valid_action_horizon': 8, 'video_horizon': None,
            'max_state_dim': 12, 'max_action_dim': 12, 'language_key': 'task',
            'formalize_language': formalize_language, 'embodiment_tag': tag, 'embodiment_mapping': dict(EMBODIMENTS),
            'normalize_min_max': True, 'state_dropout_prob': 0.0, 'clip_outliers': True, 'use_percentiles': False,
            'video_modality_keys': list(MODALITY_KEYS), 'raw_stats': {}, 'modality_config': {}}
    encode = {'model_name': str(processor), 'image_crop_size': CROP, 'image_target_size': TARGET,
              'shortest_image_edge': None, 'crop_fraction': None, 'use_albumentations': False,
              'letter_box_transform': False, 'device': 'cpu'}
    (policy / 'policy_preprocessor.json').write_text(json.dumps({'name': 'policy_preprocessor', 'steps': [
        {'registry_name': 'rename_observations_processor', 'config': {'rename_map': {}}},
        {'registry_name': 'to_batch_processor', 'config': {}},
        {'registry_name': 'groot_n1_7_pack_inputs_v1', 'config': pack, 'state_file': pack_file},
        {'registry_name': 'groot_n1_7_vlm_encode_v1', 'config': encode}, device]}, indent=2))
    if kind == 'flat':
        decode_file = 'policy_postprocessor_step_0_groot_action_unpack_unnormalize_v2.safetensors'
        save_numpy_file(flat, str(policy / decode_file))
        decode = {'registry_name': 'groot_action_unpack_unnormalize_v2', 'state_file': decode_file,
                  'config': {'env_action_dim': ACTION_DIM, 'normalize_min_max': True, 'clip_normalized_action': True,
                             'libero_gripper_action': transform == 'libero', 'libero_gripper_binarize': True}}
    else:
        # The checkpoint's own action groups (a raw N1.7 checkpoint's statistics.json / processor_config.json),
        # decoded with q01 / q99 (use_percentiles): 'arm' (3) then the scalar 'gripper'.
        raw_stats = {'action': {'arm': {k: v[:3].tolist() for k, v in action_stats.items()},
                                'gripper': {k: v[3:].tolist() for k, v in action_stats.items()}}}
        modality = {'action': {'delta_indices': list(range(8)), 'modality_keys': ['arm', 'gripper'],
                               'action_configs': [{'rep': 'absolute', 'type': 'non_eef', 'format': 'default'},
                                                  {'rep': 'absolute', 'type': 'non_eef', 'format': 'default'}]}}
        decode = {'registry_name': 'groot_n1_7_action_decode_v1',
                  'config': {'env_action_dim': ACTION_DIM, 'raw_stats': raw_stats, 'modality_config': modality,
                             'use_percentiles': True, 'use_relative_action': False,
                             'action_decode_transform': transform}}
    (policy / 'policy_postprocessor.json').write_text(json.dumps({'name': 'policy_postprocessor',
                                                                  'steps': [decode, device]}, indent=2))
    return policy


def fixture_inputs(seed: int = 7) -> Dict[str, np.ndarray]:
    """Raw inputs: uint8 frames per camera, a state partly outside its statistics' range, the noise, a task."""
    rng = np.random.default_rng(seed)
    inputs = {f'frame.{name}': rng.integers(0, 256, FRAME_SHAPE, dtype=np.uint8) for name in CAMERAS}
    inputs['state'] = (1.5 * rng.standard_normal(STATE_DIM)).astype(np.float32)
    inputs['noise'] = rng.standard_normal((1, HEAD['action_horizon'], HEAD['max_action_dim'])).astype(np.float32)
    inputs['task'] = np.array('Pick up the RED cube, then place it in the bin!')
    return inputs


def leftover(seed: int = 11, rows: int = 6, padding: int = 2) -> np.ndarray:
    """A previous chunk's leftover in the model's space [rows + padding, max_action_dim] with trailing zero rows
    (lerobot's RTC engine pads short leftovers with them)."""
    rng = np.random.default_rng(seed)
    out = np.zeros((rows + padding, HEAD['max_action_dim']), np.float32)
    out[:rows, :ACTION_DIM] = rng.uniform(-0.8, 0.8, (rows, ACTION_DIM))
    return out


def load_weights(policy: Path, dtype: Optional[torch.dtype] = None) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    weights = load_file(str(Path(policy) / 'model.safetensors'))
    return {k: (v if dtype is None else v.to(dtype)) for k, v in weights.items()}


# The cases compared with real lerobot (bench/compare_lerobot_groot.py writes their results to FIXTURE_FILE):
# variant, the state's seed (another state, same frames and task: a cache hit), RTC (delay, execution horizon),
# formalize_language, bf16 (lerobot's autocast recipe).
PARITY_CASES = {
    'flat': dict(variant='flat'),
    'flat_state_change': dict(variant='flat', state_seed=3),
    'flat_rtc': dict(variant='flat', rtc=(2, 5)),
    'groups_libero': dict(variant='groups'),
    'raw_task': dict(variant='flat', formalize=False),
    'flat_bf16': dict(variant='flat', bf16=True),
}
FIXTURE_FILE = Path(__file__).resolve().parent / 'fixtures' / 'groot_lerobot.npz'


def case_folder(root: Path, case: str) -> Path:
    """The tiny fine-tune a case runs on (one per variant and formalize setting), written under ``root``."""
    spec = PARITY_CASES[case]
    formalize = spec.get('formalize', True)
    name = f"{spec['variant']}{'' if formalize else '_raw'}"
    policy = Path(root) / name / 'policy'
    if not (policy / 'config.json').is_file():
        write_tiny_groot(Path(root) / name, spec['variant'], formalize_language=formalize)
    return policy


def case_inputs(case: str) -> Dict[str, np.ndarray]:
    spec = PARITY_CASES[case]
    inputs = fixture_inputs()
    if 'state_seed' in spec:
        inputs['state'] = (1.5 * np.random.default_rng(spec['state_seed']).standard_normal(STATE_DIM)).astype(
            np.float32)
    return inputs
