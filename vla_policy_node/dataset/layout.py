"""LeRobotDataset v3.0 on disk: paths, features and meta/info.json, as lerobot 7427f318 lays them out.

Read from lerobot's source (huggingface/lerobot 7427f318, ``src/lerobot/``):
- ``datasets/utils.py``: the path templates (``DEFAULT_DATA_PATH``, ``DEFAULT_VIDEO_PATH``,
  ``DEFAULT_EPISODES_PATH``, ``DEFAULT_TASKS_PATH``), the file limits (``DEFAULT_CHUNK_SIZE`` 1000 files per chunk
  folder, 100 MB per data file, 200 MB per video file), ``update_chunk_file_indices`` and ``DatasetInfo``
  (the fields of info.json);
- ``datasets/dataset_metadata.py``: ``CODEBASE_VERSION`` "v3.0", ``save_episode`` (``splits`` {"train": "0:N"});
- ``utils/constants.py``: ``DEFAULT_FEATURES`` (timestamp float32, frame_index, episode_index, index, task_index
  int64, all of shape (1,)), appended after the recorded features by ``LeRobotDatasetMetadata.create``;
- ``utils/feature_utils.py`` ``hw_to_dataset_features``: ``observation.state`` and ``action`` as float32 vectors
  with per-dimension ``names``, cameras as ``observation.images.<name>`` of dtype "video", shape (H, W, C) and
  names ["height", "width", "channels"];
- ``datasets/video_utils.py`` ``get_video_info`` and ``dataset_metadata.update_video_info``: the ``info`` of a
  video feature (stream-derived ``video.*`` keys, the encoder settings, ``is_depth_map``).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence, Tuple

CODEBASE_VERSION = 'v3.0'
CHUNKS_SIZE = 1000
DATA_FILES_SIZE_IN_MB = 100
VIDEO_FILES_SIZE_IN_MB = 200

INFO_PATH = 'meta/info.json'
STATS_PATH = 'meta/stats.json'
TASKS_PATH = 'meta/tasks.parquet'
CHUNK_FILE = 'chunk-{chunk_index:03d}/file-{file_index:03d}'
EPISODES_PATH = 'meta/episodes/' + CHUNK_FILE + '.parquet'
DATA_PATH = 'data/' + CHUNK_FILE + '.parquet'
VIDEO_PATH = 'videos/{video_key}/' + CHUNK_FILE + '.mp4'
# Not lerobot's: where this converter says what it did (sources, gaps by reason, the codec); lerobot reads
# only the files above, so an extra file under meta/ is invisible to it.
CONVERSION_PATH = 'meta/vla_policy_node_conversion.json'

STATE = 'observation.state'
ACTION = 'action'
IMAGES_PREFIX = 'observation.images.'
# Per camera, how old its frame was at the tick (tick time - the frame's time), which the node times every
# chunk from; vla_policy_replay --dataset feeds it back. Not an "observation." key, so
# lerobot's dataset_to_policy_features gives it to no policy. float64: the stamps come back to the nanosecond
# (float32 seconds would move them by a few ns, enough to move a due time across an episode's end).
CAMERA_AGE = 'camera_age_sec'
CAMERA_AGE_DTYPE = 'float64'
DEFAULT_FEATURES: Dict[str, Dict[str, Any]] = {
    'timestamp': {'dtype': 'float32', 'shape': [1], 'names': None},
    'frame_index': {'dtype': 'int64', 'shape': [1], 'names': None},
    'episode_index': {'dtype': 'int64', 'shape': [1], 'names': None},
    'index': {'dtype': 'int64', 'shape': [1], 'names': None},
    'task_index': {'dtype': 'int64', 'shape': [1], 'names': None},
}


def camera_key(camera: str) -> str:
    return IMAGES_PREFIX + camera


def next_file(chunk_index: int, file_index: int, chunks_size: int = CHUNKS_SIZE) -> Tuple[int, int]:
    """The (chunk, file) after this one: files fill a chunk folder, then the next chunk starts."""
    if file_index == chunks_size - 1:
        return chunk_index + 1, 0
    return chunk_index, file_index + 1


def vector_feature(names: Sequence[str], dtype: str = 'float32', **extra: Any) -> Dict[str, Any]:
    return dict({'dtype': dtype, 'shape': [len(names)], 'names': list(names)}, **extra)


def video_feature(height: int, width: int, info: Mapping[str, Any]) -> Dict[str, Any]:
    return {'dtype': 'video', 'shape': [height, width, 3], 'names': ['height', 'width', 'channels'],
            'info': dict(info)}


def features(cameras: Mapping[str, Tuple[int, int]], video_infos: Mapping[str, Mapping[str, Any]],
             state_names: Sequence[str], action_names: Sequence[str], action_source: str) -> Dict[str, Any]:
    """Every feature in lerobot's order: the recorded ones (cameras, state, action), then the defaults.

    ``cameras``: name -> (height, width); ``action_source`` says what the action was taken from (kept in the
    action feature's ``info``, which lerobot carries along without reading it).
    """
    result: Dict[str, Any] = {}
    for name, (height, width) in cameras.items():
        result[camera_key(name)] = video_feature(height, width, video_infos[name])
    result[STATE] = vector_feature(state_names)
    result[ACTION] = vector_feature(action_names, info={'source': action_source})
    result[CAMERA_AGE] = vector_feature(list(cameras), CAMERA_AGE_DTYPE)
    result.update({key: dict(value) for key, value in DEFAULT_FEATURES.items()})
    return result


def info_json(fps: int, feature_dict: Mapping[str, Any], total_episodes: int, total_frames: int, total_tasks: int,
              robot_type: Any = None) -> Dict[str, Any]:
    """meta/info.json (datasets/utils.py DatasetInfo.to_dict, its field order)."""
    return {
        'codebase_version': CODEBASE_VERSION,
        'fps': int(fps),
        'features': dict(feature_dict),
        'total_episodes': int(total_episodes),
        'total_frames': int(total_frames),
        'total_tasks': int(total_tasks),
        'chunks_size': CHUNKS_SIZE,
        'data_files_size_in_mb': DATA_FILES_SIZE_IN_MB,
        'video_files_size_in_mb': VIDEO_FILES_SIZE_IN_MB,
        'data_path': DATA_PATH,
        'video_path': VIDEO_PATH,
        'robot_type': robot_type,
        'splits': {'train': f'0:{total_episodes}'},
    }
