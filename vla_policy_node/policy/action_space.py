"""Robot units <-> the model's action space: lerobot's post-processor, and its inverse for an RTC leftover.

    model -> robot:  unnormalise -> (relative-action checkpoints) + the raw state of the observation
    robot -> model:  (relative-action checkpoints) - the raw state of the observation -> normalise

Relative actions are policy/relative_actions.py (lerobot's rule and arithmetic). These are the defaults of a
family's ``postprocess`` / ``to_model_space`` hooks (policy/family.py); a family with its own action decode
overrides the hooks.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .relative_actions import relative_action_mask, to_absolute_actions, to_relative_actions


def relative_mask(config: Any) -> Optional[np.ndarray]:
    """None: absolute actions. Else [action_dim] bool: the dims that get the raw state added back."""
    if not config.use_relative_actions:
        return None
    return relative_action_mask(config.action_dim, config.relative_exclude_joints, config.action_feature_names)


def to_robot_units(normalized_actions: np.ndarray, raw_state: np.ndarray, normalizer: Any,
                   mask: Optional[np.ndarray]) -> np.ndarray:
    """lerobot's post-processor: unnormalise, then (relative-action checkpoints) add the raw state back.

    The state added back is the raw state of the observation this chunk was predicted from. lerobot adds
    the state of its latest pre-processor call, which its synchronous loop re-runs every tick, so queued
    actions there drift with the robot (its sync rollout refuses relative actions for that reason, and
    RTC post-processes each chunk right after prediction, anchored like here). Each chunk the node
    publishes is a plan from one observation, so it is anchored to that observation's joint state.

    The prefix cache is unaffected: a family either keeps the state out of the prefix or puts the
    normalised absolute state in the prompt whether or not actions are relative, and the add-back
    only touches the action output, after the model.
    """
    actions = normalizer.unnormalize(normalized_actions)
    if mask is None:
        return actions
    return to_absolute_actions(actions, raw_state, mask)


def to_model_space(actions: np.ndarray, raw_state: np.ndarray, normalizer: Any,
                   mask: Optional[np.ndarray]) -> np.ndarray:
    """Absolute robot-unit actions [T, action_dim] -> the model's space: on a relative-action checkpoint
    first made relative to *this* observation's raw state, the state the new chunk is anchored to (lerobot
    policies/rtc/relative.py reanchor_relative_rtc_prefix), then normalised with the action statistics."""
    if mask is not None:
        actions = to_relative_actions(actions, raw_state, mask)
    return normalizer.normalize(actions)
