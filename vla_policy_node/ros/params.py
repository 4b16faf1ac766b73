"""Every ROS parameter of the node, in one table.

The node declares them from this table (with ParameterDescriptors), the
config YAML documents them, and the README tables are generated from it
(``python -m vla_policy_node.ros.params``), so the three cannot drift.
This module does not import rclpy; ``descriptor()`` imports it lazily.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

# The runtime refuses longer instructions whatever max_instruction_length says; the range stops there.
from ..runtime import MAX_INSTRUCTION_CHARS
from ..trajectory import STAMP_MODES

BUILTIN_TINY = 'builtin:tiny'
DEFAULT_TRAJECTORY_TOPIC = '/joint_trajectory_controller/joint_trajectory'
CAMERA_TYPES = ('raw', 'compressed')
INSTRUCTION_DURABILITIES = ('volatile', 'transient_local')


@dataclass(frozen=True)
class ParamSpec:
    name: str
    default: Any                      # None: typed but unset (string arrays that have no sane default)
    type_name: str                    # bool | int | double | string | string_array | double_array
    description: str
    read_only: bool = False
    min_value: Optional[float] = None
    max_value: Optional[float] = None
    choices: Tuple[str, ...] = ()

    @property
    def live(self) -> bool:
        return not self.read_only


PARAMETERS: Tuple[ParamSpec, ...] = (
    # --- model (need a restart) ---
    ParamSpec('checkpoint_path', BUILTIN_TINY, 'string',
              'lerobot pretrained_model/ folder (config.json, model.safetensors, processor files). '
              f'"{BUILTIN_TINY}" writes and loads the embedded tiny pi0 with RANDOM weights (demo only).',
              read_only=True),
    ParamSpec('tokenizer_path', '', 'string',
              'PaliGemma tokenizer.model or tokenizer.json; empty: <checkpoint>/tokenizer/.', read_only=True),
    ParamSpec('device', 'auto', 'string', 'torch device: auto (cuda if available, else cpu), cpu, cuda, cuda:1 ...',
              read_only=True),
    ParamSpec('dtype', 'auto', 'string', 'compute dtype: auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16',
              read_only=True, choices=('auto', 'float32', 'bfloat16')),
    ParamSpec('cpu_threads', 0, 'int',
              'torch CPU threads; 0: torch default. 1-2 on a CPU-only machine shared with other processes.',
              read_only=True, min_value=0, max_value=256),
    ParamSpec('warmup', True, 'bool', 'Run one inference during configure so the first tick is not the slow one.',
              read_only=True),
    ParamSpec('autostart', True, 'bool',
              'Configure and activate on start-up (no lifecycle manager needed).', read_only=True),
    # --- topics (need a restart) ---
    ParamSpec('camera_names', None, 'string_array',
              'Checkpoint camera names in camera order; unset: every camera of the checkpoint.', read_only=True),
    ParamSpec('camera_topics', None, 'string_array',
              'One topic per camera; unset: /cameras/<name>/image_raw (+ /compressed for compressed cameras).',
              read_only=True),
    ParamSpec('camera_types', None, 'string_array',
              'Per camera: raw (sensor_msgs/Image) or compressed (sensor_msgs/CompressedImage); unset: all raw.',
              read_only=True),
    ParamSpec('instruction_topic', '/instruction', 'string', 'std_msgs/String with the task text.', read_only=True),
    ParamSpec('instruction_durability', 'volatile', 'string',
              'QoS durability of the instruction subscription. transient_local receives a latched instruction '
              'but does not match volatile publishers such as plain `ros2 topic pub`.', read_only=True,
              choices=INSTRUCTION_DURABILITIES),
    ParamSpec('joint_states_topic', '/joint_states', 'string', 'sensor_msgs/JointState feeding the state vector.',
              read_only=True),
    ParamSpec('trajectory_topic', DEFAULT_TRAJECTORY_TOPIC, 'string',
              'trajectory_msgs/JointTrajectory output (a joint_trajectory_controller command topic).',
              read_only=True),
    ParamSpec('joint_names', None, 'string_array',
              'Joints commanded by the trajectory, one per action dimension of the checkpoint. Required.',
              read_only=True),
    ParamSpec('state_joint_names', None, 'string_array',
              'Joints read from joint states into the state vector, in order; unset: joint_names.', read_only=True),
    # --- control (live) ---
    ParamSpec('control_rate_hz', 10.0, 'double', 'Inference ticks per second.', min_value=0.1, max_value=100.0),
    ParamSpec('num_steps', 10, 'int', 'Flow-matching Euler steps per chunk.', min_value=1, max_value=100),
    ParamSpec('execute_steps', 0, 'int', 'Actions of each chunk published as trajectory points; 0: the whole chunk.',
              min_value=0, max_value=1000),
    ParamSpec('action_period_sec', 0.1, 'double',
              'Time between consecutive actions of a chunk: point i is at (i+1) * action_period_sec.',
              min_value=0.001, max_value=10.0),
    ParamSpec('stamp_mode', 'zero', 'string',
              'header.stamp of trajectories: zero (start now) or observation (newest camera stamp, so the '
              'controller drops points that elapsed during inference).', choices=STAMP_MODES),
    ParamSpec('instruction', '', 'string', 'Default instruction, used until one arrives on instruction_topic.'),
    ParamSpec('max_instruction_length', 500, 'int', 'Longer instructions are refused (tick skipped).',
              min_value=1, max_value=MAX_INSTRUCTION_CHARS),
    ParamSpec('joint_lower_limits', None, 'double_array',
              'Per-joint lower bound for published positions; unset: no clipping.'),
    ParamSpec('joint_upper_limits', None, 'double_array',
              'Per-joint upper bound for published positions; unset: no clipping.'),
    ParamSpec('max_image_age_sec', 0.5, 'double', 'Skip the tick when any camera frame is older.',
              min_value=0.0, max_value=60.0),
    ParamSpec('max_camera_skew_sec', 0.1, 'double', 'Skip the tick when camera stamps differ by more.',
              min_value=0.0, max_value=60.0),
    ParamSpec('max_joint_state_age_sec', 0.5, 'double', 'Skip the tick when the joint state is older.',
              min_value=0.0, max_value=60.0),
    ParamSpec('cache_enabled', True, 'bool', 'Reuse the prefix K/V of a repeated observation.'),
    ParamSpec('cache_max_bytes', 1 << 30, 'int', 'Device-memory budget of the prefix cache in bytes.',
              min_value=0, max_value=1 << 40),
    ParamSpec('cache_max_entries', 16, 'int', 'Most prefixes kept in the cache.', min_value=0, max_value=100000),
    ParamSpec('dry_run', False, 'bool', 'Compute and log trajectories but publish nothing to the controller.'),
    ParamSpec('seed', -1, 'int', 'Noise seed for every chunk (same observation, same actions); -1: fresh noise.',
              min_value=-1, max_value=2 ** 31 - 1),
    ParamSpec('diagnostics_period_sec', 1.0, 'double', 'Period of /diagnostics messages.',
              min_value=0.1, max_value=60.0),
)

SPECS: Dict[str, ParamSpec] = {spec.name: spec for spec in PARAMETERS}


def descriptor(spec: ParamSpec):
    """rcl_interfaces ParameterDescriptor for a spec (imports rclpy message types lazily)."""
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType

    types = {'bool': ParameterType.PARAMETER_BOOL, 'int': ParameterType.PARAMETER_INTEGER,
             'double': ParameterType.PARAMETER_DOUBLE, 'string': ParameterType.PARAMETER_STRING,
             'string_array': ParameterType.PARAMETER_STRING_ARRAY,
             'double_array': ParameterType.PARAMETER_DOUBLE_ARRAY}
    text = spec.description + (f' One of: {", ".join(spec.choices)}.' if spec.choices else '')
    result = ParameterDescriptor(name=spec.name, type=types[spec.type_name], description=text,
                                 read_only=spec.read_only)
    if spec.min_value is not None and spec.type_name == 'double':
        result.floating_point_range = [FloatingPointRange(from_value=float(spec.min_value),
                                                          to_value=float(spec.max_value), step=0.0)]
    elif spec.min_value is not None and spec.type_name == 'int':
        result.integer_range = [IntegerRange(from_value=int(spec.min_value), to_value=int(spec.max_value), step=0)]
    return result


def validate_value(spec: ParamSpec, value: Any) -> Optional[str]:
    """Reason to refuse ``value`` for ``spec`` beyond what the descriptor checks, or None."""
    if spec.choices and value not in spec.choices:
        return f'{spec.name} must be one of {list(spec.choices)}, got {value!r}'
    if spec.type_name == 'double' and not math.isfinite(float(value)):
        return f'{spec.name} must be finite'
    if spec.type_name == 'double_array' and value is not None and not all(math.isfinite(v) for v in value):
        return f'{spec.name} must hold finite numbers'
    return None


def _format_default(spec: ParamSpec) -> str:
    if spec.default is None:
        return '(unset)'
    if isinstance(spec.default, str):
        return f'`"{spec.default}"`' if spec.default else '`""`'
    return f'`{spec.default}`'


def markdown_table() -> str:
    """README table of every parameter, generated from PARAMETERS."""
    lines = ['| parameter | type | default | live | range / choices | description |',
             '|---|---|---|---|---|---|']
    for spec in PARAMETERS:
        if spec.choices:
            bounds = ', '.join(spec.choices)
        elif spec.min_value is not None:
            bounds = f'{spec.min_value:g} .. {spec.max_value:g}'
        else:
            bounds = ''
        lines.append(f'| `{spec.name}` | {spec.type_name} | {_format_default(spec)} | '
                     f'{"yes" if spec.live else "restart"} | {bounds} | {spec.description} |')
    return '\n'.join(lines)


TOPICS: Tuple[Tuple[str, str, str, str], ...] = (
    # (direction, topic (parameter that sets it), type, QoS)
    ('in', '`/cameras/<name>/image_raw` per camera (`camera_topics`)', 'sensor_msgs/Image or CompressedImage '
     '(`camera_types`)', 'sensor data: best effort, keep last 5'),
    ('in', '`/instruction` (`instruction_topic`)', 'std_msgs/String', 'reliable, depth 1, '
     'durability `instruction_durability`'),
    ('in', '`/joint_states` (`joint_states_topic`)', 'sensor_msgs/JointState', 'sensor data: best effort'),
    ('in', '`/clock` (with `use_sim_time`)', 'rosgraph_msgs/Clock', 'ROS default'),
    ('out', f'`{DEFAULT_TRAJECTORY_TOPIC}` (`trajectory_topic`)', 'trajectory_msgs/JointTrajectory',
     'reliable, depth 10 (lifecycle publisher: only while active)'),
    ('out', '`/diagnostics`', 'diagnostic_msgs/DiagnosticArray', 'reliable, depth 10, every '
     '`diagnostics_period_sec`'),
    ('srv', '`/vla_policy/change_state`, `get_state`, ...', 'lifecycle_msgs', 'lifecycle services'),
)


def topics_table() -> str:
    lines = ['| | topic | type | QoS |', '|---|---|---|---|']
    lines += [f'| {direction} | {topic} | {msg_type} | {qos} |' for direction, topic, msg_type, qos in TOPICS]
    return '\n'.join(lines)


def yaml_document(section: str = '/**/vla_policy') -> List[str]:
    """Lines of a params file documenting every parameter (commented where unset)."""
    lines = ['# Every parameter of vla_policy_node with its default. Generated by',
             '#   python -m vla_policy_node.ros.params --yaml > config/vla_policy.yaml',
             '# "/**/vla_policy" matches the node in any namespace.',
             f'{section}:', '  ros__parameters:']
    for spec in PARAMETERS:
        lines.append(f'    # {spec.description}' + (' (restart to change)' if spec.read_only else ''))
        if spec.default is None:
            lines.append(f'    # {spec.name}: []')
        elif isinstance(spec.default, str):
            lines.append(f'    {spec.name}: "{spec.default}"')
        elif isinstance(spec.default, bool):
            lines.append(f'    {spec.name}: {str(spec.default).lower()}')
        else:
            lines.append(f'    {spec.name}: {spec.default}')
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description='Print the parameter table (markdown) or a documented params file.')
    parser.add_argument('--yaml', action='store_true', help='print a params YAML with every default')
    parser.add_argument('--topics', action='store_true', help='print the topics table (markdown)')
    args = parser.parse_args(argv)
    if args.yaml:
        print('\n'.join(yaml_document()))
    else:
        print(topics_table() if args.topics else markdown_table())
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
