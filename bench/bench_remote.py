"""What the openpi wire adds over local inference, on loopback (prints, never asserts).

    python bench/bench_remote.py [--runs 100] [--threads 1] [--size 480x640]
    python bench/bench_remote.py --quick     # 5 runs of 96x128 frames (a smoke run)

The tiny pi0 (random weights) with three RGB frames: locally (PolicyRuntime.infer) and through the
remote backend against ``vla_policy_serve`` in its own process on 127.0.0.1, raw frames and resized to
224 on the robot. Both sides keep their prefix cache, so after the first call every inference is a hit
and the difference is the wire: client preparation and encoding, send, the server's decode and encode,
receive, and the client's reply checks. Target: <= 2 ms p50 added (raw frames).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vla_policy_node.observation import Observation  # noqa: E402
from vla_policy_node.params import resolve_values  # noqa: E402
from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402
from vla_policy_node.remote_settings import load_remote  # noqa: E402
from vla_policy_node.runtime import PolicyRuntime, set_cpu_threads  # noqa: E402
from serve_process import start_server  # noqa: E402

JOINTS = [f'joint_{i}' for i in range(1, 7)]


def percentiles(values):
    array = np.asarray(values)
    return float(np.percentile(array, 50)), float(np.percentile(array, 95))


def measure_local(runtime, observation, runs):
    runtime.infer(observation, seed=0)                    # the miss; then hits
    totals = []
    for _ in range(runs):
        start = time.perf_counter()
        runtime.infer(observation, seed=0)
        totals.append((time.perf_counter() - start) * 1e3)
    return totals


def measure_remote(backend, observation, runs):
    backend.infer(observation, seed=0)
    figures = {'total': [], 'encode': [], 'wire': [], 'decode': []}
    for _ in range(runs):
        start = time.perf_counter()
        chunk = backend.infer(observation, seed=0)
        figures['total'].append((time.perf_counter() - start) * 1e3)
        figures['encode'].append(chunk.timings_ms['preprocess'])        # frames, checks, msgpack
        # send -> reply received, less the server's own inference: both sockets, the server's decode/encode
        figures['wire'].append(chunk.timings_ms['denoise'] - chunk.timings_ms['server_ms'])
        figures['decode'].append(chunk.timings_ms['hash'])               # reply decode and checks
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--runs', type=int, default=100)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--size', default='480x640', help='camera frame HxW')
    parser.add_argument('--quick', action='store_true', help='5 runs, 96x128 frames')
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.size = 5, '96x128'
    height, width = (int(v) for v in args.size.split('x'))
    set_cpu_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix='bench_remote_'))
    checkpoint = write_tiny_default(work / 'tiny_pi0', 'pi0')
    runtime = PolicyRuntime.from_pretrained(checkpoint, device='cpu', dtype='float32')
    rng = np.random.default_rng(0)
    frames = {name: rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
              for name in runtime.config.camera_names}
    observation = Observation(frames, np.zeros(runtime.config.state_dim), 'pick up the red block')
    proc, port = start_server(checkpoint, work / 'serve.log', threads=args.threads)
    try:
        local = measure_local(runtime, observation, args.runs)
        local_p50, local_p95 = percentiles(local)
        print(f'tiny pi0, 3 x {height}x{width} rgb8, cache hits, {args.runs} runs, {args.threads} thread(s), CPU')
        print(f'{"path":<22} {"total p50/p95":>14} {"added p50":>10} {"encode p50/p95":>15} '
              f'{"wire p50/p95":>14} {"decode p50/p95":>15}   (ms)')
        print(f'{"local":<22} {local_p50:>6.2f} / {local_p95:<5.2f}')
        for label, size in (('remote, raw frames', 0), ('remote, resized 224', 224)):
            values = resolve_values({'backend': 'remote', 'remote_url': f'ws://127.0.0.1:{port}/',
                                     'remote_key_layout': 'cameras', 'remote_image_size': size,
                                     'remote_timeout_sec': 30.0, 'joint_names': JOINTS, 'instruction': 'x'})
            backend = load_remote(values)
            try:
                figures = measure_remote(backend, observation, args.runs)
            finally:
                backend.close()
            cells = {name: percentiles(series) for name, series in figures.items()}
            print(f'{label:<22} {cells["total"][0]:>6.2f} / {cells["total"][1]:<5.2f} '
                  f'{cells["total"][0] - local_p50:>+10.2f} ' + ' '.join(
                      f'{cells[name][0]:>7.2f} / {cells[name][1]:<5.2f}' for name in ('encode', 'wire', 'decode')))
        print('added = remote total p50 - local total p50; encode + wire + decode is what the wire costs '
              '(wire = round trip - the server\'s own infer_ms). Target: <= 2 ms p50 added.')
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
