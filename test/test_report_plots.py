"""The replay's plots as a person reads them: legend off the data, executed parts, p50/p95, a jump axis from 0."""
import numpy as np

from vla_policy_node.handover import HandoverMetrics
from vla_policy_node.replay.report import (ReplayResult, TickRecord, chunks_figure, executed_parts,
                                           handover_figure, latency_figure, latency_summary)

NS = 1_000_000_000
JOINTS = ('a', 'b')


def _result(tmp_path, chunks=30):
    records = []
    for k in range(chunks):
        start = (k + 1) * NS // 10
        times = (np.arange(10) + 1) * 0.1
        positions = np.stack([np.sin(times + k), np.cos(times + k)], axis=1)
        handover = HandoverMetrics(jump_max=0.27 + 0.01 * (k % 3), overlap_mean=0.2, elapsed=0) if k else None
        records.append(TickRecord(time_ns=start, cache_hit=bool(k % 2), timings_ms={'denoise': 10.0 + k},
                                  plan_start_ns=start, plan_times_sec=times, plan_positions=positions,
                                  publish_ns=start, handover=handover))
    records.append(TickRecord(time_ns=(chunks + 1) * NS // 10, skipped='camera_missing', supervisor='held: x',
                              publish_ns=(chunks + 1) * NS // 10, hold=True))
    recorded_t = np.arange(0, 4 * NS, NS // 20)
    return ReplayResult(output=tmp_path, records=records, joint_names=JOINTS, recorded_times_ns=recorded_t,
                        recorded_positions=np.zeros((recorded_t.size, 2)), command_times_ns=np.zeros(0, np.int64),
                        command_positions=np.zeros((0, 2)), summary={})


def test_each_chunk_is_executed_until_the_next_takes_over(tmp_path):
    result = _result(tmp_path)
    parts = executed_parts(result)
    assert len(parts) == 30
    # Chunks are published 0.1 s apart with points 0.1 s apart: each runs one point, plus the point it is
    # taken over between; the last one is taken over by the hold 0.1 s later.
    for due_ns, positions in parts:
        assert due_ns.size == 2 and positions.shape == (2, 2)
    assert parts[0][0][0] == result.records[0].plan_start_ns + NS // 10


def test_chunks_legend_sits_above_the_panels_and_not_every_chunk_is_drawn_in_full(tmp_path):
    fig = chunks_figure(_result(tmp_path))
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    top_axis = fig.axes[0].get_window_extent()
    assert legend.y0 >= top_axis.y1, (legend, top_axis)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert 'every 5th chunk in full' in labels
    full = [line for line in fig.axes[0].get_lines() if line.get_color() == 'tab:purple']
    assert len(full) == 6


def test_chunks_say_which_controller_each_joint_goes_to(tmp_path):
    from vla_policy_node.outputs import Output
    result = _result(tmp_path)
    result.outputs = (Output('arm', '/arm/joint_trajectory', 'joint_trajectory', ('a',), (0,)),
                      Output('gripper', '/gripper/commands', 'float64_multi_array', ('b',), (1,)))
    arm, gripper = chunks_figure(result).axes
    assert arm.get_ylabel().startswith('arm: a') and gripper.get_ylabel().startswith('gripper: b')
    assert '/arm/joint_trajectory' in arm.get_title(loc='left')
    assert 'the position due next' in gripper.get_title(loc='left')
    assert arm.spines['left'].get_edgecolor() != gripper.spines['left'].get_edgecolor()
    plain = chunks_figure(_result(tmp_path)).axes[0]          # one output of every joint: nothing to mark
    assert plain.get_ylabel() == 'a\n[rad]' and plain.get_title(loc='left') == ''


def test_latency_has_a_title_and_its_p50_p95_lines(tmp_path):
    fig = latency_figure(_result(tmp_path))
    axis = fig.axes[0]
    assert 'latency' in axis.get_title()
    labels = [line.get_label() for line in axis.get_lines()]
    totals = 10.0 + np.arange(30)
    assert f'p50 {np.percentile(totals, 50):.1f} ms' in labels and f'p95 {np.percentile(totals, 95):.1f} ms' in labels
    assert axis.get_ylim()[0] == 0


def test_latency_lines_are_the_summary_figures_and_a_remote_tick_counts_once(tmp_path):
    """A remote tick's stages are the client's work and the round trip ('denoise'); its server_ms is the
    server's own time inside that round trip, not another stage."""
    result = _result(tmp_path)
    for k, record in enumerate(result.records[:-1]):
        record.timings_ms = {'hash': 0.1, 'preprocess': 0.4, 'prefix': 0.0, 'denoise': 20.0 + k,
                             'server_ms': 15.0 + k}
    summary = latency_summary(result.records)
    totals = 20.5 + np.arange(30)
    assert summary['total'] == {'p50': np.percentile(totals, 50), 'p95': np.percentile(totals, 95),
                                'max': totals.max()}
    assert set(summary) == {'hash', 'preprocess', 'prefix', 'denoise', 'total'}
    axis = latency_figure(result).axes[0]
    lines = {line.get_label().split()[0]: line.get_ydata()[0] for line in axis.get_lines()}
    assert lines == {'p50': summary['total']['p50'], 'p95': summary['total']['p95']}
    dots = np.concatenate([collection.get_offsets()[:, 1] for collection in axis.collections[:2]])
    assert sorted(dots) == sorted(totals)


def test_latency_names_a_repeated_observation_apart_from_a_fault(tmp_path):
    result = _result(tmp_path)          # ends with a camera_missing skip
    result.records += [TickRecord(time_ns=(40 + k) * NS // 10, skipped='repeated_observation') for k in range(3)]
    fig = latency_figure(result)
    labels = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    assert 'repeated observation: the chunk goes on (3, no inference)' in labels, labels
    assert 'skipped for a fault: camera_missing (1)' in labels, labels
    assert not any('repeated' in label and 'fault' in label for label in labels)


def test_handover_jump_axis_has_a_unit_and_starts_at_zero(tmp_path):
    fig = handover_figure(_result(tmp_path))
    jump_axis = fig.axes[-1]
    assert '[rad]' in jump_axis.get_ylabel()
    low, high = jump_axis.get_ylim()
    assert low == 0 and high >= 0.29


def test_handover_legend_sits_above_the_panels_and_counts_the_repeated_observations(tmp_path):
    result = _result(tmp_path)
    result.records.append(TickRecord(time_ns=40 * NS // 10, skipped='repeated_observation'))
    fig = handover_figure(result)
    fig.canvas.draw()
    legend = fig.legends[0]
    assert legend.get_window_extent().y0 >= fig.axes[0].get_window_extent().y1
    labels = [text.get_text() for text in legend.get_texts()]
    assert 'where a new trajectory takes over' in labels
    assert any('(29; 1 repeated observations published nothing)' in label for label in labels), labels


def test_handover_says_when_nothing_was_published(tmp_path):
    # Every tick refused by the server: no trajectory to overlay, and the figure says why on the bag's span.
    result = _result(tmp_path, chunks=0)
    result.records = [TickRecord(time_ns=(k + 1) * NS // 10, skipped='remote_auth', supervisor='held: x',
                                 publish_ns=(k + 1) * NS // 10) for k in range(20)]
    fig = handover_figure(result)
    texts = [text.get_text() for axis in fig.axes for text in axis.texts]
    assert any('no trajectory was published' in text and 'remote_auth' in text for text in texts), texts
    assert fig.axes[-1].get_xlim()[1] > 1.5


def test_the_time_axis_and_the_latency_title_name_the_source_and_the_backend(tmp_path):
    # A dataset replay's ticks are its frames (episode time); a remote tick's latency is its round trip.
    result = _result(tmp_path)
    assert latency_figure(result).axes[0].get_xlabel() == 'bag time [s]'
    assert 'compute time' in latency_figure(result).axes[0].get_title()
    result.summary = {'dataset': {'root': 'ds', 'episodes': [1]}, 'backend': {'backend': 'remote'}}
    result.records.append(TickRecord(time_ns=4 * NS, skipped='repeated_observation'))    # the widest legend
    for figure in (chunks_figure, latency_figure, handover_figure):
        assert figure(result).axes[-1].get_xlabel() == 'episode time [s]', figure.__name__
    fig = latency_figure(result)
    assert 'round trip' in fig.axes[0].get_title()
    fig.canvas.draw()
    title = fig.axes[0].title.get_window_extent()
    assert title.x0 >= 0 and title.x1 <= fig.bbox.width, (title, fig.bbox)     # not clipped
