"""Replay report: summary.json and the plots (chunks.png, latency.png, handover.png)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..handover import HandoverMetrics
from ..observation import SkipReason
from ..runtime import PolicyRuntime
from ..runtime.chunk import STAGES, stages_total_ms
from ..safety import SafetySupervisor
from ..tick import HANDOVER_FIGURES, TickStats

NS_PER_SEC = 1_000_000_000


@dataclass
class TickRecord:
    """What one control tick did, for the report."""

    time_ns: int
    skipped: Optional[str] = None
    fault: str = ''                              # a skipped tick's '[reason] on topic: what is wrong'
    cache_hit: Optional[bool] = None
    timings_ms: Dict[str, float] = field(default_factory=dict)
    plan_start_ns: int = 0
    plan_times_sec: Optional[np.ndarray] = None
    plan_positions: Optional[np.ndarray] = None
    continued: bool = False                      # steered by the previous chunk (rtc)
    handover: Optional[HandoverMetrics] = None   # this trajectory taking over from the previous one
    supervisor: str = 'active'                   # the safety supervisor's state after the tick
    hold: bool = False                           # a hold trajectory went out at this tick
    publish_ns: int = 0                          # when its trajectory went out (takes over the previous one)


@dataclass
class ReplayResult:
    output: Path
    records: List[TickRecord]
    joint_names: Sequence[str]
    recorded_times_ns: np.ndarray          # joint-state times
    recorded_positions: np.ndarray         # [T, J] in joint_names order (NaN where absent)
    command_times_ns: np.ndarray
    command_positions: np.ndarray
    summary: Dict[str, Any]
    # (first, last) ns of each stretch the command covers (several episodes of a dataset); None: one stretch
    command_spans: Optional[List[Tuple[int, int]]] = None
    # The controllers the action vector is split over (outputs.Output); chunks.png marks which joint goes where
    outputs: Sequence[Any] = ()


def command_error(result: ReplayResult) -> Optional[Dict[str, Dict[str, float]]]:
    """Per joint: predicted positions against the recorded command at the same instants.

    Each published point i of a chunk is due at plan_start + time_from_start[i];
    the recorded command is linearly interpolated there. Points outside the
    recorded span are left out, and so are those already due when the chunk was
    published (a stamped chunk carries them; the controller skips them).
    """
    if result.command_times_ns.size < 2:
        return None
    times = result.command_times_ns.astype(np.float64)
    errors = []
    for record in result.records:
        if record.plan_positions is None:
            continue
        due = record.plan_start_ns + record.plan_times_sec * NS_PER_SEC
        spans = result.command_spans or [(times[0], times[-1])]
        inside = np.zeros(due.shape, dtype=bool)
        for first, last in spans:
            inside |= (due >= first) & (due <= last)
        if record.publish_ns:
            inside &= due > record.publish_ns
        if not inside.any():
            continue
        recorded = np.stack([np.interp(due[inside], times, result.command_positions[:, j])
                             for j in range(len(result.joint_names))], axis=1)
        errors.append(record.plan_positions[inside] - recorded)
    if not errors:
        return None
    stacked = np.concatenate(errors)
    return {name: {'mae': float(np.nanmean(np.abs(stacked[:, j]))),
                   'rmse': float(np.sqrt(np.nanmean(stacked[:, j] ** 2))), 'points': int(stacked.shape[0])}
            for j, name in enumerate(result.joint_names)}


def computed(records: Sequence[TickRecord]) -> List[TickRecord]:
    """The ticks that ran an inference (a chunk, hit or miss)."""
    return [r for r in records if r.cache_hit is not None]


def latency_summary(records: Sequence[TickRecord]) -> Dict[str, Dict[str, float]]:
    """p50, p95 and max in ms of every stage and of the total (ActionChunk.total_ms: the stages, not a remote
    server's own figure) over every tick that ran an inference: summary.json's ``latency_ms``, the replay's
    printed line and latency.png's lines are this one computation."""
    ticks = computed(records)
    series = {stage: [r.timings_ms.get(stage, 0.0) for r in ticks] for stage in STAGES}
    series['total'] = [stages_total_ms(r.timings_ms) for r in ticks]
    return {name: {'p50': float(np.percentile(values, 50)), 'p95': float(np.percentile(values, 95)),
                   'max': float(np.max(values))}
            for name, values in series.items() if values}


def handover_summary(records: List[TickRecord]) -> Dict[str, Any]:
    """Hand-over jump and overlap disagreement over the whole run (joint units): p50, p95, max. A tick that
    repeats the executing chunk's observation publishes nothing, so it is no hand-over (counted apart)."""
    taken = [r.handover for r in records if r.handover is not None]
    summary: Dict[str, Any] = {'count': len(taken),
                               'repeated_observations': sum(1 for r in records if r.skipped == 'repeated_observation')}
    for figure in HANDOVER_FIGURES:
        values = np.array([getattr(h, figure) for h in taken], dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size:
            summary[figure] = {'p50': float(np.percentile(values, 50)), 'p95': float(np.percentile(values, 95)),
                               'max': float(values.max())}
    return summary


def camera_clock_summary(stats: TickStats, values: Mapping[str, Any]) -> Dict[str, Any]:
    """The camera_clock parameter, the clock the observations were timed in (counts) and why (the latest), and
    per input the stamp clock jumps and the messages set aside as outliers (stamp_clock.py)."""
    latest = stats.camera_clock
    return {'setting': values.get('camera_clock', 'auto'), 'observations': dict(sorted(stats.camera_clocks.items())),
            'used': latest.name if latest else None, 'reason': latest.reason if latest else None,
            'jumps': dict(sorted(stats.clock_jumps.items())), 'outliers': dict(sorted(stats.clock_outliers.items()))}


def safety_summary(supervisor: SafetySupervisor, records: List[TickRecord]) -> Dict[str, Any]:
    """Holds per reason, interventions per kind (and per kind and joint), ticks spent held."""
    state, holds, interventions, dropped = supervisor.counters()
    _, cannot_hold = supervisor.hold_waiting()
    per_kind: Dict[str, int] = {}
    for key, count in interventions.items():
        kind = key.split(':', 1)[0]
        per_kind[kind] = per_kind.get(kind, 0) + count
    return {'final_state': state, 'holds': dict(sorted(holds.items())), 'cannot_hold_count': cannot_hold,
            'hold_trajectories': sum(1 for r in records if r.hold),
            'ticks_held': sum(1 for r in records if r.supervisor != 'active'),
            'interventions': dict(sorted(per_kind.items())),
            'interventions_by_joint': dict(sorted(interventions.items())),
            'dropped_by_estop': dropped}


FAULT_TEXT_CHARS = 400      # a server's error text is the client's to bound


def first_faults(records: List[TickRecord]) -> Dict[str, str]:
    """Skip reason -> its first tick's fault line (the node logs these; a replay keeps one per reason)."""
    faults: Dict[str, str] = {}
    for record in records:
        if record.skipped and record.skipped not in faults:
            faults[record.skipped] = record.fault[:FAULT_TEXT_CHARS]
    return dict(sorted(faults.items()))


def summarize(result: ReplayResult, stats: TickStats, runtime: PolicyRuntime, bag: Path,
              values: Mapping[str, Any], command_topic: Optional[str], latency_ms: float = 0.0,
              supervisor: Optional[SafetySupervisor] = None, source: Optional[Mapping[str, Any]] = None
              ) -> Dict[str, Any]:
    """summary.json; ``source`` adds what was replayed when it is not a bag alone (a dataset's episodes)."""
    cache = runtime.cache.stats() if getattr(runtime, 'cache', None) is not None else None   # local backends
    described = runtime.describe()
    skipped = dict(sorted(stats.skipped.items()))
    return {
        'bag': str(bag),
        'checkpoint': described.get('checkpoint_path'),       # None where nothing is loaded here (remote)
        'model_revision': described.get('model_revision'),
        'policy_type': described.get('policy_type'),
        'device': described.get('device'),
        'dtype': described.get('dtype'),
        'backend': described,
        'seed': values['seed'],
        'control_rate_hz': values['control_rate_hz'],
        'ticks': stats.ticks,
        'chunks': stats.chunks,
        'published': stats.published,
        'holds_published': stats.holds_published,
        'skipped_total': sum(skipped.values()),
        'skipped': skipped,
        'first_fault': first_faults(result.records),
        'clipped': stats.clipped,
        'cache': {'hits': stats.cache_hits, 'misses': stats.cache_misses,
                  'hit_rate': stats.cache_hits / stats.chunks if stats.chunks else 0.0,
                  'entries': cache.entries if cache else 0, 'bytes': cache.bytes if cache else 0,
                  'evictions': cache.evictions if cache else 0,
                  'entry_bytes': runtime.describe().get('cache_entry_bytes'),
                  'rejected_oversize': cache.rejected_oversize if cache else 0},
        'latency_ms': latency_summary(result.records),
        'latency_clock': stats.snapshot().timings_clock,   # 'cuda_events' (GPU-true) or 'host'
        'fast_path': runtime.fast_path_summary() if hasattr(runtime, 'fast_path_summary') else {},
        'simulated_latency_ms': latency_ms,
        'chunking': values['chunking'],
        'camera_clock': camera_clock_summary(stats, values),
        'chunks_continued': sum(1 for r in result.records if r.continued),
        'handover': handover_summary(result.records),
        'safety': safety_summary(supervisor or SafetySupervisor(), result.records),
        'command_topic': command_topic,
        'command_error': command_error(result),
        **dict(source or {}),
    }


# Full chunks drawn in chunks.png: about this many, evenly spaced, so each one can be followed.
FULL_CHUNKS_SHOWN = 6


def executed_parts(result: ReplayResult) -> List[tuple]:
    """Per published policy chunk: (due times [s, bag time], positions) of the points the controller executes,
    i.e. those due before the next trajectory (a chunk or a hold) takes over; the last one runs to its end."""
    takeovers = [r.publish_ns for r in result.records if r.plan_positions is not None or r.hold]
    parts = []
    for record in (r for r in result.records if r.plan_positions is not None):
        due_ns = record.plan_start_ns + record.plan_times_sec * NS_PER_SEC
        later = [t for t in takeovers if t > record.publish_ns]
        keep = due_ns <= later[0] if later else np.ones(due_ns.shape, dtype=bool)
        # The point the next trajectory takes over between is kept, so consecutive parts join up.
        cut = int(keep.sum())
        keep[:min(cut + 1, keep.size)] = True
        parts.append((due_ns[keep], record.plan_positions[keep]))
    return parts


def chunks_figure(result: ReplayResult):
    """Per joint: the recorded joints, what the controller executes (each chunk until the next takes over, as
    one line, hand-overs marked), every k-th chunk in full (faint), held spans shaded; the legend above."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    joints = len(result.joint_names)
    start = _start_ns(result)
    published = [r for r in result.records if r.plan_positions is not None]
    every = max(1, int(np.ceil(len(published) / FULL_CHUNKS_SHOWN)))
    parts = executed_parts(result)
    fig, axes = plt.subplots(joints, 1, figsize=(10, 1.8 * joints + 1.6), sharex=True, squeeze=False)
    for j, (axis, name) in enumerate(zip(axes[:, 0], result.joint_names)):
        _mark_output(axis, name, result.outputs)
        if result.recorded_times_ns.size:
            axis.plot((result.recorded_times_ns - start) / NS_PER_SEC, result.recorded_positions[:, j],
                      color='black', linewidth=1.2, label='recorded joint state')
        if result.command_times_ns.size:
            axis.plot((result.command_times_ns - start) / NS_PER_SEC, result.command_positions[:, j],
                      color='grey', linestyle='--', linewidth=1.0, label='recorded command')
        for k, record in enumerate(published[::every]):
            due = (record.plan_start_ns - start) / NS_PER_SEC + record.plan_times_sec
            axis.plot(due, record.plan_positions[:, j], color='tab:purple', alpha=0.45, linewidth=0.9,
                      label=(f'every {_ordinal(every)} chunk in full' if every > 1 else 'every chunk in full')
                      if k == 0 else None)
        if parts:
            # One line, as the controller is commanded: each chunk until the next takes over, the jump between.
            times = np.concatenate([(due_ns - start) / NS_PER_SEC for due_ns, _ in parts])
            axis.plot(times, np.concatenate([positions[:, j] for _, positions in parts]), color='tab:blue',
                      linewidth=1.4, label='executed: each chunk until the next takes over')
            axis.plot([(due_ns[0] - start) / NS_PER_SEC for due_ns, _ in parts[1:]],
                      [positions[0, j] for _, positions in parts[1:]], 'o', color='tab:blue', markersize=2.5,
                      label='hand-over (a new chunk starts)')
        for k, (begin, end) in enumerate(_held_spans(result, start)):
            axis.axvspan(begin, end, color='tab:red', alpha=0.15, label='held (safety)' if k == 0 else None)
        if not axis.get_ylabel():
            axis.set_ylabel(f'{name}\n[rad]')
    axes[-1, 0].set_xlabel(_time_label(result))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.suptitle('published action chunks vs recorded joints')
    height = fig.get_figheight()
    fig.legend(handles, labels, loc='upper center', ncol=3, fontsize='small', frameon=False,
               bbox_to_anchor=(0.5, 1.0 - 0.4 / height))
    fig.tight_layout(rect=(0, 0, 1, 1.0 - 0.7 / height))
    return fig


# Several outputs: each one's joints framed in its colour, its name on their axes, what it receives above its first.
OUTPUT_COLOURS = ('tab:cyan', 'tab:olive', 'tab:pink', 'tab:brown')
OUTPUT_RECEIVES = {'joint_trajectory': 'JointTrajectory, every point of each chunk',
                   'float64_multi_array': 'Float64MultiArray, the position due next at each tick'}


def _mark_output(axis, joint: str, outputs: Sequence[Any]) -> None:
    """Which controller ``joint`` goes to, where the action vector is split over several (``outputs``)."""
    named = [output for output in outputs if output.name]
    for index, output in enumerate(named):
        if joint not in output.joints:
            continue
        colour = OUTPUT_COLOURS[index % len(OUTPUT_COLOURS)]
        for spine in axis.spines.values():
            spine.set_edgecolor(colour)
            spine.set_linewidth(2.0)
        axis.set_ylabel(f'{output.name}: {joint}\n[rad]', color=colour)
        if joint == output.joints[0]:
            receives = OUTPUT_RECEIVES.get(output.kind, output.kind)
            axis.set_title(f'output {output.name} ({len(output.joints)} joint{"s" if len(output.joints) > 1 else ""})'
                           f' -> {output.topic}: {receives}', loc='left', fontsize='small', color=colour)


def _ordinal(number: int) -> str:
    suffix = 'th' if 10 <= number % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(number % 10, 'th')
    return f'{number}{suffix}'


def latency_figure(result: ReplayResult):
    """Compute time per tick (hits and misses marked) with its p50 and p95 as lines (latency_summary, as in
    summary.json); ticks without an inference at 0: a repeated observation (the executing chunk goes on) or
    the wait for /clock apart from the skips for a fault."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    start = _start_ns(result)
    fig, axis = plt.subplots(figsize=(10, 3.8))
    ticks = computed(result.records)
    for hit, color, label in ((False, 'tab:red', 'cache miss'), (True, 'tab:green', 'cache hit')):
        chosen = [r for r in ticks if r.cache_hit is hit]
        axis.scatter([(r.time_ns - start) / NS_PER_SEC for r in chosen],
                     [stages_total_ms(r.timings_ms) for r in chosen], s=14, color=color,
                     label=f'{label} ({len(chosen)})')
    no_inference = {
        SkipReason.REPEATED_OBSERVATION.value: ('|', 'tab:purple', 'repeated observation: the chunk goes on'),
        SkipReason.WAITING_FOR_CLOCK.value: ('|', 'grey', 'waiting for /clock')}
    faults = [r for r in result.records if r.skipped and r.skipped not in no_inference]
    for reason, (marker, color, label) in no_inference.items():
        chosen = [r for r in result.records if r.skipped == reason]
        if chosen:
            axis.scatter([(r.time_ns - start) / NS_PER_SEC for r in chosen], [0.0] * len(chosen), marker=marker,
                         s=120, linewidths=1.5, color=color, label=f'{label} ({len(chosen)}, no inference)',
                         clip_on=False)
    if faults:
        reasons = ', '.join(sorted({r.skipped for r in faults}))
        axis.scatter([(r.time_ns - start) / NS_PER_SEC for r in faults], [0.0] * len(faults), marker='x',
                     color='black', label=f'skipped for a fault: {reasons} ({len(faults)})', clip_on=False)
    total = latency_summary(result.records).get('total')
    if total:
        for quantile, style in (('p50', '-'), ('p95', '--')):
            axis.axhline(total[quantile], color='tab:blue', linestyle=style, linewidth=1.0,
                         label=f'{quantile} {total[quantile]:.1f} ms')
    axis.set_ylim(bottom=0)
    axis.set_xlabel(_time_label(result))
    axis.set_ylabel('latency per tick [ms]')
    axis.set_title(_latency_title(result))
    axis.legend(loc='upper left', bbox_to_anchor=(1.01, 1.0), fontsize='small', frameon=False)
    fig.tight_layout()
    return fig


def _held_spans(result: ReplayResult, start: int) -> List[tuple]:
    """[(begin_sec, end_sec)] of consecutive ticks the supervisor spent held or in e-stop."""
    spans, begin = [], None
    period = np.median(np.diff([r.time_ns for r in result.records])) if len(result.records) > 1 else 0
    for record in result.records:
        held = record.supervisor != 'active'
        if held and begin is None:
            begin = record.time_ns
        elif not held and begin is not None:
            spans.append(((begin - start) / NS_PER_SEC, (record.time_ns - start) / NS_PER_SEC))
            begin = None
    if begin is not None:
        spans.append(((begin - start) / NS_PER_SEC, (result.records[-1].time_ns + period - start) / NS_PER_SEC))
    return spans


def _time_label(result: ReplayResult) -> str:
    """The plots' time axis: a dataset replay's ticks are its frames, counted from the episode's first."""
    return 'episode time [s]' if result.summary.get('dataset') else 'bag time [s]'


def _latency_title(result: ReplayResult) -> str:
    """A remote tick's latency is its round trip (the server's compute inside it), not a compute time here."""
    remote = (result.summary.get('backend') or {}).get('backend') == 'remote'
    what = 'round trip to the server' if remote else 'measured compute time'
    return f'inference latency per tick ({what}), {len(result.records)} ticks'


def _start_ns(result: ReplayResult) -> int:
    candidates = [a[0] for a in (result.recorded_times_ns, result.command_times_ns) if a.size]
    candidates += [r.time_ns for r in result.records[:1]]
    return int(min(candidates)) if candidates else 0


def handover_figure(result: ReplayResult):
    """Consecutive published trajectories overlaid (alternating colours, take-over points marked) per joint,
    and the jump of every hand-over over time."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    from matplotlib.lines import Line2D

    joints = len(result.joint_names)
    start = _start_ns(result)
    published = [r for r in result.records if r.plan_positions is not None]
    fig, axes = plt.subplots(joints + 1, 1, figsize=(10, 1.8 * (joints + 1) + 1), sharex=True, squeeze=False)
    for j, (axis, name) in enumerate(zip(axes[:joints, 0], result.joint_names)):
        for k, record in enumerate(published):
            due = (record.plan_start_ns - start) / NS_PER_SEC + record.plan_times_sec
            colour = 'tab:blue' if k % 2 == 0 else 'tab:orange'
            axis.plot(due, record.plan_positions[:, j], color=colour, alpha=0.7, linewidth=0.9)
            if record.handover is not None:
                axis.plot(due[:1], record.plan_positions[:1, j], 'o', color='black', markersize=2.5)
        axis.set_ylabel(f'{name}\n[rad]')
    handovers = [r for r in published if r.handover is not None]
    jump_axis = axes[joints, 0]
    # Points, not a line: two chunks of one frame (the joints moved between their ticks) share an origin.
    jump_axis.plot([(r.plan_start_ns - start) / NS_PER_SEC + r.plan_times_sec[0] for r in handovers],
                   [r.handover.jump_max for r in handovers], 'o', color='tab:red', markersize=3)
    jump_axis.set_ylim(bottom=0, top=max([r.handover.jump_max for r in handovers] + [0.0]) * 1.15 or None)
    jump_axis.set_ylabel('jump [rad]\n(largest joint)')
    jump_axis.set_title('largest per-joint jump at each hand-over (0 = seamless)', fontsize='small')
    jump_axis.set_xlabel(_time_label(result))
    repeated = sum(1 for r in result.records if r.skipped == 'repeated_observation')
    handles = [Line2D([], [], color='tab:blue', linewidth=0.9), Line2D([], [], color='tab:orange', linewidth=0.9),
               Line2D([], [], marker='o', color='black', linestyle='', markersize=2.5),
               Line2D([], [], marker='o', color='tab:red', linestyle='', markersize=3)]
    labels = ['a published trajectory', 'the next one (colours alternate)', 'where a new trajectory takes over',
              f'largest jump at a hand-over ({len(handovers)}; {repeated} repeated observations published nothing)']
    if not published and result.records:
        # Nothing to overlay (every tick skipped: a server that refused the key, cameras never seen): say why on
        # the bag's span rather than leave empty axes around 0.
        reasons = ', '.join(sorted({r.skipped for r in result.records if r.skipped}))
        jump_axis.set_xlim(0, (result.records[-1].time_ns - start) / NS_PER_SEC)
        axes[0, 0].text(0.5, 0.5, f'no trajectory was published ({len(result.records)} ticks skipped: {reasons})',
                        transform=axes[0, 0].transAxes, ha='center', va='center', color='tab:red')
    height = fig.get_figheight()
    fig.suptitle('consecutive trajectories at hand-over')
    fig.legend(handles, labels, loc='upper center', ncol=2, fontsize='small', frameon=False,
               bbox_to_anchor=(0.5, 1.0 - 0.35 / height))
    fig.tight_layout(rect=(0, 0, 1, 1.0 - 0.75 / height))
    return fig


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_chunks(result: ReplayResult, path: Path) -> None:
    save_figure(chunks_figure(result), path)


def plot_latency(result: ReplayResult, path: Path) -> None:
    save_figure(latency_figure(result), path)


def plot_handovers(result: ReplayResult, path: Path) -> None:
    save_figure(handover_figure(result), path)


def write_report(result: ReplayResult, stats: TickStats, runtime: PolicyRuntime, bag: Path,
                 values: Mapping[str, Any], command_topic: Optional[str], latency_ms: float = 0.0,
                 supervisor: Optional[SafetySupervisor] = None,
                 source: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    summary = summarize(result, stats, runtime, bag, values, command_topic, latency_ms, supervisor, source)
    (result.output / 'summary.json').write_text(json.dumps(summary, indent=2) + '\n')
    result.summary = summary                        # the plots name the source (bag or dataset) and the backend
    plot_chunks(result, result.output / 'chunks.png')
    plot_latency(result, result.output / 'latency.png')
    plot_handovers(result, result.output / 'handover.png')
    return summary
