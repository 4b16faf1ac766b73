"""One-shot CUDA checks, for a machine with a GPU: what the CPU suite cannot show.

    python bench/gpu_checks.py            # about a minute on one recent GPU

On the tiny checkpoint in bf16 and fp32 on CUDA: a cache hit returns bit-identical
actions to the miss (plain and with real-time chunking), the stored prefix stays
untouched, and the bf16-vs-fp32 action error. Prints figures; exits non-zero if
a hit differs from its miss. Run it beside bench/bench_runtime.py and
bench/bench_rtc.py --no-replay (see bench/README or the issue notes).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vla_policy_node.observation import Observation  # noqa: E402
from vla_policy_node.policy.rtc import RTCSettings  # noqa: E402
from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402
from vla_policy_node.runtime import PolicyRuntime  # noqa: E402


def observation(config, seed: int) -> Observation:
    rng = np.random.default_rng(seed)
    images = {name: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for name in config.camera_names}
    return Observation(images, rng.normal(0, 0.3, config.state_dim), 'pick up the red block')


def main() -> int:
    if not torch.cuda.is_available():
        print('no CUDA device')
        return 1
    failures = 0
    with tempfile.TemporaryDirectory() as scratch:
        for policy_type in ('pi0', 'pi05'):
            checkpoint = write_tiny_default(Path(scratch) / policy_type, policy_type)
            actions = {}
            for dtype in ('float32', 'bfloat16'):
                runtime = PolicyRuntime.from_pretrained(checkpoint, device='cuda', dtype=dtype)
                obs = observation(runtime.config, 1)
                miss = runtime.infer(obs, seed=3)
                stored = runtime.cache.get(miss.key).kv.clone()
                hit = runtime.infer(obs, seed=3)
                leftover = np.linspace(-0.3, 0.3, 8 * runtime.config.action_dim).reshape(8, -1)
                rtc = RTCSettings(execution_horizon=6)
                guided_hit = runtime.infer(obs, seed=3, prev_actions=leftover, inference_delay=2, rtc=rtc)
                runtime.cache.clear()
                guided_miss = runtime.infer(obs, seed=3, prev_actions=leftover, inference_delay=2, rtc=rtc)
                same = (hit.cache_hit and np.array_equal(hit.actions, miss.actions)
                        and np.array_equal(guided_hit.actions, guided_miss.actions)
                        and torch.equal(stored, runtime.cache.get(miss.key).kv))
                failures += not same
                actions[dtype] = miss.actions
                print(f'{policy_type} {dtype}: hit == miss (plain and rtc), prefix untouched: {same}; '
                      f'miss {miss.total_ms:.1f} ms, hit {hit.total_ms:.1f} ms')
            error = np.abs(actions['bfloat16'] - actions['float32'])
            print(f'{policy_type}: bf16 vs fp32 actions, max {error.max():.2e}, mean {error.mean():.2e}')
    return 1 if failures else 0


if __name__ == '__main__':
    raise SystemExit(main())
