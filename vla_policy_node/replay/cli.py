"""``vla_policy_replay``: the command line over the two offline replays, of a bag (``offline.py``) and of
LeRobotDataset episodes (``dataset_replay.py``, built on the first); both print the same summary lines."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from ..params import ParameterError
from ..policy.checkpoint import CheckpointError
from ..policy.config_fields import ConfigError
from ..policy.tokenizer import TokenizerError
from ..bags.bag_io import BagError
from .dataset_replay import parse_episodes, replay_dataset
from .offline import DEFAULT_COMMAND_TOPIC, ReplayError, replay

DESCRIPTION = 'Offline replay of a rosbag2 bag (or LeRobotDataset episodes) through the node\'s tick code.'


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog='vla_policy_replay', description=DESCRIPTION)
    parser.add_argument('bag', type=Path, nargs='?', help='rosbag2 folder (sqlite3 or mcap)')
    parser.add_argument('--dataset', type=Path,
                        help='instead of a bag: a LeRobotDataset folder (vla_policy_bag_to_lerobot), its episodes '
                             'replayed through the same ticks (frames from the videos, action as the command)')
    parser.add_argument('--episodes', help="with --dataset: the episodes, e.g. '3,4' or '0-9' (default all)")
    parser.add_argument('--params', type=Path, help="the node's params YAML (same file as for the robot)")
    parser.add_argument('--checkpoint', help='overrides checkpoint_path from the params file')
    parser.add_argument('--output', type=Path, required=True, help='folder for the report (created)')
    parser.add_argument('--seed', type=int, help='noise seed (default: params seed, else 0)')
    parser.add_argument('--command-topic', default=DEFAULT_COMMAND_TOPIC,
                        help='recorded command topic (sensor_msgs/JointState) to compare against, if in the bag')
    parser.add_argument('--latency-ms', type=float, default=0.0,
                        help='simulated time from an observation to the publication of its chunk (deterministic; '
                             'default 0): actions that fall due meanwhile are dropped and drive the RTC delay')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar')
    args = parser.parse_args(argv)
    if (args.bag is None) == (args.dataset is None):
        parser.error('give a bag or --dataset DIR (one of them)')
    if args.episodes and args.dataset is None:
        parser.error('--episodes selects episodes of --dataset')
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)
    try:
        if args.dataset is not None:
            result = replay_dataset(args.dataset, parse_episodes(args.episodes), args.params,
                                    args.output, checkpoint=args.checkpoint, seed=args.seed,
                                    progress=not args.no_progress, latency_ms=args.latency_ms)
        else:
            result = replay(args.bag, args.params, args.output, checkpoint=args.checkpoint, seed=args.seed,
                            command_topic=args.command_topic, progress=not args.no_progress,
                            latency_ms=args.latency_ms)
    except (BagError, ReplayError, ParameterError, CheckpointError, ConfigError, TokenizerError) as exc:
        print(f'vla_policy_replay: error: {exc}', file=sys.stderr)
        return 2
    summary = result.summary
    entry = summary['cache']['entry_bytes']
    print(f"ticks {summary['ticks']}, published {summary['published']}, skipped {summary['skipped_total']} "
          f"{summary['skipped']}, cache hits {summary['cache']['hits']} / misses {summary['cache']['misses']}"
          + (f" (one entry {entry} bytes)" if entry is not None else ''))
    if summary['published'] == 0 and summary['skipped_total']:
        # The node logs each fault; a replay's user sees only this summary, so it names where to look.
        worst = max(summary['skipped'], key=summary['skipped'].get)
        where = 'docs/remote.md' if worst.startswith('remote_') else 'docs/troubleshooting.md'
        print(f'nothing was published: every tick was skipped, most as {worst} ({where} explains it); the first: '
              f"{summary['first_fault'].get(worst, '')}")
    errors = summary.get('command_error')
    if errors:
        print(f"RMSE against {summary['command_topic']}: "
              + ', '.join(f"{joint} {figures['rmse']:.4f}" for joint, figures in errors.items()))
    total = summary['latency_ms'].get('total')
    if total:
        print(f"latency p50 {total['p50']:.1f} ms, p95 {total['p95']:.1f} ms, max {total['max']:.1f} ms")
    print(f'report in {result.output}: summary.json, chunks.png, latency.png, handover.png, trajectories/')
    return 0


if __name__ == '__main__':
    sys.exit(main())
