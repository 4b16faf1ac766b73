"""Tiny random-weight checkpoints of any family, written as real lerobot folders (``vla_policy_make_checkpoint``).

``builtin:tiny`` (policy/builtin.py), the tests, the demo and the benchmarks load them through the same code
as a real lerobot folder. Their actions are meaningless (seeded random weights); only the plumbing is real.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from torch import nn

from .families import EMBEDDED_TYPE, family_class, known_types, save_checkpoint
from .layers import fuse_projections

DEFAULT_SEED = 0
# Joint-space statistics of a plausible 6-joint arm (radians): actions stay within ~±1 rad.
ACTION_STD = 0.2
STATE_STD = 0.5


def random_model(config, seed: int = DEFAULT_SEED) -> nn.Module:
    """torch's default initialisation under a fixed seed: same seed, same weights, on any machine.

    Projections are fused as a loaded model's are (same GEMMs, same numerics)."""
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        return fuse_projections(family_class(config.policy_type).model_class(config)).eval()
    finally:
        torch.random.set_rng_state(generator_state)


def statistics(dim: int, std: float) -> dict:
    """Every statistic lerobot keeps, so a config with any normalisation mode loads."""
    zeros = np.zeros(dim, dtype=np.float32)
    spread = np.full(dim, std, dtype=np.float32)
    return {'mean': zeros, 'std': spread, 'min': zeros - 3 * spread, 'max': zeros + 3 * spread,
            'q01': zeros - 2.33 * spread, 'q99': zeros + 2.33 * spread,
            'q10': zeros - 1.28 * spread, 'q90': zeros + 1.28 * spread}


def write_random_checkpoint(folder: Path, config, seed: int = DEFAULT_SEED) -> Path:
    """A lerobot pretrained_model/ folder with seeded random weights and a small trained tokenizer."""
    model = random_model(config, seed)
    family = family_class(config.policy_type)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer_file = family.build_test_tokenizer(Path(scratch), min(config.vocab_size, 512))
        return save_checkpoint(Path(folder), model, statistics(config.state_dim, STATE_STD),
                               statistics(config.action_dim, ACTION_STD), tokenizer_file=tokenizer_file)


# Names as a lerobot dataset gives them (features["action"]["names"]); the last one is the gripper.
TINY_ACTION_NAMES = ('shoulder_pan.pos', 'shoulder_lift.pos', 'elbow_flex.pos', 'wrist_flex.pos', 'wrist_roll.pos',
                     'gripper.pos')


def write_tiny_default(folder: Path, policy_type: str = EMBEDDED_TYPE, seed: int = DEFAULT_SEED,
                       relative_actions: bool = False) -> Path:
    """The tiny checkpoint; ``relative_actions``: trained on offsets from the state, gripper absolute."""
    overrides = dict(use_relative_actions=True, action_feature_names=TINY_ACTION_NAMES) if relative_actions else {}
    return write_random_checkpoint(folder, family_class(policy_type).tiny_config(**overrides), seed)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description='Write the tiny random-weight checkpoint (lerobot layout).')
    parser.add_argument('output', type=Path, help='folder to create (pretrained_model layout)')
    parser.add_argument('--type', choices=known_types(), default=EMBEDDED_TYPE)
    parser.add_argument('--seed', type=int, default=DEFAULT_SEED)
    parser.add_argument('--relative-actions', action='store_true',
                        help='use_relative_actions: actions are offsets from the state (gripper absolute)')
    args = parser.parse_args(argv)
    folder = write_tiny_default(args.output, args.type, args.seed, args.relative_actions)
    kind = ' relative-action' if args.relative_actions else ''
    print(f'wrote a tiny{kind} {args.type} checkpoint with RANDOM weights (seed {args.seed}) to {folder}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
