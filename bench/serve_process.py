"""``vla_policy_serve`` in its own process on a free loopback port, for the benchmarks that measure through it
(bench_remote.py, bench_fleet.py)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]


def start_server(checkpoint: Path, log: Path, extra: Sequence[str] = (),
                 threads: int = 1) -> Tuple[subprocess.Popen, int]:
    """The server on ``checkpoint`` (cpu, fp32, ``extra`` arguments after those), logging to ``log``; returns the
    process and the port it printed once it serves."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED='1')
    proc = subprocess.Popen([sys.executable, '-m', 'vla_policy_node.remote.server', '--checkpoint', str(checkpoint),
                             '--port', '0', '--device', 'cpu', '--dtype', 'float32', *extra],
                            stdout=open(log, 'wb'), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.findall(r'on ws://127\.0\.0\.1:(\d+) ', log.read_text(errors='replace'))
        if found:
            return proc, int(found[-1])
        if proc.poll() is not None:
            raise SystemExit(f'vla_policy_serve exited:\n{log.read_text()}')
        time.sleep(0.1)
    raise SystemExit('vla_policy_serve did not start')
