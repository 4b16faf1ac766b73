"""vla_policy_replay on generated bags: outputs, counts, determinism, cache hits, error messages."""
import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sample_bag_params import JOINTS, write_sample_bag_params
from vla_policy_node.policy.tiny_default import write_tiny_default
from vla_policy_node.bags.bag_io import BagError, BagWriter, read_messages
from vla_policy_node.replay import make_bag
from vla_policy_node.replay.make_bag import SampleBagSpec, in_hold_window, write_sample_bag
from vla_policy_node.replay.offline import replay
from vla_policy_node.params import ParameterError
from vla_policy_node.trajectory import check_controller_rules

ROOT = Path(__file__).resolve().parents[1]
DEMO_PARAMS = ROOT / 'config' / 'demo.yaml'
TRAJECTORY_TOPIC = '/joint_trajectory_controller/joint_trajectory'
NS = 1_000_000_000


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    return write_tiny_default(tmp_path_factory.mktemp('ckpt') / 'tiny_pi0', 'pi0')


@pytest.fixture(scope='module', params=['sqlite3', 'mcap'])
def bag(request, tmp_path_factory):
    spec = SampleBagSpec(duration_sec=3.0, storage=request.param, compressed_cameras=('left_wrist_0_rgb',))
    return write_sample_bag(tmp_path_factory.mktemp(request.param) / 'bag', spec), spec


def _params(tmp_path, **extra):
    return write_sample_bag_params(tmp_path, **{'camera_types': ['raw', 'compressed', 'raw'], **extra})


def _trajectories(output):
    return [(m.timestamp_ns, m.msg) for m in read_messages(output / 'trajectories', [TRAJECTORY_TOPIC])]


def _point_times(msg):
    return [p.time_from_start.sec + p.time_from_start.nanosec / NS for p in msg.points]


def test_replay_writes_a_valid_report(bag, checkpoint, tmp_path):
    bag_path, spec = bag
    result = replay(bag_path, _params(tmp_path, stamp_mode='observation'), tmp_path / 'out',
                    checkpoint=str(checkpoint), seed=3)
    out = tmp_path / 'out'
    for name in ('summary.json', 'chunks.png', 'latency.png', 'trajectories/metadata.yaml'):
        assert (out / name).is_file(), name
    assert (out / 'chunks.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    summary = json.loads((out / 'summary.json').read_text())
    # Every tick either published or was skipped, and ticks run at 10 Hz on bag time.
    assert summary['ticks'] == summary['published'] + summary['skipped_total']
    assert summary['ticks'] == pytest.approx(spec.duration_sec * 10, abs=2)
    assert summary['published'] > 0.7 * summary['ticks']
    assert summary['cache']['hits'] + summary['cache']['misses'] == summary['chunks']
    for stage in ('hash', 'denoise', 'total'):
        assert set(summary['latency_ms'][stage]) == {'p50', 'p95', 'max'}
    assert summary['latency_clock'] == 'host' and summary['fast_path']['cuda_graphs_mode'] == 'off'
    assert set(summary['command_error']) == set(JOINTS)
    assert all(np.isfinite(v['rmse']) and v['points'] > 0 for v in summary['command_error'].values())

    trajectories = _trajectories(out)
    assert summary['published'] == len(result.records) - summary['skipped_total']
    assert len(trajectories) == summary['published'] + summary['holds_published']
    start_ns = spec.start_time_ns
    for timestamp_ns, msg in trajectories:
        times = _point_times(msg)
        check_controller_rules(list(msg.joint_names), times, [list(p.positions) for p in msg.points],
                               [list(p.velocities) for p in msg.points])
        assert list(msg.joint_names) == JOINTS and len(msg.points) == 10
        stamp_ns = msg.header.stamp.sec * NS + msg.header.stamp.nanosec
        # Stamped in bag time: the observation (newest camera frame) precedes the tick that wrote it.
        assert start_ns <= stamp_ns <= timestamp_ns <= start_ns + int(spec.duration_sec * NS)


def test_same_seed_same_trajectories_and_the_hold_window_hits(bag, checkpoint, tmp_path):
    bag_path, spec = bag
    params = _params(tmp_path)
    first = replay(bag_path, params, tmp_path / 'a', checkpoint=str(checkpoint), seed=7)
    second = replay(bag_path, params, tmp_path / 'b', checkpoint=str(checkpoint), seed=7)
    other = replay(bag_path, params, tmp_path / 'c', checkpoint=str(checkpoint), seed=8)
    positions = [[list(p.positions) for p in m.points] for _, m in _trajectories(tmp_path / 'a')]
    assert positions == [[list(p.positions) for p in m.points] for _, m in _trajectories(tmp_path / 'b')]
    assert positions != [[list(p.positions) for p in m.points] for _, m in _trajectories(tmp_path / 'c')]
    assert first.summary['cache'] == second.summary['cache'] and other.summary['cache']['hits'] > 0
    # Frames are byte-identical inside the hold window (and between 5 Hz frames at a 10 Hz tick):
    # those ticks reuse the prefix.
    hits_in_hold = [r for r in first.records if r.cache_hit
                    and in_hold_window(spec, (r.time_ns - spec.start_time_ns) / NS - 0.25)]
    assert len(hits_in_hold) >= 3
    assert first.summary['cache']['hits'] >= first.summary['published'] // 3


def test_simulated_latency_is_deterministic_and_rtc_hands_over_smoothly(bag, checkpoint, tmp_path):
    bag_path, spec = bag
    runs = {}
    for name, chunking in (('independent', 'independent'), ('rtc', 'rtc'), ('rtc_again', 'rtc')):
        runs[name] = replay(bag_path, _params(tmp_path, chunking=chunking, execute_steps=10), tmp_path / name,
                            checkpoint=str(checkpoint), seed=2, latency_ms=250.0)
    again = [(t, [list(p.positions) for p in m.points]) for t, m in _trajectories(tmp_path / 'rtc_again')]
    assert again == [(t, [list(p.positions) for p in m.points]) for t, m in _trajectories(tmp_path / 'rtc')]
    for name, result in runs.items():
        summary = result.summary
        assert summary['simulated_latency_ms'] == 250.0 and summary['handover']['count'] > 0
        assert (tmp_path / name / 'handover.png').read_bytes()[:4] == b'\x89PNG'
        for timestamp_ns, msg in _trajectories(tmp_path / name):
            # Written when published (250 ms after the tick). Its actions count from the frame, 100 or 200 ms
            # old at the tick (5 Hz cameras): the 3 or 4 due by publication are not in it.
            assert (timestamp_ns - spec.start_time_ns) % (NS // 10) == 250_000_000 % (NS // 10)
            assert len(msg.points) in (6, 7) and abs(_point_times(msg)[0] - 0.05) < 1e-6
    assert runs['rtc'].summary['chunks_continued'] > 0 and runs['independent'].summary['chunks_continued'] == 0
    rtc_jump = runs['rtc'].summary['handover']['jump_max']['p50']
    assert rtc_jump < 0.5 * runs['independent'].summary['handover']['jump_max']['p50']
    with pytest.raises(Exception, match='latency-ms'):
        replay(bag_path, _params(tmp_path), tmp_path / 'bad', checkpoint=str(checkpoint), latency_ms=-1.0)


def test_dry_run_publishes_nothing(bag, checkpoint, tmp_path):
    bag_path, _ = bag
    result = replay(bag_path, _params(tmp_path, dry_run=True), tmp_path / 'out', checkpoint=str(checkpoint))
    assert result.summary['chunks'] > 0 and result.summary['published'] == 0
    assert _trajectories(tmp_path / 'out') == []


def test_missing_bag_topic_and_params_errors(bag, checkpoint, tmp_path):
    bag_path, _ = bag
    with pytest.raises(BagError, match='no rosbag2 bag at'):
        replay(tmp_path / 'nope', _params(tmp_path), tmp_path / 'o1', checkpoint=str(checkpoint))
    with pytest.raises(BagError, match=r'/cameras/elsewhere is not in the bag; it has: .*/joint_states'):
        replay(bag_path, _params(tmp_path, camera_topics=['/cameras/elsewhere', '/b', '/c']), tmp_path / 'o2',
               checkpoint=str(checkpoint))
    with pytest.raises(BagError, match='has type sensor_msgs/msg/CompressedImage in the bag, expected '
                                       'sensor_msgs/msg/Image'):
        replay(bag_path, _params(tmp_path, camera_types=['raw', 'raw', 'raw'],
                                 camera_topics=['/cameras/base_0_rgb/image_raw',
                                                '/cameras/left_wrist_0_rgb/image_raw/compressed',
                                                '/cameras/right_wrist_0_rgb/image_raw']),
               tmp_path / 'o3', checkpoint=str(checkpoint))
    with pytest.raises(ParameterError, match='stamp_mode must be one of'):
        replay(bag_path, _params(tmp_path, stamp_mode='later'), tmp_path / 'o4', checkpoint=str(checkpoint))
    with pytest.raises(ParameterError, match=r"unknown parameter\(s\) \['control_rate'\]"):
        replay(bag_path, _params(tmp_path, control_rate=5.0), tmp_path / 'o5', checkpoint=str(checkpoint))


@pytest.fixture(scope='module')
def sqlite_bag(tmp_path_factory):
    return write_sample_bag(tmp_path_factory.mktemp('cli') / 'bag', SampleBagSpec(duration_sec=1.5))


def _corrupt_bag(source, tmp_path):
    corrupt = tmp_path / 'corrupt'
    shutil.copytree(source, corrupt)
    (corrupt / 'metadata.yaml').write_text('rosbag2_bagfile_information: {version: [\n')
    return corrupt


def _rate_params(tmp_path):
    path = tmp_path / 'rate.yaml'
    path.write_text(DEMO_PARAMS.read_text() + '    control_rate_hz: -3.0\n')   # the last key wins
    return path


@pytest.mark.parametrize('case, expected', [
    ('missing', 'vla_policy_replay: error: no rosbag2 bag at'),
    ('corrupt', 'vla_policy_replay: error: cannot open bag '),
    ('rate', 'vla_policy_replay: error: control_rate_hz must be in [0.1, 100], got -3.0'),
    ('params_missing', 'vla_policy_replay: error: params file robot.yaml does not exist'),
    ('params_unparsable', 'vla_policy_replay: error: params file robot.yaml is not valid YAML (line 3, column 1'),
])
def test_cli_reports_errors_on_one_line_with_exit_code_2(sqlite_bag, tmp_path, case, expected):
    bag = {'missing': tmp_path / 'missing', 'corrupt': _corrupt_bag(sqlite_bag, tmp_path)}.get(case, sqlite_bag)
    params = {'rate': _rate_params(tmp_path), 'params_missing': Path('robot.yaml'),
              'params_unparsable': Path('robot.yaml')}.get(case, DEMO_PARAMS)
    if case == 'params_unparsable':
        (tmp_path / 'robot.yaml').write_text('/**:\n  ros__parameters: [\n')
    result = subprocess.run([sys.executable, '-m', 'vla_policy_node.replay.cli', str(bag),
                             '--params', str(params), '--output', str(tmp_path / 'out'), '--no-progress'],
                            capture_output=True, text=True, cwd=tmp_path if case.startswith('params') else ROOT)
    assert result.returncode == 2
    assert result.stderr.startswith(expected) and result.stderr.count('\n') == 1, result.stderr


def test_cli_end_to_end_prints_the_summary(sqlite_bag, checkpoint, tmp_path):
    params = _params(tmp_path, camera_types=['raw', 'raw', 'raw'])
    result = subprocess.run([sys.executable, '-m', 'vla_policy_node.replay.cli', str(sqlite_bag), '--params',
                             str(params), '--checkpoint', str(checkpoint), '--output', str(tmp_path / 'out'),
                             '--seed', '1'], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert 'published' in result.stdout and 'cache hits' in result.stdout
    assert 'replaying' in result.stderr  # the progress bar


def test_a_camera_clock_step_in_a_bag_is_judged_as_the_node_judges_it(checkpoint, tmp_path):
    """The first camera's stamps 5 s ahead from 1 s to 2 s of a 3 s bag, then back: the replay feeds the node's
    InputBuffer, so it counts the jump there and back (summary.json), refuses that camera's frames while the
    step is not on bag time (camera_clock_jump, then camera_future: on bag time camera_clock auto is header),
    and publishes before and after it."""
    spec = SampleBagSpec(duration_sec=3.0, compressed_cameras=('left_wrist_0_rgb',))
    base_topic = make_bag.camera_topics(spec)['base_0_rgb'][0]
    step = (spec.start_time_ns + NS, spec.start_time_ns + 2 * NS)
    path = tmp_path / 'stepped_bag'
    with BagWriter(path, storage=spec.storage) as writer:
        for topic, msgtype in make_bag.topic_types(spec).items():
            writer.add_topic(topic, msgtype)
        for t_ns, topic, msg in make_bag._all_messages(spec):
            if topic == base_topic and step[0] <= t_ns < step[1]:
                stamp = msg.header.stamp
                msg = dataclasses.replace(msg, header=dataclasses.replace(
                    msg.header, stamp=dataclasses.replace(stamp, sec=stamp.sec + 5)))
            writer.write(topic, t_ns, msg)
    result = replay(path, _params(tmp_path), tmp_path / 'out', checkpoint=str(checkpoint), seed=0)
    summary = json.loads((tmp_path / 'out' / 'summary.json').read_text())
    assert summary['camera_clock']['jumps'] == {'base_0_rgb': 2}, summary['camera_clock']
    assert summary['skipped'].get('camera_clock_jump', 0) >= 1 and summary['skipped'].get('camera_future', 0) >= 1
    published = [r.time_ns for r in result.records if r.plan_positions is not None]
    assert min(published) < step[0] and max(published) >= step[1]
    assert not [t for t in published if step[0] + NS // 5 <= t < step[1]], 'a frame of the step was used'


def test_cli_says_where_to_look_when_every_tick_was_skipped(sqlite_bag, checkpoint, tmp_path):
    params = _params(tmp_path, camera_types=['raw', 'raw', 'raw'], max_image_age_sec=0.001)   # every frame stale
    result = subprocess.run([sys.executable, '-m', 'vla_policy_node.replay.cli', str(sqlite_bag), '--params',
                             str(params), '--checkpoint', str(checkpoint), '--output', str(tmp_path / 'out'),
                             '--no-progress'], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert 'published 0' in result.stdout
    assert 'nothing was published: every tick was skipped, most as camera_stale' in result.stdout
    assert 'the first: [camera_stale] on /cameras/' in result.stdout            # the fault line the node would log
    summary = json.loads((tmp_path / 'out' / 'summary.json').read_text())
    assert summary['first_fault']['camera_stale'].startswith('[camera_stale] on /cameras/')
