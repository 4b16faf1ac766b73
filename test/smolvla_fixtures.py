"""Test-only: a tiny random-weight SmolVLA checkpoint in lerobot's layout, and a tiny SmolVLM-style tokenizer.

Written here, apart from the package, so the parity tests (test_smolvla_pipeline.py) do not depend on the
package's own writer. The layout is what lerobot's ``SmolVLAPolicy.save_pretrained`` and its processor
pipelines write (huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b):

    config.json                      SmolVLAConfig fields, "type": "smolvla"
    model.safetensors                the policy's state dict ("model.vlm_with_expert.vlm.model.vision_model...")
    policy_preprocessor.json         rename, to_batch, smolvla_new_line, tokenizer, device, normalizer steps
    policy_preprocessor_step_5_normalizer_processor.safetensors
    policy_postprocessor.json        unnormalizer, device steps
    policy_postprocessor_step_0_unnormalizer_processor.safetensors
    tokenizer/                       what TokenizerProcessorStep.save_artifacts writes (save_pretrained)
    vlm_config.json                  the backbone's HF config.json (SmolVLMConfig: text_config, vision_config,
                                     scale_factor), standing in for the hub id in vlm_model_name

The tokenizer is byte-level BPE like SmolVLM2's (GPT-2 style, no BOS/EOS added, pad ``<|im_end|>`` = id 2),
trained on a fixed corpus so it is the same on every machine.
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy_file
from safetensors.torch import save_file as save_torch_file

# SmolVLM2's special tokens, in its id order for the first three (<|endoftext|> 0, <|im_start|> 1, <|im_end|> 2);
# the image tokens are the ones SmolVLMProcessor looks up (fake_image_token, global_image_token, image_token).
SPECIAL_TOKENS = ('<|endoftext|>', '<|im_start|>', '<|im_end|>', '<fake_token_around_image>', '<global-img>',
                  '<image>', '<end_of_utterance>')
PAD_TOKEN = '<|im_end|>'
PAD_ID = 2

_WORDS = ('pick up the red cube and put it in the bin', 'place the green block on the plate',
          'open the drawer then close it again', 'move the blue cup to the left of the bowl',
          'push the yellow sponge towards the robot', 'grasp the small wooden spoon gently',
          'stack the three cubes on top of each other', 'wipe the table with the towel',
          'fold the shirt in half', 'pour the water into the glass', 'insert the pen into the holder',
          'turn on the lamp and turn off the light', 'hand over the banana to the person',
          'rotate the bottle by ninety degrees', 'slide the tray under the shelf')

CAMERAS = ('top', 'wrist')
STATE_DIM = 6
ACTION_DIM = 6

# config.json: SmolVLAConfig's fields with the tiny sizes (configuration_smolvla.py at the commit above).
TINY_CONFIG = {
    'type': 'smolvla',
    'n_obs_steps': 1,
    'input_features': {},          # filled from the cameras
    'output_features': {'action': {'type': 'ACTION', 'shape': [ACTION_DIM]}},
    'device': 'cpu',
    'use_amp': False,
    'use_peft': False,
    'push_to_hub': False,
    'repo_id': None,
    'private': None,
    'tags': None,
    'license': None,
    'pretrained_path': None,
    'pretrained_revision': None,
    'chunk_size': 8,
    'n_action_steps': 8,
    'normalization_mapping': {'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'},
    'max_state_dim': 32,
    'max_action_dim': 32,
    'resize_imgs_with_padding': [32, 32],
    'empty_cameras': 1,
    'adapt_to_pi_aloha': False,
    'use_delta_joint_actions_aloha': False,
    'tokenizer_max_length': 48,
    'num_steps': 10,
    'use_cache': True,
    'freeze_vision_encoder': True,
    'train_expert_only': True,
    'train_state_proj': True,
    'optimizer_lr': 1e-4,
    'optimizer_betas': [0.9, 0.95],
    'optimizer_eps': 1e-8,
    'optimizer_weight_decay': 1e-10,
    'optimizer_grad_clip_norm': 10,
    'scheduler_warmup_steps': 1000,
    'scheduler_decay_steps': 30000,
    'scheduler_decay_lr': 2.5e-6,
    'vlm_model_name': 'HuggingFaceTB/SmolVLM2-500M-Video-Instruct',
    'load_vlm_weights': True,
    'add_image_special_tokens': False,
    'attention_mode': 'cross_attn',
    'prefix_length': -1,
    'pad_language_to': 'longest',
    'num_expert_layers': -1,
    'num_vlm_layers': 4,
    'self_attn_every_n_layers': 2,
    'expert_width_multiplier': 0.75,
    'min_period': 4e-3,
    'max_period': 4.0,
    'rtc_config': None,
    'compile_model': False,
    'compile_mode': 'max-autotune',
}

# vlm_config.json: the HF SmolVLMConfig layout of SmolVLM2-500M-Video-Instruct, at tiny sizes. The text stack
# has more layers than num_vlm_layers (lerobot keeps the first num_vlm_layers; the file holds only those).
TINY_VLM_CONFIG = {
    'architectures': ['SmolVLMForConditionalGeneration'],
    'model_type': 'smolvlm',
    'image_token_id': 5,
    'scale_factor': 2,
    'tie_word_embeddings': False,
    'torch_dtype': 'float32',
    'vision_config': {
        'model_type': 'smolvlm_vision', 'hidden_size': 32, 'intermediate_size': 64, 'num_hidden_layers': 2,
        'num_attention_heads': 4, 'num_channels': 3, 'image_size': 32, 'patch_size': 8,
        'hidden_act': 'gelu_pytorch_tanh', 'layer_norm_eps': 1e-6, 'attention_dropout': 0.0,
    },
    'text_config': {
        'model_type': 'llama', 'hidden_size': 64, 'intermediate_size': 128, 'num_hidden_layers': 6,
        'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': 16, 'hidden_act': 'silu',
        'rms_norm_eps': 1e-5, 'rope_theta': 100000.0, 'max_position_embeddings': 8192, 'vocab_size': None,
        'attention_bias': False, 'mlp_bias': False, 'tie_word_embeddings': False, 'torch_dtype': 'bfloat16',
        'pad_token_id': PAD_ID,
    },
}


# config.json variants the parity tests (and bench/compare_lerobot_smolvla.py --parts v) run.
PARITY_VARIANTS = {
    'default': {},                                                      # 2 cameras + 1 empty, 'longest'
    'max_length': {'pad_language_to': 'max_length'},
    'every3_width05': {'self_attn_every_n_layers': 3, 'expert_width_multiplier': 0.5, 'empty_cameras': 0,
                       'num_steps': 4},
    'all_cross': {'self_attn_every_n_layers': 0},                      # every expert layer cross-attends
    'self_attn_mode': {'attention_mode': 'self_attn'},                 # no cross-attention layer at all
    'padded_prefix': {'prefix_length': 64, 'tokenizer_max_length': 10, 'empty_cameras': 2, 'num_steps': 3,
                      'chunk_size': 5, 'n_action_steps': 5},            # prefix padded to 64, prompts cut to 10
}


# ---- tokenizer --------------------------------------------------------------------------------------------
def build_smolvlm_tokenizer(folder: Path, vocab_size: int = 400) -> Path:
    """``folder/tokenizer.json`` (+ tokenizer_config.json, special_tokens_map.json) as save_pretrained writes.

    Byte-level BPE like SmolVLM2's: the special tokens first (ids 0..6), no BOS/EOS template (the
    post-processor is plain ByteLevel), pad ``<|im_end|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([line + '\n' for line in _WORDS] * 3, trainer=trainer)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / 'tokenizer.json'
    tok.save(str(path))
    (folder / 'tokenizer_config.json').write_text(json.dumps({
        'tokenizer_class': 'GPT2Tokenizer', 'add_bos_token': False, 'add_eos_token': False,
        'add_prefix_space': False, 'bos_token': '<|im_start|>', 'eos_token': '<end_of_utterance>',
        'pad_token': PAD_TOKEN, 'unk_token': '<|endoftext|>', 'model_max_length': 8192,
        'clean_up_tokenization_spaces': False,
        'extra_special_tokens': {'fake_image_token': '<fake_token_around_image>', 'image_token': '<image>',
                                 'end_of_utterance_token': '<end_of_utterance>', 'global_image_token': '<global-img>'},
    }, indent=2))
    (folder / 'special_tokens_map.json').write_text(json.dumps({
        'bos_token': '<|im_start|>', 'eos_token': '<end_of_utterance>', 'pad_token': PAD_TOKEN,
        'unk_token': '<|endoftext|>'}, indent=2))
    return path


# ---- weights ------------------------------------------------------------------------------------------------
def get_intermediate_size(hidden_dim: int, ffn_dim_multiplier: int = 4, multiple_of: int = 256) -> int:
    """lerobot's smolvlm_with_expert.get_intermediate_size (the expert's MLP width)."""
    hidden_dim = int(2 * hidden_dim / 3)
    hidden_dim = int(ffn_dim_multiplier * hidden_dim)
    return multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)


def weight_shapes(config: Dict, vlm: Dict) -> Dict[str, tuple]:
    """Every tensor of a lerobot SmolVLA state dict with its shape (the keys smolvla.md lists)."""
    vis, txt = vlm['vision_config'], vlm['text_config']
    shapes = {}
    v = 'model.vlm_with_expert.vlm.model.vision_model.'
    d, p, c = vis['hidden_size'], vis['patch_size'], vis.get('num_channels', 3)
    shapes[v + 'embeddings.patch_embedding.weight'] = (d, c, p, p)
    shapes[v + 'embeddings.patch_embedding.bias'] = (d,)
    shapes[v + 'embeddings.position_embedding.weight'] = ((vis['image_size'] // p) ** 2, d)
    for i in range(vis['num_hidden_layers']):
        layer = f'{v}encoder.layers.{i}.'
        for name in ('q_proj', 'k_proj', 'v_proj', 'out_proj'):
            shapes[f'{layer}self_attn.{name}.weight'] = (d, d)
            shapes[f'{layer}self_attn.{name}.bias'] = (d,)
        shapes[layer + 'mlp.fc1.weight'] = (vis['intermediate_size'], d)
        shapes[layer + 'mlp.fc1.bias'] = (vis['intermediate_size'],)
        shapes[layer + 'mlp.fc2.weight'] = (d, vis['intermediate_size'])
        shapes[layer + 'mlp.fc2.bias'] = (d,)
        for norm in ('layer_norm1', 'layer_norm2'):
            shapes[f'{layer}{norm}.weight'] = (d,)
            shapes[f'{layer}{norm}.bias'] = (d,)
    shapes[v + 'post_layernorm.weight'] = (d,)
    shapes[v + 'post_layernorm.bias'] = (d,)
    hidden, heads, kv = txt['hidden_size'], txt['num_attention_heads'], txt['num_key_value_heads']
    hd = txt.get('head_dim') or hidden // heads
    shapes['model.vlm_with_expert.vlm.model.connector.modality_projection.proj.weight'] = (
        hidden, d * vlm['scale_factor'] ** 2)
    t = 'model.vlm_with_expert.vlm.model.text_model.'
    shapes[t + 'embed_tokens.weight'] = (txt['vocab_size'], hidden)
    num_vlm = config['num_vlm_layers'] if config['num_vlm_layers'] > 0 else txt['num_hidden_layers']

    def llama_layer(prefix, width, inter, k_in):
        shapes[prefix + 'self_attn.q_proj.weight'] = (heads * hd, width)
        shapes[prefix + 'self_attn.k_proj.weight'] = (kv * hd, k_in)
        shapes[prefix + 'self_attn.v_proj.weight'] = (kv * hd, k_in)
        shapes[prefix + 'self_attn.o_proj.weight'] = (width, heads * hd)
        shapes[prefix + 'mlp.gate_proj.weight'] = (inter, width)
        shapes[prefix + 'mlp.up_proj.weight'] = (inter, width)
        shapes[prefix + 'mlp.down_proj.weight'] = (width, inter)
        shapes[prefix + 'input_layernorm.weight'] = (width,)
        shapes[prefix + 'post_attention_layernorm.weight'] = (width,)

    for i in range(num_vlm):
        llama_layer(f'{t}layers.{i}.', hidden, txt['intermediate_size'], hidden)
    shapes[t + 'norm.weight'] = (hidden,)
    shapes['model.vlm_with_expert.vlm.lm_head.weight'] = (txt['vocab_size'], hidden)
    width = int(hidden * config['expert_width_multiplier'])
    inter = get_intermediate_size(width)
    num_expert = config['num_expert_layers'] if config['num_expert_layers'] > 0 else num_vlm
    every = config['self_attn_every_n_layers']
    for i in range(num_expert):
        cross = 'cross' in config['attention_mode'] and not (every > 0 and i % every == 0)
        llama_layer(f'model.vlm_with_expert.lm_expert.layers.{i}.', width, inter, kv * hd if cross else width)
    shapes['model.vlm_with_expert.lm_expert.norm.weight'] = (width,)
    for name, (out_dim, in_dim) in {'state_proj': (hidden, config['max_state_dim']),
                                    'action_in_proj': (width, config['max_action_dim']),
                                    'action_out_proj': (config['max_action_dim'], width),
                                    'action_time_mlp_in': (width, 2 * width),
                                    'action_time_mlp_out': (width, width)}.items():
        shapes[f'model.{name}.weight'] = (out_dim, in_dim)
        shapes[f'model.{name}.bias'] = (out_dim,)
    return shapes


def random_weights(shapes: Dict[str, tuple], seed: int) -> Dict[str, torch.Tensor]:
    """Seeded weights of a sensible scale: Linear/conv U(+-1/sqrt(fan_in)), norms 1 + N(0, 0.1) (so x*w and
    x*(1+w) differ), embeddings N(0, 0.5), biases U(+-0.1)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in shapes.items():
        if 'norm' in key and key.endswith('.weight'):
            value = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif 'norm' in key or key.endswith('.bias'):
            value = 0.1 * (2 * torch.rand(shape, generator=gen) - 1)
        elif 'embed' in key or 'lm_head' in key:
            value = 0.5 * torch.randn(shape, generator=gen)
        else:
            fan_in = int(np.prod(shape[1:]))
            value = (2 * torch.rand(shape, generator=gen) - 1) / math.sqrt(fan_in)
        out[key] = value.float().contiguous()
    return out


def _stats(dim: int, seed: int, center: float, spread: float) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mean = (center * rng.standard_normal(dim)).astype(np.float32)
    std = (spread * (0.5 + rng.random(dim))).astype(np.float32)
    return {'mean': mean, 'std': std, 'min': mean - 3 * std, 'max': mean + 3 * std,
            'q01': mean - 2.33 * std, 'q99': mean + 2.33 * std, 'q10': mean - 1.28 * std, 'q90': mean + 1.28 * std}


def write_tiny_smolvla(folder: Path, seed: int = 0, cameras: Sequence[str] = CAMERAS,
                       vlm_overrides: Optional[Dict] = None, **overrides) -> Path:
    """A tiny lerobot SmolVLA ``pretrained_model/`` folder; ``overrides`` replace config.json fields."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(TINY_CONFIG)
    unknown = set(overrides) - set(config)
    if unknown:
        raise KeyError(f'not SmolVLAConfig fields: {sorted(unknown)}')
    config.update(overrides)
    config['input_features'] = {f'observation.images.{name}': {'type': 'VISUAL', 'shape': [3, 480, 640]}
                                for name in cameras}
    config['input_features']['observation.state'] = {'type': 'STATE', 'shape': [STATE_DIM]}
    vlm = copy.deepcopy(TINY_VLM_CONFIG)
    for key, value in (vlm_overrides or {}).items():
        if isinstance(value, dict):
            vlm[key].update(value)
        else:
            vlm[key] = value

    tokenizer_file = build_smolvlm_tokenizer(folder / 'tokenizer')
    if vlm['text_config'].get('vocab_size') is None:       # the tiny one: the tokenizer's size
        vocab = json.loads(tokenizer_file.read_text())
        vlm['text_config']['vocab_size'] = len(vocab['model']['vocab']) + sum(
            1 for t in vocab['added_tokens'] if t['content'] not in vocab['model']['vocab'])
    (folder / 'config.json').write_text(json.dumps(config, indent=2) + '\n')
    (folder / 'vlm_config.json').write_text(json.dumps(vlm, indent=2) + '\n')
    save_torch_file(random_weights(weight_shapes(config, vlm), seed), str(folder / 'model.safetensors'),
                    metadata={'format': 'pt'})

    state_stats, action_stats = _stats(STATE_DIM, seed + 1, 0.3, 0.5), _stats(ACTION_DIM, seed + 2, 0.2, 0.3)
    features = {'observation.state': {'type': 'STATE', 'shape': [STATE_DIM]},
                'action': {'type': 'ACTION', 'shape': [ACTION_DIM]}}
    norm_map = dict(config['normalization_mapping'])
    flat = {f'observation.state.{k}': v for k, v in state_stats.items()}
    flat.update({f'action.{k}': v for k, v in action_stats.items()})
    pre_file = 'policy_preprocessor_step_5_normalizer_processor.safetensors'
    save_numpy_file(flat, str(folder / pre_file))
    pre_steps = [
        {'registry_name': 'rename_observations_processor', 'config': {'rename_map': {}}},
        {'registry_name': 'to_batch_processor', 'config': {}},
        {'registry_name': 'smolvla_new_line_processor', 'config': {}},
        {'registry_name': 'tokenizer_processor',
         'config': {'max_length': config['tokenizer_max_length'], 'task_key': 'task', 'padding_side': 'right',
                    'padding': config['pad_language_to'], 'truncation': True, 'tokenizer_name': 'tokenizer'},
         'artifacts': {'tokenizer_name': 'tokenizer'}},
        {'registry_name': 'device_processor', 'config': {'device': 'cpu', 'float_dtype': None}},
        {'registry_name': 'normalizer_processor',
         'config': {'eps': 1e-8, 'features': features, 'norm_map': norm_map}, 'state_file': pre_file},
    ]
    (folder / 'policy_preprocessor.json').write_text(
        json.dumps({'name': 'policy_preprocessor', 'steps': pre_steps}, indent=2))
    post_file = 'policy_postprocessor_step_0_unnormalizer_processor.safetensors'
    save_numpy_file({f'action.{k}': v for k, v in action_stats.items()}, str(folder / post_file))
    post_steps = [
        {'registry_name': 'unnormalizer_processor',
         'config': {'eps': 1e-8, 'features': {'action': features['action']}, 'norm_map': norm_map},
         'state_file': post_file},
        {'registry_name': 'device_processor', 'config': {'device': 'cpu', 'float_dtype': None}},
    ]
    (folder / 'policy_postprocessor.json').write_text(
        json.dumps({'name': 'policy_postprocessor', 'steps': post_steps}, indent=2))
    return folder
