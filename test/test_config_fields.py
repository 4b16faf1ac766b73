"""Every config.json field of lerobot's PI0Config / PI05Config is classified, and nothing we do not implement loads."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from runtime_fixtures import tiny_checkpoints  # noqa: F401
from vla_policy_node.policy.checkpoint import CheckpointError
from vla_policy_node.policy.config_fields import DEFAULT_ONLY, IMPLEMENTED, METADATA, TRAINING, ConfigError
from vla_policy_node.policy.families import family_class, load_checkpoint

# The fields of lerobot's configs with the values its draccus dump writes for a default config, in dataclass
# order, read from huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b:
# src/lerobot/configs/policies.py (PreTrainedConfig), src/lerobot/policies/pi0/configuration_pi0.py (PI0Config),
# src/lerobot/policies/pi05/configuration_pi05.py (PI05Config). "type" is the draccus choice key.
PRETRAINED_CONFIG = {
    'n_obs_steps': 1, 'input_features': {}, 'output_features': {}, 'device': 'cuda', 'use_amp': False,
    'use_peft': False, 'push_to_hub': True, 'repo_id': None, 'private': None, 'tags': None, 'license': None,
    'pretrained_path': None, 'pretrained_revision': None,
}
PI_COMMON = {
    'paligemma_variant': 'gemma_2b', 'action_expert_variant': 'gemma_300m', 'dtype': 'float32', 'chunk_size': 50,
    'n_action_steps': 50,
}
PI_FLOW = {
    'max_state_dim': 32, 'max_action_dim': 32, 'num_inference_steps': 10, 'time_sampling_beta_alpha': 1.5,
    'time_sampling_beta_beta': 1.0, 'time_sampling_scale': 0.999, 'time_sampling_offset': 0.001,
    'min_period': 0.004, 'max_period': 4.0, 'use_relative_actions': False, 'relative_exclude_joints': ['gripper'],
    'action_feature_names': None, 'rtc_config': None,
}
PI_TRAINING = {
    'gradient_checkpointing': False, 'compile_model': False, 'compile_mode': 'max-autotune',
    'freeze_vision_encoder': False, 'train_expert_only': False, 'optimizer_lr': 2.5e-05,
    'optimizer_betas': [0.9, 0.95], 'optimizer_eps': 1e-08, 'optimizer_weight_decay': 0.01,
    'optimizer_grad_clip_norm': 1.0, 'scheduler_warmup_steps': 1000, 'scheduler_decay_steps': 30000,
    'scheduler_decay_lr': 2.5e-06,
}
LEROBOT_PI0_CONFIG = dict(
    PRETRAINED_CONFIG, **PI_COMMON, **PI_FLOW, image_resolution=[224, 224], empty_cameras=0,
    normalization_mapping={'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'},
    **PI_TRAINING, tokenizer_max_length=48)
LEROBOT_PI05_CONFIG = dict(
    PRETRAINED_CONFIG, **PI_COMMON, use_visual_memory=False, use_proprioceptive_memory=False, memory_frames=6,
    memory_stride=30, memory_temporal_attention_every=4, **PI_FLOW, rtc_training_max_delay=0,
    image_resolution=[224, 224], empty_cameras=0, tokenizer_max_length=200,
    normalization_mapping={'VISUAL': 'IDENTITY', 'STATE': 'QUANTILES', 'ACTION': 'QUANTILES'}, **PI_TRAINING)
LEROBOT_CONFIGS = {'pi0': LEROBOT_PI0_CONFIG, 'pi05': LEROBOT_PI05_CONFIG}
CPU = torch.device('cpu')


def test_the_field_lists_are_lerobots():
    assert len(LEROBOT_PI0_CONFIG) == 48 and len(LEROBOT_PI05_CONFIG) == 54


def parse(raw: dict):
    """config.json -> the config of the family its type names (the registry's dispatch)."""
    return family_class(raw['type'] if raw.get('type') in ('pi0', 'pi05') else 'pi0').parse_config(raw)


@pytest.mark.parametrize('policy_type', ['pi0', 'pi05'])
def test_every_lerobot_field_is_classified_for_its_type(policy_type):
    fields = set(LEROBOT_CONFIGS[policy_type]) | {'type'}
    classified = set(family_class(policy_type).config_fields())
    assert not fields - classified, f'lerobot {policy_type} fields missing from its family\'s field table'
    # Nothing stale either: only this project's model_sizes is not a lerobot field.
    assert classified - fields == {'model_sizes'}


@pytest.mark.parametrize('policy_type', ['pi0', 'pi05'])
def test_the_table_is_well_formed(policy_type):
    table = family_class(policy_type).config_fields()
    for entry in table.values():
        assert entry.handling in (IMPLEMENTED, TRAINING, METADATA, DEFAULT_ONLY), entry
        assert bool(entry.accepted) == (entry.handling == DEFAULT_ONLY), entry
        assert entry.why, entry
    # Real-time chunking is implemented: a trained delay is read, lerobot's rollout RTC settings are not ours.
    assert table['rtc_config'].handling == METADATA
    if policy_type == 'pi05':
        assert table['rtc_training_max_delay'].handling == IMPLEMENTED


def full_config(policy_type: str, **changes) -> dict:
    """A config.json as lerobot writes it: every field, plus the tiny model's features and sizes."""
    tiny = family_class(policy_type).tiny_config().to_lerobot_dict()
    raw = dict(LEROBOT_CONFIGS[policy_type], type=policy_type)
    for key in ('input_features', 'output_features', 'model_sizes', 'image_resolution', 'chunk_size',
                'n_action_steps', 'tokenizer_max_length'):
        raw[key] = tiny[key]
    raw.update(changes)
    return raw


@pytest.mark.parametrize('policy_type', ['pi0', 'pi05'])
def test_a_complete_lerobot_config_loads(policy_type):
    config = parse(full_config(policy_type))
    assert config.policy_type == policy_type and not config.use_relative_actions
    assert config.relative_exclude_joints == ('gripper',) and config.action_feature_names is None


@pytest.mark.parametrize('policy_type', ['pi0', 'pi05'])
def test_training_and_metadata_fields_load_with_any_value(policy_type):
    changes = {'optimizer_lr': 1.0, 'compile_model': True, 'gradient_checkpointing': True, 'train_expert_only': True,
               'freeze_vision_encoder': True, 'time_sampling_beta_alpha': 3.0, 'scheduler_decay_steps': 5,
               'device': 'mps', 'use_amp': True, 'push_to_hub': False, 'repo_id': 'me/pi', 'tags': ['x'],
               'pretrained_path': '/models/base', 'dtype': 'bfloat16'}
    parse(full_config(policy_type, **changes))


REFUSED = [
    ('pi0', 'n_obs_steps', 2, '2'),
    ('pi05', 'n_obs_steps', 3, '3'),
    ('pi0', 'use_peft', True, 'true'),
    ('pi05', 'use_visual_memory', True, 'true'),
    ('pi05', 'use_proprioceptive_memory', True, 'true'),
    ('pi0', 'n_obs_steps', True, 'true'),           # a bool is not the int 1
]


def test_rtc_fields_load_a_trained_delay_and_leave_rollout_settings_to_the_node():
    config = parse(full_config('pi05', rtc_training_max_delay=5))
    assert config.rtc_training_max_delay == 5
    assert parse(full_config('pi0', rtc_config={'enabled': True})).rtc_training_max_delay == 0
    with pytest.raises(ConfigError, match='rtc_training_max_delay'):
        parse(full_config('pi05', rtc_training_max_delay=10))   # not below chunk_size


@pytest.mark.parametrize('policy_type, name, value, shown', REFUSED)
def test_an_unimplemented_field_off_its_default_is_refused_naming_field_and_value(policy_type, name, value, shown):
    with pytest.raises(ConfigError) as info:
        parse(full_config(policy_type, **{name: value}))
    assert name in str(info.value) and shown in str(info.value)


@pytest.mark.parametrize('policy_type, key', [
    ('pi0', 'use_visual_memory'),          # a pi0.5-only field on a pi0 config
    ('pi0', 'rtc_training_max_delay'),
    ('pi05', 'use_fancy_future_thing'),    # a field a later lerobot might add
    ('pi0', 'adapt_to_pi_aloha'),          # a field of the pre-#1910 pi0
])
def test_unknown_fields_are_refused_by_name(policy_type, key):
    with pytest.raises(ConfigError) as info:
        parse(full_config(policy_type, **{key: False}))
    assert key in str(info.value)


@pytest.mark.parametrize('mapping, named', [
    ({'VISUAL': 'MEAN_STD', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'}, 'normalization_mapping.VISUAL = "MEAN_STD"'),
    ({'VISUAL': 'IDENTITY', 'STATE': 'LOG', 'ACTION': 'MEAN_STD'}, 'normalization_mapping.STATE = "LOG"'),
    ({'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'TANH'}, 'normalization_mapping.ACTION = "TANH"'),
])
def test_normalisation_modes_we_do_not_compute_are_refused(mapping, named):
    with pytest.raises(ConfigError) as info:
        parse(full_config('pi0', normalization_mapping=mapping))
    assert named in str(info.value)


@pytest.mark.parametrize('mode', ['IDENTITY', 'MEAN_STD', 'QUANTILES', 'QUANTILE10', 'MIN_MAX'])
def test_every_lerobot_normalisation_mode_loads_for_state_and_action(mode, tmp_path, tiny_checkpoints):
    folder = Path(shutil.copytree(tiny_checkpoints['pi0'], tmp_path / 'ckpt'))
    raw = json.loads((folder / 'config.json').read_text())
    raw['normalization_mapping'] = {'VISUAL': 'IDENTITY', 'STATE': mode, 'ACTION': mode}
    (folder / 'config.json').write_text(json.dumps(raw))
    loaded = load_checkpoint(folder, CPU, torch.float32)
    assert loaded.state_normalizer.mode == mode and loaded.action_normalizer.mode == mode


@pytest.mark.parametrize('type_value', ['act', 'pi0_fast', None, 'smolvla'])
def test_an_unknown_type_is_refused_naming_it(type_value):
    with pytest.raises(ConfigError) as info:
        parse(full_config('pi0', type=type_value))
    assert repr(type_value) in str(info.value)


def test_relative_fields_are_read():
    config = parse(full_config(
        'pi0', use_relative_actions=True, relative_exclude_joints=['Gripper', 'wrist'],
        action_feature_names=['a.pos', 'b.pos', 'c.pos', 'd.pos', 'e.pos', 'f.pos']))
    assert config.use_relative_actions
    assert config.relative_exclude_joints == ('Gripper', 'wrist')
    assert config.action_feature_names == ('a.pos', 'b.pos', 'c.pos', 'd.pos', 'e.pos', 'f.pos')
    # null exclusions: every joint relative, as lerobot's empty list
    assert parse(full_config('pi0', relative_exclude_joints=None)).relative_exclude_joints \
        == ()


@pytest.mark.parametrize('name, value', [('use_relative_actions', 1), ('relative_exclude_joints', 'gripper'),
                                         ('action_feature_names', [1, 2])])
def test_malformed_relative_fields_are_refused(name, value):
    with pytest.raises(ConfigError, match=name):
        parse(full_config('pi0', **{name: value}))


def test_relative_actions_with_a_state_shorter_than_the_action_are_refused():
    raw = full_config('pi0', use_relative_actions=True)
    raw['input_features']['observation.state']['shape'] = [4]        # action_dim is 6
    with pytest.raises(ConfigError, match='state_dim 4 < action_dim 6'):
        parse(raw)
    raw['use_relative_actions'] = False                               # absolute actions: fine
    assert parse(raw).state_dim == 4


def _edit(folder: Path, name: str, edit) -> None:
    document = json.loads((folder / name).read_text())
    edit(document)
    (folder / name).write_text(json.dumps(document))


def _step(document: dict, registry_name: str) -> dict:
    return next(step for step in document['steps'] if step['registry_name'] == registry_name)


@pytest.mark.parametrize('file_name, step, key, value', [
    ('policy_preprocessor.json', 'relative_actions_processor', 'enabled', True),
    ('policy_postprocessor.json', 'absolute_actions_processor', 'enabled', True),
])
def test_processor_files_that_disagree_with_config_json_are_refused(tiny_checkpoints, tmp_path, file_name, step,
                                                                    key, value):
    folder = Path(shutil.copytree(tiny_checkpoints['pi0'], tmp_path / 'ckpt'))
    load_checkpoint(folder, CPU, torch.float32)
    _edit(folder, file_name, lambda doc: _step(doc, step)['config'].__setitem__(key, value))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(folder, CPU, torch.float32)
    assert file_name in str(info.value) and key in str(info.value)


def test_a_processor_file_without_relative_steps_is_an_absolute_checkpoint(tiny_checkpoints, tmp_path):
    # lerobot before #2970 wrote no relative/absolute steps.
    folder = Path(shutil.copytree(tiny_checkpoints['pi0'], tmp_path / 'ckpt'))
    for name in ('policy_preprocessor.json', 'policy_postprocessor.json'):
        _edit(folder, name, lambda doc: doc.__setitem__('steps', [
            s for s in doc['steps'] if 'relative' not in s['registry_name'] and 'absolute' not in s['registry_name']]))
    assert not load_checkpoint(folder, CPU, torch.float32).config.use_relative_actions
