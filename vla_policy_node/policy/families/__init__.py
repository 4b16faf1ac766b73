"""The policy-family registry: lerobot's config.json ``type`` -> the family module that reads it.

Entries are "module:Class" strings, imported on first use, so loading a pi0 never
imports SmolVLA's code and a broken optional family cannot break the others.
A new family is its own module here plus one line in ``FAMILIES``.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Type, Union

import torch

from ..config_fields import ConfigError
from ..family import PolicyFamily

FAMILIES: Dict[str, str] = {
    'pi0': 'vla_policy_node.policy.families.pi0:Pi0Family',
    'pi05': 'vla_policy_node.policy.families.pi05:Pi05Family',
    'smolvla': 'vla_policy_node.policy.families.smolvla:SmolVLAFamily',
}
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
    from ..checkpoint import CheckpointError, read_config_json
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    raw = read_config_json(folder)
    try:
        return family_class(raw.get('type')), raw
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from exc


def load_policy(folder: Union[str, Path], device: torch.device, dtype: torch.dtype,
                tokenizer_path: Optional[Union[str, Path]] = None, **options: Any) -> PolicyFamily:
    """Load a lerobot ``pretrained_model/`` folder with the family its config.json ``type`` names."""
    folder = Path(folder)
    family, _ = _folder_family(folder)
    return family.load(folder, device, dtype, Path(tokenizer_path) if tokenizer_path else None, **options)


def folder_config(folder: Union[str, Path]) -> Any:
    """A folder's family config without its weights (config.json and what the family reads beside it), for any
    family; ConfigError / CheckpointError as loading gives them."""
    folder = Path(folder)
    family, raw = _folder_family(folder)
    return family.folder_config(folder, raw)
