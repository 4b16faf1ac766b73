"""A LeRobotDataset v3.0 folder read back episode by episode (pyarrow for the tables, PyAV for the videos).

For ``vla_policy_replay --dataset``: where lerobot's loader (``datasets/dataset_reader.py``) finds an episode's
rows (``meta/episodes``: ``data/chunk_index`` / ``data/file_index``, ``dataset_from_index``), its frames
(``videos/<key>/chunk_index`` / ``file_index``, ``from_timestamp``) and its tasks (``meta/tasks.parquet``), the
same is read here. Datasets recorded by lerobot itself read too; they have no ``camera_age_sec`` (frames then
count as taken at their tick).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

from . import DatasetError
from . import layout as lr
from .video import decode_frames


@dataclass
class DatasetEpisode:
    """One episode's rows (frame order) and a way to decode its camera frames in order."""

    index: int
    fps: int
    states: np.ndarray                  # [n, S] float32
    actions: np.ndarray                 # [n, A] float32
    tasks: List[str]                    # per frame
    camera_ages_sec: np.ndarray         # [n, cameras] (zeros when the dataset has none)
    videos: Dict[str, tuple]            # camera -> (path, first frame, count)

    @property
    def length(self) -> int:
        return int(self.states.shape[0])

    def frames(self, camera: str) -> Iterator[np.ndarray]:
        path, first, count = self.videos[camera]
        for _, rgb in decode_frames(path, first, count):
            yield rgb


class DatasetReader:
    """meta/ of a dataset folder, and its episodes on demand."""

    def __init__(self, root: Path) -> None:
        import pyarrow.parquet as pq
        self.root = Path(root)
        info_path = self.root / lr.INFO_PATH
        if not info_path.is_file():
            raise DatasetError(f'no LeRobotDataset at {self.root} (expected {lr.INFO_PATH})')
        self.info = json.loads(info_path.read_text())
        version = str(self.info.get('codebase_version'))
        if not version.startswith('v3.'):
            raise DatasetError(f'{self.root} is a LeRobotDataset {version}; this reads v3.x (lerobot converts older '
                               'ones with lerobot.scripts.convert_dataset_v21_to_v30)')
        self.fps = int(self.info['fps'])
        self.features: Dict[str, Any] = self.info['features']
        for key in (lr.STATE, lr.ACTION):
            if key not in self.features:
                raise DatasetError(f'{self.root}: the dataset has no {key!r} feature')
        self.cameras = [key[len(lr.IMAGES_PREFIX):] for key, ft in self.features.items()
                        if key.startswith(lr.IMAGES_PREFIX) and ft.get('dtype') == 'video']
        tasks = pq.read_table(str(self.root / lr.TASKS_PATH)).to_pydict()
        self.tasks = dict(zip(tasks['task_index'], tasks['task']))
        episode_files = sorted((self.root / 'meta' / 'episodes').glob('*/*.parquet'))
        if not episode_files:
            raise DatasetError(f'{self.root}: no meta/episodes/*/*.parquet')
        self.episodes: Dict[int, Dict[str, Any]] = {}
        for path in episode_files:
            table = pq.read_table(str(path), columns=[name for name in pq.read_schema(str(path)).names
                                                      if not name.startswith('stats/')])
            for row in table.to_pylist():
                self.episodes[int(row['episode_index'])] = row

    @property
    def state_names(self) -> List[str]:
        return _names(self.features[lr.STATE])

    @property
    def action_names(self) -> List[str]:
        return _names(self.features[lr.ACTION])

    @property
    def action_source(self) -> str:
        return str((self.features[lr.ACTION].get('info') or {}).get('source') or lr.ACTION)

    def select(self, wanted: Optional[Sequence[int]]) -> List[int]:
        """The episodes to read (all when ``wanted`` is None); DatasetError naming unknown ones."""
        if wanted is None:
            return sorted(self.episodes)
        unknown = [index for index in wanted if index not in self.episodes]
        if unknown:
            raise DatasetError(f'{self.root} has no episode {unknown}; it has 0..{len(self.episodes) - 1}')
        return list(wanted)

    def episode(self, index: int) -> DatasetEpisode:
        import pyarrow.parquet as pq
        meta = self.episodes[index]
        path = self.root / self.info['data_path'].format(chunk_index=meta['data/chunk_index'],
                                                         file_index=meta['data/file_index'])
        table = pq.read_table(str(path), filters=[('episode_index', '=', index)])
        rows = table.sort_by('frame_index').to_pydict()
        if len(rows['frame_index']) != int(meta['length']):
            raise DatasetError(f'{path}: episode {index} has {len(rows["frame_index"])} rows, its metadata says '
                               f'{meta["length"]}')
        ages = (np.asarray(rows[lr.CAMERA_AGE], dtype=np.float64) if lr.CAMERA_AGE in rows
                else np.zeros((len(rows['frame_index']), len(self.cameras))))
        videos = {}
        for camera in self.cameras:
            key = lr.camera_key(camera)
            video = self.root / self.info['video_path'].format(video_key=key,
                                                               chunk_index=meta[f'videos/{key}/chunk_index'],
                                                               file_index=meta[f'videos/{key}/file_index'])
            videos[camera] = (video, int(round(float(meta[f'videos/{key}/from_timestamp']) * self.fps)),
                              int(meta['length']))
        return DatasetEpisode(index, self.fps, np.asarray(rows[lr.STATE], dtype=np.float32),
                              np.asarray(rows[lr.ACTION], dtype=np.float32),
                              [self.tasks[int(i)] for i in rows['task_index']], ages, videos)


def _names(feature: Dict[str, Any]) -> List[str]:
    """A vector feature's per-dimension names (a list, or older datasets' {"motors": [...]})."""
    names = feature.get('names')
    if isinstance(names, dict):
        names = next(iter(names.values()), None)
    if not names:
        return [f'{i}' for i in range(int(feature['shape'][0]))]
    return [str(name) for name in names]
