"""/diagnostics: what the node knows each period, as one DiagnosticStatus with its level and wording."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.clock import Clock, ClockType
from rclpy.node import Node

from ..cache import CacheStats
from ..observation import InputBuffer
from ..runtime import PolicyRuntime
from ..tick import TickStatsSnapshot
from .messages import time_msg

INSTRUCTION_CHARS_SHOWN = 80            # enough to recognise a task, short enough for rqt_robot_monitor


def _values(pairs: Iterable[Tuple[str, object]]) -> list:
    return [KeyValue(key=key, value=(f'{value:.6g}' if isinstance(value, float) else str(value)))
            for key, value in pairs]


@dataclass
class PolicyReport:
    """What the node knows at one diagnostics period; ``diagnostics_msg`` decides level and wording."""

    name: str                          # the status name (the node's fully qualified name: /arm/vla_policy: policy)
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
    hold_pending: bool = False         # a hold is due and waits for a joint state to hold to
    cannot_hold_count: int = 0         # holds that found no joint state to hold to when they fell due
    waiting_for_clock: bool = False    # use_sim_time and no /clock yet: ROS time is 0, no tick runs

    def with_runtime(self, runtime: Optional[PolicyRuntime]) -> 'PolicyReport':
        """Add what drives the arm, as the backend describes itself (local: checkpoint_path, policy, device,
        dtype, weights revision; remote: URL without credentials, connected, latency, reconnects, errors by
        kind), and the cache figures of a local one. Unconfigured, only the backend's name is known."""
        if runtime is not None:
            described = runtime.describe()
            self.hardware_id = str(described.get('device') or described.get('remote_url') or 'none')
            self.info.update(described)
            cache = getattr(runtime, 'cache', None)
            self.cache = cache.stats() if cache is not None else None
        return self


def shortened(text: str, limit: int = INSTRUCTION_CHARS_SHOWN) -> str:
    return text if len(text) <= limit else text[:limit - 3] + '...'


class DiagnosticsPublisher:
    """/diagnostics every period on the steady clock, in every state: under use_sim_time ROS time stands
    still until /clock (and after a bag ends), exactly when an operator needs to read why nothing happens.

    The topic stays absolute (aggregators listen on /diagnostics); the status name is the node's fully
    qualified name, so two arms can be told apart.
    """

    def __init__(self, node: Node, period_sec: float, on_period: Callable[[], None]) -> None:
        self.name = f'{node.get_fully_qualified_name()}: policy'
        self._publisher = node.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self.timer = node.create_timer(period_sec, on_period, clock=Clock(clock_type=ClockType.STEADY_TIME))
        self._skips_at_last = 0

    def publish(self, now_ns: int, lifecycle: str, configure_error: str, stats: TickStatsSnapshot,
                buffer: InputBuffer, values: Mapping[str, Any], runtime: Optional[PolicyRuntime],
                supervisor: Any = None) -> None:
        """One status from what the node knows now (``supervisor``: once configured)."""
        new_skips = stats.faults_total - self._skips_at_last       # a repeated observation is no fault
        self._skips_at_last = stats.faults_total
        instruction = buffer.instruction()
        report = PolicyReport(name=self.name, lifecycle=lifecycle, configure_error=configure_error,
                              new_skips=new_skips, stats=stats, camera_ages=buffer.camera_ages(now_ns),
                              info={'dry_run': values['dry_run'], 'backend': values['backend'],
                                    'instruction': shortened(values['instruction'] if instruction is None
                                                             else instruction)},
                              waiting_for_clock=now_ns == 0).with_runtime(runtime)
        if supervisor is not None:
            report.supervisor, report.holds, report.interventions, report.dropped = supervisor.counters()
            report.hold_pending, report.cannot_hold_count = supervisor.hold_waiting()
        self._publisher.publish(diagnostics_msg(now_ns, report))


def _level_and_message(report: PolicyReport) -> Tuple[bytes, str]:
    if report.configure_error:
        return DiagnosticStatus.ERROR, f'unconfigured: {report.configure_error}'
    if report.supervisor == 'estop':
        return DiagnosticStatus.ERROR, f'{report.lifecycle}; e-stop latched (call ~/reset_estop once released)'
    if report.waiting_for_clock:
        return DiagnosticStatus.WARN, (f'{report.lifecycle}; waiting for /clock (use_sim_time is set): no tick '
                                       'runs until the first /clock message')
    if report.supervisor.startswith('held') and report.lifecycle == 'active':
        return DiagnosticStatus.WARN, f'{report.lifecycle}; {report.supervisor}'
    if report.new_skips:
        return DiagnosticStatus.WARN, (f'{report.lifecycle}; {report.new_skips} tick(s) skipped, '
                                       f'last: {report.stats.last_skip}')
    failed = int(report.info.get('graph_capture_failures', 0)) + int(report.info.get('prefix_capture_failures', 0))
    if failed:       # cuda_graphs auto: those shapes run eagerly (runtime/report.py figures say why)
        return DiagnosticStatus.WARN, (f'{report.lifecycle}; {failed} CUDA graph capture(s) failed, those shapes '
                                       'run eagerly (see eager_fallback_reasons)')
    return DiagnosticStatus.OK, report.lifecycle


def diagnostics_msg(stamp_ns: int, report: PolicyReport) -> DiagnosticArray:
    """One DiagnosticStatus with latency percentiles, cache figures, skips and camera ages."""
    stats = report.stats
    pairs = [('lifecycle_state', report.lifecycle), ('waiting_for_clock', report.waiting_for_clock)]
    pairs += list(report.info.items())
    if report.supervisor:
        pairs += [('supervisor_state', report.supervisor), ('trajectories_dropped_by_estop', report.dropped)]
        pairs += [(f'holds_{reason}', count) for reason, count in sorted(report.holds.items())]
        pairs += [('hold_pending', report.hold_pending), ('cannot_hold_count', report.cannot_hold_count)]
        pairs += [(f'intervention_{key.replace(":", "_")}', count)
                  for key, count in sorted(report.interventions.items())]
    pairs += [('ticks', stats.ticks), ('chunks_computed', stats.chunks), ('chunks_published', stats.published),
              ('holds_published', stats.holds_published),
              ('chunks_clipped', stats.clipped), ('ticks_skipped', stats.skipped_total)]
    pairs += [(f'skipped_{reason}', count) for reason, count in sorted(stats.skipped.items())]
    if stats.last_skip is not None:
        pairs.append(('last_skip', f'[{stats.last_skip.reason}] {stats.last_skip}'))
    if stats.camera_clock is not None:
        pairs += [('camera_clock', stats.camera_clock.name), ('camera_clock_reason', stats.camera_clock.reason)]
    if stats.joint_state_clock is not None:
        pairs += [('joint_state_clock', stats.joint_state_clock.name),
                  ('joint_state_clock_reason', stats.joint_state_clock.reason)]
    pairs += [('clock_jumps', sum(stats.clock_jumps.values())), ('clock_outliers', sum(stats.clock_outliers.values()))]
    pairs += [(f'clock_jumps_{name}', count) for name, count in sorted(stats.clock_jumps.items())]
    pairs += [(f'clock_outliers_{name}', count) for name, count in sorted(stats.clock_outliers.items())]
    if stats.timings_clock:
        pairs.append(('latency_clock', stats.timings_clock))
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
