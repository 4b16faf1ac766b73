"""Every parameter of the node, with its validation, in one table (no rclpy).

The node declares its ROS parameters from this table, the replay reads the
same names from a params file, and both refuse a value through ``validate``,
so a value means and is checked the same on the robot and in a replay.
Checks are data on each spec (ranges, choices, ``unique``, ``same_length_as``,
``at_most``, and rules against the loaded checkpoint), the way
generate_parameter_library declares ``validation:`` per parameter.
config/vla_policy.yaml and the tables of docs/parameters.md are generated from it
(``python -m vla_policy_node.params [--yaml | --topics | --docs docs/parameters.md]``), so none can drift.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from .backends import BACKENDS
from .handover import CHUNKING_MODES, DELAY_MODES
from .outputs import OUTPUT_TYPES, output_name_problem
from .images import DEFAULT_MAX_PIXELS, MAX_PIXELS_LIMIT
from .observation import CAMERA_CLOCKS, MAX_INSTRUCTION_CHARS
from .policy.builtin import BUILTIN_DEMO, BUILTIN_TINY  # noqa: F401  (the embedded checkpoints' names)
from .policy.relative_actions import relative_action_mask
from .policy.families import type_capabilities
from .policy.rtc import AUTO, RTC_MODES, SCHEDULES
from .wire.profiles import KEY_LAYOUTS, PROFILES
from .safety import LIMIT_MODES, ON_FAULT_MODES
from .trajectory import STAMP_MODES

NODE_NAME = 'vla_policy'
# Topic names without a leading slash are relative: they resolve in the node's namespace
# (`ros2 launch ... namespace:=arm` gives /arm/joint_states), as ROS nodes conventionally do.
DEFAULT_TRAJECTORY_TOPIC = 'joint_trajectory_controller/joint_trajectory'
# The joints config/vla_policy.yaml ships, so the file runs as is with builtin:demo (6 actions) and the
# sample bag; a real robot names its own.
TINY_JOINT_NAMES = ('joint_1', 'joint_2', 'joint_3', 'joint_4', 'joint_5', 'joint_6')
CAMERA_TYPES = ('raw', 'compressed')
INSTRUCTION_DURABILITIES = ('volatile', 'transient_local')
TYPE_NAMES = ('bool', 'int', 'double', 'string', 'string_array', 'double_array')
# Set by ROS itself, accepted in params files and never part of the table.
ROS_PARAMETERS = ('use_sim_time', 'start_type_description_service')


class ParameterError(ValueError):
    """A parameter value (or a params file) that cannot configure the node; the message names it."""


@dataclass(frozen=True)
class ParamSpec:
    name: str
    default: Any                            # None: typed but unset (arrays without a sane default)
    type_name: str                          # one of TYPE_NAMES
    description: str
    read_only: bool = False                 # a change needs a restart
    # ---- validation, declared per parameter -------------------------------------------------------
    min_value: Optional[float] = None       # inclusive range, for int, double and double_array elements
    max_value: Optional[float] = None
    choices: Tuple[str, ...] = ()           # a string, or every element of a string array
    required: bool = False                  # must be set and non-empty
    unique: bool = False                    # no element twice
    same_length_as: Optional[str] = None    # as many elements as this parameter's effective value
    at_most: Optional[str] = None           # element-wise <= this array parameter
    falls_back_to: Optional[str] = None     # unset: this parameter's value
    model_default: Optional[str] = None     # unset: this attribute of the checkpoint config
    model_length: Optional[str] = None      # length == this attribute of the checkpoint config
    model_max: Optional[str] = None         # value <= this attribute of the checkpoint config
    model_members: Optional[str] = None     # every element is in this attribute of the checkpoint config
    model_requires: Optional[Tuple[str, str]] = None   # (value, attribute): that value needs attribute > 0
    required_when: Optional[Tuple[str, str]] = None    # (parameter, value): must be set when that one has it
    # The value is AUTO or one of this FamilyCapabilities field of the checkpoint's family (a policy type no
    # family of the registry has, a remote server's own: not checked here, the server refuses it).
    family_choices: Optional[str] = None
    # ---- documentation ---------------------------------------------------------------------------------
    shipped: Any = None                     # the value config/vla_policy.yaml ships instead of the default
    # A policy family's load option (PolicyFamily.option_defaults, same name): passed to the loaded policy,
    # which refuses it by name when set for a family that has no such option.
    family_option: bool = False

    @property
    def live(self) -> bool:
        return not self.read_only

    @property
    def is_array(self) -> bool:
        return self.type_name.endswith('_array')


PARAMETERS: Tuple[ParamSpec, ...] = (
    # --- model (need a restart) ---
    ParamSpec('checkpoint_path', BUILTIN_DEMO, 'string',
              'lerobot pretrained_model/ folder (config.json, model.safetensors, processor files). '
              f'"{BUILTIN_DEMO}": the embedded tiny pi0 trained on the sample bag only (demo only: it knows that '
              f'one recorded motion); "{BUILTIN_TINY}": the same model with RANDOM weights (tests).',
              read_only=True),
    ParamSpec('tokenizer_path', '', 'string',
              'PaliGemma tokenizer.model or tokenizer.json; empty: <checkpoint>/tokenizer/.', read_only=True),
    ParamSpec('device', 'auto', 'string', 'torch device: auto (cuda if available, else cpu), cpu, cuda, cuda:1 ...',
              read_only=True),
    ParamSpec('dtype', 'auto', 'string', 'compute dtype: auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16',
              read_only=True, choices=('auto', 'float32', 'bfloat16')),
    ParamSpec('cpu_threads', 0, 'int',
              'torch CPU threads. 0: auto, half the CPUs this process may use and at most all but 2 (at least '
              '1), leaving room for the executor, the tick thread, camera drivers and the bag player (2 CPUs: '
              '1 thread); -1: torch\'s own default (every core, which oversubscribes a small shared machine); '
              'N: N threads.', read_only=True, min_value=-1, max_value=256),
    ParamSpec('pi05_padded_state_prompt', False, 'bool',
              'pi0.5 only: bin the state zero-padded to max_state_dim (32) into the prompt, as lerobot did from '
              '2025-10-02 (#1910) to 2026-03-05 (#2964). Set it only for checkpoints fine-tuned with lerobot '
              'releases between those dates; false: the unpadded state of current lerobot and openpi.',
              read_only=True, family_option=True),
    ParamSpec('warmup', True, 'bool', 'Run one inference during configure so the first tick is not the slow one. '
              'With cuda_graphs auto or on it always runs: that is where the graphs are captured.',
              read_only=True),
    ParamSpec('cuda_graphs', 'off', 'string',
              'CUDA graphs for the denoise loop (all steps in one graph, over a static K/V workspace) and the '
              'prefix, captured in the configure warm-up for every prompt bucket and chunking mode at num_steps '
              '(a tick never captures; a shape without a graph runs eagerly, counted in /diagnostics '
              'eager_fallback_reasons): auto (on a CUDA device, eager where a capture fails, logged once), on (a '
              'capture failure in the warm-up, or a device without CUDA, fails configure), off (eager). Default '
              'off until measured on a GPU. docs/gpu.md.',
              read_only=True, choices=('auto', 'on', 'off')),
    ParamSpec('quantization', 'none', 'string',
              'Weights of the transformer blocks (and the token table): none; int8_weights (per-channel int8, '
              'activations in dtype: about half the bf16 weight bytes, any CUDA device incl. Jetson Orin, or '
              'the CPU); fp8 (e4m3 weights and per-token activations through torch._scaled_mm: CUDA compute '
              'capability >= 8.9 only, elsewhere configure fails naming the device; on device cpu a slow '
              'reference for accuracy checks). docs/precision.md.',
              read_only=True, choices=('none', 'int8_weights', 'fp8')),
    ParamSpec('autostart', True, 'bool',
              'Configure and activate on start-up (no lifecycle manager needed).', read_only=True),
    # --- topics (need a restart) ---
    ParamSpec('camera_names', None, 'string_array',
              'Checkpoint camera names in camera order; unset: every camera of the checkpoint.', read_only=True,
              unique=True, model_default='camera_names', model_members='camera_names'),
    ParamSpec('camera_topics', None, 'string_array',
              'One topic per camera; unset: cameras/<name>/image_raw (+ /compressed for compressed cameras).',
              read_only=True, same_length_as='camera_names'),
    ParamSpec('camera_types', None, 'string_array',
              'Per camera: raw (sensor_msgs/Image) or compressed (sensor_msgs/CompressedImage); unset: all raw.',
              read_only=True, choices=CAMERA_TYPES, same_length_as='camera_names'),
    ParamSpec('instruction_topic', 'instruction', 'string', 'std_msgs/String with the task text.', read_only=True),
    ParamSpec('instruction_durability', 'volatile', 'string',
              'QoS durability of the instruction subscription. transient_local receives a latched instruction '
              'but does not match volatile publishers such as plain `ros2 topic pub`.', read_only=True,
              choices=INSTRUCTION_DURABILITIES),
    ParamSpec('joint_states_topic', 'joint_states', 'string', 'sensor_msgs/JointState feeding the state vector.',
              read_only=True),
    ParamSpec('trajectory_topic', DEFAULT_TRAJECTORY_TOPIC, 'string',
              'trajectory_msgs/JointTrajectory output (a joint_trajectory_controller command topic) of every '
              'joint; not used when outputs is set.', read_only=True),
    ParamSpec('outputs', None, 'string_array',
              'Several controllers from one action vector (ros2_control YAML style): output names, each with '
              '<name>.joints, <name>.type and <name>.topic; together the joints are a partition of '
              'joint_names. Unset: one JointTrajectory of every joint on trajectory_topic.',
              read_only=True, unique=True),
    ParamSpec('joint_names', None, 'string_array',
              'Joints commanded by the trajectory, one per action dimension of the checkpoint. Required '
              '(config/vla_policy.yaml ships the 6 joints of builtin:demo and the sample bag).',
              read_only=True, required=True, unique=True, model_length='action_dim', shipped=TINY_JOINT_NAMES),
    ParamSpec('state_joint_names', None, 'string_array',
              'Joints read from joint states into the state vector, in order; unset: joint_names.', read_only=True,
              unique=True, falls_back_to='joint_names', model_length='state_dim'),
    # --- control (live) ---
    ParamSpec('control_rate_hz', 10.0, 'double', 'Inference ticks per second.', min_value=0.1, max_value=100.0),
    ParamSpec('num_steps', 0, 'int', 'Flow-matching Euler steps per chunk; 0: the checkpoint\'s '
              'num_inference_steps (builtin:demo and lerobot\'s pi0 / pi0.5 / SmolVLA: 10; GR00T N1.7: 4).',
              min_value=0, max_value=100),
    ParamSpec('execute_steps', 0, 'int', 'Actions of each chunk published as trajectory points; 0: the whole chunk.',
              min_value=0, max_value=1000, model_max='chunk_size'),
    ParamSpec('action_period_sec', 0.1, 'double',
              'Time between consecutive actions of a chunk: point i is at (i+1) * action_period_sec.',
              min_value=0.001, max_value=10.0),
    ParamSpec('stamp_mode', 'zero', 'string',
              'header.stamp of trajectories. Either way action i of a chunk is due at the observation\'s time '
              '(its newest camera frame, see camera_clock) + (i+1) * action_period_sec. zero: start now; the node '
              'drops the actions already due at publication and times the rest from publication. observation: '
              'stamped at the observation\'s time, every point; the controller drops the elapsed ones, so its '
              'clock must be the node\'s.',
              choices=STAMP_MODES),
    ParamSpec('camera_clock', 'auto', 'string',
              'The clock of the camera stamps, which time every chunk: header (the stamps are in the node\'s '
              'clock: same machine, synchronised clocks, sim time), receive (another clock: a frame\'s time is its '
              'receive time less how much later it arrived than the fastest of its camera\'s recent frames) or '
              'auto (header under use_sim_time, or when every camera\'s frames arrive after their stamps and '
              'within half of max_image_age_sec; else receive). A frame whose stamp jumps against its receive '
              'time by more than 0.5 s (a clock step, a glitched stamp) is never timed from the estimate before '
              'the jump: refused (camera_clock_jump) or timed by receipt until the jump has held 0.5 s (the '
              'estimate restarts on it: /diagnostics clock_jumps) or the stamps come back (clock_outliers). The '
              'choice and why: /diagnostics camera_clock and camera_clock_reason, the replay summary.',
              read_only=True, choices=CAMERA_CLOCKS),
    ParamSpec('joint_state_clock', 'auto', 'string',
              'The clock of the joint-state stamps, which time max_joint_state_age_sec: header, receive or auto, '
              'the rule of camera_clock on the joint states\' own delays (auto: header under use_sim_time, or '
              'when they arrive after their stamps and within half of max_joint_state_age_sec; else receive), jumps '
              'included (joint_state_clock_jump). The choice and why: /diagnostics joint_state_clock and '
              'joint_state_clock_reason.', read_only=True, choices=CAMERA_CLOCKS),
    ParamSpec('chunking', 'independent', 'string',
              'independent: every chunk is sampled on its own; rtc: real-time chunking, each chunk continues '
              'the unexecuted rest of the one being executed (smooth hand-over).', choices=CHUNKING_MODES),
    ParamSpec('rtc_mode', AUTO, 'string',
              'auto: the policy family\'s own first mode (guided for pi0, pi0.5 and SmolVLA, inpainting for GR00T); '
              'guided: training-free guidance toward the previous chunk; trained: clamp the first delay actions '
              '(checkpoints trained with rtc_training_max_delay > 0); inpainting: the chunk starts from the '
              'leftover, its velocity ramped in (GR00T N1.7\'s own). A mode the checkpoint\'s family lacks is '
              'refused at configure, naming its modes.', choices=(AUTO,) + RTC_MODES,
              model_requires=('trained', 'rtc_training_max_delay'), family_choices='rtc_modes'),
    ParamSpec('rtc_schedule', 'linear', 'string',
              'Guidance weights over the previous chunk, after the delay: zeros, ones, linear or exp decay.',
              choices=SCHEDULES),
    ParamSpec('rtc_max_guidance_weight', 10.0, 'double', 'Upper bound of the guidance weight (beta).',
              min_value=0.01, max_value=1000.0),
    ParamSpec('rtc_execution_horizon', 10, 'int',
              'Actions of the previous chunk that guide the new one (capped at what is left of it).',
              min_value=1, max_value=1000, model_max='chunk_size'),
    ParamSpec('inference_delay_mode', 'measured', 'string',
              'How the inference delay d (actions that fall due before a chunk is out) is estimated: measured '
              '(the most that elapsed over the last inference_delay_window ticks, the first after activation '
              'excluded) or fixed (inference_delay_steps).', choices=DELAY_MODES),
    ParamSpec('inference_delay_window', 20, 'int', 'Ticks over which the measured inference delay is taken.',
              min_value=1, max_value=1000),
    ParamSpec('inference_delay_steps', 0, 'int', 'The inference delay in actions when inference_delay_mode is fixed.',
              min_value=0, max_value=1000, model_max='chunk_size'),
    ParamSpec('repeated_state_tolerance', 1e-3, 'double',
              'A tick whose observation is the executing chunk\'s again (the same camera frames, stamp and '
              'pixels, the same instruction and settings, every joint within this of its state) is skipped as '
              'repeated_observation (no fault) and the chunk goes on; 0: only an identical state repeats.',
              min_value=0.0, max_value=1e3),
    ParamSpec('instruction', '', 'string', 'Default instruction, used until one arrives on instruction_topic.'),
    ParamSpec('max_instruction_length', 500, 'int', 'Longer instructions are refused (tick skipped).',
              min_value=1, max_value=MAX_INSTRUCTION_CHARS),
    ParamSpec('joint_lower_limits', None, 'double_array',
              'Per-joint lower bound for published positions; unset: no clipping.',
              same_length_as='joint_names', at_most='joint_upper_limits'),
    ParamSpec('joint_upper_limits', None, 'double_array',
              'Per-joint upper bound for published positions; unset: no clipping.', same_length_as='joint_names'),
    # --- safety (live, but for the topics) ---
    ParamSpec('on_fault', 'hold', 'string',
              'A skipped tick (stale camera, bad joint state, error ...): hold (publish one trajectory that keeps '
              'the arm where it is measured, until inputs are good again) or continue (publish nothing; the '
              'controller finishes the last trajectory).', choices=ON_FAULT_MODES),
    ParamSpec('fault_hold_after_sec', 1.0, 'double',
              'Hold when no valid trajectory was produced for this long (whatever on_fault says); 0: off.',
              min_value=0.0, max_value=60.0),
    ParamSpec('max_position_step', None, 'double_array',
              'Per joint: the largest change between consecutive points, and from the measured position to the '
              'first point; unset: off.', same_length_as='joint_names', min_value=1e-9, max_value=1e6),
    ParamSpec('max_velocity', None, 'double_array',
              'Per joint: the largest finite-difference velocity between points (units/s); unset: off.',
              same_length_as='joint_names', min_value=1e-9, max_value=1e6),
    ParamSpec('limit_mode', 'clamp', 'string',
              'Beyond max_position_step / max_velocity: clamp (move the point to the bound), stretch (clamp steps, '
              'slow fast segments down in time) or hold (refuse the trajectory and hold the arm).',
              choices=LIMIT_MODES),
    ParamSpec('enable_topic', 'enable', 'string',
              'std_msgs/Bool deadman input (see require_enable).', read_only=True),
    ParamSpec('require_enable', False, 'bool',
              'Publish policy trajectories only while true messages keep arriving on enable_topic within '
              'enable_timeout_sec; otherwise hold.'),
    ParamSpec('enable_timeout_sec', 0.5, 'double', 'Deadman timeout.', min_value=0.01, max_value=60.0),
    ParamSpec('estop_topic', 'estop', 'string',
              'std_msgs/Bool e-stop input: true latches a hold until ~/reset_estop (std_srvs/Trigger) is called '
              'with the input false.', read_only=True),
    ParamSpec('ramp_in_sec', 0.0, 'double',
              'After activation, an enable or a released hold, blend the published positions from the measured '
              'position to the policy\'s over this long; 0: off.', min_value=0.0, max_value=60.0),
    ParamSpec('max_image_age_sec', 0.5, 'double', 'Skip the tick when any camera frame is older.',
              min_value=0.0, max_value=60.0),
    ParamSpec('max_camera_skew_sec', 0.1, 'double', 'Skip the tick when camera stamps differ by more.',
              min_value=0.0, max_value=60.0),
    ParamSpec('max_joint_state_age_sec', 0.5, 'double', 'Skip the tick when the joint state is older.',
              min_value=0.0, max_value=60.0),
    ParamSpec('max_image_pixels', DEFAULT_MAX_PIXELS, 'int',
              'Skip the tick (bad_image) when a camera frame has more pixels (width x height, read from the '
              'raw message or the JPEG/PNG header before any decoding). The default, 4096 x 4096, admits any '
              'robot camera and bounds the memory one frame can take.', min_value=1, max_value=MAX_PIXELS_LIMIT),
    ParamSpec('cache_enabled', True, 'bool', 'Reuse the prefix K/V of a repeated observation.'),
    ParamSpec('cache_max_bytes', 1 << 30, 'int', 'Device-memory budget of the prefix cache in bytes.',
              min_value=0, max_value=1 << 40),
    ParamSpec('cache_max_entries', 16, 'int', 'Most prefixes kept in the cache.', min_value=0, max_value=100000),
    ParamSpec('dry_run', False, 'bool', 'Compute and log trajectories but publish nothing to the controller.'),
    ParamSpec('seed', -1, 'int', 'Noise seed for every chunk (same observation, same actions); -1: fresh noise.',
              min_value=-1, max_value=2 ** 31 - 1),
    ParamSpec('diagnostics_period_sec', 1.0, 'double', 'Period of /diagnostics messages.',
              min_value=0.1, max_value=60.0),
    # --- remote inference (need a restart; docs/remote.md) ---
    ParamSpec('backend', 'local', 'string',
              'local: load checkpoint_path and run it here; remote: ask a server on the openpi WebSocket wire '
              '(openpi serve_policy.py, sglang, vLLM-Omni, vla_policy_serve) for each chunk; checkpoint_path is '
              'then not loaded.', read_only=True, choices=tuple(BACKENDS)),
    ParamSpec('remote_url', '', 'string',
              'backend remote: ws://host:port/path or wss://... (openpi: ws://gpu-box:8000, sglang: '
              '.../openpi/policy, vLLM-Omni: .../v1/realtime/robot/openpi).', read_only=True,
              required_when=('backend', 'remote')),
    ParamSpec('remote_profile', 'openpi', 'string',
              'The server: openpi (reply {"actions"}, text error frames), sglang (normalised state and actions: '
              'needs remote_stats_path; {"error"} frames) or vllm_omni (bare-array reply; {"type": "error"}).',
              read_only=True, choices=tuple(PROFILES)),
    ParamSpec('remote_api_key', '', 'string',
              'Sent as "Authorization: Api-Key <key>" when set; never logged nor in /diagnostics, but ros2 param '
              'get/dump shows it to anyone on the ROS graph: prefer remote_api_key_file. openpi\'s own server '
              'ignores it: put wss:// behind a proxy that checks it.', read_only=True),
    ParamSpec('remote_api_key_file', '', 'string',
              'A file holding the API key (one line; read at configure, never logged): the key stays off the ROS '
              'graph. Set this or remote_api_key, not both.', read_only=True),
    ParamSpec('remote_timeout_sec', 1.0, 'double',
              'Longest wait for a reply (and for a connection); past it the tick is skipped (remote_timeout) and '
              'the connection reopened.', read_only=True, min_value=0.01, max_value=60.0),
    ParamSpec('remote_key_layout', 'auto', 'string',
              'Observation keys on the wire: droid (observation/exterior_image_1_left, observation/wrist_image_left, '
              'joint_position + gripper_position), libero, aloha (images.cam_* CHW, state), cameras '
              '(images.<camera>: vla_policy_serve), sglang (observation.images.<camera>); auto: the profile\'s '
              '(openpi and vllm_omni: droid, sglang: sglang).', read_only=True, choices=KEY_LAYOUTS),
    ParamSpec('remote_image_keys', None, 'string_array',
              'Per camera (camera_names order): its wire key, dots nesting maps; unset: the layout\'s.',
              read_only=True, unique=True, same_length_as='camera_names'),
    ParamSpec('remote_state_keys', None, 'string_array',
              'The state on the wire, split in state order: key:N takes N values, one key without :N the rest '
              '(DROID: [observation/joint_position, observation/gripper_position:1]); unset: the layout\'s.',
              read_only=True, unique=True),
    ParamSpec('remote_prompt_key', '', 'string', 'Wire key of the instruction; empty: the layout\'s (prompt).',
              read_only=True),
    ParamSpec('remote_image_size', 224, 'int',
              'Resize-with-pad every frame to this square size as uint8 on the robot, as openpi clients do; 0: send '
              'the raw frames (the server resizes).', read_only=True, min_value=0, max_value=4096),
    ParamSpec('remote_stats_path', '', 'string',
              'A checkpoint folder (config.json and processor files; no weights) whose statistics normalise the '
              'state and unnormalise the actions here, for profiles whose server expects that (sglang).',
              read_only=True),
    ParamSpec('remote_max_reply_bytes', 8 << 20, 'int',
              'Larger replies (and metadata frames) are refused (remote_bad_reply).', read_only=True,
              min_value=1024, max_value=1 << 30),
)

SPECS: Dict[str, ParamSpec] = {spec.name: spec for spec in PARAMETERS}
# The parameters that are policy-family options (settings.load_runtime hands them to the loaded policy).
FAMILY_OPTIONS: Tuple[str, ...] = tuple(spec.name for spec in PARAMETERS if spec.family_option)

# Starting values for the first runs on a real arm, commented into config/vla_policy.yaml beside the
# defaults (docs/safety.md "First run on a real arm": dry_run, then limits + deadman with a slow ramp, then live).
FIRST_RUN: Dict[str, str] = {
    'dry_run': 'true for the first run: everything is computed, checked and logged, nothing is sent',
    'on_fault': 'hold',
    'fault_hold_after_sec': '1.0 (a few ticks at the measured latency)',
    'max_position_step': 'per joint, what the arm may move in one action_period_sec at a slow speed, e.g. '
                         '0.5 rad/s x 0.02 s = 0.01 rad',
    'max_velocity': 'per joint, 30-50% of the URDF velocity limits, e.g. [0.5, 0.5, 0.5, 0.8, 0.8, 0.8]',
    'limit_mode': 'hold while a checkpoint is new (a refusal stops the arm and logs why); clamp or stretch '
                  'once its motion is trusted',
    'joint_lower_limits': 'the URDF lower limits plus a margin (0.05 rad)',
    'joint_upper_limits': 'the URDF upper limits minus a margin (0.05 rad)',
    'require_enable': 'true: a deadman (a held button publishing true at 10-20 Hz on enable_topic)',
    'enable_timeout_sec': '0.3 with a 10-20 Hz deadman publisher',
    'ramp_in_sec': '3.0 for the first live runs (blend from where the arm is), then 1.0',
}

# The sub-parameters of every name in `outputs` (`arm.joints`, `arm.type`, `arm.topic`), as
# ros2_control's controller YAML nests them. Templates: ``output_specs`` names them per output.
OUTPUT_FIELDS: Tuple[ParamSpec, ...] = (
    ParamSpec('joints', None, 'string_array',
              'The joints of joint_names this output commands, in the order its message lists them.',
              read_only=True, required=True, unique=True),
    ParamSpec('type', 'joint_trajectory', 'string',
              'joint_trajectory (trajectory_msgs/JointTrajectory: every point of the plan, for a '
              'joint_trajectory_controller) or float64_multi_array (std_msgs/Float64MultiArray: one position '
              'per joint, the first point not yet due at publication, for a forward_command_controller such as '
              'a position gripper).', read_only=True, choices=OUTPUT_TYPES),
    ParamSpec('topic', '', 'string',
              'Command topic; empty: <name>_controller/joint_trajectory (joint_trajectory) or '
              '<name>_controller/commands (float64_multi_array).', read_only=True),
)
OUTPUT_PLACEHOLDER = '<output>'


def output_specs(outputs: Any) -> Tuple[ParamSpec, ...]:
    """The concrete sub-parameters (``<name>.<field>``) of the names in ``outputs`` (none while unset or bad)."""
    if not isinstance(outputs, (list, tuple)) or not all(isinstance(name, str) for name in outputs):
        return ()
    usable = [name for name in outputs if name == OUTPUT_PLACEHOLDER or output_name_problem(name, SPECS) is None]
    return tuple(dataclasses.replace(field, name=f'{name}.{field.name}') for name in usable for field in OUTPUT_FIELDS)


def all_specs(values: Mapping[str, Any]) -> Tuple[ParamSpec, ...]:
    """The table plus the sub-parameters of the outputs ``values`` names."""
    return PARAMETERS + output_specs(values.get('outputs'))


# ---- validation ------------------------------------------------------------------------------------

def is_unset(value: Any) -> bool:
    """None, or an empty array: 'not set' for the optional array parameters."""
    return value is None or (isinstance(value, (list, tuple)) and not value)


def effective(values: Mapping[str, Any], name: str, config: Any = None) -> Any:
    """A parameter's value after its fallbacks (state_joint_names -> joint_names; cameras -> the checkpoint's)."""
    spec = SPECS.get(name)
    value = values.get(name)
    if spec is None:                        # an output's sub-parameter: no fallbacks
        return value
    if is_unset(value) and spec.falls_back_to:
        return effective(values, spec.falls_back_to, config)
    if is_unset(value) and spec.model_default and config is not None:
        return tuple(getattr(config, spec.model_default))
    return value


def value_problem(spec: ParamSpec, value: Any) -> Optional[str]:
    """Why ``value`` cannot be this parameter on its own (type, range, choices, repeats), or None."""
    if value is None:
        return f'{spec.name} is not set ({spec.description})' if spec.required else None
    type_problem = _type_problem(spec, value)
    if type_problem:
        return type_problem
    if spec.required and is_unset(value):
        return f'{spec.name} is not set ({spec.description})'
    elements = list(value) if spec.is_array else [value]
    if spec.type_name in ('double', 'double_array') and not all(math.isfinite(v) for v in elements):
        return f'{spec.name} must be finite, got {value!r}'
    if spec.min_value is not None and not all(spec.min_value <= v <= spec.max_value for v in elements):
        return f'{spec.name} must be in [{_bound(spec, spec.min_value)}, {_bound(spec, spec.max_value)}], got {value!r}'
    if spec.choices and not all(v in spec.choices for v in elements):
        return f'{spec.name} must be one of {list(spec.choices)}, got {value!r}'
    if spec.unique and len(set(elements)) != len(elements):
        return f'{spec.name} has duplicates: {list(elements)}'
    return None


def _bound(spec: ParamSpec, bound: float) -> str:
    return str(int(bound)) if spec.type_name == 'int' else f'{bound:g}'


def _type_problem(spec: ParamSpec, value: Any) -> Optional[str]:
    # As strict as ROS: 10 is not a double, 1 is not a bool (rcl parses params files this way too).
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    element_ok = {'bool': lambda v: isinstance(v, bool), 'int': is_int,
                  'double': lambda v: isinstance(v, float), 'string': lambda v: isinstance(v, str)}
    base = spec.type_name[:-len('_array')] if spec.is_array else spec.type_name
    if spec.is_array:
        ok = isinstance(value, (list, tuple)) and all(element_ok[base](v) for v in value)
    else:
        ok = element_ok[base](value)
    if ok:
        return None
    hint = ' (write 10.0, not 10)' if base == 'double' else ''
    return f'{spec.name} must be a {spec.type_name}{hint}, got {type(value).__name__} {value!r}'


def _relation_problem(spec: ParamSpec, values: Mapping[str, Any], config: Any) -> Optional[str]:
    value = values.get(spec.name)
    if spec.required_when and values.get(spec.required_when[0]) == spec.required_when[1] and not value:
        return f'{spec.name} must be set with {spec.required_when[0]}: {spec.required_when[1]} ({spec.description})'
    if spec.same_length_as and not is_unset(value):
        other = effective(values, spec.same_length_as, config)
        if not is_unset(other) and len(other) != len(value):
            return f'{spec.name} has {len(value)} entries for {len(other)} {spec.same_length_as}'
    if spec.at_most and not is_unset(value):
        upper = values.get(spec.at_most)
        if not is_unset(upper) and len(upper) == len(value) and any(lo > hi for lo, hi in zip(value, upper)):
            return f'{spec.name} must not exceed {spec.at_most}'
    if config is None:
        return None
    value = effective(values, spec.name, config)
    if spec.model_length and not is_unset(value) and len(value) != getattr(config, spec.model_length):
        return (f'{spec.name} has {len(value)} entries; the checkpoint has {spec.model_length} '
                f'{getattr(config, spec.model_length)}')
    if spec.model_max and value is not None and value > getattr(config, spec.model_max):
        return f'{spec.name} {value} exceeds the checkpoint {spec.model_max} {getattr(config, spec.model_max)}'
    if spec.family_choices and value != AUTO:
        capabilities = type_capabilities(config.policy_type)
        choices = getattr(capabilities, spec.family_choices) if capabilities is not None else None
        if choices is not None and value not in choices:
            return (f'{spec.name} {value} is not a mode of the {config.policy_type} family (its modes: '
                    f'{", ".join(choices) or "none"}; {AUTO} picks {choices[0] if choices else "none"})')
    if spec.model_requires and value == spec.model_requires[0] and not getattr(config, spec.model_requires[1]) > 0:
        return (f'{spec.name} {value} needs a checkpoint with {spec.model_requires[1]} > 0, this one has '
                f'{getattr(config, spec.model_requires[1])}')
    if spec.model_members and not is_unset(value):
        known = tuple(getattr(config, spec.model_members))
        unknown = [v for v in value if v not in known]
        if unknown:
            return f'{spec.name} {unknown} are not in the checkpoint {spec.model_members} {list(known)}'
    return None


def problems(values: Mapping[str, Any], config: Any = None) -> List[str]:
    """Every reason to refuse ``values`` (one line each, naming the parameter); with ``config``, also
    the rules against the loaded checkpoint (joint counts, camera names, chunk size)."""
    found = []
    for spec in all_specs(values):
        problem = value_problem(spec, values.get(spec.name)) or _relation_problem(spec, values, config)
        if problem:
            found.append(problem)
    found += _outputs_problems(values) if not found else []
    relative = _relative_action_problem(values, config) if not found else None
    return found + ([relative] if relative else [])


def _outputs_problems(values: Mapping[str, Any]) -> List[str]:
    """Output names usable as parameter names; their joints a partition of joint_names; one topic each."""
    outputs = values.get('outputs')
    if is_unset(outputs):
        return []
    found = [problem for problem in (output_name_problem(name, SPECS) for name in outputs) if problem]
    if found:
        return found
    joints = list(values.get('joint_names') or [])
    owner: Dict[str, str] = {}
    for name in outputs:
        for joint in values[f'{name}.joints']:
            if joint not in joints:
                found.append(f'{name}.joints names {joint!r}, which is not in joint_names {joints}')
            elif joint in owner:
                found.append(f'joint {joint!r} is in both {owner[joint]}.joints and {name}.joints: each joint '
                             'belongs to one output')
            else:
                owner[joint] = name
    missing = [joint for joint in joints if joint not in owner]
    if missing and not found:
        found.append(f'joints {missing} of joint_names are in no output ({", ".join(outputs)}): every joint '
                     'belongs to one output')
    topics = [effective_output_topic(values, name) for name in outputs]
    repeated = sorted({topic for topic in topics if topics.count(topic) > 1})
    if repeated:
        found.append(f'outputs share the topic {repeated}: one controller topic per output')
    return found


def effective_output_topic(values: Mapping[str, Any], name: str) -> str:
    """``<name>.topic``, or the ros2_control default of its type when empty."""
    topic = values.get(f'{name}.topic') or ''
    if topic:
        return topic
    suffix = 'commands' if values.get(f'{name}.type') == 'float64_multi_array' else 'joint_trajectory'
    return f'{name}_controller/{suffix}'


def _relative_action_problem(values: Mapping[str, Any], config: Any) -> Optional[str]:
    """A relative-action checkpoint adds state[i] to action[i]: where it does, both lists must name one joint."""
    if config is None or not getattr(config, 'use_relative_actions', False):
        return None
    joints, state = effective(values, 'joint_names'), effective(values, 'state_joint_names')
    mask = relative_action_mask(config.action_dim, config.relative_exclude_joints, config.action_feature_names)
    differ = [i for i, relative in enumerate(mask) if relative and joints[i] != state[i]]
    if differ:
        return (f'state_joint_names must match joint_names at {differ}: the checkpoint predicts those actions '
                'relative to the state of the same joint (use_relative_actions), so the offset would be added to '
                f'another joint\'s position ({[state[i] for i in differ]} vs {[joints[i] for i in differ]})')
    return None


def validate(values: Mapping[str, Any], config: Any = None) -> None:
    """Raise ParameterError with the first problem; the node, the replay and the demo all call this."""
    found = problems(values, config)
    if found:
        raise ParameterError(found[0])


def resolve_values(overrides: Mapping[str, Any]) -> Dict[str, Any]:
    """Every parameter's value: the override where given, else the table default. Unknown names are refused."""
    specs = all_specs(overrides)
    unknown = sorted(set(overrides) - {spec.name for spec in specs} - set(ROS_PARAMETERS))
    if unknown:
        outputs = overrides.get('outputs')
        hint = (f' (outputs is {list(outputs)}: <name>.joints, <name>.type and <name>.topic exist for those names)'
                if any('.' in name for name in unknown) else '') if outputs else ''
        raise ParameterError(f'unknown parameter(s) {unknown}{hint}')
    return {spec.name: overrides.get(spec.name, spec.default) for spec in specs}


def flatten(block: Mapping[str, Any], prefix: str = '') -> Dict[str, Any]:
    """Nested ros__parameters mappings as rcl reads them: ``arm: {joints: [...]}`` is ``arm.joints``."""
    flat: Dict[str, Any] = {}
    for key, value in block.items():
        name = f'{prefix}{key}'
        if isinstance(value, dict):
            flat.update(flatten(value, name + '.'))
        else:
            flat[name] = value
    return flat


def read_params_document(path: Path) -> Dict[str, Any]:
    """The YAML mapping of a ROS 2 params file; ParameterError in one line naming the file otherwise (missing,
    not a file, unreadable, not YAML, not a mapping of node names to ros__parameters)."""
    try:
        document = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ParameterError(f'params file {path} does not exist') from None
    except IsADirectoryError:
        raise ParameterError(f'params file {path} is a folder, not a file') from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParameterError(f'params file {path} cannot be read: {exc}') from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, 'problem_mark', None)
        where = f'line {mark.line + 1}, column {mark.column + 1}: ' if mark is not None else ''
        problem = getattr(exc, 'problem', None) or str(exc).splitlines()[0]
        raise ParameterError(f'params file {path} is not valid YAML ({where}{problem})') from None
    if not isinstance(document, dict):
        raise ParameterError(f'params file {path} is not a mapping of node names to ros__parameters')
    return document


def ros_args_params_files(argv: Sequence[str]) -> List[str]:
    """The files that ``--params-file`` names in the ``--ros-args`` sections of a command line, as rcl reads them
    (a section ends at ``--`` or the next ``--ros-args``)."""
    files, in_ros_args = [], False
    for i, word in enumerate(argv):
        if word == '--ros-args':
            in_ros_args = True
        elif word == '--':
            in_ros_args = False
        elif in_ros_args and word == '--params-file' and i + 1 < len(argv):
            files.append(argv[i + 1])
    return files


def check_ros_args_params_files(argv: Sequence[str]) -> None:
    """Each ``--params-file`` of a command line exists and parses (``read_params_document``), checked before
    rclpy.init, whose own refusal is a traceback ("Couldn't parse params file")."""
    for path in ros_args_params_files(argv):
        read_params_document(Path(path))


def load_params_file(path: Path, node_name: str = NODE_NAME) -> Dict[str, Any]:
    """ros__parameters for ``node_name`` from a ROS 2 params YAML (wildcard sections first)."""
    document = read_params_document(path)
    merged: Dict[str, Any] = {}
    for section in ('/**', f'/**/{node_name}', node_name, f'/{node_name}'):
        block = document.get(section)
        if isinstance(block, dict):
            merged.update(flatten(block.get('ros__parameters') or {}))
    return merged


# ---- generated documentation ------------------------------------------------------------------------

def _format_default(spec: ParamSpec) -> str:
    if spec.default is None:
        return '(unset)'
    if isinstance(spec.default, str):
        return f'`"{spec.default}"`' if spec.default else '`""`'
    return f'`{spec.default}`'


def markdown_table() -> str:
    """The markdown table of every parameter (docs/parameters.md), generated from PARAMETERS."""
    lines = ['| parameter | type | default | live | range / choices | description |',
             '|---|---|---|---|---|---|']
    for spec in PARAMETERS + output_specs([OUTPUT_PLACEHOLDER]):
        if spec.choices:
            bounds = ', '.join(spec.choices)
        elif spec.min_value is not None:
            bounds = f'{_bound(spec, spec.min_value)} .. {_bound(spec, spec.max_value)}'
        else:
            bounds = ''
        lines.append(f'| `{spec.name}` | {spec.type_name} | {_format_default(spec)} | '
                     f'{"yes" if spec.live else "restart"} | {bounds} | {spec.description} |')
    return '\n'.join(lines)


TOPICS: Tuple[Tuple[str, str, str, str], ...] = (
    # (direction, topic (parameter that sets it), type, QoS); relative names resolve in the node's namespace
    ('in', '`cameras/<name>/image_raw` per camera (`camera_topics`)', 'sensor_msgs/Image or CompressedImage '
     '(`camera_types`)', 'sensor data: best effort, keep last 5'),
    ('in', '`instruction` (`instruction_topic`)', 'std_msgs/String', 'reliable, depth 1, '
     'durability `instruction_durability`'),
    ('in', '`joint_states` (`joint_states_topic`)', 'sensor_msgs/JointState', 'sensor data: best effort'),
    ('in', '`enable` (`enable_topic`)', 'std_msgs/Bool (deadman, with `require_enable`)', 'reliable, depth 10'),
    ('in', '`estop` (`estop_topic`)', 'std_msgs/Bool (`true` latches a hold)', 'reliable, depth 10'),
    ('in', '`/clock` (with `use_sim_time`)', 'rosgraph_msgs/Clock', 'ROS default'),
    ('out', f'`{DEFAULT_TRAJECTORY_TOPIC}` (`trajectory_topic`)', 'trajectory_msgs/JointTrajectory',
     'reliable, depth 10 (lifecycle publisher: only while active)'),
    ('out', 'with `outputs`, instead: `<name>.topic` per output (default `<name>_controller/joint_trajectory` '
     'or `<name>_controller/commands`)', 'trajectory_msgs/JointTrajectory or std_msgs/Float64MultiArray '
     '(`<name>.type`)', 'reliable, depth 10 (lifecycle publishers: only while active)'),
    ('out', '`/diagnostics` (status name `<node>: policy`, e.g. `/arm/vla_policy: policy`)',
     'diagnostic_msgs/DiagnosticArray', 'reliable, depth 10, every `diagnostics_period_sec`'),
    ('srv', '`~/change_state`, `~/get_state`, ... (`/vla_policy/...` in the root namespace)', 'lifecycle_msgs',
     'lifecycle services'),
    ('srv', '`~/reset_estop`', 'std_srvs/Trigger', 'release a latched e-stop (input must be false)'),
)


def topics_table() -> str:
    lines = ['| | topic | type | QoS |', '|---|---|---|---|']
    lines += [f'| {direction} | {topic} | {msg_type} | {qos} |' for direction, topic, msg_type, qos in TOPICS]
    return '\n'.join(lines)


def yaml_document(section: str = f'/**/{NODE_NAME}') -> List[str]:
    """Lines of a params file documenting every parameter (commented where unset)."""
    lines = ['# Every parameter of vla_policy_node with its default. Generated by',
             '#   python -m vla_policy_node.params --yaml > config/vla_policy.yaml',
             '# It runs as is (`vla_policy_node --ros-args --params-file config/vla_policy.yaml`) with the',
             f'# embedded {BUILTIN_DEMO} checkpoint (a tiny pi0 trained on the sample bag only); for a robot set',
             '# checkpoint_path and joint_names.',
             '# "FIRST RUN ON A REAL ARM" comments give safe starting values for the safety parameters',
             '# (docs/safety.md "First run on a real arm"); the values set here are the defaults, which limit',
             '# nothing.',
             f'# "{section}" matches the node in any namespace.',
             f'{section}:', '  ros__parameters:']
    for spec in PARAMETERS:
        lines.append(f'    # {spec.description}' + (' (restart to change)' if spec.read_only else ''))
        if spec.name in FIRST_RUN:
            lines.append(f'    # FIRST RUN ON A REAL ARM: {FIRST_RUN[spec.name]}')
        value = spec.default if spec.shipped is None else spec.shipped
        if value is None:
            lines.append(f'    # {spec.name}: []')
        else:
            lines.append(f'    {spec.name}: {_yaml_value(value)}')
        if spec.name == 'outputs':
            lines += _outputs_example()
    return lines


def _outputs_example() -> List[str]:
    """Commented sub-parameters under `outputs` (docs/outputs.md has complete examples)."""
    lines = ['    # Per output name, e.g. outputs: [arm, gripper] (ros2_control style, nested or `arm.joints: [...]`):']
    for field in OUTPUT_FIELDS:
        value = _yaml_value(field.default) if field.default is not None else '[]'
        choices = f'   # {" or ".join(field.choices)}' if field.choices else ''
        lines.append(f'    #   arm.{field.name}: {value}{choices}')
    return lines


def _yaml_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return '[' + ', '.join(_yaml_value(v) for v in value) + ']'
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


DOCS_PAGE = Path('docs') / 'parameters.md'


def update_tables(path: Path) -> None:
    """Rewrite the parameter and topics tables of a markdown page in place (each table ends at its first blank
    line); the page must hold both, as docs/parameters.md does."""
    text = Path(path).read_text()
    for table in (markdown_table(), topics_table()):
        header = table.split('\n', 1)[0]
        start = text.find(header + '\n')
        if start < 0:
            raise SystemExit(f'{path} has no table starting with {header!r}: the generated tables live in '
                             f'{DOCS_PAGE}')
        end = text.find('\n\n', start)
        text = text[:start] + table + (text[end:] if end >= 0 else '\n')
    Path(path).write_text(text)


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description='Print the parameter table (markdown) or a documented params file.')
    parser.add_argument('--yaml', action='store_true', help='print a params YAML with every default')
    parser.add_argument('--topics', action='store_true', help='print the topics table (markdown)')
    parser.add_argument('--docs', type=Path, metavar='PAGE',
                        help=f'rewrite both tables of this markdown page in place ({DOCS_PAGE})')
    args = parser.parse_args(argv)
    if args.docs:
        update_tables(args.docs)
    elif args.yaml:
        print('\n'.join(yaml_document()))
    else:
        print(topics_table() if args.topics else markdown_table())
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
