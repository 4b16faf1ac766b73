"""vla_policy_bag_to_lerobot on real bags, read back by an independent reader (test/dataset_reading.py: pyarrow,
PyAV, Pillow), and vla_policy_replay --dataset against the bag replay it came from."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip('pyarrow')
pytest.importorskip('av')

import dataset_reading as dr  # noqa: E402
from vla_policy_node.dataset import DatasetError  # noqa: E402
from vla_policy_node.dataset.convert import convert, main as convert_main  # noqa: E402
from vla_policy_node.bags.bag_io import (BagError, BagWriter, bag_topics, get_kilted_typestore,  # noqa: E402
                                         read_messages)
from vla_policy_node.replay.make_bag import SampleBagSpec, write_sample_bag  # noqa: E402
from vla_policy_node.replay.offline import replay  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
JOINTS = [f'joint_{i}' for i in range(1, 7)]
CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb')
NS = dr.NS
PERIOD = NS // 10
SECOND_TASK = 'place it in the bin'
STOPPED_CAMERA = '/cameras/right_wrist_0_rgb/image_raw'
STOP = (2.5, 3.3)            # bag-relative seconds without frames from STOPPED_CAMERA
MAX_AGE, MAX_SKEW = 0.5, 0.25
TRAJECTORY_TOPIC = '/arm_controller/joint_trajectory'


def write_params(path, **extra):
    lines = ['/**:', '  ros__parameters:', '    checkpoint_path: "builtin:demo"', f'    joint_names: {JOINTS}',
             '    instruction: "pick up the red block"', '    control_rate_hz: 10.0', '    action_period_sec: 0.1',
             f'    max_camera_skew_sec: {MAX_SKEW}', f'    max_image_age_sec: {MAX_AGE}',
             '    camera_types: ["raw", "compressed", "raw"]']
    lines += [f'    {key}: {json.dumps(value)}' for key, value in extra.items()]
    path.write_text('\n'.join(lines) + '\n')
    return path


def edit_bag(source, target, drop=lambda topic, t: False, replace=lambda topic, t, raw: raw, add=()):
    """A copy of ``source`` without the messages ``drop`` picks, ``replace`` mapping raw CDR (or giving a message),
    plus ``add`` [(topic, type, [(t, msg)])]."""
    topics = bag_topics(source)
    messages = [(m.timestamp_ns, m.topic, m.raw) for m in read_messages(source) if not drop(m.topic, m.timestamp_ns)]
    messages += [(t, topic, msg) for topic, _, items in add for t, msg in items]
    topics.update({topic: msgtype for topic, msgtype, _ in add})
    with BagWriter(target, storage='sqlite3') as writer:
        for topic in sorted({topic for _, topic, _ in messages}):        # a topic left without messages goes
            writer.add_topic(topic, topics[topic])
        for t, topic, payload in sorted(messages, key=lambda item: item[0]):
            writer.write(topic, t, replace(topic, t, payload))
    return target


@pytest.fixture(scope='module')
def spec():
    return SampleBagSpec(duration_sec=4.0, compressed_cameras=('left_wrist_0_rgb',))


@pytest.fixture(scope='module')
def plain_bag(spec, tmp_path_factory):
    return write_sample_bag(tmp_path_factory.mktemp('plain') / 'bag', spec)


@pytest.fixture(scope='module')
def edited_bag(spec, plain_bag, tmp_path_factory):
    """Two instructions (the second one new at the midpoint) and a stretch where one camera stops."""
    start = spec.start_time_ns
    strings = get_kilted_typestore().types['std_msgs/msg/String']
    midpoint = start + int(spec.duration_sec / 2 * NS)

    def drop(topic, t):
        return topic == STOPPED_CAMERA and STOP[0] * NS <= t - start < STOP[1] * NS

    def replace(topic, t, raw):
        return strings(data=SECOND_TASK) if topic == '/instruction' and t == midpoint else raw

    return edit_bag(plain_bag, tmp_path_factory.mktemp('edited') / 'bag', drop, replace)


@pytest.fixture(scope='module')
def params(tmp_path_factory):
    return write_params(tmp_path_factory.mktemp('params') / 'robot.yaml')


@pytest.fixture(scope='module')
def dataset(edited_bag, params, tmp_path_factory):
    out = tmp_path_factory.mktemp('datasets') / 'per_bag'
    convert(out, [edited_bag], params)
    return out


def bag_streams(bag):
    """Per topic, the (receive time, message) stream, in time order."""
    streams = {}
    for message in read_messages(bag):
        streams.setdefault(message.topic, []).append((message.timestamp_ns, message.msg))
    return streams


def expected_ticks(bag, streams):
    """The node's tick grid and, per tick, whether it has an observation (independently of the converter: the
    newest frame per camera before the tick, its age and the cameras' skew)."""
    first = min(stream[0][0] for stream in streams.values())
    last = max(stream[-1][0] for stream in streams.values())
    ticks = []
    t = first + PERIOD
    while t <= last:
        frames = [dr.newest_before(streams[topic], t) for topic in camera_topics()]
        stamps = [header_ns(msg) for _, msg in frames] if all(frames) else []
        ok = bool(stamps) and all((t - s) / NS <= MAX_AGE for s in stamps) and \
            (max(stamps) - min(stamps)) / NS <= MAX_SKEW
        ticks.append((t, ok))
        t += PERIOD
    return ticks


def camera_topics():
    return ['/cameras/base_0_rgb/image_raw', '/cameras/left_wrist_0_rgb/image_raw/compressed', STOPPED_CAMERA]


def header_ns(msg):
    return msg.header.stamp.sec * NS + msg.header.stamp.nanosec


def positions(msg, names=JOINTS):
    index = {name: i for i, name in enumerate(msg.name)}
    return np.array([msg.position[index[name]] for name in names])


# ---- the round trip --------------------------------------------------------------------------------------------

def test_frames_are_the_node_ticks_with_their_state_action_task_and_gaps(dataset, edited_bag, spec):
    streams = bag_streams(edited_bag)
    ticks = expected_ticks(edited_bag, streams)
    kept = [t for t, ok in ticks if ok]
    rows = dr.frames_table(dataset)
    meta = dr.info(dataset)
    # one frame per tick the node would run, nothing else
    assert meta['total_frames'] == len(rows['index']) == len(kept)
    assert 0 < len(kept) < len(ticks)
    record = dr.conversion(dataset)
    assert record['ticks'] == len(ticks) and record['frames'] == len(kept)
    assert sum(record['gaps'].values()) == len(ticks) - len(kept)
    assert set(record['gaps']) <= {'camera_stale', 'camera_skew'}
    # the gap where the camera stopped splits the bag into two episodes
    episodes = dr.episodes_table(dataset)
    assert [e['length'] for e in episodes] == [len(run) for run in _runs(ticks)]
    assert len(episodes) == 2
    np.testing.assert_array_equal(rows['index'], np.arange(len(kept)))
    task_names = dr.tasks(dataset)
    times = [t for run in _runs(ticks) for t in run]
    for i, t in enumerate(times):
        ep = rows['episode_index'][i]
        assert rows['timestamp'][i] == pytest.approx(rows['frame_index'][i] / 10, abs=1e-6)
        assert rows['frame_index'][i] == (t - _runs(ticks)[ep][0]) // PERIOD
        # the state the node assembles: the newest joint state received before the tick
        _, state = dr.newest_before(streams['/joint_states'], t)
        np.testing.assert_array_equal(rows['observation.state'][i], positions(state).astype(np.float32))
        # the action: the command recorded at the tick (one stamped at the tick counts)
        _, command = dr.newest_before(streams['/joint_command'], t, inclusive=True)
        np.testing.assert_array_equal(rows['action'][i], positions(command).astype(np.float32))
        # the task: the instruction in force at the tick
        _, instruction = dr.newest_before(streams['/instruction'], t)
        assert task_names[rows['task_index'][i]] == instruction.data
    assert sorted(task_names.values()) == sorted({'pick up the red block', SECOND_TASK})
    assert meta['total_tasks'] == 2 and sorted(episodes[0]['tasks']) == sorted(task_names.values())


def _runs(ticks):
    runs, current = [], []
    for t, ok in ticks:
        if ok:
            current.append(t)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_every_frame_decodes_close_to_the_bag_frame_of_its_tick(dataset, edited_bag):
    streams = bag_streams(edited_bag)
    ticks = [t for run in _runs(expected_ticks(edited_bag, streams)) for t in run]
    episodes = dr.episodes_table(dataset)
    for topic, camera in zip(camera_topics(), CAMERAS):
        key = f'observation.images.{camera}'
        decoded = dr.video_frames(dataset, key)
        assert len(decoded) == len(ticks)
        # frame k of the file is at k / fps; each episode's frames start at its from_timestamp
        assert [round(t * 10) for t, _ in decoded] == list(range(len(ticks)))
        assert [e[f'videos/{key}/from_timestamp'] for e in episodes] == [0.0, episodes[0]['length'] / 10]
        for k, t in enumerate(ticks):
            _, msg = dr.newest_before(streams[topic], t)
            source = dr.rgb_of(msg).astype(int)
            error = np.abs(decoded[k][1].astype(int) - source).mean()
            assert error < 4.0, (camera, k, error)
            # ... and it is that tick's frame, not a neighbour's (the scene moves between camera frames)
            for other_t in (t - 2 * PERIOD, t + 2 * PERIOD):
                neighbour = dr.newest_before(streams[topic], other_t)
                if neighbour is None:
                    continue
                other = dr.rgb_of(neighbour[1]).astype(int)
                if np.abs(other - source).mean() > 1.0:          # the scene moved (not in the hold)
                    assert error < np.abs(decoded[k][1].astype(int) - other).mean()


def test_info_json_describes_the_features_lerobot_loads(dataset):
    meta = dr.info(dataset)
    assert meta['codebase_version'] == 'v3.0' and meta['fps'] == 10
    assert meta['data_path'] == 'data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet'
    assert meta['video_path'] == 'videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4'
    features = meta['features']
    for camera in CAMERAS:
        video = features[f'observation.images.{camera}']
        assert video['dtype'] == 'video' and video['shape'] == [48, 64, 3]
        assert video['names'] == ['height', 'width', 'channels']
        assert video['info']['video.codec'] in ('av1', 'h264') and video['info']['video.pix_fmt'] == 'yuv420p'
        assert video['info']['video.fps'] == 10 and video['info']['video.g'] == 2 and video['info']['video.crf'] == 30
    assert features['observation.state'] == {'dtype': 'float32', 'shape': [6], 'names': JOINTS}
    assert features['camera_age_sec'] == {'dtype': 'float64', 'shape': [3], 'names': list(CAMERAS)}
    assert features['action']['names'] == JOINTS and '/joint_command' in features['action']['info']['source']
    assert list(features)[-5:] == ['timestamp', 'frame_index', 'episode_index', 'index', 'task_index']
    assert meta['total_episodes'] == len(dr.episodes_table(dataset))
    assert meta['splits'] == {'train': f"0:{meta['total_episodes']}"}


def test_stats_match_an_independent_computation(dataset, edited_bag):
    rows = dr.frames_table(dataset)
    written = dr.stats(dataset)
    episodes = dr.episodes_table(dataset)
    for key in ('observation.state', 'action'):
        parts = [rows[key][rows['episode_index'] == e['episode_index']].astype(np.float64) for e in episodes]
        values = np.concatenate(parts)
        np.testing.assert_allclose(written[key]['mean'], values.mean(axis=0), atol=1e-6)
        np.testing.assert_allclose(written[key]['std'], values.std(axis=0), atol=1e-6)
        np.testing.assert_allclose(written[key]['min'], values.min(axis=0), atol=1e-7)
        np.testing.assert_allclose(written[key]['max'], values.max(axis=0), atol=1e-7)
        assert written[key]['count'] == [len(values)]
        # quantiles per episode (where the count of values reaches q * n, read from a 5000-bin histogram, so
        # within a bin or two); the dataset's are lerobot's bounds over the episodes (min below q50, max above)
        for q, name in ((0.01, 'q01'), (0.10, 'q10'), (0.50, 'q50'), (0.90, 'q90'), (0.99, 'q99')):
            per_episode = np.stack([order_statistic(part, q) for part in parts])
            bins = np.stack([(part.max(axis=0) - part.min(axis=0)) / 5000 for part in parts]).max(axis=0)
            bound = per_episode.min(axis=0) if q <= 0.5 else per_episode.max(axis=0)
            np.testing.assert_allclose(written[key][name], bound, atol=2 * bins.max() + 1e-7)
            for part, episode in zip(parts, episodes):
                np.testing.assert_allclose(episode[f'stats/{key}/{name}'], order_statistic(part, q),
                                           atol=2 * bins.max() + 1e-7)
    # images: every frame of these short episodes, per channel, over the frames as the bag holds them
    streams = bag_streams(edited_bag)
    ticks = [t for run in _runs(expected_ticks(edited_bag, streams)) for t in run]
    for topic, camera in zip(camera_topics(), CAMERAS):
        pixels = np.stack([dr.rgb_of(dr.newest_before(streams[topic], t)[1]) for t in ticks]).reshape(-1, 3) / 255.0
        figures = written[f'observation.images.{camera}']
        np.testing.assert_allclose(np.ravel(figures['mean']), pixels.mean(axis=0), atol=1e-5)
        np.testing.assert_allclose(np.ravel(figures['min']), pixels.min(axis=0), atol=1e-7)
        np.testing.assert_allclose(np.ravel(figures['max']), pixels.max(axis=0), atol=1e-7)
        assert np.shape(figures['mean']) == (3, 1, 1) and figures['count'] == [len(ticks)]
    assert written['timestamp']['count'] == [len(ticks)] and written['index']['max'] == [len(ticks) - 1]


def lerobot_sample_indices(frames):
    """The frames of an episode lerobot reads for its image statistics, restated from lerobot 7427f318
    ``src/lerobot/datasets/compute_stats.py`` (``estimate_num_samples``: every frame below 100, then 100 up
    to ~464 frames and frames ** 0.75 beyond, at most 10 000; ``sample_indices``: evenly spaced, rounded)."""
    count = max(min(100, frames), min(int(frames ** 0.75), 10_000))
    return np.round(np.linspace(0, frames - 1, count)).astype(int).tolist()


@pytest.fixture(scope='module')
def long_episode(params, tmp_path_factory):
    """One episode of more than 100 frames, where lerobot reads 100 of them for the image statistics; the
    cameras at the tick rate, so each frame is one tick's. The base camera's frame at a tick lerobot skips is
    all white, at the last tick (which it always reads) all black."""
    spec = SampleBagSpec(duration_sec=14.0, camera_rate_hz=10.0, compressed_cameras=('left_wrist_0_rgb',))
    plain = write_sample_bag(tmp_path_factory.mktemp('long') / 'bag', spec)
    streams = bag_streams(plain)
    ticks = [t for run in _runs(expected_ticks(plain, streams)) for t in run]
    chosen = lerobot_sample_indices(len(ticks))
    topic = camera_topics()[0]
    seen = [dr.newest_before(streams[topic], t) for t in ticks]
    skipped = next(k for k in range(len(ticks)) if k not in chosen)
    painted = {seen[skipped][0]: 255, seen[-1][0]: 0}          # receive time -> the value of every byte
    assert seen[skipped][0] not in {seen[k][0] for k in chosen}
    image = get_kilted_typestore().types['sensor_msgs/msg/Image']

    def paint(name, t, raw):
        if name != topic or t not in painted:
            return raw
        msg = dict(seen)[t]
        return image(header=msg.header, height=msg.height, width=msg.width, encoding=msg.encoding,
                     is_bigendian=msg.is_bigendian, step=msg.step,
                     data=np.full(len(msg.data), painted[t], dtype=np.uint8))

    bag = edit_bag(plain, tmp_path_factory.mktemp('long') / 'painted', replace=paint)
    out = tmp_path_factory.mktemp('datasets') / 'long'
    convert(out, [bag], params)
    return bag, out


def test_image_stats_of_a_long_episode_read_the_frames_lerobot_reads(long_episode):
    bag, dataset = long_episode
    streams = bag_streams(bag)
    ticks = [t for run in _runs(expected_ticks(bag, streams)) for t in run]
    assert len(dr.episodes_table(dataset)) == 1 and len(ticks) > 120
    chosen = lerobot_sample_indices(len(ticks))
    assert len(chosen) == 100
    written = dr.stats(dataset)
    episode = dr.episodes_table(dataset)[0]
    for topic, camera in zip(camera_topics(), CAMERAS):
        frames = np.stack([dr.rgb_of(dr.newest_before(streams[topic], t)[1]) for t in ticks])
        sampled = frames[chosen].reshape(-1, 3) / 255.0
        key = f'observation.images.{camera}'
        own = {name: episode[f'stats/{key}/{name}'] for name in ('mean', 'min', 'max', 'count')}
        for figures in (written[key], own):
            assert figures['count'] == [100]
            np.testing.assert_allclose(np.ravel(figures['min']), sampled.min(axis=0), atol=1e-7)
            np.testing.assert_allclose(np.ravel(figures['max']), sampled.max(axis=0), atol=1e-7)
            # float32 sums over 300 000 pixels, as lerobot adds them: within 1e-3 (one white frame moves it 5e-3)
            np.testing.assert_allclose(np.ravel(figures['mean']), sampled.mean(axis=0), atol=1e-3)
        if camera == CAMERAS[0]:     # the white frame lerobot skips would move the mean by 4e-3
            every = frames.reshape(-1, 3) / 255.0
            assert np.abs(np.ravel(written[key]['mean']) - every.mean(axis=0)).min() > 2e-3


def test_each_episode_owns_the_rows_from_its_from_index_to_its_exclusive_to_index(
        plain_bag, edited_bag, params, tmp_path):
    """lerobot 7427f318 ``dataset_reader._get_query_indices``: an episode's rows are ``index`` in
    [dataset_from_index, dataset_to_index), the last one at dataset_to_index - 1 (a frame at or past it is
    padding); the next episode starts at this one's dataset_to_index (``dataset_writer.save_episode``)."""
    out = tmp_path / 'two_bags'
    convert(out, [plain_bag, edited_bag], params)
    rows = dr.frames_table(out)
    episodes = dr.episodes_table(out)
    assert len(episodes) == 3
    for episode in episodes:
        mine = rows['index'][rows['episode_index'] == episode['episode_index']]
        assert mine.tolist() == list(range(episode['dataset_from_index'], episode['dataset_to_index']))
        assert len(mine) == episode['length']
        for camera in CAMERAS:
            key = f'observation.images.{camera}'
            span = episode[f'videos/{key}/to_timestamp'] - episode[f'videos/{key}/from_timestamp']
            assert span == pytest.approx(episode['length'] / 10)
    assert [e['dataset_from_index'] for e in episodes[1:]] == [e['dataset_to_index'] for e in episodes[:-1]]
    assert episodes[-1]['dataset_to_index'] == dr.info(out)['total_frames'] == len(rows['index'])


def test_tasks_parquet_is_indexed_by_the_task_strings(dataset):
    """lerobot reads meta/tasks.parquet with pandas and looks a task up by its string in the index
    (dataset_reading.tasks says how); every frame's task_index is that of its episode's task there."""
    try:
        import pandas
    except ImportError:
        pandas = None
    names = dr.tasks(dataset)
    by_string = {task: index for index, task in names.items()}
    rows = dr.frames_table(dataset)
    for episode in dr.episodes_table(dataset):
        mine = set(rows['task_index'][rows['episode_index'] == episode['episode_index']].tolist())
        assert mine == {by_string[task] for task in episode['tasks']}
    if pandas is not None:      # lerobot's own reading, where pandas is installed
        table = pandas.read_parquet(dataset / 'meta' / 'tasks.parquet')
        assert table.index.name == 'task'
        assert {task: int(table.loc[task].task_index) for task in table.index} == by_string


def order_statistic(values, q):
    """Per column, the smallest value with at least q * n values at or below it."""
    ordered = np.sort(values, axis=0)
    return ordered[max(0, int(np.ceil(q * len(values))) - 1)]


def test_relative_action_stats_are_over_in_episode_windows_minus_the_state(dataset, edited_bag, params, tmp_path):
    out = tmp_path / 'relative'
    convert(out, [edited_bag], params, action_stats='relative', chunk_size=5)
    rows = dr.frames_table(out)
    windows = []
    for episode in sorted(set(rows['episode_index'])):
        actions = rows['action'][rows['episode_index'] == episode].astype(np.float64)
        states = rows['observation.state'][rows['episode_index'] == episode].astype(np.float64)
        windows += [actions[k:k + 5] - states[k] for k in range(len(actions) - 4)]     # no joint is a gripper
    windows = np.concatenate(windows)
    written = dr.stats(out)['action']
    assert written['count'] == [len(windows)]
    np.testing.assert_allclose(written['mean'], windows.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(written['std'], windows.std(axis=0), atol=1e-6)
    np.testing.assert_allclose(written['min'], windows.min(axis=0), atol=1e-6)
    np.testing.assert_allclose(written['max'], windows.max(axis=0), atol=1e-6)
    assert dr.conversion(out)['relative_action_stats'] == {'chunk_size': 5, 'exclude_joints': ['gripper']}
    # the data keep the absolute command (lerobot's pre-processor makes it relative while training)
    np.testing.assert_array_equal(rows['action'], dr.frames_table(dataset)['action'])
    assert dr.stats(dataset)['action']['mean'] != written['mean']


def test_episodes_split_per_instruction(edited_bag, params, tmp_path):
    out = tmp_path / 'per_instruction'
    convert(out, [edited_bag], params, episode_split='instruction')
    rows = dr.frames_table(out)
    episodes = dr.episodes_table(out)
    assert len(episodes) == 3                      # first task; second task up to the gap; after the gap
    for episode in episodes:
        chosen = rows['task_index'][rows['episode_index'] == episode['episode_index']]
        assert len(set(chosen)) == 1 and len(episode['tasks']) == 1
    assert [e['tasks'][0] for e in episodes] == ['pick up the red block', SECOND_TASK, SECOND_TASK]
    assert dr.info(out)['total_frames'] == len(rows['index']) == sum(e['length'] for e in episodes)


def test_several_bags_append_episodes(plain_bag, edited_bag, params, tmp_path):
    out = tmp_path / 'two_bags'
    convert(out, [plain_bag, edited_bag], params)
    episodes = dr.episodes_table(out)
    assert len(episodes) == 3 and [e['episode_index'] for e in episodes] == [0, 1, 2]
    assert [e['dataset_from_index'] for e in episodes] == [0, episodes[0]['length'],
                                                           episodes[0]['length'] + episodes[1]['length']]
    assert [s['bag'] for s in dr.conversion(out)['episodes']] == [str(plain_bag), str(edited_bag), str(edited_bag)]
    assert len(dr.video_frames(out, 'observation.images.base_0_rgb')) == dr.info(out)['total_frames']


def test_a_trajectory_command_gives_the_point_due_at_each_tick(plain_bag, spec, tmp_path):
    types = get_kilted_typestore().types
    start = spec.start_time_ns

    def trajectory(t_ns):
        # points every 0.1 s from 0.05 s, positions that say when each point is due
        # point i of the trajectory sent at t_ns says when it is due (s after the bag start), plus 10 x the joint
        # number, plus 100 x which trajectory it is
        sent_index = (t_ns - start) // (NS // 2)
        points = [types['trajectory_msgs/msg/JointTrajectoryPoint'](
            positions=(t_ns - start) / NS + 0.05 + 0.1 * i + 10.0 * np.arange(6, 0, -1) + 100.0 * sent_index,
            velocities=np.zeros(0),
            accelerations=np.zeros(0), effort=np.zeros(0),
            time_from_start=types['builtin_interfaces/msg/Duration'](sec=0, nanosec=int((0.05 + 0.1 * i) * NS)))
            for i in range(10)]
        header = types['std_msgs/msg/Header'](stamp=types['builtin_interfaces/msg/Time'](sec=0, nanosec=0),
                                              frame_id='')
        return types['trajectory_msgs/msg/JointTrajectory'](header=header, joint_names=list(reversed(JOINTS)),
                                                            points=points)

    sent = [start + k * NS // 2 for k in range(8)]
    bag = edit_bag(plain_bag, tmp_path / 'bag', add=[(TRAJECTORY_TOPIC, 'trajectory_msgs/msg/JointTrajectory',
                                                      [(t, trajectory(t)) for t in sent])])
    out = tmp_path / 'out'
    convert(out, [bag], write_params(tmp_path / 'p.yaml'), action_topic=TRAJECTORY_TOPIC)
    rows = dr.frames_table(out)
    assert 'JointTrajectory' in dr.info(out)['features']['action']['info']['source']
    first_tick = start + PERIOD
    for i, frame in enumerate(rows['frame_index']):
        t = first_tick + int(frame) * PERIOD
        received = max(s for s in sent if s <= t)
        dues = [received + int((0.05 + 0.1 * k) * NS) for k in range(10)]
        due = next((d for d in dues if d >= t), dues[-1])
        np.testing.assert_allclose(rows['action'][i], (due - start) / NS + 10.0 * np.arange(1, 7) +
                                   100.0 * sent.index(received), atol=1e-4)


def test_encoding_leaves_this_process_and_its_children_at_normal_scheduling(tmp_path):
    """SVT-AV1 run as root (a robot's Docker container, CI) moves the calling thread to SCHED_FIFO 99; every process
    started afterwards inherited it, and a busy loop at that priority starved the machine's other processes (a
    pytest worker's DDS nodes hung). Bites only where the encoder can raise the priority (root, libsvtav1)."""
    from vla_policy_node.dataset.video import VideoFile, choose_encoder
    if not hasattr(os, 'sched_getscheduler'):
        pytest.skip('no POSIX scheduling here')
    video = VideoFile(tmp_path / 'camera.mp4', choose_encoder(), 10, 48, 64)
    rng = np.random.default_rng(0)
    for _ in range(4):
        video.append(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    video.close()
    tasks = Path('/proc/self/task').iterdir()
    assert {os.sched_getscheduler(int(task.name)) for task in tasks} <= {os.SCHED_OTHER}
    child = subprocess.run([sys.executable, '-c', 'import os; print(os.sched_getscheduler(0))'],
                           capture_output=True, text=True, check=True)
    assert int(child.stdout) == os.SCHED_OTHER


def test_without_libsvtav1_the_videos_are_h264_and_say_so(plain_bag, params, tmp_path, monkeypatch):
    import av
    monkeypatch.setattr(av, 'codecs_available', frozenset(av.codecs_available) - {'libsvtav1', 'libaom-av1'})
    out = tmp_path / 'h264'
    said = []
    convert(out, [plain_bag], params, log=said.append)
    assert dr.info(out)['features']['observation.images.base_0_rgb']['info']['video.codec'] == 'h264'
    assert dr.conversion(out)['video'] == {'codec': 'h264', 'options': {'g': '2', 'crf': '30'}, 'pix_fmt': 'yuv420p',
                                           'fallback': True}
    assert any('libsvtav1' in line for line in said)
    streams = bag_streams(plain_bag)
    ticks = [t for t, ok in expected_ticks(plain_bag, streams) if ok]
    decoded = dr.video_frames(out, 'observation.images.base_0_rgb')
    assert len(decoded) == len(ticks)
    for (_, frame), t in zip(decoded, ticks):
        source = dr.rgb_of(dr.newest_before(streams['/cameras/base_0_rgb/image_raw'], t)[1])
        assert np.abs(frame.astype(int) - source.astype(int)).mean() < 4.0


# ---- refusals ---------------------------------------------------------------------------------------------------

def _nothing_written(out):
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f'.{out.name}.partial-')]


def test_bags_without_the_needed_topics_are_refused_before_anything_is_written(plain_bag, params, tmp_path):
    no_joints = edit_bag(plain_bag, tmp_path / 'no_joints', drop=lambda topic, t: topic == '/joint_states')
    out = tmp_path / 'out'
    with pytest.raises(BagError, match='/joint_states'):
        convert(out, [plain_bag, no_joints], params)
    _nothing_written(out)
    with pytest.raises(BagError, match='/teleop/command'):
        convert(out, [plain_bag], params, action_topic='/teleop/command')
    _nothing_written(out)
    with pytest.raises(DatasetError, match='sensor_msgs/msg/JointState'):
        convert(out, [plain_bag], params, action_topic='/instruction')
    _nothing_written(out)
    convert(out, [plain_bag], params)
    with pytest.raises(DatasetError, match='already exists'):
        convert(out, [plain_bag], params)


def test_a_damaged_message_names_its_topic_and_time_and_leaves_nothing(plain_bag, spec, params, tmp_path):
    broken_at = spec.start_time_ns + 2 * NS
    bag = edit_bag(plain_bag, tmp_path / 'bag',
                   replace=lambda topic, t, raw: raw[:7] if topic == '/joint_states' and t == broken_at else raw)
    out = tmp_path / 'out'
    with pytest.raises(DatasetError, match=r'/joint_states at bag time 1700000002\.000000000 s'):
        convert(out, [bag], params)
    _nothing_written(out)


def test_a_camera_changing_size_is_refused_naming_it(plain_bag, spec, params, tmp_path):
    images = get_kilted_typestore().types['sensor_msgs/msg/Image']
    changed_at = spec.start_time_ns + 2 * NS

    def replace(topic, t, raw):
        if topic != '/cameras/base_0_rgb/image_raw' or t < changed_at:
            return raw
        header = get_kilted_typestore().deserialize_cdr(raw, 'sensor_msgs/msg/Image').header
        return images(header=header, height=24, width=32, encoding='rgb8', is_bigendian=0, step=96,
                      data=np.zeros(24 * 96, dtype=np.uint8))

    bag = edit_bag(plain_bag, tmp_path / 'bag', replace=replace)
    out = tmp_path / 'out'
    with pytest.raises(DatasetError, match=r'base_0_rgb on /cameras/base_0_rgb/image_raw changes size from 64x48 '
                                           r'to 32x24 at bag time 1700000002\.1'):
        convert(out, [bag], params)
    _nothing_written(out)


def test_the_cli_names_the_extra_when_pyarrow_or_av_is_missing(plain_bag, params, tmp_path, monkeypatch, capsys):
    import importlib
    real = importlib.import_module

    def without_av(name, *args):
        if name == 'av':
            raise ImportError('No module named av')
        return real(name, *args)

    monkeypatch.setattr(importlib, 'import_module', without_av)
    assert convert_main([str(tmp_path / 'out'), str(plain_bag), '--params', str(params), '--no-progress']) == 2
    assert "pip install 'vla_policy_node[dataset]'" in capsys.readouterr().err
    _nothing_written(tmp_path / 'out')


def test_the_console_script_converts_and_reports_its_gaps(edited_bag, params, tmp_path):
    out = tmp_path / 'cli'
    done = subprocess.run([str(Path(sys.executable).parent / 'vla_policy_bag_to_lerobot'), str(out), str(edited_bag),
                           '--params', str(params), '--no-progress'], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert 'wrote' in done.stdout and '2 episodes' in done.stdout and 'camera_st' in done.stdout
    assert (out / 'meta' / 'info.json').is_file()


# ---- held-out evaluation -------------------------------------------------------------------------------------------

@pytest.fixture(scope='module', params=['zero', 'observation'])
def replays(request, plain_bag, tmp_path_factory):
    """The bag replay and the replay of the dataset converted from it, same params and seed; with stamp_mode
    observation the chunks count from the camera stamps, which the dataset carries as camera_age_sec."""
    base = tmp_path_factory.mktemp('replays')
    params = write_params(base / 'robot.yaml', stamp_mode=request.param)
    out = base / 'dataset'
    convert(out, [plain_bag], params)
    from vla_policy_node.replay.dataset_replay import replay_dataset
    from_bag = replay(plain_bag, params, base / 'bag', seed=0)
    from_dataset = replay_dataset(out, None, params, base / 'from_dataset', seed=0)
    return from_bag, from_dataset, out, params


def test_the_dataset_replay_gives_the_bag_replay_rmse_within_the_codec_error(replays):
    from_bag, from_dataset, _, _ = replays
    bag_errors, dataset_errors = from_bag.summary['command_error'], from_dataset.summary['command_error']
    assert from_dataset.summary['command_topic'] == 'action' and from_dataset.summary['dataset']['episodes'] == [0]
    # Every tick publishes, but those that repeat the executing chunk's observation (no fault), as from the bag.
    assert from_dataset.summary['skipped'] == from_bag.summary['skipped']
    assert set(from_dataset.summary['skipped']) <= {'repeated_observation'}
    assert from_dataset.summary['ticks'] == from_dataset.summary['published'] + from_dataset.summary['skipped_total']
    for joint in JOINTS:
        assert dataset_errors[joint]['points'] == bag_errors[joint]['points']
        # AV1 at crf 30 moves the decoded pixels by a few levels; the policy's chunks move with them.
        assert dataset_errors[joint]['rmse'] == pytest.approx(bag_errors[joint]['rmse'], rel=0.1, abs=0.005)


def test_with_the_bag_frames_the_dataset_replay_is_the_bag_replay_exactly(replays, plain_bag, tmp_path, monkeypatch):
    """The codec is the only difference: fed the frames the node decoded from the bag, every chunk is the same,
    timed the same."""
    from_bag, _, out, params = replays
    from vla_policy_node.dataset.reader import DatasetEpisode
    from vla_policy_node.replay.dataset_replay import replay_dataset
    streams = bag_streams(plain_bag)
    ticks = [t for run in _runs(expected_ticks(plain_bag, streams)) for t in run]
    by_camera = dict(zip(CAMERAS, camera_topics()))

    def bag_frames(self, camera):
        for t in ticks:
            yield dr.rgb_of(dr.newest_before(streams[by_camera[camera]], t)[1])

    monkeypatch.setattr(DatasetEpisode, 'frames', bag_frames)
    exact = replay_dataset(out, [0], params, tmp_path / 'exact', seed=0)
    plans = [r.plan_positions for r in exact.records if r.plan_positions is not None]
    expected = [r.plan_positions for r in from_bag.records if r.plan_positions is not None]
    assert len(plans) == len(expected)
    for got, want in zip(plans, expected):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    offset = exact.records[0].time_ns - from_bag.records[0].time_ns           # the replay's own timeline
    assert [r.plan_start_ns - offset for r in exact.records if r.plan_positions is not None] == \
        [r.plan_start_ns for r in from_bag.records if r.plan_positions is not None]
    for joint in JOINTS:
        assert exact.summary['command_error'][joint]['points'] == from_bag.summary['command_error'][joint]['points']
        assert exact.summary['command_error'][joint]['rmse'] == pytest.approx(
            from_bag.summary['command_error'][joint]['rmse'], abs=1e-6)


def test_the_replay_cli_takes_episodes_and_refuses_unknown_ones(replays, tmp_path):
    _, _, out, params = replays
    script = str(Path(sys.executable).parent / 'vla_policy_replay')
    done = subprocess.run([script, '--dataset', str(out), '--episodes', '0', '--params', str(params), '--output',
                           str(tmp_path / 'r'), '--no-progress'], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert 'RMSE against action' in done.stdout
    summary = json.loads((tmp_path / 'r' / 'summary.json').read_text())
    assert summary['dataset']['episodes'] == [0] and summary['bag'] == str(out)
    done = subprocess.run([script, '--dataset', str(out), '--episodes', '3,4', '--params', str(params), '--output',
                           str(tmp_path / 'r2'), '--no-progress'], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and 'no episode [3, 4]' in done.stderr
