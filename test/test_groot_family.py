"""GR00T N1.7 behind the family seam: loading (every config field classified, refusals by name, nothing from the
network), the prompt, the state-free cache (a state change hits, a hit equals its miss bit for bit, the entry's
bytes), prompt buckets, a capture-safe Euler loop, the checkpoint writer. Parity with lerobot: test_groot_pipeline.py;
the fast path, batching and the capture stand-in: the registry-parametrised tests (test_fast_path.py,
test_batching.py, test_capture_standin.py); the applications: test_groot_applications.py and
test_state_free_cache_dds.py."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

from groot_fixtures import CAMERAS, fixture_inputs, leftover, write_tiny_groot
from vla_policy_node.fast_path import StaticDenoiser
from vla_policy_node.observation import Observation, ObservationError, SkipReason
from vla_policy_node.policy.checkpoint import CheckpointError, read_config_json
from vla_policy_node.policy.families.groot.adapter import GrootFamily
from vla_policy_node.policy.families.groot.config import GROOT_CONFIG_FIELDS
from vla_policy_node.policy.families.groot.presets import groot_preset
from vla_policy_node.policy.rtc import RTCSettings
from vla_policy_node.policy.tokenizer import TokenizerError
from vla_policy_node.runtime import PolicyRuntime

CPU = torch.device('cpu')
TASK = 'Pick up the RED cube!'

# GrootConfig's fields (src/lerobot/policies/groot/configuration_groot.py) and PreTrainedConfig's
# (src/lerobot/configs/policies.py) at huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b.
LEROBOT_GROOT_FIELDS = (
    'n_obs_steps', 'input_features', 'output_features', 'device', 'use_amp', 'use_peft', 'push_to_hub', 'repo_id',
    'private', 'tags', 'license', 'pretrained_path', 'pretrained_revision', 'chunk_size', 'n_action_steps',
    'max_state_dim', 'max_action_dim', 'normalization_mapping', 'base_model_path', 'action_decode_transform',
    'embodiment_tag', 'tune_llm', 'tune_visual', 'tune_projector', 'tune_diffusion_model', 'tune_vlln',
    'tune_top_llm_layers', 'num_inference_timesteps', 'rtc_ramp_rate', 'use_flash_attention', 'use_relative_actions',
    'relative_exclude_joints', 'optimizer_lr', 'optimizer_betas', 'optimizer_eps', 'optimizer_weight_decay',
    'warmup_ratio', 'use_bf16', 'model_params_fp32', 'image_size', 'tokenizer_assets_repo', 'lora_rank', 'lora_alpha',
    'lora_dropout', 'lora_full_model', 'video_backend', 'balance_dataset_weights', 'balance_trajectory_weights',
    'dataset_paths', 'output_dir', 'save_steps', 'max_steps', 'batch_size', 'dataloader_num_workers', 'report_to',
    'resume')


@pytest.fixture(scope='module')
def tiny(tmp_path_factory) -> Path:
    return write_tiny_groot(tmp_path_factory.mktemp('groot') / 'tiny', 'flat')


@pytest.fixture(scope='module')
def runtime(tiny) -> PolicyRuntime:
    return PolicyRuntime(GrootFamily.load(tiny, CPU, torch.float32), 'test')


@pytest.fixture
def folder(tmp_path, tiny) -> Path:
    """A copy of the tiny fine-tune whose files a test may edit (the base model and the processor folder stay)."""
    return Path(shutil.copytree(tiny, tmp_path / 'policy'))


def observation(seed: int = 7, state=None, task: str = TASK, frames=None) -> Observation:
    inputs = fixture_inputs(seed)
    images = frames or {name: inputs[f'frame.{name}'] for name in CAMERAS}
    return Observation(images, inputs['state'] if state is None else np.asarray(state, np.float32), task)


def edit_json(path: Path, change) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def step(document, registry):
    return next(s for s in document['steps'] if s['registry_name'] == registry)


# ---- loading -----------------------------------------------------------------------------------------------------

def test_every_lerobot_groot_field_is_classified_and_nothing_else():
    assert set(GROOT_CONFIG_FIELDS) - {'type'} == set(LEROBOT_GROOT_FIELDS)


def test_the_folder_loads_with_the_checkpoints_camera_order_and_horizon(runtime):
    config = runtime.config
    assert config.camera_names == ('wrist', 'top')          # the pack step's video_modality_keys, not config.json's
    assert config.image_resolution == (64, 96) and config.tokens_per_image == 6
    assert (config.chunk_size, config.n_action_steps, config.num_inference_steps) == (8, 8, 4)
    assert config.embodiment_id == 10 and runtime.policy.describe()['embodiment'] == 'new_embodiment'


def set_config(name, value):
    return ('config.json', lambda d: d.__setitem__(name, value))


def set_step(file, registry, name, value):
    return (file, lambda d: step(d, registry)['config'].__setitem__(name, value))


REFUSALS = {
    'use_relative_actions': (set_config('use_relative_actions', True), 'use_relative_actions'),
    'tokenizer_assets_repo': (set_config('tokenizer_assets_repo', 'nvidia/x'), 'tokenizer_assets_repo'),
    'unknown field': (set_config('my_field', 1), 'my_field'),
    'albumentations': (set_step('policy_preprocessor.json', 'groot_n1_7_vlm_encode_v1', 'use_albumentations', True),
                       'use_albumentations'),
    'letter box': (set_step('policy_preprocessor.json', 'groot_n1_7_vlm_encode_v1', 'letter_box_transform', True),
                   'letter_box_transform'),
    'video horizon': (set_step('policy_preprocessor.json', 'groot_n1_7_pack_inputs_v1', 'video_horizon', 2),
                      'video_horizon'),
    'unknown step': (('policy_preprocessor.json',
                      lambda d: d['steps'].insert(2, {'registry_name': 'relative_actions_processor', 'config': {}})),
                     'relative_actions_processor'),
}


@pytest.mark.parametrize('case', list(REFUSALS))
def test_what_is_not_implemented_is_refused_by_name(folder, case):
    (file, change), name = REFUSALS[case]
    edit_json(folder / file, change)
    with pytest.raises(CheckpointError, match=name):
        GrootFamily.load_checkpoint(folder, read_config_json(folder), CPU, torch.float32)


def test_an_embodiment_missing_from_the_mapping_is_refused(folder):
    edit_json(folder / 'config.json', lambda d: d.__setitem__('embodiment_tag', 'my_arm'))
    edit_json(folder / 'policy_preprocessor.json',
              lambda d: step(d, 'groot_n1_7_pack_inputs_v1')['config'].__setitem__('embodiment_tag', 'my_arm'))
    with pytest.raises(CheckpointError, match="embodiment_tag 'my_arm' is not in .*embodiment_mapping"):
        GrootFamily.load_checkpoint(folder, read_config_json(folder), CPU, torch.float32)


def test_relative_action_groups_are_refused(tmp_path):
    policy = write_tiny_groot(tmp_path / 'groups', 'groups')

    def relative(document):
        config = step(document, 'groot_n1_7_action_decode_v1')['config']
        config['use_relative_action'] = True
        config['modality_config']['action']['action_configs'][0]['rep'] = 'relative'
    edit_json(policy / 'policy_postprocessor.json', relative)
    with pytest.raises(CheckpointError, match="group 'arm' is relative"):
        GrootFamily.load_checkpoint(policy, read_config_json(policy), CPU, torch.float32)


def test_hub_ids_not_on_disk_are_refused_naming_the_folder_to_pass(folder, tiny, tmp_path, monkeypatch):
    cache = tmp_path / 'hub'
    monkeypatch.setenv('HF_HUB_CACHE', str(cache))
    base = Path(read_config_json(tiny)['base_model_path'])
    edit_json(folder / 'config.json', lambda d: d.__setitem__('base_model_path', 'nvidia/GR00T-N1.7-3B'))
    with pytest.raises(CheckpointError, match=r"base_model_path 'nvidia/GR00T-N1.7-3B' .*hf download "
                                              r"nvidia/GR00T-N1.7-3B config.json.*set base_model_path"):
        GrootFamily.load_checkpoint(folder, read_config_json(folder), CPU, torch.float32)
    # In the Hugging Face cache it is found without the network.
    snapshot = cache / 'models--nvidia--GR00T-N1.7-3B' / 'snapshots' / 'abc123'
    shutil.copytree(base, snapshot)
    (cache / 'models--nvidia--GR00T-N1.7-3B' / 'refs').mkdir()
    (cache / 'models--nvidia--GR00T-N1.7-3B' / 'refs' / 'main').write_text('abc123')
    assert GrootFamily.load(folder, CPU, torch.float32).config.head.select_layer == 2
    processor = Path(step(json.loads((folder / 'policy_preprocessor.json').read_text()),
                          'groot_n1_7_vlm_encode_v1')['config']['model_name'])
    edit_json(folder / 'policy_preprocessor.json', lambda d: step(d, 'groot_n1_7_vlm_encode_v1')['config']
              .__setitem__('model_name', 'nvidia/Cosmos-Reason2-2B'))
    with pytest.raises(TokenizerError, match=r'gated repository.*fetch it into .*/tokenizer; pass tokenizer_path='):
        GrootFamily.load(folder, CPU, torch.float32)
    assert GrootFamily.load(folder, CPU, torch.float32, tokenizer_path=processor).tokenizer.image_token_id == 151655


def test_float16_is_refused(tiny):
    with pytest.raises(CheckpointError, match='float32 or bfloat16'):
        GrootFamily.load(tiny, CPU, torch.float16)


def test_the_doctors_view_needs_no_processor_folder(tiny, folder):
    edit_json(folder / 'policy_preprocessor.json', lambda d: step(d, 'groot_n1_7_vlm_encode_v1')['config']
              .__setitem__('model_name', 'nvidia/Cosmos-Reason2-2B'))
    with_folder = GrootFamily.folder_config(tiny, read_config_json(tiny))
    without = GrootFamily.folder_config(folder, read_config_json(folder))
    assert without.camera_names == with_folder.camera_names and with_folder.image_resolution == (64, 96)
    # Without the folder, Qwen3-VL's own image processor settings: smart_resize to at least 65536 pixels.
    assert without.image_resolution == (224, 320)


# ---- the prompt --------------------------------------------------------------------------------------------------

def real_tokens(policy, task):
    ids, mask = policy.prompt_tokens(task, None)
    return ids[mask]


def test_the_prompt_is_the_chat_template_with_every_cameras_image_tokens(runtime):
    policy = runtime.policy
    rendered = policy.tokenizer.render('pick up the red cube', 2)
    assert rendered == ('<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|>'
                        '<|vision_end|>pick up the red cube<|im_end|>\n')
    ids, mask = policy.prompt_tokens(TASK, None)
    length = int(mask.sum())
    assert len(ids) == runtime.config.tokenizer_max_length and mask[:length].all() and not mask[length:].any()
    assert int((ids[mask] == 151655).sum()) == 2 * runtime.config.tokens_per_image
    assert np.array_equal(ids, policy.prompt_tokens('pick up the red cube', None)[0]), 'formalised task'
    with pytest.raises(ObservationError) as error:
        policy.prompt_tokens('cube ' * 600, None)
    assert error.value.reason == SkipReason.INSTRUCTION_TOO_LONG


def test_an_unformalised_task_cannot_smuggle_image_tokens(tmp_path):
    policy = GrootFamily.load(write_tiny_groot(tmp_path / 'raw', 'flat', formalize_language=False), CPU,
                              torch.float32)
    assert not np.array_equal(real_tokens(policy, TASK), real_tokens(policy, TASK.lower()))
    with pytest.raises(ObservationError, match='special token'):
        policy.prompt_tokens('grab <|image_pad|> now', None)


def test_the_chat_template_may_come_from_chat_template_jinja(tmp_path, tiny):
    processor = Path(step(json.loads((tiny / 'policy_preprocessor.json').read_text()),
                          'groot_n1_7_vlm_encode_v1')['config']['model_name'])
    copy = Path(shutil.copytree(processor, tmp_path / 'processor'))
    config = json.loads((copy / 'tokenizer_config.json').read_text())
    (copy / 'chat_template.jinja').write_text(config.pop('chat_template'))
    (copy / 'tokenizer_config.json').write_text(json.dumps(config))
    policy = GrootFamily.load(tiny, CPU, torch.float32, tokenizer_path=copy)
    reference = GrootFamily.load(tiny, CPU, torch.float32)
    assert np.array_equal(real_tokens(policy, TASK), real_tokens(reference, TASK))
    (copy / 'chat_template.jinja').unlink()
    with pytest.raises(TokenizerError, match='no chat template'):
        GrootFamily.load(tiny, CPU, torch.float32, tokenizer_path=copy)


# ---- the cache ------------------------------------------------------------------------------------------------

def test_a_state_change_hits_and_equals_a_fresh_miss(runtime):
    runtime.cache.clear()
    runtime.infer(observation(), seed=1)
    other_state = np.linspace(-2, 2, 5)
    hit = runtime.infer(observation(state=other_state), seed=2)
    miss = runtime.infer(observation(state=other_state), seed=2, use_cache=False)
    assert hit.cache_hit and not miss.cache_hit
    assert np.array_equal(hit.actions, miss.actions)
    again = runtime.infer(observation(), seed=2)
    assert again.cache_hit and not np.array_equal(again.actions, hit.actions), 'the state reaches the actions'


def test_a_frame_or_task_change_misses(runtime):
    runtime.cache.clear()
    runtime.infer(observation(), seed=1)
    frames = dict(observation().images)
    frames['top'] = frames['top'].copy()
    frames['top'][0, 0, 0] ^= 1
    assert not runtime.infer(observation(frames=frames), seed=1).cache_hit
    assert not runtime.infer(observation(task='stack the cubes'), seed=1).cache_hit


def test_a_hit_never_writes_the_entry_and_the_entry_is_analytic(runtime):
    runtime.cache.clear()
    runtime.infer(observation(), seed=1)
    entry = runtime.cache.get(runtime.prefix_key(observation()))
    before = {name: tensor.clone() for name, tensor in entry.items()}
    runtime.infer(observation(state=np.ones(5)), seed=3, prev_chunk_left_over=leftover(), inference_delay=2,
                  rtc=RTCSettings(mode='inpainting'))
    assert all(torch.equal(before[name], entry[name]) for name in before)
    # Three sequences, each with its own mask: the prompt bucket, its text subset, the image tokens.
    config = runtime.config
    assert dict(entry.masks) == {'prefix': 'token_mask', 'text': 'text_mask', 'image': 'image_mask'}
    bucket = runtime.prompt_buckets[0]
    assert entry.prefix_len == bucket and entry['text_kv'].shape[-2] == bucket - config.image_tokens
    assert entry['token_mask'].sum() == entry['text_mask'].sum() + config.image_tokens
    # At the longest bucket an entry holds exactly the analytic bytes.
    context = policy_context(runtime.policy, config.tokenizer_max_length)
    assert context.nbytes == config.cache_entry_bytes(4)
    assert entry.nbytes < config.cache_entry_bytes(4)


def policy_context(policy, bucket, task=TASK):
    """The context of the fixture frames and ``task`` with the prompt fitted to ``bucket`` (as the runtime does)."""
    inputs = fixture_inputs()
    ids, mask = policy.prompt_tokens(task, None)
    frames = [(name, inputs[f'frame.{name}']) for name in policy.config.camera_names]
    return policy.fill_prefix(*policy.prefix_inputs(frames, ids[:bucket], mask[:bucket]))


def test_prompt_buckets_pad_the_text_keys_exactly_and_the_backbone_sees_the_prompt_alone(runtime):
    """The prompt runs through the backbone at its own length in every bucket (features equal bit for bit); the
    text K/V padded to a larger bucket with a False mask change the actions by rounding only."""
    policy = runtime.policy
    noise = torch.from_numpy(fixture_inputs()['noise'])
    state = torch.zeros(1, runtime.config.max_state_dim)
    small, large = runtime.prompt_buckets[0], runtime.config.tokenizer_max_length
    contexts = [policy_context(policy, bucket) for bucket in (small, large)]
    length = int(contexts[0]['token_mask'].sum())
    text = length - runtime.config.image_tokens
    assert torch.equal(contexts[0]['features'][:, :length], contexts[1]['features'][:, :length])
    assert not contexts[1]['features'][:, length:].any() and not contexts[1]['text_mask'][:, text:].any()
    assert torch.equal(contexts[0]['text_kv'][..., :text, :], contexts[1]['text_kv'][..., :text, :])
    results = [policy.denoise(context, state, noise, 4) for context in contexts]
    assert (results[0] - noise).abs().max() > 0.1
    assert (results[0] - results[1]).abs().max() < 1e-5


def test_the_real_shapes_entry_is_analytic():
    config = groot_preset('groot')
    assert config.tokens_per_image == 64 and config.image_resolution == (256, 256)
    # 8 text and 8 image blocks' K/V (1536 wide, bf16) + the 2048-wide fp32 features, at the longest prompt; the
    # three masks (prompt, text subset, image tokens).
    text, images = config.prefix_len - 128, 128
    assert config.kv_entry_bytes(2) == 8 * 2 * (text + images) * 1536 * 2 + config.prefix_len * 2048 * 4
    assert config.cache_entry_bytes(2) == config.kv_entry_bytes(2) + 2 * config.prefix_len


# ---- the loop: RTC and capture ---------------------------------------------------------------------------------

class ForbidWhatACaptureForbids(TorchDispatchMode):
    """A CUDA graph capture cannot synchronise with the host, draw random numbers or copy Python values in:
    raise on the ops that would (item / nonzero / masked_select / bool indexing, RNG, tensors made from data)."""

    FORBIDDEN = ('_local_scalar_dense', 'nonzero', 'masked_select', 'lift_fresh', 'randn', 'normal', 'uniform',
                 'bernoulli', 'random_', 'multinomial', 'is_nonzero', 'equal', '_assert_async')

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if any(name == forbidden or name.startswith(forbidden) for forbidden in self.FORBIDDEN):
            raise RuntimeError(f'{name} is not allowed under capture')
        if name == 'index' and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            raise RuntimeError('boolean indexing is not allowed under capture')
        return func(*args, **(kwargs or {}))


def test_the_prefix_and_the_euler_loop_are_capture_safe_and_the_stand_in_bites(runtime):
    policy = runtime.policy
    inputs = policy.prefix_inputs([(name, fixture_inputs()[f'frame.{name}']) for name in policy.config.camera_names],
                                  *[part[:60] for part in policy.prompt_tokens(TASK, None)])
    context = policy.fill_prefix(*inputs)
    with ForbidWhatACaptureForbids():        # the second fill: the ViT's grid tables are made by the first
        again = policy.fill_prefix(*inputs)
    assert all(torch.equal(again[name], context[name]) for name in context)
    noise = torch.from_numpy(fixture_inputs()['noise'])
    state = torch.zeros(1, runtime.config.max_state_dim)
    chunk = policy.chunk_setup(context, state, noise, 4, prev_chunk_left_over=torch.from_numpy(leftover()),
                               inference_delay=2, rtc=RTCSettings(mode='inpainting'))
    expected = policy.euler_loop(chunk)
    with ForbidWhatACaptureForbids():
        got = policy.euler_loop(chunk)
    assert torch.equal(got, expected)
    with pytest.raises(RuntimeError, match='not allowed under capture'), ForbidWhatACaptureForbids():
        policy.chunk_setup(context, state, noise, 4, prev_chunk_left_over=torch.from_numpy(leftover()),
                           rtc=RTCSettings(mode='inpainting'))          # the leftover's padding rows: a host sync


def test_the_static_workspace_gives_the_plain_actions_and_never_writes_the_entry(runtime):
    policy = runtime.policy
    fast = StaticDenoiser(policy, family_name='groot', graphs=False)
    from vla_policy_node.fast_path import EntryToken
    contexts = [policy_context(policy, bucket) for bucket in runtime.prompt_buckets[:2]]
    noise, state = torch.from_numpy(fixture_inputs()['noise']), torch.zeros(1, runtime.config.max_state_dim)
    for index, context in enumerate(contexts + contexts):
        expected = policy.denoise(context, state, noise, 4)
        kv = context['text_kv'].clone()
        got = fast.denoise(context, EntryToken(str(index % 2), index % 2), state, noise, 4)
        assert torch.equal(got, expected) and torch.equal(context['text_kv'], kv)
    assert len(fast.workspaces) == 2


# ---- the writer --------------------------------------------------------------------------------------------------

def test_the_package_writer_writes_lerobots_layout(tmp_path, tiny):
    from vla_policy_node.policy.tiny_default import statistics
    torch.manual_seed(0)
    model = GrootFamily.model_class(GrootFamily.tiny_config()).eval()
    tokenizer = GrootFamily.build_test_tokenizer(tmp_path / 'tok', 512)
    folder = GrootFamily.save_checkpoint(tmp_path / 'ckpt', model, statistics(6, 0.5), statistics(6, 0.2), tokenizer)
    assert sorted(p.name for p in tiny.iterdir()) == sorted(p.name for p in folder.iterdir()
                                                            if p.name not in ('base_model', 'processor'))
    assert set(json.loads((tiny / 'config.json').read_text())) == set(json.loads((folder / 'config.json').read_text()))
    loaded = GrootFamily.load(folder, CPU, torch.float32)
    assert all(torch.equal(loaded.model.state_dict()[k], v) for k, v in model.state_dict().items())
    weights = load_file(str(folder / 'model.safetensors'))
    assert '_groot_model.backbone.model.lm_head.weight' in weights
    assert '_groot_model.backbone.model.model.language_model.embed_tokens.weight' not in weights


def test_the_runtimes_warm_up_and_self_description_work(runtime):
    chunk = runtime.warmup()
    assert chunk.actions.shape == (8, 5 - 1) and np.isfinite(chunk.actions).all()
    described = runtime.describe()
    assert described['policy_type'] == 'groot' and described['cache_entry_bytes'] == \
        runtime.config.cache_entry_bytes(4)
