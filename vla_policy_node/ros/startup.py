"""rclpy.init for the console scripts that take ``--ros-args`` (the node, vla_policy_play, the gripper relay).

A ``--params-file`` that is missing or does not parse ends in one line naming the file and exit status 2
(``params.read_params_document``, the same check as vla_policy_replay's ``--params``), not in rclpy's
traceback "Couldn't parse params file". What only rcl refuses (a YAML mapping it reads differently, a bad
``--ros-args`` rule) is reported the same way, in rcl's words.
"""
from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

from ..params import ParameterError, check_ros_args_params_files

BAD_ARGUMENTS = 2


def init_rclpy(prog: str, argv: Sequence[str], **init_kwargs: Any) -> Optional[int]:
    """``rclpy.init(args=argv, **init_kwargs)``; None when it succeeded, else the exit status after one line on
    stderr."""
    try:
        check_ros_args_params_files(argv)
    except ParameterError as exc:
        print(f'{prog}: error: {exc}', file=sys.stderr)
        return BAD_ARGUMENTS
    import rclpy
    from rclpy.impl.implementation_singleton import rclpy_implementation

    try:
        rclpy.init(args=list(argv), **init_kwargs)
    except rclpy_implementation.RCLError as exc:
        # rcl's message ends in its source locations (", at .../arguments.c:415"): the first part says it.
        print(f'{prog}: error: {str(exc).split(", at ")[0]}', file=sys.stderr)
        return BAD_ARGUMENTS
    return None
