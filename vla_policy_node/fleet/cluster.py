"""Starting (or joining) Ray for the fleet, and keeping a one-machine fleet on loopback.

Ray turns ``--node-ip-address=127.0.0.1`` into the machine's routable address (ray/_private/services.py
``resolve_ip_for_localhost``, Ray 2.60): its own processes then talk over the private address. Only when
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is 0 (Ray's single-machine mode; the name is Ray's) does it keep every
address on 127.0.0.1, and that must be in the environment before ``ray`` is imported, since Ray reads it at
import (ray/_private/ray_constants.py). Usage statistics (a report Ray sends out) are off.

Nothing here is imported by the rest of the package: Ray is the optional ``fleet`` extra.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, Optional

LOOPBACK = '127.0.0.1'
LOOPBACK_ENV = {'RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER': '0', 'RAY_USAGE_STATS_ENABLED': '0'}
# Serve's controller kills an HTTP proxy whose readiness check has not answered in 5 s three times running
# (ray/serve/_private/constants.py PROXY_READY_CHECK_TIMEOUT_S), then starts another: on a busy small machine (a
# Jetson, a shared CI box) the proxy's start-up imports take longer, and it never comes up. 30 s each leaves the
# proxy the whole of serve.start's own 60 s. Read by the controller, so set before this machine's Ray starts.
PROXY_READY_ENV = {'RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S': '30'}


def use_loopback() -> None:
    """Keep Ray on 127.0.0.1 in this process and the ones it starts; before ``import ray``."""
    if 'ray' in sys.modules and os.environ.get('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER') != '0':
        raise RuntimeError('ray was imported before use_loopback(): its addresses would not stay on loopback')
    os.environ.update(LOOPBACK_ENV)


def start_ray(address: Optional[str] = None, num_cpus: Optional[float] = None, num_gpus: Optional[int] = None,
              quiet: bool = True) -> Any:
    """``address`` None: a Ray instance of this machine alone, on loopback (``use_loopback`` first); else join
    that cluster (``auto``: the one ``ray start`` started here)."""
    if address is None:
        use_loopback()
        for name, value in PROXY_READY_ENV.items():
            os.environ.setdefault(name, value)
    else:
        os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
    import ray

    options: Dict[str, Any] = dict(log_to_driver=not quiet, ignore_reinit_error=True)
    if address is None:
        options.update(_node_ip_address=LOOPBACK, include_dashboard=False, num_cpus=num_cpus, num_gpus=num_gpus)
        return ray.init(**options)
    return ray.init(address=address, **options)


def start_serve(host: str = LOOPBACK, port: int = 8000) -> None:
    """Serve's controller and HTTP proxies (``host``: where robots connect; 0.0.0.0 for other machines)."""
    from ray import serve

    serve.start(http_options={'host': host, 'port': port})
