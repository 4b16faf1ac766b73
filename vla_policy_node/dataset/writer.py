"""Writes a LeRobotDataset v3.0 folder from samples, episode by episode, into a temporary folder renamed at the end.

What lerobot 7427f318 writes, file by file (``src/lerobot/datasets/dataset_writer.py`` ``save_episode`` /
``_save_episode_data`` / ``_save_episode_video``, ``dataset_metadata.py`` ``save_episode`` /
``_save_episode_metadata`` / ``save_episode_tasks``, ``io_utils.py``):

- ``data/chunk-000/file-000.parquet``: one row per frame, one row group per episode, the non-video features
  in feature order (vectors as fixed-size float32 lists, timestamp float32 = frame_index / fps, the int64
  indices); a new file once the current one and the episode would pass 100 MB;
- ``videos/<key>/chunk-000/file-000.mp4``: per camera, the episodes one after the other (video.py); a new
  file once the current one has reached 200 MB;
- ``meta/episodes/chunk-000/file-000.parquet``: per episode its index, tasks, length, where its rows and
  frames are (``data/...``, ``dataset_from_index`` / ``dataset_to_index``, ``videos/<key>/...`` with
  ``from_timestamp`` / ``to_timestamp``), its statistics flattened as ``stats/<feature>/<stat>``, and
  ``meta/episodes/...`` indices;
- ``meta/tasks.parquet``: the task strings as the (pandas) index, ``task_index`` as the column;
- ``meta/stats.json`` (stats.py) and ``meta/info.json`` (layout.py).

Nothing lands at OUT until everything is written: the folder is built beside it (``.OUT.partial-*``) and renamed
in one step, and removed on any error, so a half-written dataset never looks complete.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import DatasetError
from . import layout as lr
from .stats import (Stats, aggregate, downsampled, image_stats, relative_action_stats, sampled_frames, serialisable,
                    vector_stats)
from .video import Encoder, VideoFile, stream_codec

MB = 1024 ** 2


@dataclass(frozen=True)
class RelativeActions:
    """Write ``action`` statistics in lerobot's relative space (stats.relative_action_stats)."""

    chunk_size: int
    exclude_joints: Tuple[str, ...]


@dataclass
class _Camera:
    """One camera's video file being written and the downsampled frames its episode statistics sample."""

    height: int
    width: int
    video: Optional[VideoFile] = None
    chunk_index: int = 0
    file_index: int = 0
    frames_in_file: int = 0
    stats_path: Optional[Path] = None
    stats_shape: Tuple[int, ...] = ()
    stats_frames: int = 0


@dataclass
class _Episode:
    """The numeric rows of the episode being written (frames go straight to the video files)."""

    index: int
    source: Dict[str, Any]
    states: List[np.ndarray] = field(default_factory=list)
    actions: List[np.ndarray] = field(default_factory=list)
    ages: List[np.ndarray] = field(default_factory=list)
    tasks: List[int] = field(default_factory=list)
    video_starts: Dict[str, Tuple[int, int, int]] = field(default_factory=dict)   # camera -> chunk, file, frame

    @property
    def length(self) -> int:
        return len(self.states)


class LeRobotWriter:
    """``start_episode`` / ``add`` / ``end_episode`` ..., then ``finish``; ``abort`` (or an exception inside
    ``with``) leaves nothing at OUT."""

    def __init__(self, out: Path, fps: int, cameras: Sequence[str], state_names: Sequence[str],
                 action_names: Sequence[str], action_source: str, encoder: Encoder, robot_type: Optional[str] = None,
                 relative: Optional[RelativeActions] = None) -> None:
        import pyarrow  # noqa: F401 (fail before anything is written)
        self.out = Path(out)
        if self.out.exists():
            raise DatasetError(f'{self.out} already exists; refusing to overwrite (choose a new folder)')
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f'.{self.out.name}.partial-', dir=self.out.parent))
        self.fps = int(fps)
        self.camera_names = tuple(cameras)
        self.state_names = tuple(state_names)
        self.action_names = tuple(action_names)
        self.action_source = action_source
        self.encoder = encoder
        self.robot_type = robot_type
        self.relative = relative
        self.cameras: Dict[str, _Camera] = {}
        self.tasks: Dict[str, int] = {}
        self.episodes: List[Dict[str, Any]] = []
        self.stats: Optional[Dict[str, Stats]] = None
        self.frames = 0
        self.record: Dict[str, Any] = {}          # what finish() wrote to the conversion file
        self._episode: Optional[_Episode] = None
        self._data_writer: Any = None
        self._data_file = (0, 0)
        self._data_file_first_frame = 0
        self._all_states: List[np.ndarray] = []       # for relative action statistics
        self._all_actions: List[np.ndarray] = []
        self._all_episodes: List[np.ndarray] = []

    # ---- context ------------------------------------------------------------------------------------------------
    def __enter__(self) -> 'LeRobotWriter':
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is not None:
            self.abort()

    def abort(self) -> None:
        """Drop everything written so far (the temporary folder)."""
        for camera in self.cameras.values():
            if camera.video is not None:
                try:
                    camera.video.close()
                except Exception:  # closing a broken stream must not hide the original error
                    pass
        if self._data_writer is not None:
            try:
                self._data_writer.close()
            except Exception:
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    # ---- episodes -----------------------------------------------------------------------------------------------
    @property
    def in_episode(self) -> bool:
        return self._episode is not None

    def start_episode(self, source: Mapping[str, Any]) -> None:
        """A new episode; ``source`` (bag, first tick) goes to the conversion record."""
        if self._episode is not None:
            self.end_episode()
        self._episode = _Episode(len(self.episodes), dict(source))
        for camera in self.cameras.values():
            if camera.video is not None and camera.video.size_bytes() >= lr.VIDEO_FILES_SIZE_IN_MB * MB:
                camera.video.close()
                camera.video = None
                camera.chunk_index, camera.file_index = lr.next_file(camera.chunk_index, camera.file_index)
                camera.frames_in_file = 0

    def shape_of(self, camera: str) -> Optional[Tuple[int, int]]:
        state = self.cameras.get(camera)
        return None if state is None else (state.height, state.width)

    def add(self, images: Mapping[str, np.ndarray], state: np.ndarray, action: np.ndarray,
            camera_ages: Sequence[float], task: str) -> None:
        """One frame of the current episode (frames of a camera keep its first size: the caller checks)."""
        episode = self._episode
        if episode is None:
            raise DatasetError('add() outside an episode; call start_episode first')
        for name in self.camera_names:
            self._append_frame(name, images[name], episode)
        episode.states.append(np.asarray(state, dtype=np.float32))
        episode.actions.append(np.asarray(action, dtype=np.float32))
        episode.ages.append(np.asarray(camera_ages, dtype=lr.CAMERA_AGE_DTYPE))
        episode.tasks.append(self.tasks.setdefault(task, len(self.tasks)))

    def _append_frame(self, name: str, rgb: np.ndarray, episode: _Episode) -> None:
        camera = self.cameras.get(name)
        if camera is None:
            camera = self.cameras[name] = _Camera(int(rgb.shape[0]), int(rgb.shape[1]))
        if rgb.shape != (camera.height, camera.width, 3):
            raise DatasetError(f'camera {name}: a {rgb.shape[1]}x{rgb.shape[0]} frame in a video of '
                               f'{camera.width}x{camera.height}')
        if camera.video is None:
            path = self.root / lr.VIDEO_PATH.format(video_key=lr.camera_key(name), chunk_index=camera.chunk_index,
                                                    file_index=camera.file_index)
            camera.video = VideoFile(path, self.encoder, self.fps, camera.height, camera.width)
        if name not in episode.video_starts:
            episode.video_starts[name] = (camera.chunk_index, camera.file_index, camera.frames_in_file)
        camera.video.append(rgb)
        camera.frames_in_file += 1
        # The frames lerobot's statistics would read, kept on disk (an episode is unbounded).
        small = np.ascontiguousarray(downsampled(rgb.transpose(2, 0, 1)))
        if camera.stats_path is None:
            camera.stats_path = self.root / f'.stats-{name}.u8'
            camera.stats_path.write_bytes(b'')
            camera.stats_shape = small.shape
        with open(camera.stats_path, 'ab') as handle:
            handle.write(small.tobytes())
        camera.stats_frames += 1

    def end_episode(self) -> None:
        """Write the current episode's rows and statistics (an episode without frames is dropped)."""
        episode, self._episode = self._episode, None
        if episode is None or episode.length == 0:
            return
        n = episode.length
        first = self.frames
        columns = {
            lr.STATE: np.stack(episode.states), lr.ACTION: np.stack(episode.actions),
            lr.CAMERA_AGE: np.stack(episode.ages),
            'timestamp': np.arange(n) / self.fps,                 # float64 as lerobot's buffer holds it
            'frame_index': np.arange(n, dtype=np.int64),
            'episode_index': np.full(n, episode.index, dtype=np.int64),
            'index': np.arange(first, first + n, dtype=np.int64),
            'task_index': np.asarray(episode.tasks, dtype=np.int64),
        }
        chunk_index, file_index = self._write_rows(columns, n)
        episode_stats: Dict[str, Stats] = {}
        for name in self.camera_names:
            episode_stats[lr.camera_key(name)] = self._camera_stats(name)
        for key, values in columns.items():
            episode_stats[key] = vector_stats(values)
        ordered = {key: episode_stats[key] for key in self._feature_order()}
        names = {index: task for task, index in self.tasks.items()}
        row: Dict[str, Any] = {'episode_index': episode.index,
                               'tasks': [names[index] for index in dict.fromkeys(episode.tasks)],   # first seen first
                               'length': n, 'data/chunk_index': chunk_index, 'data/file_index': file_index,
                               'dataset_from_index': first, 'dataset_to_index': first + n}
        for name in self.camera_names:
            chunk, file, start = episode.video_starts[name]
            key = lr.camera_key(name)
            row.update({f'videos/{key}/chunk_index': chunk, f'videos/{key}/file_index': file,
                        f'videos/{key}/from_timestamp': start / self.fps,
                        f'videos/{key}/to_timestamp': (start + n) / self.fps})
        for key, stats in ordered.items():
            row.update({f'stats/{key}/{name}': np.asarray(value).tolist() for name, value in stats.items()})
        row.update({'meta/episodes/chunk_index': 0, 'meta/episodes/file_index': 0})
        row['_source'] = episode.source
        self.episodes.append(row)
        self.stats = ordered if self.stats is None else aggregate([self.stats, ordered])
        self.frames += n
        if self.relative is not None:
            self._all_states.append(columns[lr.STATE])
            self._all_actions.append(columns[lr.ACTION])
            self._all_episodes.append(columns['episode_index'])

    def _feature_order(self) -> List[str]:
        return [lr.camera_key(name) for name in self.camera_names] + [
            lr.STATE, lr.ACTION, lr.CAMERA_AGE] + list(lr.DEFAULT_FEATURES)

    def _camera_stats(self, name: str) -> Stats:
        camera = self.cameras[name]
        frames = np.fromfile(camera.stats_path, dtype=np.uint8).reshape((camera.stats_frames,) + camera.stats_shape)
        stats = image_stats(np.ascontiguousarray(frames[sampled_frames(camera.stats_frames)]))
        camera.stats_path.write_bytes(b'')
        camera.stats_frames = 0
        return stats

    def _write_rows(self, columns: Mapping[str, np.ndarray], n: int) -> Tuple[int, int]:
        """Append the episode as one row group; a new data file when this one would pass the limit."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        arrays, names = [], []
        for key, values in columns.items():
            if values.ndim == 2:                        # float32 vectors (float64 camera ages)
                flat = pa.array(values.reshape(-1), type=pa.from_numpy_dtype(values.dtype))
                arrays.append(pa.FixedSizeListArray.from_arrays(flat, values.shape[1]))
            else:
                arrays.append(pa.array(values.astype(np.float32) if key == 'timestamp' else values))
            names.append(key)
        table = pa.Table.from_arrays(arrays, names=names)
        if self._data_writer is not None:
            path = self.root / lr.DATA_PATH.format(chunk_index=self._data_file[0], file_index=self._data_file[1])
            size_mb = path.stat().st_size / MB
            frames_in_file = self.frames - self._data_file_first_frame
            per_frame = size_mb / frames_in_file if frames_in_file else 0.0
            if size_mb + per_frame * n >= lr.DATA_FILES_SIZE_IN_MB:
                self._data_writer.close()
                self._data_writer = None
                self._data_file = lr.next_file(*self._data_file)
                self._data_file_first_frame = self.frames
        if self._data_writer is None:
            path = self.root / lr.DATA_PATH.format(chunk_index=self._data_file[0], file_index=self._data_file[1])
            path.parent.mkdir(parents=True, exist_ok=True)
            self._data_writer = pq.ParquetWriter(str(path), table.schema, compression='snappy', use_dictionary=True)
        self._data_writer.write_table(table)
        return self._data_file

    # ---- the end ------------------------------------------------------------------------------------------------
    def finish(self, conversion: Mapping[str, Any]) -> Path:
        """Close every file, write the metadata and move the folder to OUT; DatasetError when nothing was kept."""
        if self._episode is not None:
            self.end_episode()
        if not self.episodes:
            raise DatasetError('no frame to write: every tick was a gap (see the counts above)')
        for camera in self.cameras.values():
            if camera.video is not None:
                camera.video.close()
            if camera.stats_path is not None:
                camera.stats_path.unlink()
        if self._data_writer is not None:
            self._data_writer.close()
            self._data_writer = None
        stats = dict(self.stats or {})
        if self.relative is not None:
            try:
                stats[lr.ACTION] = relative_action_stats(
                    np.concatenate(self._all_actions), np.concatenate(self._all_states),
                    np.concatenate(self._all_episodes), self.relative.chunk_size, self.relative.exclude_joints,
                    self.action_names)
            except ValueError as err:
                raise DatasetError(f'relative action statistics: {err}') from err
        sources = [row.pop('_source') for row in self.episodes]
        self._write_episodes()
        self._write_tasks()
        _write_json(self.root / lr.STATS_PATH, serialisable(stats))
        features = lr.features({name: (c.height, c.width) for name, c in self.cameras.items()},
                               {name: self._video_info(name) for name in self.camera_names}, self.state_names,
                               self.action_names, self.action_source)
        _write_json(self.root / lr.INFO_PATH, lr.info_json(self.fps, features, len(self.episodes), self.frames,
                                                           len(self.tasks), self.robot_type))
        record = dict(conversion)
        record['episodes'] = [dict(source, episode_index=i, length=row['length'])
                              for i, (source, row) in enumerate(zip(sources, self.episodes))]
        record['video'] = {'codec': self.encoder.vcodec, 'options': dict(self.encoder.options),
                           'pix_fmt': self.encoder.pix_fmt, 'fallback': self.encoder.fallback}
        record['tasks'] = [task for task, _ in sorted(self.tasks.items(), key=lambda item: item[1])]
        record['relative_action_stats'] = (None if self.relative is None else
                                           {'chunk_size': self.relative.chunk_size,
                                            'exclude_joints': list(self.relative.exclude_joints)})
        _write_json(self.root / lr.CONVERSION_PATH, record)
        self.record = record
        if self.out.exists():
            raise DatasetError(f'{self.out} appeared while converting; the dataset is left in {self.root}')
        os.rename(self.root, self.out)
        return self.out

    def _video_info(self, name: str) -> Dict[str, Any]:
        """info of a video feature: lerobot's starting {"is_depth_map": False}, the stream's video.* keys, the
        encoder settings (dataset_metadata.update_video_info with get_video_info)."""
        path = self.root / lr.VIDEO_PATH.format(video_key=lr.camera_key(name), chunk_index=0, file_index=0)
        info: Dict[str, Any] = {'is_depth_map': False}
        info.update(stream_codec(path))
        for key, value in self.encoder.info().items():
            info.setdefault(key, value)
        return info

    def _write_episodes(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        columns: Dict[str, List[Any]] = {}
        for row in self.episodes:
            for key, value in row.items():
                columns.setdefault(key, []).append(value)
        path = self.root / lr.EPISODES_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pydict(columns), str(path), compression='snappy')

    def _write_tasks(self) -> None:
        """tasks.parquet as pandas writes a DataFrame indexed by "task" (lerobot reads it with pd.read_parquet and
        looks tasks up by that index), without needing pandas here."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        tasks = sorted(self.tasks.items(), key=lambda item: item[1])
        pandas_meta = {'index_columns': ['task'], 'column_indexes': [],
                       'columns': [{'name': 'task_index', 'field_name': 'task_index', 'pandas_type': 'int64',
                                    'numpy_type': 'int64', 'metadata': None},
                                   {'name': 'task', 'field_name': 'task', 'pandas_type': 'unicode',
                                    'numpy_type': 'object', 'metadata': None}],
                       'attributes': {}, 'creator': {'library': 'pyarrow', 'version': pa.__version__}}
        table = pa.table({'task_index': pa.array([i for _, i in tasks], type=pa.int64()),
                          'task': pa.array([t for t, _ in tasks], type=pa.string())})
        table = table.replace_schema_metadata({b'pandas': json.dumps(pandas_meta).encode()})
        path = self.root / lr.TASKS_PATH
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, str(path))


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4, ensure_ascii=False) + '\n')
