"""The backend registry (the backend seam, docs/architecture.md): the ``backend`` parameter's value -> its loader.

A loader takes ``(values, info, warn)`` and returns a connected or loaded backend: an object with
``infer(...)`` (PolicyRuntime's signature), ``config``, ``warmup()``, ``close()``, ``describe() -> dict``
(what /diagnostics and the replay summary show) and ``summary() -> str`` (the configure log line).
Loaders are imported only when asked for (``remote`` needs websockets and msgpack, ``local`` torch), like the
policy families. A new backend is its own module plus one line here; nothing else tests the name.

This module imports nothing of the package, so the parameter table can read the names from it.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, Optional

BACKENDS = {
    'local': 'vla_policy_node.settings:load_local',
    'remote': 'vla_policy_node.remote_settings:load_remote',
}

Loader = Callable[[Mapping[str, Any], Callable[[str], None], Optional[Callable[[str], None]]], Any]


def backend_loader(name: str) -> Loader:
    """The loader registered under ``name`` (imported now); KeyError names the known ones."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise KeyError(f'unknown backend {name!r}; known: {", ".join(BACKENDS)}') from None
    module, function = target.split(':')
    return getattr(importlib.import_module(module), function)


def load_backend(values: Mapping[str, Any], info: Callable[[str], None],
                 warn: Optional[Callable[[str], None]] = None) -> Any:
    """The backend the (validated) parameters ask for."""
    return backend_loader(values['backend'])(values, info, warn)
