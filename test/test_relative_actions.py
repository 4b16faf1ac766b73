"""Relative-action checkpoints (lerobot use_relative_actions): the mask, the add-back, and the state it uses."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from runtime_fixtures import make_observation, rgb_image
from vla_policy_node.observation import InputBuffer
from vla_policy_node.params import ParameterError, resolve_values, validate
from vla_policy_node.policy.families.pi0.config import preset
from vla_policy_node.policy.relative_actions import relative_action_mask, to_absolute_actions
from vla_policy_node.policy.tiny_default import TINY_ACTION_NAMES, write_random_checkpoint, write_tiny_default
from vla_policy_node.runtime import PolicyRuntime
from vla_policy_node.settings import input_layout, tick_settings
from vla_policy_node.tick import TickEngine

SO100_NAMES = ['shoulder_pan.pos', 'shoulder_lift.pos', 'elbow_flex.pos', 'wrist_flex.pos', 'wrist_roll.pos',
               'gripper.pos']


# ---- the mask: lerobot's RelativeActionsProcessorStep._build_mask ------------------------------------------------

def test_the_gripper_is_excluded_by_name_by_default():
    assert relative_action_mask(6, ['gripper'], SO100_NAMES).tolist() == [True] * 5 + [False]


def test_exclusion_is_a_case_insensitive_substring_match():
    names = ['left_shoulder', 'left_GRIPPER.pos', 'right_shoulder', 'Right_Gripper_width']
    assert relative_action_mask(4, ['Gripper'], names).tolist() == [True, False, True, False]
    assert relative_action_mask(4, ['shoulder', 'gripper'], names).tolist() == [False] * 4
    # 'pan' is inside 'shoulder_pan.pos': excluded too, however odd.
    assert relative_action_mask(6, ['pan'], SO100_NAMES).tolist() == [False] + [True] * 5


@pytest.mark.parametrize('exclude, names', [([], SO100_NAMES), (None, SO100_NAMES), (['gripper'], None),
                                            (['', ''], SO100_NAMES)])
def test_no_names_or_no_exclusions_make_every_dim_relative(exclude, names):
    assert relative_action_mask(6, exclude, names).tolist() == [True] * 6


def test_names_shorter_than_the_action_pad_with_relative_and_longer_ones_are_cut():
    assert relative_action_mask(4, ['gripper'], ['a', 'gripper']).tolist() == [True, False, True, True]
    assert relative_action_mask(2, ['gripper'], ['a', 'b', 'gripper']).tolist() == [True, True]


# ---- the add-back ----------------------------------------------------------------------------------------------

def test_round_trip_moves_relative_joints_and_leaves_excluded_ones():
    rng = np.random.default_rng(0)
    absolute = rng.normal(size=(10, 6)).astype(np.float32)
    state = rng.normal(size=6).astype(np.float32)
    mask = relative_action_mask(6, ['gripper'], SO100_NAMES)
    # What training fed the model (lerobot's to_relative_actions), then our add-back.
    relative = absolute.copy()
    relative[:, :6] -= state[None] * mask.astype(np.float32)
    assert np.array_equal(relative[:, 5], absolute[:, 5])                       # the gripper stays absolute
    assert np.allclose(relative[:, :5], absolute[:, :5] - state[:5], atol=0)
    restored = to_absolute_actions(relative, state, mask)
    np.testing.assert_allclose(restored, absolute, rtol=0, atol=1e-6)
    assert np.array_equal(restored[:, 5], relative[:, 5])


def test_a_longer_state_adds_its_first_action_dim_values():
    actions = np.zeros((3, 4), dtype=np.float32)
    state = np.array([1.0, 2.0, 3.0, 4.0, 50.0, 60.0])                           # 6 state values, 4 actions
    out = to_absolute_actions(actions, state, np.array([True, True, False, True]))
    assert out.tolist() == [[1.0, 2.0, 0.0, 4.0]] * 3
    assert out.dtype == np.float32


# ---- in the runtime ------------------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def pair(tmp_path_factory):
    """The same seeded weights, saved once as an absolute and once as a relative-action pi0 checkpoint."""
    root = tmp_path_factory.mktemp('relative')
    return (PolicyRuntime.from_pretrained(write_tiny_default(root / 'absolute', 'pi0'), device='cpu', dtype='float32'),
            PolicyRuntime.from_pretrained(write_tiny_default(root / 'relative', 'pi0', relative_actions=True),
                                          device='cpu', dtype='float32'))


def test_relative_checkpoint_adds_the_observation_state_to_non_gripper_joints(pair):
    absolute_rt, relative_rt = pair
    assert relative_rt.policy.relative_mask.tolist() == [True] * 5 + [False]
    assert list(relative_rt.config.action_feature_names) == list(TINY_ACTION_NAMES)
    state = np.array([1.2, -0.7, 0.4, 2.0, -1.5, 0.03])
    obs = make_observation(state=state)
    base = absolute_rt.infer(obs, seed=4).actions
    moved = relative_rt.infer(obs, seed=4).actions
    np.testing.assert_array_equal(moved[:, :5], base[:, :5] + state[:5].astype(np.float32))
    np.testing.assert_array_equal(moved[:, 5], base[:, 5])


def test_each_chunk_is_anchored_to_its_own_observation_and_a_hit_reuses_the_prefix(pair):
    _, relative_rt = pair
    relative_rt.cache.clear()
    first_state = np.zeros(6)
    second_state = np.full(6, 0.5)
    first = relative_rt.infer(make_observation(state=first_state), seed=1)
    second = relative_rt.infer(make_observation(state=second_state), seed=1)
    # pi0: the state is not in the prefix, so the second chunk is a cache hit...
    assert not first.cache_hit and second.cache_hit
    # ...and its offsets are added to its own state, not to the first observation's.
    absolute_rt = pair[0]
    expected = absolute_rt.infer(make_observation(state=second_state), seed=1).actions
    expected[:, :5] += np.float32(0.5)
    np.testing.assert_array_equal(second.actions, expected)


def test_an_rtc_leftover_in_robot_units_is_re_anchored_to_the_new_observation(pair):
    """The executing chunk's absolute targets become offsets from the *new* state before they guide the new
    chunk (lerobot reanchor_relative_rtc_prefix), so guidance agrees with where the arm is commanded to go."""
    from vla_policy_node.policy.rtc import RTCSettings
    _, relative_rt = pair
    state = np.array([1.2, -0.7, 0.4, 2.0, -1.5, 0.03])
    leftover = np.linspace(-1.0, 1.0, 8 * 6).reshape(8, 6)
    rtc = RTCSettings(execution_horizon=6)
    from_robot = relative_rt.infer(make_observation(state=state), seed=2, prev_actions=leftover,
                                   inference_delay=1, rtc=rtc)
    offsets = leftover.copy()
    offsets[:, :5] -= state[:5]
    by_hand = relative_rt.infer(make_observation(state=state), seed=2, inference_delay=1, rtc=rtc,
                                prev_chunk_left_over=relative_rt.action_normalizer.normalize(offsets))
    np.testing.assert_allclose(from_robot.actions, by_hand.actions, atol=1e-5)
    # The guided chunk lands near the absolute leftover on its first actions, gripper and arm alike.
    assert np.abs(from_robot.actions[:1] - leftover[:1]).max() < 0.1


def test_state_and_action_dims_that_differ(tmp_path):
    names = ('j1', 'j2', 'j3', 'gripper')
    config = preset('tiny', state_dim=7, action_dim=4, use_relative_actions=True, action_feature_names=names)
    absolute = preset('tiny', state_dim=7, action_dim=4)
    rel_rt = PolicyRuntime.from_pretrained(write_random_checkpoint(tmp_path / 'rel', config), device='cpu',
                                           dtype='float32')
    abs_rt = PolicyRuntime.from_pretrained(write_random_checkpoint(tmp_path / 'abs', absolute), device='cpu',
                                           dtype='float32')
    state = np.array([0.1, 0.2, 0.3, 0.4, 9.0, 9.0, 9.0])
    obs = make_observation(state=state)
    base, moved = abs_rt.infer(obs, seed=2).actions, rel_rt.infer(obs, seed=2).actions
    assert moved.shape == (10, 4)
    # state[:3] on the relative joints, nothing on the gripper; state[4:] is never used.
    np.testing.assert_array_equal(moved, base + np.float32([0.1, 0.2, 0.3, 0.0]))


# ---- the tick: the offset uses the joint state the tick read ------------------------------------------------------

def _header(ns):
    return SimpleNamespace(stamp=SimpleNamespace(sec=ns // 10**9, nanosec=ns % 10**9))


def test_the_tick_adds_the_joint_state_it_read(pair):
    absolute_rt, relative_rt = pair
    joints = [f'joint_{i}' for i in range(1, 7)]
    values = resolve_values({'joint_names': joints, 'seed': 3, 'instruction': 'pick'})
    settings = tick_settings(values, input_layout(values, relative_rt.config))
    now = 100 * 10**9
    frame = rgb_image(5)
    camera = SimpleNamespace(header=_header(now), height=frame.shape[0], width=frame.shape[1], encoding='rgb8',
                             is_bigendian=0, step=frame.shape[1] * 3, data=frame.tobytes())
    positions = {name: 0.1 * (i + 1) for i, name in enumerate(joints)}
    # The joint state message lists the joints in another order; the tick maps them to state_joint_names.
    message = SimpleNamespace(header=_header(now), name=joints[::-1], position=[positions[n] for n in joints[::-1]])
    outcomes = []
    for runtime in (absolute_rt, relative_rt):
        buffer = InputBuffer()
        for entry in settings.layout.cameras:
            buffer.put(entry, camera, now)
        buffer.put(settings.layout.joint_states, message, now)
        outcome = TickEngine(runtime).run(buffer, settings, now)
        assert outcome.skip is None, outcome.skip
        outcomes.append(outcome)
    tick_state = outcomes[1].assembled.observation.state
    np.testing.assert_allclose(tick_state, [positions[n] for n in joints])
    offset = outcomes[1].chunk.actions - outcomes[0].chunk.actions
    np.testing.assert_allclose(offset[:, :5], np.tile(tick_state[:5], (10, 1)), rtol=0, atol=1e-6)
    assert np.array_equal(offset[:, 5], np.zeros(10, dtype=np.float32))
    # What is published is that chunk: the trajectory carries the offset positions.
    np.testing.assert_allclose(outcomes[1].plan.positions, outcomes[1].chunk.actions[:len(outcomes[1].plan.positions)])


# ---- parameters: state and action joints must agree where the state is added back ---------------------------

def test_state_joint_names_must_match_joint_names_where_actions_are_relative():
    config = preset('tiny', state_dim=7, use_relative_actions=True, action_feature_names=TINY_ACTION_NAMES)
    joints = [f'j{i}' for i in range(6)]

    def values(state_joint_names):
        return resolve_values({'joint_names': joints, 'state_joint_names': state_joint_names})

    validate(values(joints + ['extra']), config)
    # The gripper (index 5) is absolute: its state joint may have another name.
    validate(values(joints[:5] + ['gripper_sensor', 'extra']), config)
    swapped = [joints[1], joints[0]] + joints[2:] + ['extra']
    with pytest.raises(ParameterError, match=r'state_joint_names must match joint_names at \[0, 1\]'):
        validate(values(swapped), config)
    # An absolute checkpoint does not care.
    validate(values(swapped), preset('tiny', state_dim=7))


def test_cli_writes_a_relative_checkpoint(tmp_path, capsys):
    from vla_policy_node.policy.tiny_default import main
    assert main([str(tmp_path / 'rel'), '--relative-actions']) == 0
    assert 'relative-action' in capsys.readouterr().out
    runtime = PolicyRuntime.from_pretrained(Path(tmp_path / 'rel'), device='cpu', dtype='float32')
    assert runtime.config.use_relative_actions
