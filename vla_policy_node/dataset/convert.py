"""vla_policy_bag_to_lerobot: rosbags -> a LeRobotDataset (lerobot codebase v3.0), built as the node sees them.

    vla_policy_bag_to_lerobot OUT BAG [BAG ...] --params robot.yaml [--checkpoint DIR] [--action-topic TOPIC]
                              [--fps N] [--episode-split bag|instruction] [--action-stats auto|absolute|relative]

The params file is the robot's (the same file the node and vla_policy_replay read); its checkpoint supplies the
camera names and state size, read from config.json without loading weights. One frame per control tick
(``--fps``, default control_rate_hz), assembled by the node's own tick code (samples.py); the ticks the node
would skip are gaps, counted by reason, and end an episode. The action is the command recorded on
``--action-topic`` at the tick (sensor_msgs/JointState or trajectory_msgs/JointTrajectory). The task is the
instruction in force. An episode per bag, split at every gap, or also at every instruction change
(``--episode-split instruction``).

Needs the dataset extra: pip install 'vla_policy_node[dataset]' (pyarrow, av).
"""
from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..params import ParameterError, load_params_file, resolve_values, validate
from ..policy.checkpoint import CheckpointError
from ..policy.config_fields import ConfigError
from ..bags.bag_io import BagError, message_count, require_topics
from ..bags.bag_time import DEFAULT_COMMAND_TOPIC, replayed_topics
from . import DatasetError, require_dataset_extra
from .samples import CommandTrack, Gap, Sample, TickInputs, bag_ticks, bag_time_text

TOOL = 'vla_policy_bag_to_lerobot'
EPISODE_SPLITS = ('bag', 'instruction')


@dataclass
class Conversion:
    """What the conversion needs from the params and the checkpoint, resolved once."""

    values: Dict[str, Any]
    inputs: TickInputs
    fps: int
    config: Any
    warnings: List[str] = field(default_factory=list)

    @property
    def period_ns(self) -> int:
        return int(round(1e9 / self.fps))


def conversion_settings(params: Optional[Path], checkpoint: Optional[str] = None,
                        fps: Optional[float] = None) -> Conversion:
    """The node's configure path without loading weights: values validated, the checkpoint's config (its
    folder's config.json), validated against it, the input layout and tick settings (settings.py)."""
    from ..policy.families import folder_config
    from ..settings import checkpoint_folder, input_layout, tick_settings
    raw = load_params_file(params) if params else {}
    if checkpoint:
        raw['checkpoint_path'] = checkpoint
    values = resolve_values(raw)
    validate(values)
    folder = checkpoint_folder(values['checkpoint_path'])
    if values['backend'] != 'local' and not folder.is_dir():
        raise DatasetError(f"the cameras and the state size come from the checkpoint's config.json; with backend "
                           f"{values['backend']} checkpoint_path {values['checkpoint_path']!r} is no folder here: pass "
                           '--checkpoint DIR')
    config = folder_config(folder)
    validate(values, config)
    layout = input_layout(values, config)
    settings = tick_settings(dict(values, use_sim_time=True), layout)      # on bag time, as the replay
    rate = float(fps) if fps is not None else float(values['control_rate_hz'])
    if not (math.isfinite(rate) and rate > 0 and rate == int(rate)):
        raise DatasetError(f'a LeRobotDataset has a whole number of frames per second; the tick rate is {rate:g} '
                           '(control_rate_hz, or --fps): pass --fps N')
    inputs = TickInputs(layout, settings.limits, settings.joint_names, config.state_dim,
                        settings.max_instruction_length, settings.max_image_pixels)
    result = Conversion(values, inputs, int(rate), config)
    if not math.isclose(settings.action_period_sec, 1.0 / result.fps, rel_tol=1e-9):
        result.warnings.append(
            f'action_period_sec is {settings.action_period_sec:g} s but the dataset has {result.fps} frames per '
            f'second: a policy trained on it predicts one action per {1.0 / result.fps:g} s, so set '
            f'action_period_sec: {1.0 / result.fps:g} on the robot')
    return result


def check_bags(bags: Sequence[Path], conversion: Conversion, action_topic: str) -> List[Dict[str, str]]:
    """Every bag has the cameras, the joint states and the action topic, of the right types (all refused
    before anything is written); returns each bag's topics."""
    layout = conversion.inputs.layout
    needed = {entry.topic: entry.msg_type for entry in layout.cameras + (layout.joint_states,)}
    found, action_types = [], set()
    for bag in bags:
        try:
            topics = require_topics(bag, needed)
        except BagError as err:
            raise BagError(f'{bag}: {err}') from None
        if action_topic not in topics:
            raise BagError(f'{bag}: the action topic {action_topic} is not in the bag (--action-topic); it has '
                           f'{sorted(topics)}')
        CommandTrack(action_topic, topics[action_topic], conversion.inputs.joint_names)   # its type, or DatasetError
        for topic in list(needed) + [action_topic]:
            if message_count(bag, [topic]) == 0:
                raise BagError(f'{bag}: the topic {topic} has no messages')
        action_types.add(topics[action_topic])
        found.append(topics)
    if len(action_types) > 1:
        raise DatasetError(f'the action topic {action_topic} has different types in these bags: '
                           f'{sorted(action_types)}; convert them separately')
    return found


def convert(out: Path, bags: Sequence[Path], params: Optional[Path], checkpoint: Optional[str] = None,
            action_topic: str = DEFAULT_COMMAND_TOPIC, fps: Optional[float] = None, episode_split: str = 'bag',
            action_stats: str = 'auto', chunk_size: Optional[int] = None, robot_type: Optional[str] = None,
            progress: bool = False, log=print) -> Dict[str, Any]:
    """Library entry point (the CLI and tests call this); returns the conversion record it wrote."""
    require_dataset_extra(TOOL)
    from .video import choose_encoder
    from .writer import LeRobotWriter
    if episode_split not in EPISODE_SPLITS:
        raise DatasetError(f'--episode-split must be one of {list(EPISODE_SPLITS)}, got {episode_split!r}')
    bags = [Path(bag) for bag in bags]
    conversion = conversion_settings(params, checkpoint, fps)
    topics = check_bags(bags, conversion, action_topic)
    relative = _relative(action_stats, conversion.config, chunk_size)
    encoder = choose_encoder()
    if encoder.fallback:
        conversion.warnings.append(f'this PyAV has no libsvtav1 (lerobot\'s default): videos are {encoder.vcodec}')
    inputs = conversion.inputs
    command_type = topics[0][action_topic]
    record: Dict[str, Any] = {'tool': TOOL, 'params': None if params is None else str(params),
                              'checkpoint_path': conversion.values['checkpoint_path'], 'fps': conversion.fps,
                              'episode_split': episode_split,
                              'cameras': {c.camera: c.topic for c in inputs.layout.cameras},
                              'joint_states_topic': inputs.layout.joint_states.topic,
                              'instruction_topic': inputs.layout.instruction.topic,
                              'action': CommandTrack(action_topic, command_type, inputs.joint_names).taken,
                              'bags': [], 'warnings': conversion.warnings}
    gaps: Counter = Counter()
    wanted = [replayed_topics(inputs.layout, bag_topics_, action_topic) for bag_topics_ in topics]
    bar = _progress(progress, sum(message_count(bag, topic_set) for bag, topic_set in zip(bags, wanted)))
    try:
        with LeRobotWriter(out, conversion.fps, inputs.layout.camera_names, inputs.layout.state_joint_names,
                           inputs.joint_names, record['action'], encoder, robot_type, relative) as writer:
            for bag, topic_set in zip(bags, wanted):
                record['bags'].append(_convert_bag(writer, bag, topic_set, conversion, action_topic, command_type,
                                                   episode_split, bar, gaps))
            record['ticks'] = sum(entry['ticks'] for entry in record['bags'])
            record['frames'] = sum(entry['frames'] for entry in record['bags'])
            record['gaps'] = dict(sorted(gaps.items()))
            writer.finish(record)
            record = writer.record
    finally:
        if bar is not None:
            bar.close()
    for warning in conversion.warnings:
        log(f'{TOOL}: warning: {warning}')
    return record


def _convert_bag(writer, bag: Path, topics, conversion: Conversion, action_topic: str, command_type: str,
                 episode_split: str, bar, gaps: Counter) -> Dict[str, Any]:
    """One bag's ticks into the writer: a sample extends the episode, a gap ends it."""
    inputs = conversion.inputs
    command = CommandTrack(action_topic, command_type, inputs.joint_names)
    counts: Counter = Counter()
    first_gap: Dict[str, str] = {}
    ticks = frames = 0
    task = None
    for tick in bag_ticks(bag, topics, inputs, command, conversion.period_ns, bar):
        ticks += 1
        if isinstance(tick, Gap):
            counts[tick.reason] += 1
            first_gap.setdefault(tick.reason, f'{bag_time_text(tick.time_ns)}: {tick.message}')
            writer.end_episode()
            continue
        _check_sizes(writer, tick, inputs, bag)
        if not writer.in_episode or (episode_split == 'instruction' and tick.task != task):
            writer.start_episode({'bag': str(bag), 'first_tick_ns': tick.time_ns})
        task = tick.task
        writer.add(tick.images, tick.state, tick.action, tick.camera_ages_sec, tick.task)
        frames += 1
    writer.end_episode()
    gaps.update(counts)
    return {'bag': str(bag), 'ticks': ticks, 'frames': frames, 'gaps': dict(sorted(counts.items())),
            'first_gap': first_gap}


def _check_sizes(writer, sample: Sample, inputs: TickInputs, bag: Path) -> None:
    """A video has one size: a camera whose frames change size is refused, naming it and when."""
    for entry in inputs.layout.cameras:
        shape = sample.images[entry.camera].shape[:2]
        known = writer.shape_of(entry.camera)
        if known is not None and tuple(shape) != known:
            raise DatasetError(f'{bag}: camera {entry.camera} on {entry.topic} changes size from {known[1]}x{known[0]} '
                               f'to {shape[1]}x{shape[0]} at {bag_time_text(sample.time_ns)}; a LeRobotDataset '
                               'video has one size (convert the parts separately)')


def _relative(action_stats: str, config: Any, chunk_size: Optional[int]):
    from .writer import RelativeActions
    if action_stats not in ('auto', 'absolute', 'relative'):
        raise DatasetError(f'--action-stats must be auto, absolute or relative, got {action_stats!r}')
    relative = action_stats == 'relative' or (action_stats == 'auto' and bool(config.use_relative_actions))
    if not relative:
        return None
    size = int(chunk_size or config.chunk_size)
    if size < 1:
        raise DatasetError(f'--chunk-size must be >= 1, got {size}')
    return RelativeActions(size, tuple(config.relative_exclude_joints))


def _progress(enabled: bool, total: int):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc='converting', unit='msg', file=sys.stderr)


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=TOOL, description=__doc__.split('\n\n')[0])
    parser.add_argument('out', type=Path, help='the dataset folder to create (must not exist)')
    parser.add_argument('bags', type=Path, nargs='+', help='rosbag2 folders (sqlite3 or mcap)')
    parser.add_argument('--params', type=Path, required=True, help="the robot's params YAML (the node's)")
    parser.add_argument('--checkpoint', help='overrides checkpoint_path from the params file')
    parser.add_argument('--action-topic', default=DEFAULT_COMMAND_TOPIC,
                        help='the recorded command (sensor_msgs/JointState or trajectory_msgs/JointTrajectory); '
                             'default %(default)s')
    parser.add_argument('--fps', type=float, help='frames (ticks) per second; default control_rate_hz')
    parser.add_argument('--episode-split', choices=EPISODE_SPLITS, default='bag',
                        help='an episode per bag (split at gaps), or also per instruction; default %(default)s')
    parser.add_argument('--action-stats', choices=('auto', 'absolute', 'relative'), default='auto',
                        help='action statistics in lerobot\'s relative space (use_relative_actions training) or '
                             'absolute; auto: as the checkpoint\'s use_relative_actions')
    parser.add_argument('--chunk-size', type=int, help='relative action statistics window; default the '
                                                       'checkpoint\'s chunk_size')
    parser.add_argument('--robot-type', help='info.json robot_type')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)
    try:
        record = convert(args.out, args.bags, args.params, checkpoint=args.checkpoint, action_topic=args.action_topic,
                         fps=args.fps, episode_split=args.episode_split, action_stats=args.action_stats,
                         chunk_size=args.chunk_size, robot_type=args.robot_type, progress=not args.no_progress)
    except (DatasetError, BagError, ParameterError, CheckpointError, ConfigError) as exc:
        print(f'{TOOL}: error: {exc}', file=sys.stderr)
        return 2
    gaps = record['gaps']
    episodes, tasks = len(record['episodes']), len(record['tasks'])
    print(f"wrote {args.out}: {episodes} episode{'s' if episodes != 1 else ''}, {record['frames']} frames at "
          f"{record['fps']} fps, {tasks} task{'s' if tasks != 1 else ''}, video {record['video']['codec']}")
    print(f"ticks {record['ticks']}: {record['frames']} frames, {sum(gaps.values())} gaps {gaps}")
    for entry in record['bags']:
        for reason, example in entry['first_gap'].items():
            print(f"  {entry['bag']}: first {reason} gap at {example}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
