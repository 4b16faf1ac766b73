"""Relative actions (lerobot ``use_relative_actions``): the model predicts ``action - state`` on some joints.

A checkpoint trained with relative actions learnt, for every joint its mask
selects, the offset of the target from the joint's position at the
observation; the other joints (the gripper by default) stay absolute. After
unnormalising, the raw (unnormalised) state is added back:

    actions[:, :A] += state[:A] * mask          (A = action_dim, mask [A] of 0/1)

This follows huggingface/lerobot 7427f318,
``src/lerobot/processor/relative_action_processor.py``
(``RelativeActionsProcessorStep._build_mask``, ``to_absolute_actions``,
``AbsoluteActionsProcessorStep``), the same idea as openpi's
``DeltaActions`` / ``AbsoluteActions`` in ``src/openpi/transforms.py``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def relative_action_mask(action_dim: int, exclude_joints: Sequence[str],
                         action_names: Optional[Sequence[str]]) -> np.ndarray:
    """[action_dim] bool: True where the action is an offset from the state.

    lerobot's rule: with no names or no exclusions every dimension is relative;
    otherwise a dimension is absolute when any exclusion token is a
    case-insensitive substring of its name ("gripper" excludes
    "left_gripper.pos"); dimensions beyond the names are relative.
    """
    tokens = [str(token).lower() for token in (exclude_joints or ()) if token]
    if action_names is None or not tokens:
        return np.ones(action_dim, dtype=bool)
    mask = np.ones(action_dim, dtype=bool)
    for index, name in enumerate(list(action_names)[:action_dim]):
        lowered = str(name).lower()
        mask[index] = not any(token in lowered for token in tokens)
    return mask


def to_absolute_actions(actions: np.ndarray, state: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Unnormalised actions [H, A] + raw state [S >= A] on the masked dims, in float32 as lerobot adds them."""
    dims = mask.shape[0]
    # lerobot casts the state to the actions' dtype (float32) and multiplies by a 0/1 mask.
    offset = np.asarray(state, dtype=np.float32)[:dims] * mask.astype(np.float32)
    absolute = np.array(actions, dtype=np.float32, copy=True)
    absolute[:, :dims] += offset[None, :]
    return absolute


def to_relative_actions(actions: np.ndarray, state: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Absolute actions [T, A] - raw state on the masked dims: what the model predicts (lerobot to_relative_actions)."""
    dims = mask.shape[0]
    offset = np.asarray(state, dtype=np.float32)[:dims] * mask.astype(np.float32)
    relative = np.array(actions, dtype=np.float32, copy=True)
    relative[:, :dims] -= offset[None, :]
    return relative
