"""The embedded checkpoints: what checkpoint_path ``builtin:demo`` and ``builtin:tiny`` name, as folders.

- ``builtin:demo``: the shipped folder ``vla_policy_node/demo_checkpoint/`` (package data), read in place: the
  tiny model of the registry's ``EMBEDDED_TYPE`` trained on the demo's sample bag by ``vla_policy_train_demo``.
- ``builtin:tiny``: the same model with seeded RANDOM weights, written on first use under ~/.cache.

Every reader of checkpoint_path (the node and the replay through settings.py, the doctor, vla_policy_serve,
the demo) resolves the names here, so none of them loads the trainer or the configure path to do it.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .checkpoint import WEIGHTS_FILE, CheckpointError
from .families import EMBEDDED_TYPE
from .tiny_default import write_tiny_default

BUILTIN_TINY = 'builtin:tiny'
BUILTIN_DEMO = 'builtin:demo'
# The shipped checkpoint (package data); SHIPPED_COMMAND, run in the source tree, reproduces it (training.json in
# the folder records the command, versions and digest).
DEMO_CHECKPOINT = Path(__file__).resolve().parents[1] / 'demo_checkpoint'
SHIPPED_COMMAND = 'vla_policy_train_demo vla_policy_node/demo_checkpoint'


def builtin_demo_checkpoint() -> Path:
    """The embedded default (checkpoint_path "builtin:demo"): the shipped folder, read in place."""
    if not (DEMO_CHECKPOINT / WEIGHTS_FILE).is_file():
        raise CheckpointError(f'the embedded demo checkpoint is missing from {DEMO_CHECKPOINT}; rebuild it with '
                              f'`{SHIPPED_COMMAND}` from the source tree')
    return DEMO_CHECKPOINT


def builtin_tiny_checkpoint() -> Path:
    """The embedded random-weight default (checkpoint_path "builtin:tiny"), written on first use under ~/.cache."""
    folder = Path.home() / '.cache' / 'vla_policy_node' / f'tiny_{EMBEDDED_TYPE}'
    if (folder / WEIGHTS_FILE).exists():
        return folder
    # Written beside and renamed into place, so a half-written folder is never loaded.
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f'{folder.name}.', dir=folder.parent))
    write_tiny_default(scratch, EMBEDDED_TYPE)
    try:
        scratch.rename(folder)
    except OSError:  # another process finished first; its folder is complete
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def checkpoint_folder(checkpoint: str) -> Path:
    """The folder a checkpoint_path names: an embedded checkpoint (builtin:demo, builtin:tiny) or a path."""
    builtin = {BUILTIN_TINY: builtin_tiny_checkpoint, BUILTIN_DEMO: builtin_demo_checkpoint}.get(checkpoint)
    return builtin() if builtin is not None else Path(checkpoint)
