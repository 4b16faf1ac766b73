"""SmolVLA behind the family seam: loading (strict config, backbone, weights, tokenizer), the pipeline's
details (padding side, prompt padding, the state token's mask, positions) and the state-last cache."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from sample_bag_params import write_sample_bag_params
from vla_policy_node.observation import Observation, ObservationError
from vla_policy_node.policy.checkpoint import CheckpointError
from vla_policy_node.policy.families import load_checkpoint
from vla_policy_node.policy.config_fields import DEFAULT_ONLY, ConfigError
from vla_policy_node.policy.families import family_class, load_policy
from vla_policy_node.policy.layers import additive_mask, fold_mask, grouped_query_attention, split_half_rope_tables
from vla_policy_node.policy.rtc import RTCSettings
from vla_policy_node.policy.families.smolvla.config import SMOLVLA_CONFIG_FIELDS, SmolVLAConfig, smolvla_preset
from vla_policy_node.policy.tiny_default import write_random_checkpoint, write_tiny_default
from vla_policy_node.runtime import PolicyRuntime

CPU = torch.device('cpu')
TASK = 'pick up the red cube'
STATE = np.array([0.31, -1.2, 0.05, 2.5, -0.44, 0.9])
OTHER_STATE = np.array([-0.2, 0.4, 1.1, -0.7, 0.0, 0.3])

# SmolVLAConfig's fields (src/lerobot/policies/smolvla/configuration_smolvla.py) and PreTrainedConfig's
# (src/lerobot/configs/policies.py) at huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b, with the
# values a default config dumps.
LEROBOT_SMOLVLA_CONFIG = {
    'n_obs_steps': 1, 'input_features': {}, 'output_features': {}, 'device': 'cuda', 'use_amp': False,
    'use_peft': False, 'push_to_hub': True, 'repo_id': None, 'private': None, 'tags': None, 'license': None,
    'pretrained_path': None, 'pretrained_revision': None,
    'chunk_size': 50, 'n_action_steps': 50,
    'normalization_mapping': {'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'},
    'max_state_dim': 32, 'max_action_dim': 32, 'resize_imgs_with_padding': [512, 512], 'empty_cameras': 0,
    'adapt_to_pi_aloha': False, 'use_delta_joint_actions_aloha': False, 'tokenizer_max_length': 48,
    'num_steps': 10, 'use_cache': True, 'freeze_vision_encoder': True, 'train_expert_only': True,
    'train_state_proj': True, 'optimizer_lr': 1e-4, 'optimizer_betas': [0.9, 0.95], 'optimizer_eps': 1e-8,
    'optimizer_weight_decay': 1e-10, 'optimizer_grad_clip_norm': 10, 'scheduler_warmup_steps': 1000,
    'scheduler_decay_steps': 30000, 'scheduler_decay_lr': 2.5e-6,
    'vlm_model_name': 'HuggingFaceTB/SmolVLM2-500M-Video-Instruct', 'load_vlm_weights': False,
    'add_image_special_tokens': False, 'attention_mode': 'cross_attn', 'prefix_length': -1,
    'pad_language_to': 'longest', 'num_expert_layers': -1, 'num_vlm_layers': 16, 'self_attn_every_n_layers': 2,
    'expert_width_multiplier': 0.75, 'min_period': 4e-3, 'max_period': 4.0, 'rtc_config': None,
    'compile_model': False, 'compile_mode': 'max-autotune',
}


@pytest.fixture(scope='module')
def tiny(tmp_path_factory) -> Path:
    return write_tiny_default(tmp_path_factory.mktemp('smolvla') / 'tiny', 'smolvla')


@pytest.fixture
def folder(tmp_path, tiny) -> Path:
    return Path(shutil.copytree(tiny, tmp_path / 'ckpt'))


@pytest.fixture
def runtime(tiny) -> PolicyRuntime:
    return PolicyRuntime.from_pretrained(tiny, device='cpu', dtype='float32')


def frames(seed: int = 1):
    rng = np.random.default_rng(seed)
    return {'base_0_rgb': rng.integers(0, 256, (24, 40, 3), dtype=np.uint8),
            'left_wrist_0_rgb': rng.integers(0, 256, (48, 30, 3), dtype=np.uint8)}     # the right wrist masked


def full_config(**changes) -> dict:
    """A complete lerobot SmolVLA config.json with the tiny model's features and sizes."""
    tiny = smolvla_preset('tiny').to_lerobot_dict()
    raw = dict(LEROBOT_SMOLVLA_CONFIG, type='smolvla')
    for key in ('input_features', 'output_features', 'resize_imgs_with_padding', 'chunk_size', 'n_action_steps',
                'num_vlm_layers', 'empty_cameras'):
        raw[key] = tiny[key]
    raw.update(changes)
    return raw


def tiny_backbone_document() -> dict:
    return smolvla_preset('tiny').backbone.to_hf_config()


# ---- config -----------------------------------------------------------------------------------------
def test_every_lerobot_smolvla_field_is_classified_and_nothing_else():
    assert len(LEROBOT_SMOLVLA_CONFIG) == 51
    assert set(SMOLVLA_CONFIG_FIELDS) == set(LEROBOT_SMOLVLA_CONFIG) | {'type'}
    for entry in SMOLVLA_CONFIG_FIELDS.values():
        assert bool(entry.accepted) == (entry.handling == DEFAULT_ONLY) and entry.why, entry


def test_a_complete_lerobot_config_loads_with_the_local_backbone():
    config = SmolVLAConfig.from_lerobot_dict(full_config(), tiny_backbone_document())
    assert config.policy_type == 'smolvla' and config.text.width == 64 and config.expert.width == 48
    assert config.layer_plan == ((0, True), (1, False), (2, True), (3, False))
    assert config.tokens_per_image == 4 and config.prefix_len == 3 * 4 + 48


@pytest.mark.parametrize('key', ['use_fancy_future_thing', 'paligemma_variant', 'rtc_training_max_delay'])
def test_unknown_config_fields_are_refused_by_name(key):
    with pytest.raises(ConfigError) as info:
        SmolVLAConfig.from_lerobot_dict(full_config(**{key: 1}), tiny_backbone_document())
    assert key in str(info.value)


@pytest.mark.parametrize('name, value, shown', [('adapt_to_pi_aloha', True, 'true'), ('use_cache', False, 'false'),
                                                ('add_image_special_tokens', True, 'true'), ('n_obs_steps', 2, '2'),
                                                ('pad_language_to', 'do_not_pad', 'do_not_pad')])
def test_unimplemented_values_are_refused_naming_field_and_value(name, value, shown):
    with pytest.raises(ConfigError) as info:
        SmolVLAConfig.from_lerobot_dict(full_config(**{name: value}), tiny_backbone_document())
    assert name in str(info.value) and shown in str(info.value)


def test_the_backbone_comes_from_the_table_or_vlm_config_json_and_an_unknown_one_is_refused():
    real = SmolVLAConfig.from_lerobot_dict(full_config(resize_imgs_with_padding=[512, 512], num_vlm_layers=16))
    assert (real.text.width, real.text.num_kv_heads, real.expert.width, real.expert.mlp_dim) == (960, 5, 720, 2048)
    assert real.tokens_per_image == 64
    with pytest.raises(ConfigError) as info:
        SmolVLAConfig.from_lerobot_dict(full_config(vlm_model_name='someone/SmolVLM-7B'))
    assert 'someone/SmolVLM-7B' in str(info.value) and 'vlm_config.json' in str(info.value)
    local = SmolVLAConfig.from_lerobot_dict(full_config(vlm_model_name='someone/SmolVLM-7B'), tiny_backbone_document())
    assert local.text.width == 64


def test_a_layer_plan_lerobot_cannot_run_is_refused():
    with pytest.raises(ConfigError, match='self-attention layer without an expert layer'):
        SmolVLAConfig.from_lerobot_dict(full_config(num_expert_layers=2, self_attn_every_n_layers=1),
                                        tiny_backbone_document())


# ---- folder -------------------------------------------------------------------------------------------
def test_the_folder_has_lerobots_layout_and_keys(tiny):
    keys = set(load_file(str(tiny / 'model.safetensors')))
    for key in ('model.vlm_with_expert.vlm.model.vision_model.embeddings.patch_embedding.weight',
                'model.vlm_with_expert.vlm.model.vision_model.encoder.layers.1.self_attn.out_proj.bias',
                'model.vlm_with_expert.vlm.model.connector.modality_projection.proj.weight',
                'model.vlm_with_expert.vlm.model.text_model.layers.3.mlp.gate_proj.weight',
                'model.vlm_with_expert.vlm.model.text_model.norm.weight', 'model.vlm_with_expert.vlm.lm_head.weight',
                'model.vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight',
                'model.vlm_with_expert.lm_expert.norm.weight', 'model.state_proj.bias',
                'model.action_time_mlp_in.weight'):
        assert key in keys, key
    assert not any('qkv' in key or 'gate_up' in key for key in keys)
    # A cross layer's k_proj reads the VLM's K (kv heads x head dim = 32), a self layer's the expert width (48).
    weights = load_file(str(tiny / 'model.safetensors'))
    assert weights['model.vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight'].shape == (32, 32)
    assert weights['model.vlm_with_expert.lm_expert.layers.0.self_attn.k_proj.weight'].shape == (32, 48)
    assert (tiny / 'tokenizer' / 'tokenizer.json').is_file() and (tiny / 'vlm_config.json').is_file()
    assert json.loads((tiny / 'config.json').read_text())['type'] == 'smolvla'


@pytest.mark.parametrize('edit, named', [
    (lambda t: t.pop('model.vlm_with_expert.lm_expert.layers.2.mlp.up_proj.weight'), 'missing'),
    (lambda t: t.__setitem__('model.vlm_with_expert.lm_expert.layers.9.mlp.up_proj.weight', torch.zeros(2)),
     'lm_expert.layers.9'),
    (lambda t: t.__setitem__('model.state_proj.weight', torch.zeros(64, 31)), 'model.state_proj.weight'),
])
def test_weights_load_strictly(folder, edit, named):
    tensors = load_file(str(folder / 'model.safetensors'))
    edit(tensors)
    save_file(tensors, str(folder / 'model.safetensors'), metadata={'format': 'pt'})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(folder, CPU, torch.float32)
    assert named in str(info.value)


def test_an_unknown_config_field_in_a_folder_is_refused(folder):
    raw = json.loads((folder / 'config.json').read_text())
    raw['use_fancy_future_thing'] = True
    (folder / 'config.json').write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match='use_fancy_future_thing'):
        load_checkpoint(folder, CPU, torch.float32)


def test_without_a_tokenizer_the_load_names_tokenizer_path(folder):
    shutil.rmtree(folder / 'tokenizer')
    with pytest.raises(ValueError, match='tokenizer_path'):
        load_policy(folder, CPU, torch.float32)


def test_a_pi05_only_option_is_refused_for_smolvla(tiny):
    with pytest.raises(ValueError, match='pi05_padded_state_prompt'):
        PolicyRuntime.from_pretrained(tiny, device='cpu', dtype='float32', pi05_padded_state_prompt=True)
    assert family_class('smolvla').capabilities.state_in_prompt is False


# ---- pipeline details ---------------------------------------------------------------------------------
def test_padding_goes_left_and_top_at_the_model_size(runtime):
    wide = torch.rand(3, 16, 40)      # ratio 40/32: resized to 12 x 32, 20 rows of padding on top
    out = runtime.policy.image_to_model(wide)
    assert out.shape == (3, 32, 32)
    assert torch.all(out[:, :20] == -1) and not torch.all(out[:, 20:] == -1)
    tall = torch.rand(3, 64, 16)      # resized to 32 x 8: 24 columns of padding on the left
    out = runtime.policy.image_to_model(tall)
    assert torch.all(out[:, :, :24] == -1) and not torch.all(out[:, :, 24:] == -1)
    same = torch.rand(3, 32, 32)
    assert torch.equal(runtime.policy.image_to_model(same), same * 2 - 1)


def test_prompt_is_task_newline_right_padded_with_im_end(runtime):
    tokenizer = runtime.tokenizer
    ids, mask = runtime.policy.prompt_tokens(TASK, np.zeros(6))
    expected = tokenizer.encode_text(TASK + '\n')
    assert ids.shape == mask.shape == (48,) and ids.dtype == np.int64
    assert ids[:len(expected)].tolist() == expected and mask[:len(expected)].all() and not mask[len(expected):].any()
    assert set(ids[len(expected):].tolist()) == {tokenizer.pad_id} and tokenizer.pad_id == 2
    same, _ = runtime.policy.prompt_tokens(TASK + '\n', np.zeros(6))      # a newline is not doubled
    assert np.array_equal(same, ids)
    long_ids, long_mask = runtime.policy.prompt_tokens('stack the cubes ' * 40, np.zeros(6))
    assert long_mask.all() and len(long_ids) == 48                        # truncated to tokenizer_max_length


def _joint_prefix_pass(model, images, image_masks, tokens, token_masks, state):
    """lerobot's one prefix pass over [images ; language ; state] with att masks 0 ... 0 1 -> K/V per layer."""
    cfg = model.config
    x = torch.cat([model.embed_images(images), model.embed_language(tokens),
                   model.state_proj(state)[:, None]], dim=1)
    image_pad = image_masks[:, :, None].expand(-1, -1, cfg.tokens_per_image).reshape(1, -1)
    pad = torch.cat([image_pad, token_masks, torch.ones(1, 1, dtype=torch.bool)], dim=1)
    att = torch.zeros_like(pad, dtype=torch.long)
    att[:, -1] = 1
    cumsum = att.cumsum(dim=1)
    allowed = (cumsum[:, None, :] <= cumsum[:, :, None]) & pad[:, None, :] & pad[:, :, None]
    mask = fold_mask(additive_mask(allowed[:, None], torch.float32), cfg.text.num_heads // cfg.text.num_kv_heads)
    cos, sin = split_half_rope_tables(pad.long().cumsum(dim=1) - 1, cfg.text.head_dim)
    keys = []
    for layer in model.vlm_with_expert.vlm.model.text_model.layers:
        q, k, v = layer.project_qkv(x, cos, sin)
        keys.append((k, v))
        x = layer.finish(x, grouped_query_attention(q, k, v, mask))
    return keys


def test_nothing_attends_to_the_state_token_so_the_cached_kv_are_lerobots(runtime):
    """The split (prefix cached, state per chunk) gives the K/V of lerobot's joint pass, where the state is the
    prefix's last token with att mask 1: the image + language K/V do not move with the state."""
    model = runtime.model
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    images = torch.rand(1, 3, 3, 32, 32, generator=g) * 2 - 1
    image_masks = torch.tensor([[True, False, True]])
    tokens = torch.randint(0, 200, (1, 48), generator=g)
    token_masks = torch.arange(48)[None] < 11
    context = model.fill_prefix(images, image_masks, tokens, token_masks)
    noise = torch.randn(1, cfg.chunk_size, cfg.max_action_dim, generator=g)
    for seed in (1, 2):
        state = torch.randn(1, cfg.max_state_dim, generator=torch.Generator().manual_seed(seed))
        joint = _joint_prefix_pass(model, images, image_masks, tokens, token_masks, state)
        chunk = model.chunk_setup(context, state, noise, 3)
        P = context.prefix_len
        valid = context['pad_mask'][0]      # a masked token's own K/V are attended by nobody (its row is all masked)
        for i, (k, v) in enumerate(joint):
            torch.testing.assert_close(k[:, :, :P][:, :, valid], context['kv'][i, 0][:, :, valid], atol=1e-6, rtol=0)
            torch.testing.assert_close(v[:, :, :P][:, :, valid], context['kv'][i, 1][:, :, valid], atol=1e-6, rtol=0)
            torch.testing.assert_close(k[:, :, P], chunk.self_kv[i, 0, :, :, P], atol=1e-5, rtol=0)
            torch.testing.assert_close(v[:, :, P], chunk.self_kv[i, 1, :, :, P], atol=1e-5, rtol=0)


def test_positions_self_layers_after_the_valid_prefix_cross_layers_from_zero(runtime):
    model = runtime.model
    cfg = model.config
    images = torch.zeros(1, 3, 3, 32, 32)
    image_masks = torch.tensor([[True, False, False]])       # 4 valid image tokens
    tokens = torch.zeros(1, 48, dtype=torch.long)
    token_masks = torch.arange(48)[None] < 5                 # 5 valid language tokens
    context = model.fill_prefix(images, image_masks, tokens, token_masks)
    chunk = model.chunk_setup(context, torch.zeros(1, 32), torch.zeros(1, cfg.chunk_size, 32), 2)
    horizon = torch.arange(cfg.chunk_size)[None]
    for (cos, sin), positions in ((chunk.self_rope, 9 + 1 + horizon), (chunk.cross_rope, horizon)):
        want_cos, want_sin = split_half_rope_tables(positions, cfg.text.head_dim)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    # Self layers: the action tokens see the valid prefix, the state and the earlier actions; cross layers the
    # valid prefix and the state only.
    groups = cfg.text.num_heads // cfg.text.num_kv_heads
    seen = chunk.self_mask[0, 0, :cfg.chunk_size] == 0                  # first query head group
    P = context.prefix_len
    assert seen[:, :P].sum(dim=1).tolist() == [9] * cfg.chunk_size and seen[:, P].all()
    assert torch.equal(seen[:, P + 1:], torch.ones(cfg.chunk_size, cfg.chunk_size, dtype=torch.bool).tril())
    cross_seen = chunk.cross_mask[0, 0, :cfg.chunk_size] == 0
    assert cross_seen.shape[1] == P + 1 and cross_seen[:, :P].sum(dim=1).tolist() == [9] * cfg.chunk_size
    assert chunk.self_mask.shape[2] == groups * cfg.chunk_size


# ---- the state-last cache -----------------------------------------------------------------------------
def test_a_state_change_hits_and_equals_a_fresh_miss_with_that_state(tiny):
    cached = PolicyRuntime.from_pretrained(tiny, device='cpu', dtype='float32')
    first = cached.infer(Observation(frames(), STATE, TASK), seed=3)
    moved = cached.infer(Observation(frames(), OTHER_STATE, TASK), seed=3)
    assert not first.cache_hit and moved.cache_hit and moved.key == first.key
    fresh = PolicyRuntime.from_pretrained(tiny, device='cpu', dtype='float32')
    miss = fresh.infer(Observation(frames(), OTHER_STATE, TASK), seed=3)
    assert not miss.cache_hit
    np.testing.assert_array_equal(moved.actions, miss.actions)
    assert np.abs(moved.actions - first.actions).max() > 1e-3


def test_a_frame_or_instruction_change_misses(runtime):
    runtime.infer(Observation(frames(1), STATE, TASK), seed=0)
    other_frame = frames(1)
    other_frame['left_wrist_0_rgb'] = other_frame['left_wrist_0_rgb'].copy()
    other_frame['left_wrist_0_rgb'][0, 0, 0] ^= 1
    assert not runtime.infer(Observation(other_frame, STATE, TASK), seed=0).cache_hit
    assert not runtime.infer(Observation(frames(1), STATE, 'open the drawer'), seed=0).cache_hit
    assert runtime.infer(Observation(frames(1), OTHER_STATE, TASK), seed=0).cache_hit


def test_a_hit_equals_its_miss_bit_for_bit_and_never_writes_the_entry(runtime):
    miss = runtime.infer(Observation(frames(), STATE, TASK), seed=5)
    context = runtime.cache.get(miss.key)
    stored = [context['kv'].clone(), context['pad_mask'].clone()] + [context['cross_kv'].clone()]
    rtc = RTCSettings()
    for state in (OTHER_STATE, STATE * 0.5, STATE):
        runtime.infer(Observation(frames(), state, TASK), seed=5)
        runtime.infer(Observation(frames(), state, TASK), seed=5, prev_actions=miss.actions[3:], inference_delay=2,
                      rtc=rtc)
    hit = runtime.infer(Observation(frames(), STATE, TASK), seed=5)
    assert hit.cache_hit
    np.testing.assert_array_equal(hit.actions, miss.actions)
    for before, after in zip(stored, [context['kv'], context['pad_mask']] + [context['cross_kv']]):
        assert torch.equal(before, after)
    assert context.nbytes == runtime.config.cache_entry_bytes(4) and runtime.prefix_bytes() == context.nbytes - \
        context['pad_mask'].numel()


def test_entry_bytes_are_analytic_for_the_real_shape():
    config = smolvla_preset('smolvla')
    # 16 VLM layers x 2 x 5 kv heads x 64, plus 8 cross layers x 2 x 5 x 64, over 2 x 64 + 48 tokens, fp32.
    assert config.prefix_len == 176 and config.cross_layer_count == 8
    assert config.kv_entry_bytes(4) == (16 + 8) * 2 * 5 * 64 * 176 * 4


def test_guided_rtc_continues_the_previous_chunk_and_trained_mode_is_refused(runtime):
    plain = runtime.infer(Observation(frames(), STATE, TASK), seed=2)
    steered = runtime.infer(Observation(frames(), STATE, TASK), seed=2, prev_actions=plain.actions[4:] + 0.5,
                            inference_delay=2, rtc=RTCSettings(execution_horizon=5))
    assert steered.cache_hit and steered.continued
    # The delayed actions are pulled towards the leftover; the end of the chunk is left free.
    target = plain.actions[4:] + 0.5
    assert np.abs(steered.actions[:2] - target[:2]).mean() < np.abs(plain.actions[:2] - target[:2]).mean()
    with pytest.raises(ObservationError, match='rtc_training_max_delay'):
        runtime.infer(Observation(frames(), STATE, TASK), seed=2, prev_actions=plain.actions[4:], inference_delay=1,
                      rtc=RTCSettings(mode='trained'))


def test_bf16_runs_the_decoder_in_bf16_and_keeps_the_rest_fp32(tiny):
    runtime = PolicyRuntime.from_pretrained(tiny, device='cpu', dtype='bfloat16')
    params = dict(runtime.model.named_parameters())
    assert params['vlm_with_expert.vlm.model.text_model.layers.0.self_attn.q_proj.weight'].dtype == torch.bfloat16
    assert params['vlm_with_expert.lm_expert.layers.1.mlp.down_proj.weight'].dtype == torch.bfloat16
    for name in ('vlm_with_expert.vlm.model.vision_model.embeddings.patch_embedding.weight',
                 'vlm_with_expert.vlm.model.connector.modality_projection.proj.weight',
                 'vlm_with_expert.lm_expert.layers.0.input_layernorm.weight', 'state_proj.weight',
                 'vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight',     # a cross layer's, as lerobot's
                 'action_out_proj.weight', 'action_time_mlp_in.weight'):
        assert params[name].dtype == torch.float32, name
    assert params['vlm_with_expert.lm_expert.layers.0.self_attn.k_proj.weight'].dtype == torch.bfloat16   # self
    chunk = runtime.infer(Observation(frames(), STATE, TASK), seed=0)
    assert np.all(np.isfinite(chunk.actions))
    context = runtime.cache.get(chunk.key)
    assert context['kv'].dtype == torch.bfloat16 and context['cross_kv'].dtype == torch.float32
    assert context.nbytes == runtime.config.cache_entry_bytes(2)


def test_a_random_checkpoint_of_another_shape_round_trips(tmp_path):
    config = smolvla_preset('tiny', attention_mode='self_attn', self_attn_every_n_layers=0,
                            pad_language_to='max_length')
    folder = write_random_checkpoint(tmp_path / 'self_attn', config)
    loaded = load_checkpoint(folder, CPU, torch.float32)
    assert loaded.config == config and loaded.config.cross_layer_count == 0
    runtime = PolicyRuntime.from_pretrained(folder, device='cpu', dtype='float32')
    assert np.all(np.isfinite(runtime.infer(Observation(frames(), STATE, TASK), seed=0).actions))


# ---- the tools -------------------------------------------------------------------------------------------
def test_the_replay_runs_a_smolvla_checkpoint_and_reports_its_entry_bytes(tiny, tmp_path):
    from vla_policy_node.replay.make_bag import SampleBagSpec, write_sample_bag
    from vla_policy_node.replay.offline import replay
    bag = write_sample_bag(tmp_path / 'bag', SampleBagSpec(duration_sec=2.0))
    params = write_sample_bag_params(tmp_path)
    result = replay(bag, params, tmp_path / 'out', checkpoint=str(tiny), seed=1)
    summary = result.summary
    assert summary['policy_type'] == 'smolvla' and summary['published'] > 0
    assert summary['cache']['entry_bytes'] == smolvla_preset('tiny').cache_entry_bytes(4)
    # The joints move at 50 Hz while frames change at 5 Hz: ticks between frames hit.
    assert summary['cache']['hits'] >= summary['published'] // 3


def test_make_checkpoint_writes_a_smolvla(tmp_path, capsys):
    from vla_policy_node.policy.tiny_default import main
    assert main([str(tmp_path / 'out'), '--type', 'smolvla']) == 0
    assert 'smolvla' in capsys.readouterr().out
    assert load_checkpoint(tmp_path / 'out', CPU, torch.float32).config.policy_type == 'smolvla'
