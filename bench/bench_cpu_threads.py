"""cpu_threads: auto (0) against torch's default (-1) and fixed counts, through vla_policy_replay.

    python bench/bench_cpu_threads.py [--settings -1,0,1,2] [--repeats 3] [--competitors 1]
    python bench/bench_cpu_threads.py --quick    # auto and 1 thread, one 1 s replay each, no competitor

Each run is a real ``vla_policy_replay`` process on the sample bag with the shipped
config/vla_policy.yaml (builtin:demo), only ``cpu_threads`` changed; settings alternate within
each repeat so a shared machine's load drifts over all of them alike. ``--competitors N`` runs N
busy processes beside it, standing in for the camera drivers / bag player a robot's node shares its
CPUs with. Prints per setting the median over repeats of the replay's latency p50/p95 (total) and
denoise p50, and each as a ratio to auto. Nothing is asserted (timing never goes into tests).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _busy(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10000))


def _replay(bag: Path, params: Path, out: Path) -> dict:
    script = BIN / 'vla_policy_replay'
    command = [str(script)] if script.exists() else [sys.executable, '-m', 'vla_policy_node.replay.cli']
    subprocess.run(command + [str(bag), '--params', str(params), '--output', str(out), '--no-progress'],
                   check=True, capture_output=True, timeout=900)
    return json.loads((out / 'summary.json').read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--settings', default='-1,0,1,2', help='cpu_threads values (default -1,0,1,2)')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--duration', type=float, default=4.0, help='sample bag seconds (default 4)')
    parser.add_argument('--competitors', type=int, default=1, help='busy processes beside the replay (default 1)')
    parser.add_argument('--quick', action='store_true', help='settings 0,1, one repeat, a 1 s bag, no competitor')
    args = parser.parse_args(argv)
    if args.quick:
        args.settings, args.repeats, args.duration, args.competitors = '0,1', 1, 1.0, 0
    settings = [int(v) for v in args.settings.split(',')]
    from vla_policy_node.settings import cpu_threads, usable_cpus

    work = Path(tempfile.mkdtemp(prefix='bench_cpu_threads.'))
    bag = work / 'bag'
    subprocess.run([sys.executable, '-m', 'vla_policy_node.replay.make_bag', str(bag), '--duration',
                    str(args.duration)], check=True, capture_output=True, timeout=300)
    shipped = yaml.safe_load((ROOT / 'config' / 'vla_policy.yaml').read_text())
    section = next(iter(shipped))
    results = {setting: [] for setting in settings}
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=_busy, args=(stop,), daemon=True) for _ in range(args.competitors)]
    for process in busy:
        process.start()
    try:
        for repeat in range(args.repeats):
            for setting in settings:
                document = json.loads(json.dumps(shipped))
                document[section]['ros__parameters']['cpu_threads'] = setting
                params = work / f'params_{setting}.yaml'
                params.write_text(yaml.safe_dump(document))
                summary = _replay(bag, params, work / f'out_{setting}_{repeat}')
                latency = summary['latency_ms']
                results[setting].append((latency['total']['p50'], latency['total']['p95'], latency['denoise']['p50']))
                print(f'repeat {repeat} cpu_threads {setting:>2}: total p50 {latency["total"]["p50"]:8.1f} ms, '
                      f'p95 {latency["total"]["p95"]:8.1f} ms', file=sys.stderr)
    finally:
        stop.set()
        for process in busy:
            process.join(timeout=5)
        shutil.rmtree(work, ignore_errors=True)         # the bag and every replay's report
    cpus = usable_cpus()
    print(f'{cpus} usable CPUs, {args.competitors} busy competitor(s), {args.repeats} repeats, '
          f'{args.duration:g} s bag; medians over repeats')
    medians = {s: [statistics.median(run[i] for run in runs) for i in range(3)] for s, runs in results.items()}
    base = medians.get(0)
    print('| cpu_threads | torch threads | total p50 ms | total p95 ms | denoise p50 ms | p95 / auto |')
    print('|---|---|---|---|---|---|')
    for setting, (p50, p95, denoise) in medians.items():
        threads = cpu_threads(setting) or 'torch default'
        ratio = f'{p95 / base[1]:.1f}x' if base else '-'
        label = {0: '0 (auto)', -1: '-1 (torch default)'}.get(setting, str(setting))
        print(f'| {label} | {threads} | {p50:.1f} | {p95:.1f} | {denoise:.1f} | {ratio} |')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
