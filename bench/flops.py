"""FLOP count of one inference, per stage, from the config alone (so a GFLOP/s figure can be checked by hand).

Each policy family counts its own stages (``PolicyFamily.stage_flops``: policy/families/<type>/flops.py,
from the shared pieces in policy/flops.py, which also says what is counted and what is not); a new
family brings its counter with it. This module asks the family of the config.
"""
from __future__ import annotations

from typing import Dict

from vla_policy_node.policy.families import family_class


def stage_flops(config, num_steps: int) -> Dict[str, int]:
    """{'prefix': FLOPs of a miss's prefix, 'denoise': FLOPs of one chunk's denoise} for any family's config."""
    return family_class(config.policy_type).stage_flops(config, num_steps)
