"""The policy-family registry: lerobot's config.json ``type`` -> the family that reads it.

A family is a folder here, as lerobot's ``policies/<name>/``: its config and field table, its model,
its tokenizer and its adapter (the ``PolicyFamily`` subclass of policy/family.py). Entries are
"module:Class" strings, imported on first use, so loading one family never imports another's code
and a broken optional family cannot break the others. A new family is its folder plus one line in
``FAMILIES`` (docs/architecture.md).

Everything that dispatches on a config.json ``type`` goes through this module (load, save, a folder's
config, the options of the families); nothing else names a family.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Type, Union

import numpy as np
import torch

from ..checkpoint import CheckpointError, LoadedCheckpoint, read_config_json
from ..config_fields import ConfigError
from ..family import FamilyCapabilities, PolicyFamily

FAMILIES: Dict[str, str] = {
    'pi0': 'vla_policy_node.policy.families.pi0.adapter:Pi0Family',
    'pi05': 'vla_policy_node.policy.families.pi05.adapter:Pi05Family',
    'smolvla': 'vla_policy_node.policy.families.smolvla.adapter:SmolVLAFamily',
    'groot': 'vla_policy_node.policy.families.groot.adapter:GrootFamily',
}
# The family of the embedded checkpoints (builtin:demo, builtin:tiny) and the default of the tools that
# write a random-weight checkpoint (vla_policy_make_checkpoint, the demo's comparison model).
EMBEDDED_TYPE = 'pi0'
_LOADED: Dict[str, Type[PolicyFamily]] = {}


def known_types() -> tuple:
    return tuple(FAMILIES)


def family_class(type_name: Any) -> Type[PolicyFamily]:
    """The family class for a config.json ``type``; ConfigError naming it and the known ones otherwise."""
    if not isinstance(type_name, str) or type_name not in FAMILIES:
        raise ConfigError(f'config.json "type" must be one of {known_types()}, got {type_name!r}')
    if type_name not in _LOADED:
        module_name, _, class_name = FAMILIES[type_name].partition(':')
        cls = getattr(importlib.import_module(module_name), class_name)
        if cls.type_name != type_name:
            raise TypeError(f'{FAMILIES[type_name]} declares type {cls.type_name!r}, registered as {type_name!r}')
        _LOADED[type_name] = cls
    return _LOADED[type_name]


def _folder_family(folder: Path) -> Tuple[Type[PolicyFamily], Dict[str, Any]]:
    """The family a folder's config.json ``type`` names, and that config.json; CheckpointError otherwise."""
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    raw = read_config_json(folder)
    try:
        return family_class(raw.get('type')), raw
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from exc


def load_policy(folder: Union[str, Path], device: torch.device, dtype: torch.dtype,
                tokenizer_path: Optional[Union[str, Path]] = None, **options: Any) -> PolicyFamily:
    """Load a lerobot ``pretrained_model/`` folder with the family its config.json ``type`` names.

    ``options`` are family options: one that no family has (a misspelt keyword) is refused as unknown,
    one that another family has, set away from its off value, by that family's ``checked_options``."""
    folder = Path(folder)
    family, _ = _folder_family(folder)
    unknown = sorted(name for name in options if name not in family.option_defaults
                     and name not in family_options())
    if unknown:
        raise ValueError(f'unknown option{"s" if len(unknown) > 1 else ""} {", ".join(map(repr, unknown))}: no '
                         f'policy family takes {"them" if len(unknown) > 1 else "it"} (their options: '
                         f'{", ".join(family_options()) or "none"})')
    return family.load(folder, device, dtype, Path(tokenizer_path) if tokenizer_path else None, **options)


def type_capabilities(type_name: Any) -> Optional[FamilyCapabilities]:
    """The capabilities of the family a policy type names, or None for a type no family here reads (a remote
    server's own); imports that family."""
    return family_class(type_name).capabilities if type_name in FAMILIES else None


def family_options() -> Tuple[str, ...]:
    """Every option any registered family takes (``option_defaults``), sorted; imports every family."""
    return tuple(sorted({name for type_name in FAMILIES for name in family_class(type_name).option_defaults}))


def preset_config(name: str, depth: Optional[int] = None) -> Any:
    """The configuration of a named preset of any registered family (benchmarks; ``depth`` as
    ``PolicyFamily.preset``); ConfigError naming the known presets otherwise. Imports every family."""
    known = []
    for type_name in FAMILIES:
        family = family_class(type_name)
        if name in family.preset_names:
            return family.preset(name, depth)
        known += family.preset_names
    raise ConfigError(f'unknown preset {name!r}; known: {", ".join(known)}')


def folder_config(folder: Union[str, Path]) -> Any:
    """A folder's family config without its weights (config.json and what the family reads beside it), for any
    family; ConfigError / CheckpointError as loading gives them."""
    folder = Path(folder)
    family, raw = _folder_family(folder)
    return family.folder_config(folder, raw)


def folder_statistics(folder: Union[str, Path]) -> Tuple[Any, Any, Any]:
    """A folder's family config and its state and action normalisers (``PolicyFamily.folder_normalizers``: the
    processor files, no weights), for any family; ConfigError / CheckpointError as loading gives them."""
    folder = Path(folder)
    family, raw = _folder_family(folder)
    config = family.folder_config(folder, raw)
    state, action = family.folder_normalizers(folder, config)
    return config, state, action


def load_checkpoint(folder: Union[str, Path], device: torch.device, compute_dtype: torch.dtype) -> LoadedCheckpoint:
    """Config, model and statistics of a folder, by the family its config.json ``type`` names (no tokenizer)."""
    folder = Path(folder)
    family, raw = _folder_family(folder)
    return family.load_checkpoint(folder, raw, device, compute_dtype)


def save_checkpoint(folder: Union[str, Path], model: torch.nn.Module, state_stats: Mapping[str, np.ndarray],
                    action_stats: Mapping[str, np.ndarray], tokenizer_file: Optional[Path] = None) -> Path:
    """Write ``model`` and its statistics as a lerobot ``pretrained_model/`` folder, in its family's layout."""
    return family_class(model.config.policy_type).save_checkpoint(Path(folder), model, state_stats, action_stats,
                                                                  tokenizer_file)
