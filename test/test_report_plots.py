"""The replay's plots as a person reads them: legend off the data, executed parts, p50/p95, a jump axis from 0."""
import numpy as np

from vla_policy_node.handover import HandoverMetrics
from vla_policy_node.replay.report import (ReplayResult, TickRecord, chunks_figure, executed_parts,
                                           handover_figure, latency_figure)

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


def test_latency_has_a_title_and_its_p50_p95_lines(tmp_path):
    fig = latency_figure(_result(tmp_path))
    axis = fig.axes[0]
    assert 'latency' in axis.get_title()
    labels = [line.get_label() for line in axis.get_lines()]
    totals = 10.0 + np.arange(30)
    assert f'p50 {np.percentile(totals, 50):.1f} ms' in labels and f'p95 {np.percentile(totals, 95):.1f} ms' in labels
    assert axis.get_ylim()[0] == 0


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
