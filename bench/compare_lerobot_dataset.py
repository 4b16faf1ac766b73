"""vla_policy_bag_to_lerobot checked against REAL lerobot (issue 26). Prints, never asserts.

lerobot is no dependency of the package. Run this with the python of a scratch venv that has lerobot with its
dataset extra (lerobot 0.6.2 = huggingface/lerobot 7427f318, see bench/compare_lerobot_smolvla.py for the
set-up), from the repository root; the conversion itself runs in the package's own venv (``--package-python``,
default .venv/bin/python), so nothing of the package is installed into lerobot's:

    /work/scratch/lerobot-venv/bin/python bench/compare_lerobot_dataset.py [--quick] [--keep DIR]

1. (package venv) sample bags as the tests make them: three cameras (one JPEG CompressedImage), two
   instructions, a stretch where a camera stops; converted twice (absolute action statistics, and
   ``--action-stats relative``); beside them the node's own assembly of every tick (dataset/samples.py
   ``bag_ticks``: the frames as the node decodes them, state, action, task, tick time) in reference.npz.
2. (lerobot venv) lerobot's ``LeRobotDataset(repo_id, root=OUT)`` loads each dataset (video_backend pyav, and
   torchcodec where it loads) and every item is compared with the node's assembly: frames (max / mean abs error
   in 0-255 levels, PSNR), state, action, task, timestamp; then ``meta/stats.json`` against lerobot's own
   ``compute_episode_stats`` per episode (images from the node's frames as PNG files, as lerobot's recorder
   stores them before encoding) folded with ``aggregate_stats``, and the relative action statistics against
   ``compute_relative_action_stats``. The same again for a dataset written with the fallback codec (h264).

``--quick``: one short bag, pyav only (a smoke run for the suite). Without lerobot it prints ``skipped: needs
lerobot`` and exits with status 2.

Figures of one run (2026-12-02, the project's 2-core shared CPU; lerobot 0.6.2 with av 15.1.0 and pyarrow
26.0.1 reading, the package's venv with av 18.1.0 writing; two 8 s bags, 152 frames in 3 episodes):

    LeRobotDataset loads both datasets (pyav; torchcodec cannot load its FFmpeg libraries on this machine)
    frames, libsvtav1 crf 30: worst mean abs error 2.70 / 3.12 / 3.36 levels per camera, lowest PSNR 31.8 dB,
        worst single pixel 146 (the edges of saturated squares: yuv420p halves the chroma)
    frames, h264 fallback:    worst mean abs error 2.86 / 3.12 / 3.34 levels, lowest PSNR 31.5 dB
    state, action, task, timestamp of all 152 items: equal to the node's assembly (float32 values)
    stats.json vs lerobot compute_episode_stats + aggregate_stats: 0 difference, every feature and statistic
    relative action stats (chunk 10) vs lerobot compute_relative_action_stats: 0 difference
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REPO_ID = 'local/vla_policy_node_bench'
SECOND_TASK = 'place it in the bin'


# ---- phase 1: in the package's venv ------------------------------------------------------------------------------

def prepare(folder: Path, quick: bool) -> None:
    """Bags, the two conversions and the node's own assembly of every tick (reference.npz, reference.json)."""
    sys.path.insert(0, str(ROOT))
    from vla_policy_node.dataset.convert import conversion_settings, convert
    from vla_policy_node.dataset.samples import CommandTrack, Gap, bag_ticks
    from vla_policy_node.bags.bag_io import BagWriter, bag_topics, get_kilted_typestore, read_messages
    from vla_policy_node.bags.bag_time import replayed_topics
    from vla_policy_node.replay.make_bag import SampleBagSpec, write_sample_bag

    params = folder / 'robot.yaml'
    params.write_text('\n'.join([
        '/**:', '  ros__parameters:', '    checkpoint_path: "builtin:demo"',
        '    joint_names: ["joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "joint_6"]',
        '    instruction: "pick up the red block"', '    control_rate_hz: 10.0', '    action_period_sec: 0.1',
        '    max_camera_skew_sec: 0.25', '    camera_types: ["raw", "compressed", "raw"]']) + '\n')
    spec = SampleBagSpec(duration_sec=3.0 if quick else 8.0, compressed_cameras=('left_wrist_0_rgb',))
    plain = write_sample_bag(folder / 'plain', spec)
    # the second instruction new at the midpoint, the right wrist camera silent for 0.8 s
    strings = get_kilted_typestore().types['std_msgs/msg/String']
    midpoint = spec.start_time_ns + int(spec.duration_sec / 2 * 1e9)
    stop = (spec.start_time_ns + int(spec.duration_sec * 0.6e9), spec.start_time_ns + int(spec.duration_sec * 0.7e9))
    bags = [plain]
    if not quick:
        edited = folder / 'edited'
        with BagWriter(edited, storage='sqlite3') as writer:
            for topic, msgtype in bag_topics(plain).items():
                writer.add_topic(topic, msgtype)
            for m in read_messages(plain):
                if m.topic == '/cameras/right_wrist_0_rgb/image_raw' and stop[0] <= m.timestamp_ns < stop[1]:
                    continue
                is_second = m.topic == '/instruction' and m.timestamp_ns == midpoint
                replaced = strings(data=SECOND_TASK) if is_second else None
                writer.write(m.topic, m.timestamp_ns, replaced if replaced is not None else m.raw)
        bags.append(edited)
    started = time.perf_counter()
    convert(folder / 'dataset', bags, params)
    seconds = time.perf_counter() - started
    convert(folder / 'dataset_relative', bags, params, action_stats='relative', chunk_size=10)
    if not quick:
        # the fallback codec, as a PyAV without libsvtav1 would write it
        from vla_policy_node.dataset import video
        default = video.choose_encoder
        video.choose_encoder = lambda available=None: default(frozenset({'libx264'}))
        try:
            convert(folder / 'dataset_h264', bags, params)
        finally:
            video.choose_encoder = default
    conversion = conversion_settings(params)
    inputs = conversion.inputs
    frames = {camera: [] for camera in inputs.layout.camera_names}
    states, actions, tasks, times, episodes = [], [], [], [], []
    episode = -1
    for bag in bags:
        topics = replayed_topics(inputs.layout, bag_topics(bag), '/joint_command')
        command = CommandTrack('/joint_command', 'sensor_msgs/msg/JointState', inputs.joint_names)
        previous_gap = True
        for tick in bag_ticks(bag, topics, inputs, command, conversion.period_ns):
            if isinstance(tick, Gap):
                previous_gap = True
                continue
            if previous_gap:
                episode += 1
                previous_gap = False
            for camera in frames:
                frames[camera].append(tick.images[camera])
            states.append(tick.state)
            actions.append(tick.action)
            tasks.append(tick.task)
            times.append(tick.time_ns)
            episodes.append(episode)
    np.savez(folder / 'reference.npz', states=np.asarray(states), actions=np.asarray(actions),
             times=np.asarray(times, dtype=np.int64), episodes=np.asarray(episodes),
             **{f'frames_{camera}': np.asarray(stack) for camera, stack in frames.items()})
    (folder / 'reference.json').write_text(json.dumps({'tasks': tasks, 'cameras': list(frames),
                                                       'convert_seconds': seconds, 'bags': [str(b) for b in bags]}))


# ---- phase 2: in lerobot's venv ----------------------------------------------------------------------------------

def compare(folder: Path, quick: bool) -> None:
    from lerobot.datasets.compute_stats import aggregate_stats, compute_episode_stats, compute_relative_action_stats
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from PIL import Image

    reference = np.load(folder / 'reference.npz')
    described = json.loads((folder / 'reference.json').read_text())
    cameras = described['cameras']
    print(f"bags: {described['bags']}; conversion {described['convert_seconds']:.1f} s")
    runs = [('dataset', 'pyav')]
    if not quick:
        runs += [('dataset', 'torchcodec'), ('dataset_h264', 'pyav')]
    for name, backend in runs:
        try:
            dataset = LeRobotDataset(REPO_ID, root=folder / name, video_backend=backend)
            dataset[0]
        except Exception as err:  # torchcodec without FFmpeg's shared libraries
            print(f'[{backend}] lerobot cannot decode here: {type(err).__name__}: {str(err).splitlines()[0][:120]}')
            continue
        codec = dataset.meta.features[f'observation.images.{cameras[0]}']['info']['video.codec']
        print(f'[{backend}, {codec}] LeRobotDataset loads {folder / name}: {dataset.num_episodes} episodes, '
              f'{len(dataset)} frames, fps {dataset.fps}, features {list(dataset.features)}')
        worst = {camera: [0.0, 0.0, np.inf] for camera in cameras}
        mismatches = {'state': 0, 'action': 0, 'task': 0, 'timestamp': 0}
        firsts = {}
        for i in range(len(dataset)):
            item = dataset[i]
            episode = int(item['episode_index'])
            firsts.setdefault(episode, int(reference['times'][i]))
            for camera in cameras:
                decoded = (item[f'observation.images.{camera}'].permute(1, 2, 0).numpy() * 255.0).round()
                source = reference[f'frames_{camera}'][i].astype(np.float64)
                difference = np.abs(decoded - source)
                mse = float(np.mean(difference ** 2))
                figures = worst[camera]
                figures[0] = max(figures[0], float(difference.max()))
                figures[1] = max(figures[1], float(difference.mean()))
                figures[2] = min(figures[2], 10 * np.log10(255.0 ** 2 / mse) if mse else np.inf)
            mismatches['state'] += int(not np.array_equal(item['observation.state'].numpy(),
                                                          reference['states'][i].astype(np.float32)))
            mismatches['action'] += int(not np.array_equal(item['action'].numpy(),
                                                           reference['actions'][i].astype(np.float32)))
            mismatches['task'] += int(item['task'] != described['tasks'][i])
            expected = (int(reference['times'][i]) - firsts[episode]) / 1e9
            mismatches['timestamp'] += int(abs(float(item['timestamp']) - expected) > 1e-6)
        for camera, (max_abs, mean_abs, psnr) in worst.items():
            print(f'  frames {camera}: worst max abs {max_abs:.0f}, worst mean abs {mean_abs:.2f} levels, '
                  f'lowest PSNR {psnr:.1f} dB')
        print(f'  items differing from the node\'s assembly: {mismatches} of {len(dataset)}')
    dataset = LeRobotDataset(REPO_ID, root=folder / 'dataset', video_backend='pyav')
    features = dataset.meta.features
    hf = dataset.hf_dataset.with_format(None)
    # as lerobot's recorder buffers them: float32 vectors (validate_frame insists), int64 indices
    columns = {key: np.asarray(hf[key], dtype=features[key]['dtype']) for key in features
               if features[key]['dtype'] not in ('video', 'image')}
    episode_index = columns['episode_index']
    lerobot_stats = None
    with tempfile.TemporaryDirectory() as scratch:
        for episode in sorted(set(episode_index.tolist())):
            chosen = episode_index == episode
            data = {}
            for key, ft in features.items():
                if ft['dtype'] == 'video':
                    paths = []
                    for k, frame in enumerate(reference[f'frames_{key.split(".")[-1]}'][chosen]):
                        path = Path(scratch) / f'{key}-{episode}-{k:06d}.png'
                        Image.fromarray(frame).save(path)
                        paths.append(str(path))
                    data[key] = paths
                elif key == 'timestamp':
                    data[key] = np.arange(int(chosen.sum())) / dataset.fps      # lerobot's buffer: k / fps
                else:
                    data[key] = columns[key][chosen]
            stats = compute_episode_stats(data, features)
            lerobot_stats = stats if lerobot_stats is None else aggregate_stats([lerobot_stats, stats])
    written = json.loads((folder / 'dataset' / 'meta' / 'stats.json').read_text())
    print('meta/stats.json vs lerobot compute_episode_stats + aggregate_stats, max abs difference:')
    for key in features:
        diffs = {name: float(np.max(np.abs(np.asarray(written[key][name], dtype=np.float64) -
                                           np.asarray(value, dtype=np.float64))))
                 for name, value in lerobot_stats[key].items()}
        print(f'  {key}: ' + ', '.join(f'{name} {value:.1e}' for name, value in diffs.items()))
    relative = LeRobotDataset(REPO_ID, root=folder / 'dataset_relative', video_backend='pyav')
    ours = json.loads((folder / 'dataset_relative' / 'meta' / 'stats.json').read_text())['action']
    theirs = compute_relative_action_stats(relative.hf_dataset.with_format(None), relative.meta.features, 10,
                                           exclude_joints=['gripper'])
    print('relative action stats (chunk 10) vs lerobot compute_relative_action_stats, max abs difference: '
          + ', '.join(f'{name} {float(np.max(np.abs(np.asarray(ours[name]) - value))):.1e}'
                      for name, value in theirs.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='one short bag, pyav only')
    parser.add_argument('--keep', type=Path, help='work in this folder (kept) instead of a temporary one')
    parser.add_argument('--package-python', default=str(ROOT / '.venv' / 'bin' / 'python'),
                        help="the package's venv python, which runs the conversion")
    parser.add_argument('--prepare', type=Path, help=argparse.SUPPRESS)      # phase 1, in the package's venv
    args = parser.parse_args()
    if args.prepare is not None:
        prepare(args.prepare, args.quick)
        return 0
    try:
        import lerobot  # noqa: F401
    except ImportError:
        print('skipped: needs lerobot (not importable here: run this with a venv that has lerobot[dataset], '
              'see the docstring)')
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        command = [args.package_python, str(Path(__file__).resolve()), '--prepare', str(folder)]
        subprocess.run(command + (['--quick'] if args.quick else []), check=True, cwd=str(ROOT))
        compare(folder, args.quick)
    return 0


if __name__ == '__main__':
    sys.exit(main())
