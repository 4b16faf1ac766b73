"""Parameter values -> a loaded backend and what each tick needs: one configure path for node and replay.

    values --validate--> load backend --validate against its config--> input layout --> tick settings
           --> warm-up

The backend (the backend seam, docs/architecture.md) is what the registry in backends.py builds for the
``backend`` parameter: a PolicyRuntime (``local``, ``load_local`` here) or a remote client (``remote``,
remote_settings.py); neither this module nor the tick tells them apart.

The live node reads values from its ROS parameters, the replay tool from the
same params YAML file; both call ``configure``, so a params file means the
same thing on the robot and in a replay, checked in the same order.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Tuple

from .backends import load_backend
from .observation import InputKind, InputLayout, InputTopic, TimingLimits
from .outputs import Output, build_outputs
from .params import FAMILY_OPTIONS, effective, effective_output_topic, validate
from .policy.builtin import BUILTIN_DEMO, BUILTIN_TINY, checkpoint_folder
from .policy.family import PolicyLevelConfig
from .policy.rtc import RTCSettings
from .runtime import PolicyRuntime, set_cpu_threads
from .safety import SafetySettings
from .tick import TickSettings


@dataclass
class Configured:
    """What configure leaves behind: the backend (``runtime``: a PolicyRuntime or a RemoteBackend), the fixed
    input layout, and the tick settings at that moment."""

    runtime: Any
    layout: InputLayout
    settings: TickSettings
    outputs: Tuple[Output, ...] = ()    # the controllers the plan is split between (one without `outputs`)


def absolute_topic(name: str, namespace: str = '/') -> str:
    """A topic name resolved without remapping: relative names in ``namespace``. The replay's view (a bag
    records absolute names and the replay has no node namespace, so the root); the node resolves with
    rclpy's ``resolve_topic_name``, which also applies remappings and ``~``."""
    if name.startswith('/'):
        return name
    return namespace.rstrip('/') + '/' + name


def default_camera_topic(name: str, compressed: bool = False) -> str:
    """Relative, so it follows the node's namespace."""
    return f'cameras/{name}/image_raw' + ('/compressed' if compressed else '')


def input_layout(values: Mapping[str, Any], config: PolicyLevelConfig,
                 resolve: Callable[[str], str] = absolute_topic) -> InputLayout:
    """Every input topic, resolved (the name on the wire, as logs and skip reasons give it), and the field it
    fills, in camera order (values already validated against config)."""
    names = list(effective(values, 'camera_names', config))
    kinds = list(values.get('camera_types') or ['raw'] * len(names))
    topics = list(values.get('camera_topics') or
                  [default_camera_topic(name, kind == 'compressed') for name, kind in zip(names, kinds)])
    cameras = tuple(InputTopic(resolve(topic), InputKind.CAMERA, camera=name, compressed=kind == 'compressed')
                    for name, topic, kind in zip(names, topics, kinds))
    return InputLayout(cameras=cameras,
                       joint_states=InputTopic(resolve(values['joint_states_topic']), InputKind.JOINT_STATE),
                       instruction=InputTopic(resolve(values['instruction_topic']), InputKind.INSTRUCTION),
                       state_joint_names=tuple(effective(values, 'state_joint_names')),
                       operator=(InputTopic(resolve(values['enable_topic']), InputKind.ENABLE),
                                 InputTopic(resolve(values['estop_topic']), InputKind.ESTOP)))


def tick_settings(values: Mapping[str, Any], layout: InputLayout) -> TickSettings:
    """The live parameter values one tick runs with (``use_sim_time``, ROS's own parameter, when among them)."""
    limits = TimingLimits(max_image_age_sec=values['max_image_age_sec'],
                          max_camera_skew_sec=values['max_camera_skew_sec'],
                          max_joint_state_age_sec=values['max_joint_state_age_sec'],
                          default_instruction=values['instruction'], camera_clock=values['camera_clock'],
                          joint_state_clock=values['joint_state_clock'],
                          sim_time=bool(values.get('use_sim_time', False)))
    return TickSettings(layout=layout, limits=limits, joint_names=tuple(values['joint_names']),
                        action_period_sec=values['action_period_sec'], execute_steps=values['execute_steps'],
                        stamp_mode=values['stamp_mode'],
                        lower_limits=tuple(values['joint_lower_limits'] or ()),
                        upper_limits=tuple(values['joint_upper_limits'] or ()),
                        num_steps=values['num_steps'], seed=None if values['seed'] < 0 else values['seed'],
                        cache_enabled=values['cache_enabled'],
                        max_instruction_length=values['max_instruction_length'],
                        max_image_pixels=values['max_image_pixels'],
                        rtc=rtc_settings(values), delay_mode=values['inference_delay_mode'],
                        delay_window=values['inference_delay_window'], delay_steps=values['inference_delay_steps'],
                        safety=safety_settings(values), repeated_state_tolerance=values['repeated_state_tolerance'])


def safety_settings(values: Mapping[str, Any]) -> SafetySettings:
    return SafetySettings(on_fault=values['on_fault'], fault_hold_after_sec=values['fault_hold_after_sec'],
                          max_position_step=tuple(values['max_position_step'] or ()),
                          max_velocity=tuple(values['max_velocity'] or ()), limit_mode=values['limit_mode'],
                          require_enable=values['require_enable'], enable_timeout_sec=values['enable_timeout_sec'],
                          ramp_in_sec=values['ramp_in_sec'], hold_time_sec=values['action_period_sec'])


def rtc_settings(values: Mapping[str, Any]) -> Optional[RTCSettings]:
    """Real-time chunking as the parameters ask for it; None with chunking independent."""
    if values['chunking'] != 'rtc':
        return None
    return RTCSettings(mode=values['rtc_mode'], schedule=values['rtc_schedule'],
                       max_guidance_weight=values['rtc_max_guidance_weight'],
                       execution_horizon=values['rtc_execution_horizon'])


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: taskset, cgroup cpusets), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_threads(setting: int, cpus: Optional[int] = None) -> int:
    """torch's CPU threads for the cpu_threads parameter: 0 auto, -1 torch's default (returned as 0), N.

    auto: half the usable CPUs and at most all but two, at least one. The other CPUs are for the
    executor (subscriptions, timers), the tick thread, the camera drivers and a bag player: torch's
    default of one spinning OpenMP thread per core made the tiny denoise 11x slower on 2 shared cores.
    """
    if setting > 0:
        return int(setting)
    if setting < 0:
        return 0
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, min(cpus // 2, cpus - 2))


def load_runtime(values: Mapping[str, Any]) -> PolicyRuntime:
    """The runtime a set of parameter values describes (checkpoint, device, dtype, cache, threads)."""
    set_cpu_threads(cpu_threads(values['cpu_threads']))
    return PolicyRuntime.from_pretrained(checkpoint_folder(values['checkpoint_path']), device=values['device'],
                                         dtype=values['dtype'],
                                         tokenizer_path=values['tokenizer_path'] or None,
                                         cache_max_bytes=values['cache_max_bytes'],
                                         cache_max_entries=values['cache_max_entries'],
                                         num_steps=values['num_steps'], cuda_graphs=values['cuda_graphs'],
                                         quantization=values['quantization'],
                                         **{name: values[name] for name in FAMILY_OPTIONS})


def load_local(values: Mapping[str, Any], info: Callable[[str], None] = lambda message: None,
               warn: Optional[Callable[[str], None]] = None) -> PolicyRuntime:
    """``backend: local`` (the backend registry, backends.py): the checkpoint loaded here."""
    if values['checkpoint_path'] == BUILTIN_TINY and warn is not None:
        warn('checkpoint_path is builtin:tiny: a tiny pi0 with RANDOM weights; its actions are meaningless. '
             'Set checkpoint_path to a real lerobot pretrained_model folder.')
    if values['checkpoint_path'] == BUILTIN_DEMO and warn is not None:
        warn('checkpoint_path is builtin:demo: a tiny pi0 trained on the sample bag only; it knows that one '
             'recorded motion and nothing else. Set checkpoint_path to a real lerobot pretrained_model folder.')
    runtime = load_runtime(values)
    runtime.checkpoint_path = str(values['checkpoint_path'])
    return runtime


def configure(values: Mapping[str, Any], info: Optional[Callable[[str], None]] = None,
              warn: Optional[Callable[[str], None]] = None,
              resolve: Callable[[str], str] = absolute_topic) -> Configured:
    """Validate, load, validate against the checkpoint, lay out the inputs (topics resolved by ``resolve``),
    warm up.

    Raises ParameterError (a value), CheckpointError / ConfigError / TokenizerError
    (the checkpoint) or ValueError (device, dtype); nothing is left loaded (or connected) on failure.
    """
    info = info or (lambda message: None)
    validate(values)
    runtime = load_backend(values, info, warn)
    try:
        config = runtime.config
        validate(values, config)
        layout = input_layout(values, config, resolve)
        outputs = build_outputs(values, resolve, effective_output_topic)
        threads = cpu_threads(values['cpu_threads'])
        info(f'torch CPU threads: {threads or "torch default"} (cpu_threads {values["cpu_threads"]}, '
             f'{usable_cpus()} usable CPUs)')
        info(f'{runtime.summary()}; cameras {[camera.topic for camera in layout.cameras]}')
        # cuda_graphs auto / on always warm up: graphs are captured there (under 'on' a failure fails configure).
        warm = runtime.warmup() if values['warmup'] or values['cuda_graphs'] != 'off' else None
        if warm is not None:                     # None: the backend has nothing to warm (remote)
            info(f'warm-up chunk in {warm.total_ms:.1f} ms')
        if values.get('outputs'):
            info('outputs: ' + '; '.join(f'{output.name} -> {output.topic} ({output.kind}: {list(output.joints)})'
                                         for output in outputs))
        return Configured(runtime, layout, tick_settings(values, layout), outputs)
    except BaseException:
        runtime.close()
        raise
