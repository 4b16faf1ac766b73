"""The launch file compiles everywhere and builds a LaunchDescription where launch_ros exists.

`make setup` installs launch_ros from ../shared/ros-tools when that folder exists; test_user_journey.py
launches the file for real with `ros2 launch`.
"""
import importlib.util
import py_compile
from pathlib import Path

import pytest

LAUNCH_FILE = Path(__file__).resolve().parents[1] / 'launch' / 'vla_policy.launch.py'


def test_launch_file_compiles():
    py_compile.compile(str(LAUNCH_FILE), doraise=True)


def test_launch_description_has_the_arguments():
    pytest.importorskip('launch_ros', reason='launch_ros is not on PyPI: install ../shared/ros-tools (make setup '
                                             'does when it exists) or use a ROS 2 install')
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument

    spec = importlib.util.spec_from_file_location('vla_policy_launch', LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    assert isinstance(description, LaunchDescription)
    names = {entity.name for entity in description.entities if isinstance(entity, DeclareLaunchArgument)}
    assert names == {'params_file', 'checkpoint_path', 'namespace', 'use_sim_time'}
