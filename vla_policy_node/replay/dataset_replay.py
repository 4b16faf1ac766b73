"""Offline evaluation on LeRobotDataset episodes: held-out data through the node's own tick path.

    vla_policy_replay --dataset DIR [--episodes 3,4] --params robot.yaml [--checkpoint DIR] --output OUT

Each frame of an episode is one control tick, as vla_policy_bag_to_lerobot sampled it: its camera frames
(decoded from the videos) arrive as sensor_msgs/Image stamped as old as they were at the tick
(``camera_age_sec``; 0 for datasets without it), its state as a sensor_msgs/JointState, the task as the
instruction, then the tick runs through the same OfflineReplay (InputBuffer, TickEngine, safety supervisor,
outputs). The recorded action is the command the chunks are compared with, so summary.json, the RMSE table
and the plots are the bag replay's. Ticks run at the dataset's fps; an episode starts like an activation one
tick before its first frame (nothing executing, the supervisor ramped in), and episodes are laid one after
another on one timeline, apart by more than a chunk, each compared only with its own actions.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

import numpy as np

from ..observation import NS_PER_SEC, InputBuffer
from ..settings import configure
from ..bags.bag_io import BagWriter, get_kilted_typestore
from .offline import OfflineReplay, ReplayError, replay_values
from .report import ReplayResult, TickRecord

# Where the first episode starts on the replay's timeline (any time > 0: 0 means "no clock yet" to the tick).
TIMELINE_START_NS = 1_000 * NS_PER_SEC


def parse_episodes(text: Optional[str]) -> Optional[List[int]]:
    """'3,4' / '0-9' / '0-2,7' -> episode indices (None: all); ReplayError for anything else."""
    if text is None or not text.strip():
        return None
    chosen: List[int] = []
    try:
        for part in text.split(','):
            first, _, last = part.strip().partition('-')
            chosen += list(range(int(first), int(last) + 1)) if last else [int(first)]
    except ValueError:
        raise ReplayError(f"--episodes takes indices like '3,4' or '0-9', got {text!r}") from None
    if any(index < 0 for index in chosen):
        raise ReplayError(f'--episodes must be >= 0, got {text!r}')
    return list(dict.fromkeys(chosen))


class DatasetReplay(OfflineReplay):
    """OfflineReplay's ticks fed from a dataset's frames instead of a bag's messages."""

    def run_dataset(self, reader, episodes: Sequence[int], output: Path, progress: bool = True) -> ReplayResult:
        layout = self.layout
        self._check_names(reader)
        names = self.settings.joint_names
        state_index = [list(layout.state_joint_names).index(name) if name in layout.state_joint_names else None
                       for name in names]
        period = int(round(NS_PER_SEC / reader.fps))
        # Apart by more than a chunk, so no plan of one episode is due inside the next.
        apart = (self.runtime.config.chunk_size + 2) * max(period, self.settings.period_ns)
        output.mkdir(parents=True, exist_ok=True)
        records: List[TickRecord] = []
        recorded_t: List[int] = []
        recorded_p: List[np.ndarray] = []
        command_t: List[int] = []
        command_p: List[np.ndarray] = []
        spans = []
        start = TIMELINE_START_NS
        bar = _progress(progress, sum(int(reader.episodes[e]['length']) for e in episodes))
        types = get_kilted_typestore().types
        with BagWriter(output / 'trajectories', storage='sqlite3') as writer:
            for entry in self.outputs:
                writer.add_topic(entry.topic, entry.msg_type)
            for index in episodes:
                episode = reader.episode(index)
                self.buffer = InputBuffer()
                self.engine.activate(start - period)
                frames = {camera: episode.frames(camera) for camera in layout.camera_names}
                task = None
                for k in range(episode.length):
                    now = start + k * period
                    for entry in layout.cameras:
                        age_ns = int(round(float(episode.camera_ages_sec[k, reader.cameras.index(entry.camera)])
                                           * NS_PER_SEC)) if reader.cameras else 0
                        self.buffer.put(entry, _image(types, next(frames[entry.camera]), now - age_ns), now)
                    state = episode.states[k].astype(np.float64)
                    self.buffer.put(layout.joint_states, _joint_state(types, layout.state_joint_names, state, now),
                                    now)
                    if episode.tasks[k] != task:
                        task = episode.tasks[k]
                        self.buffer.put(layout.instruction, types['std_msgs/msg/String'](data=task), now)
                    records.append(self._tick(now, writer))
                    recorded_t.append(now)
                    recorded_p.append(np.array([state[i] if i is not None else np.nan for i in state_index]))
                    command_t.append(now)
                    command_p.append(episode.actions[k].astype(np.float64))
                    if bar is not None:
                        bar.update(1)
                last = start + (episode.length - 1) * period
                spans.append((start, last))
                # A row of NaN between episodes: the plots do not join them.
                for times, positions in ((recorded_t, recorded_p), (command_t, command_p)):
                    times.append(last + period)
                    positions.append(np.full(len(names), np.nan))
                start = last + apart
        if bar is not None:
            bar.close()
        source = {'dataset': {'root': str(reader.root), 'episodes': list(episodes), 'fps': reader.fps,
                              'frames': int(sum(int(reader.episodes[e]['length']) for e in episodes)),
                              'action': reader.action_source}}
        return self.report(output, records, (recorded_t, recorded_p), (command_t, command_p), reader.root,
                           'action', spans, source)

    def _check_names(self, reader) -> None:
        """The params must describe the dataset: its cameras, state and action joints, by name."""
        layout = self.layout
        missing = [camera for camera in layout.camera_names if camera not in reader.cameras]
        if missing:
            raise ReplayError(f'the dataset has no camera {missing} (observation.images.<name>); it has '
                              f'{reader.cameras}')
        if list(layout.state_joint_names) != reader.state_names:
            raise ReplayError(f'state_joint_names {list(layout.state_joint_names)} differ from the dataset\'s '
                              f'observation.state names {reader.state_names}')
        if list(self.settings.joint_names) != reader.action_names:
            raise ReplayError(f'joint_names {list(self.settings.joint_names)} differ from the dataset\'s action '
                              f'names {reader.action_names}')


def _image(types: Any, rgb: np.ndarray, stamp_ns: int) -> Any:
    """A sensor_msgs/Image (rgb8) as a camera driver would publish the decoded frame."""
    height, width = rgb.shape[:2]
    return types['sensor_msgs/msg/Image'](header=_header(types, stamp_ns), height=height, width=width, encoding='rgb8',
                                          is_bigendian=0, step=width * 3,
                                          data=np.ascontiguousarray(rgb).reshape(-1))


def _joint_state(types: Any, names: Sequence[str], positions: np.ndarray, stamp_ns: int) -> Any:
    return types['sensor_msgs/msg/JointState'](header=_header(types, stamp_ns), name=list(names),
                                               position=np.asarray(positions, dtype=np.float64),
                                               velocity=np.zeros(0), effort=np.zeros(0))


def _header(types: Any, stamp_ns: int) -> Any:
    stamp = types['builtin_interfaces/msg/Time'](sec=stamp_ns // NS_PER_SEC, nanosec=stamp_ns % NS_PER_SEC)
    return types['std_msgs/msg/Header'](stamp=stamp, frame_id='')


def _progress(enabled: bool, total: int):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc='replaying dataset', unit='frame', file=sys.stderr)


def replay_dataset(dataset: Path, episodes: Optional[Sequence[int]], params: Optional[Path], output: Path,
                   checkpoint: Optional[str] = None, seed: Optional[int] = None, progress: bool = False,
                   overrides: Optional[Mapping[str, Any]] = None, latency_ms: float = 0.0) -> ReplayResult:
    """Library entry point (the CLI and tests call this)."""
    from ..dataset import DatasetError, require_dataset_extra
    from ..dataset.reader import DatasetReader
    try:
        require_dataset_extra('vla_policy_replay --dataset')
        reader = DatasetReader(Path(dataset))
        chosen = reader.select(episodes)
    except DatasetError as err:
        raise ReplayError(str(err)) from None
    values = replay_values(params, checkpoint, seed, overrides, latency_ms)
    if float(values['control_rate_hz']) != float(reader.fps):
        print(f'vla_policy_replay: note: ticks follow the dataset\'s {reader.fps} fps, not control_rate_hz '
              f'{values["control_rate_hz"]:g}', file=sys.stderr)
        values['control_rate_hz'] = float(reader.fps)
    configured = configure(values)
    try:
        return DatasetReplay(configured, values, latency_ms).run_dataset(reader, chosen, Path(output), progress)
    except DatasetError as err:
        raise ReplayError(str(err)) from None
