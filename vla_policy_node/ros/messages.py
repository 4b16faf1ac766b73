"""Conversions to and from rclpy: plans and statistics -> JointTrajectory and DiagnosticArray; input QoS."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Tuple

from builtin_interfaces.msg import Duration, Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Bool, String
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from ..cache import CacheStats
from ..observation import InputKind, InputTopic
from ..runtime import PolicyRuntime
from ..tick import TickStatsSnapshot
from ..trajectory import TrajectoryPlan

NS_PER_SEC = 1_000_000_000
MESSAGE_CLASSES = {'sensor_msgs/msg/Image': Image, 'sensor_msgs/msg/CompressedImage': CompressedImage,
                   'sensor_msgs/msg/JointState': JointState, 'std_msgs/msg/String': String, 'std_msgs/msg/Bool': Bool}


def input_msg_class(entry: InputTopic) -> type:
    """The rclpy message class of an input topic."""
    return MESSAGE_CLASSES[entry.msg_type]


def input_qos(entry: InputTopic, instruction_durability: str) -> QoSProfile:
    """Sensor data (best effort) for cameras and joint states; the operator's enable and e-stop reliable (an
    e-stop must not be dropped); the instruction reliable, with the durability asked."""
    if entry.kind in (InputKind.ENABLE, InputKind.ESTOP):
        return QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    if entry.kind is not InputKind.INSTRUCTION:
        return qos_profile_sensor_data
    durability = (DurabilityPolicy.TRANSIENT_LOCAL if instruction_durability == 'transient_local'
                  else DurabilityPolicy.VOLATILE)
    return QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=durability)


def time_msg(stamp_ns: int) -> Time:
    return Time(sec=int(stamp_ns // NS_PER_SEC), nanosec=int(stamp_ns % NS_PER_SEC))


def duration_msg(seconds: float) -> Duration:
    total_ns = int(round(seconds * NS_PER_SEC))
    return Duration(sec=total_ns // NS_PER_SEC, nanosec=total_ns % NS_PER_SEC)


def trajectory_msg(plan: TrajectoryPlan, frame_id: str = '') -> JointTrajectory:
    msg = JointTrajectory()
    msg.header.stamp = time_msg(plan.stamp_ns)
    msg.header.frame_id = frame_id
    msg.joint_names = list(plan.joint_names)
    msg.points = [JointTrajectoryPoint(positions=[float(v) for v in positions],
                                       velocities=[float(v) for v in velocities],
                                       time_from_start=duration_msg(float(t)))
                  for t, positions, velocities in zip(plan.times_sec, plan.positions, plan.velocities)]
    return msg


def _values(pairs: Iterable[Tuple[str, object]]) -> list:
    return [KeyValue(key=key, value=(f'{value:.6g}' if isinstance(value, float) else str(value)))
            for key, value in pairs]


@dataclass
class PolicyReport:
    """What the node knows at one diagnostics period; ``diagnostics_msg`` decides level and wording."""

    name: str                          # the status name (the node's name)
    lifecycle: str                     # unconfigured | inactive | active
    configure_error: str               # why the last configure failed ('' when it did not)
    new_skips: int                     # ticks skipped since the last report
    stats: TickStatsSnapshot
    info: Dict[str, object] = field(default_factory=dict)     # policy, device, dtype, revision ...
    camera_ages: Dict[str, float] = field(default_factory=dict)
    hardware_id: str = 'none'          # the device, once configured
    cache: Optional[CacheStats] = None
    supervisor: str = ''               # 'active', 'held: <reason>' or 'estop' (configured nodes)
    holds: Dict[str, int] = field(default_factory=dict)           # reason -> entries into the held state
    interventions: Dict[str, int] = field(default_factory=dict)   # '<kind>:<joint>' -> points changed
    dropped: int = 0                   # policy trajectories an e-stop overtook before publication

    def with_runtime(self, runtime: Optional[PolicyRuntime]) -> 'PolicyReport':
        """Add what drives the arm (policy, device, dtype, weights revision) and the cache figures."""
        if runtime is not None:
            self.hardware_id = str(runtime.device)
            self.info.update(policy_type=runtime.config.policy_type, device=str(runtime.device),
                             dtype=str(runtime.dtype).replace('torch.', ''), model_revision=runtime.model_revision,
                             prefix_entry_bytes=runtime.prefix_bytes())
            self.cache = runtime.cache.stats()
        return self


def _level_and_message(report: PolicyReport) -> Tuple[bytes, str]:
    if report.configure_error:
        return DiagnosticStatus.ERROR, f'unconfigured: {report.configure_error}'
    if report.supervisor == 'estop':
        return DiagnosticStatus.ERROR, f'{report.lifecycle}; e-stop latched (call ~/reset_estop once released)'
    if report.supervisor.startswith('held') and report.lifecycle == 'active':
        return DiagnosticStatus.WARN, f'{report.lifecycle}; {report.supervisor}'
    if report.new_skips:
        return DiagnosticStatus.WARN, (f'{report.lifecycle}; {report.new_skips} tick(s) skipped, '
                                       f'last: {report.stats.last_skip}')
    return DiagnosticStatus.OK, report.lifecycle


def diagnostics_msg(stamp_ns: int, report: PolicyReport) -> DiagnosticArray:
    """One DiagnosticStatus with latency percentiles, cache figures, skips and camera ages."""
    stats = report.stats
    pairs = [('lifecycle_state', report.lifecycle)] + list(report.info.items())
    if report.supervisor:
        pairs += [('supervisor_state', report.supervisor), ('trajectories_dropped_by_estop', report.dropped)]
        pairs += [(f'holds_{reason}', count) for reason, count in sorted(report.holds.items())]
        pairs += [(f'intervention_{key.replace(":", "_")}', count)
                  for key, count in sorted(report.interventions.items())]
    pairs += [('ticks', stats.ticks), ('chunks_computed', stats.chunks), ('chunks_published', stats.published),
              ('chunks_clipped', stats.clipped), ('ticks_skipped', stats.skipped_total)]
    pairs += [(f'skipped_{reason}', count) for reason, count in sorted(stats.skipped.items())]
    if stats.last_skip is not None:
        pairs.append(('last_skip', f'[{stats.last_skip.reason}] {stats.last_skip}'))
    for stage, summary in stats.latency.items():
        pairs += [(f'latency_{stage}_p50_ms', summary['p50']), (f'latency_{stage}_p95_ms', summary['p95'])]
    pairs += [('chunks_continued', stats.continued), ('inference_delay_actions', stats.delay)]
    for figure, summary in stats.handover.items():
        pairs += [(f'handover_{figure}_p50', summary['p50']), (f'handover_{figure}_p95', summary['p95'])]
    cache = report.cache
    if cache is not None:
        pairs += [('cache_hits', cache.hits), ('cache_misses', cache.misses), ('cache_hit_rate', cache.hit_rate),
                  ('cache_entries', cache.entries), ('cache_bytes', cache.bytes),
                  ('cache_max_bytes', cache.max_bytes), ('cache_evictions', cache.evictions),
                  ('cache_rejected_oversize', cache.rejected_oversize)]
    pairs += [(f'camera_age_{camera}_sec', age) for camera, age in sorted(report.camera_ages.items())]
    level, message = _level_and_message(report)
    status = DiagnosticStatus(level=level, name=report.name, message=message, hardware_id=report.hardware_id,
                              values=_values(pairs))
    array = DiagnosticArray()
    array.header.stamp = time_msg(stamp_ns)
    array.status = [status]
    return array
