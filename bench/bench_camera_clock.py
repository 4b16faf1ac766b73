"""Camera-clock recovery over real DDS: how soon the node drives the arm again (prints, never asserts).

    python bench/bench_camera_clock.py [--runs 5] [--timeout 30]
    python bench/bench_camera_clock.py --quick      # one run of each case (a smoke run)

The node as its own process (the tiny pi0, 10 Hz, execute_steps 10, stamp_mode observation, camera_clock
auto) and the DDS test rig (test/dds_helpers.py: three cameras and the joint states at 20 Hz, one isolated
domain on loopback). In each case the first camera's stamps change at t0; the figure is the time from t0 to
the arrival of the first chunk computed from frames sent 0.1 s after t0 or later (stamp_mode observation
stamps every chunk at its observation), so it includes up to two frame periods of the rig:
  step cases (the stamps moved for good, then back): 'into' the camera's new clock (its frames refused, or
  timed by receipt, until the jump has held 0.5 s), and 'back' to the node's clock;
  a glitch: one frame stamped 1e6 s ahead among good ones.
A case that does not recover within --timeout prints '> timeout'. Median and max over --runs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'test'))
os.environ.setdefault('OMP_NUM_THREADS', '1')

NS = 1_000_000_000
LATER_NS = NS // 10          # a frame period or two of the rig after t0


def recovery(rig, change, timeout: float, first_chunk_observed_since) -> float:
    """Seconds from ``change()`` to the first chunk of frames sent LATER_NS after it (inf: none in time)."""
    since = rig.trajectory_count()
    start, start_ns = time.monotonic(), rig.now_ns()
    change()
    try:
        return first_chunk_observed_since(rig, start_ns + LATER_NS, timeout, since=since) - start
    except AssertionError:
        return float('inf')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', type=int, default=5)
    parser.add_argument('--timeout', type=float, default=30.0, help='seconds to wait for a recovery')
    parser.add_argument('--quick', action='store_true', help='one run of each case')
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    try:
        from dds_helpers import (CAMERAS, CLOCK_STEPS, NodeProcess, TestRig, base_params, first_chunk_observed_since,
                                 glitched_once, isolate, pick_domain_id, shifted_frames)
    except ImportError as error:
        print(f'skipped: needs rclpy (pip install -e .[ros]): {error}')
        return 2
    from vla_policy_node.policy.tiny_default import write_tiny_default
    domain = pick_domain_id()
    isolate(domain)
    base = CAMERAS[0]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_tiny_default(Path(tmp) / 'tiny', 'pi0')
        rig = TestRig(domain)
        proc = NodeProcess(Path(tmp) / 'node', base_params(checkpoint, execute_steps=10, stamp_mode='observation'),
                           domain).start()
        try:
            proc.wait_for_state(rig, 'active', timeout=120)
            rig.start_streaming()
            first_chunk_observed_since(rig, rig.now_ns(), args.timeout)
            time.sleep(1.0)          # the node has known the camera clocks for a while (not a jump at start-up)

            def settle() -> None:
                """Good stamps for long enough that every jump of the case before has held (0.5 s): cases apart."""
                rig.reset_inputs()
                first_chunk_observed_since(rig, rig.now_ns(), args.timeout, since=rig.trajectory_count())
                time.sleep(1.5)

            def override(frames) -> callable:
                return lambda: rig.set_inputs(camera_overrides=frames)

            for case, offset in CLOCK_STEPS.items():
                for _ in range(runs):
                    settle()
                    shifted = {base: shifted_frames(rig, base, lambda stamp, offset=offset: offset)}
                    results.setdefault((case, 'into'), []).append(
                        recovery(rig, override(shifted), args.timeout, first_chunk_observed_since))
                    time.sleep(1.5)                  # the camera's new clock, until the jump has held
                    results.setdefault((case, 'back'), []).append(
                        recovery(rig, override({}), args.timeout, first_chunk_observed_since))
            for _ in range(runs):
                settle()
                results.setdefault(('1 frame 1e6 s ahead', 'glitch'), []).append(recovery(
                    rig, override({base: glitched_once(rig, base, 10**6 * NS)}), args.timeout,
                    first_chunk_observed_since))
        finally:
            rig.close()
            proc.stop()
    print(f'\ncamera-clock recovery, seconds from the change to the first chunk of frames sent after it '
          f'({runs} run(s) each)\n')
    print('| case | phase | median s | max s |')
    print('|---|---|---|---|')
    for (case, phase), values in results.items():
        median, worst = statistics.median(values), max(values)
        text = [f'{v:.2f}' if v != float('inf') else f'> {args.timeout:g}' for v in (median, worst)]
        print(f'| {case} | {phase} | {text[0]} | {text[1]} |')
    return 0


if __name__ == '__main__':
    sys.exit(main())
