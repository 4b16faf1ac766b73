"""The DDS test files, N times each, under two busy processes per core: pass counts per file.

    make stress-test [STRESS_RUNS=5] [STRESS_FILES='test/test_node_dds.py test/test_launch.py']
    .venv/bin/python .ci/stress_test.py [--runs 5] [--busy-per-core 2] [FILE ...]

A user's CI is a shared, loaded machine: a DDS test must hold when the node, the rig and everything else
get a fraction of a core. The busy processes (`while True: pass`, as many as --busy-per-core times the
cores) run for the whole stress run; each run goes through every file once, in order, each file its own
pytest process. Every pytest output is kept in --log-dir; the table at the end gives, per file, the runs it
passed, and every failing test with how often it failed. Exit status 1 when any run of any file failed.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The files that start the node (or a server) and talk over real DDS.
DDS_FILES = sorted(str(path.relative_to(ROOT)) for path in (ROOT / 'test').glob('test_*dds*.py')) + [
    'test/test_launch.py', 'test/test_user_journey.py']


# A busy loop that ends when its parent does (a stress run killed outright leaves no spinning orphans).
BUSY = 'import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n'


def start_busy(count: int):
    return [subprocess.Popen([sys.executable, '-c', BUSY]) for _ in range(count)]


def stop_busy(processes) -> None:
    for process in processes:
        process.kill()
    for process in processes:
        process.wait()


def run_file(path: str, log: Path) -> tuple:
    """pytest on one file: (passed, seconds, failing test ids)."""
    started = time.monotonic()
    with open(log, 'w') as out:
        done = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', path], cwd=ROOT,
                              stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    failed = re.findall(r'^(?:FAILED|ERROR) (\S+)', log.read_text(errors='replace'), flags=re.MULTILINE)
    return done.returncode == 0, seconds, failed or ([f'{path} (exit {done.returncode})'] if done.returncode else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('files', nargs='*', default=DDS_FILES)
    parser.add_argument('--runs', type=int, default=5)
    parser.add_argument('--busy-per-core', type=int, default=2)
    parser.add_argument('--log-dir', type=Path, default=ROOT / 'artifacts' / 'stress-test')
    args = parser.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))        # stop the busy processes on the way out
    cores = os.cpu_count() or 1
    busy = start_busy(args.busy_per_core * cores)
    passes = collections.Counter()
    failures = collections.defaultdict(collections.Counter)
    durations = collections.defaultdict(list)
    started = time.monotonic()
    print(f'{len(args.files)} file(s), {args.runs} run(s), {len(busy)} busy processes on {cores} cores; logs in '
          f'{args.log_dir}', flush=True)
    try:
        for run in range(1, args.runs + 1):
            for path in args.files:
                log = args.log_dir / f'run{run}_{Path(path).stem}.log'
                passed, seconds, failed = run_file(path, log)
                passes[path] += int(passed)
                durations[path].append(seconds)
                for test in failed:
                    failures[path][test] += 1
                print(f'run {run}/{args.runs} {path}: {"passed" if passed else "FAILED " + ", ".join(failed)} '
                      f'({seconds:.0f} s)', flush=True)
    finally:
        stop_busy(busy)
    print(f'\nstress test: {args.runs} run(s) under {args.busy_per_core} busy processes per core ({cores} cores), '
          f'{(time.monotonic() - started) / 60:.0f} min\n')
    print('| file | runs passed | slowest run | failures |')
    print('|---|---|---|---|')
    for path in args.files:
        failed = '; '.join(f'{test} x{count}' for test, count in failures[path].items()) or '-'
        print(f'| {path} | {passes[path]}/{args.runs} | {max(durations[path]):.0f} s | {failed} |')
    return 0 if all(passes[path] == args.runs for path in args.files) else 1


if __name__ == '__main__':
    sys.exit(main())
