"""LeRobotDataset (lerobot's codebase v3.0) from rosbags, assembled by the node's own tick code, and back.

    vla_policy_bag_to_lerobot OUT BAG [BAG ...] --params robot.yaml      (convert.py)
    vla_policy_replay --dataset OUT --episodes 3,4 --params robot.yaml   (replay/dataset_replay.py)

- ``samples``: a bag -> one sample per control tick (the node's InputBuffer, input layout, image decoding,
  content checks) or a gap with the reason the node would have skipped the tick; the recorded command as the
  action.
- ``layout``: lerobot's on-disk layout (paths, features, info.json), ``stats``: its statistics,
  ``video``: its video encoding through PyAV, ``writer``: the dataset written into a temporary folder and
  renamed when complete, ``reader``: the episodes read back for the replay.

pyarrow and PyAV (``av``) come with the ``dataset`` extra, not with the node: ``require_dataset_extra``
names it when they are missing.
"""
from __future__ import annotations

import importlib

EXTRA_HINT = "pip install 'vla_policy_node[dataset]' (pyarrow and av)"


class DatasetError(RuntimeError):
    """A dataset that cannot be written or read; the message says what to fix."""


def require_dataset_extra(tool: str) -> None:
    """Raise DatasetError naming the extra when pyarrow or av cannot be imported."""
    missing = []
    for module in ('pyarrow', 'av'):
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise DatasetError(f'{tool} needs {" and ".join(missing)}, which come with the dataset extra: {EXTRA_HINT}')
