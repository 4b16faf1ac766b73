"""Plans and statistics -> rclpy messages (JointTrajectory, DiagnosticArray)."""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

from builtin_interfaces.msg import Duration, Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from ..cache import CacheStats
from ..tick import TickStatsSnapshot
from ..trajectory import TrajectoryPlan

NS_PER_SEC = 1_000_000_000


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
    return [KeyValue(key=key, value=(f'{value:.3f}' if isinstance(value, float) else str(value)))
            for key, value in pairs]


def diagnostics_msg(stamp_ns: int, name: str, hardware_id: str, level: bytes, message: str,
                    info: Dict[str, object], stats: TickStatsSnapshot, cache: Optional[CacheStats],
                    camera_ages: Dict[str, float]) -> DiagnosticArray:
    """One DiagnosticStatus with latency percentiles, cache figures, skips and camera ages."""
    pairs = list(info.items())
    pairs += [('ticks', stats.ticks), ('chunks_computed', stats.chunks), ('chunks_published', stats.published),
              ('chunks_clipped', stats.clipped), ('ticks_skipped', stats.skipped_total)]
    pairs += [(f'skipped_{reason}', count) for reason, count in sorted(stats.skipped.items())]
    if stats.last_skip is not None:
        pairs.append(('last_skip', f'[{stats.last_skip.reason}] {stats.last_skip}'))
    for stage, summary in stats.latency.items():
        pairs += [(f'latency_{stage}_p50_ms', summary['p50']), (f'latency_{stage}_p95_ms', summary['p95'])]
    if cache is not None:
        pairs += [('cache_hits', cache.hits), ('cache_misses', cache.misses), ('cache_hit_rate', cache.hit_rate),
                  ('cache_entries', cache.entries), ('cache_bytes', cache.bytes),
                  ('cache_max_bytes', cache.max_bytes), ('cache_evictions', cache.evictions),
                  ('cache_rejected_oversize', cache.rejected_oversize)]
    pairs += [(f'camera_age_{camera}_sec', age) for camera, age in sorted(camera_ages.items())]
    status = DiagnosticStatus(level=level, name=name, message=message, hardware_id=hardware_id,
                              values=_values(pairs))
    array = DiagnosticArray()
    array.header.stamp = time_msg(stamp_ns)
    array.status = [status]
    return array
