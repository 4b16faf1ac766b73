"""The parameter table's validation, without rclpy: the rules the node and the replay both enforce."""
import pytest

from vla_policy_node.params import (PARAMETERS, SPECS, ParameterError, effective, problems, resolve_values,
                                    validate)
from vla_policy_node.policy.families.pi0.config import preset

JOINTS = [f'joint_{i}' for i in range(1, 7)]
CONFIG = preset('tiny')            # 6 actions, 6 state values, chunk 10, three cameras


def values(**overrides):
    return resolve_values(dict({'joint_names': JOINTS}, **overrides))


def test_defaults_with_joint_names_are_valid_with_and_without_the_checkpoint():
    validate(values())
    validate(values(), CONFIG)


@pytest.mark.parametrize('overrides, message', [
    # ranges, types, choices, finiteness: the descriptor's rules, in our words
    (dict(control_rate_hz=-3.0), r'control_rate_hz must be in \[0.1, 100\], got -3.0'),
    (dict(control_rate_hz=0.0), r'control_rate_hz must be in \[0.1, 100\]'),
    (dict(control_rate_hz=10), 'control_rate_hz must be a double'),
    (dict(control_rate_hz=float('nan')), 'control_rate_hz must be finite'),
    (dict(num_steps=-1), r'num_steps must be in \[0, 100\], got -1'),
    (dict(num_steps=True), 'num_steps must be a int'),
    (dict(action_period_sec=-0.1), 'action_period_sec must be in'),
    (dict(execute_steps='ten'), 'execute_steps must be a int'),
    (dict(stamp_mode='bogus'), "stamp_mode must be one of \\['zero', 'observation'\\]"),
    (dict(camera_types=['raw', 'jpeg']), 'camera_types must be one of'),
    (dict(joint_upper_limits=[1.0, float('inf')] + [0.0] * 4), 'joint_upper_limits must be finite'),
    # required, unique, lengths, order between arrays
    (dict(joint_names=None), 'joint_names is not set'),
    (dict(joint_names=[]), 'joint_names is not set'),
    (dict(joint_names=['a', 'a', 'b', 'c', 'd', 'e']), 'joint_names has duplicates'),
    (dict(state_joint_names=JOINTS[:1] * 6), 'state_joint_names has duplicates'),
    (dict(camera_names=['a', 'a']), 'camera_names has duplicates'),
    (dict(joint_lower_limits=[0.0] * 5), 'joint_lower_limits has 5 entries for 6 joint_names'),
    (dict(joint_lower_limits=[1.0] * 6, joint_upper_limits=[-1.0] * 6),
     'joint_lower_limits must not exceed joint_upper_limits'),
    (dict(camera_names=['a', 'b'], camera_topics=['/a']), 'camera_topics has 1 entries for 2 camera_names'),
])
def test_values_refused_without_a_checkpoint(overrides, message):
    with pytest.raises(ParameterError, match=message):
        validate(values(**overrides))


@pytest.mark.parametrize('overrides, message', [
    (dict(joint_names=JOINTS[:5]), 'joint_names has 5 entries; the checkpoint has action_dim 6'),
    (dict(state_joint_names=JOINTS + ['joint_7']), 'state_joint_names has 7 entries; the checkpoint has state_dim 6'),
    (dict(execute_steps=11), 'execute_steps 11 exceeds the checkpoint chunk_size 10'),
    (dict(camera_names=['front_cam']), r"camera_names \['front_cam'\] are not in the checkpoint camera_names"),
    # camera_names unset means every camera of the checkpoint: topics must then match their number
    (dict(camera_topics=['/a', '/b']), 'camera_topics has 2 entries for 3 camera_names'),
    # an RTC mode of another family, named with this family's modes
    (dict(rtc_mode='inpainting'), r'rtc_mode inpainting is not a mode of the pi0 family \(its modes: guided, '
                                  r'trained; auto picks guided\)'),
])
def test_values_refused_against_the_checkpoint(overrides, message):
    validate(values(**overrides))          # fine on their own ...
    with pytest.raises(ParameterError, match=message):
        validate(values(**overrides), CONFIG)      # ... not for this checkpoint


def test_fallbacks():
    assert effective(values(), 'state_joint_names') == JOINTS
    assert effective(values(state_joint_names=['x']), 'state_joint_names') == ['x']
    assert effective(values(), 'camera_names') is None
    assert effective(values(), 'camera_names', CONFIG) == CONFIG.camera_names


def test_unknown_names_are_refused_but_ros_own_parameters_pass():
    with pytest.raises(ParameterError, match=r"unknown parameter\(s\) \['control_rate'\]"):
        resolve_values({'control_rate': 1.0})
    assert resolve_values({'use_sim_time': True})['control_rate_hz'] == SPECS['control_rate_hz'].default


def test_every_problem_is_reported_once_and_names_its_parameter():
    found = problems(values(num_steps=-1, stamp_mode='x', joint_names=None))
    assert [p.split()[0] for p in found] == ['joint_names', 'num_steps', 'stamp_mode']


def test_every_range_and_choice_in_the_table_admits_its_own_default():
    for spec in PARAMETERS:
        if spec.default is not None:
            assert not problems({**values(), spec.name: spec.default}), spec.name


def test_backend_choices_are_the_backend_registry():
    from vla_policy_node.backends import BACKENDS, backend_loader

    assert SPECS['backend'].choices == tuple(BACKENDS) and 'local' in BACKENDS
    with pytest.raises(ParameterError, match='backend'):
        validate(values(backend='grpc'))
    with pytest.raises(KeyError, match='known: local, remote'):
        backend_loader('grpc')
    assert all(callable(backend_loader(name)) for name in BACKENDS)


def test_rtc_mode_auto_fits_every_family_and_another_familys_mode_is_refused_by_name():
    """The default rtc_mode (auto) and num_steps (0: the checkpoint's) configure any family; a mode the
    checkpoint's family lacks is refused naming its modes; a remote server's own policy type is its business."""
    from dataclasses import replace
    from vla_policy_node.policy.families import family_class, known_types
    for kind in known_types():
        config = family_class(kind).tiny_config()
        validate(values(chunking='rtc'), config)
        modes = family_class(kind).capabilities.rtc_modes
        for mode in ('guided', 'trained', 'inpainting'):
            found = [p for p in problems(values(chunking='rtc', rtc_mode=mode), config) if 'not a mode' in p]
            assert bool(found) == (mode not in modes), (kind, mode, found)
    groot = family_class('groot').tiny_config()
    with pytest.raises(ParameterError, match=r'rtc_mode guided is not a mode of the groot family \(its modes: '
                                             r'inpainting; auto picks inpainting\)'):
        validate(values(rtc_mode='guided'), groot)
    from vla_policy_node.remote_settings import RemoteConfig
    remote = RemoteConfig(camera_names=('a',), state_dim=6, action_dim=6, chunk_size=10, policy_type='its_own')
    assert not problems(values(rtc_mode='inpainting'), remote)
    with pytest.raises(ParameterError, match='not a mode of the groot family'):
        validate(values(rtc_mode='guided'), replace(remote, policy_type='groot'))     # vla_policy_serve's metadata
