"""FLOP count of one inference, per stage, from the config alone (so a GFLOP/s figure can be checked by hand).

    python bench/flops.py                       # every preset of every family, 10 steps
    python bench/flops.py --presets pi0 --steps 5
    python bench/flops.py --quick               # the tiny presets only (a smoke run)

Each policy family counts its own stages (``PolicyFamily.stage_flops``: policy/families/<type>/flops.py,
from the shared pieces in policy/flops.py, which also says what is counted and what is not); a new
family brings its counter with it. This module asks the family of the config; bench_runtime.py imports
``stage_flops`` from here.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vla_policy_node.policy.families import family_class, known_types, preset_config  # noqa: E402


def stage_flops(config, num_steps: int) -> Dict[str, int]:
    """{'prefix': FLOPs of a miss's prefix, 'denoise': FLOPs of one chunk's denoise} for any family's config."""
    return family_class(config.policy_type).stage_flops(config, num_steps)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--presets', default='', help='comma list of preset names (default: every preset)')
    parser.add_argument('--steps', type=int, default=10, help='Euler steps of the denoise')
    parser.add_argument('--quick', action='store_true', help='the presets named tiny only')
    args = parser.parse_args(argv)
    names = [p.strip() for p in args.presets.split(',') if p.strip()]
    if not names:
        names = [name for type_name in known_types() for name in family_class(type_name).preset_names]
    if args.quick:
        names = [name for name in names if 'tiny' in name]
    print(f'FLOPs of one inference, {args.steps} steps')
    print('| preset | type | cameras | prefix tokens | prefix GFLOP | denoise GFLOP |')
    print('|---|---|---|---|---|---|')
    for name in names:
        config = preset_config(name)
        flops = stage_flops(config, args.steps)
        print(f"| {name} | {config.policy_type} | {len(config.camera_names)} | {config.prefix_len} | "
              f"{flops['prefix'] / 1e9:.3f} | {flops['denoise'] / 1e9:.3f} |")
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
