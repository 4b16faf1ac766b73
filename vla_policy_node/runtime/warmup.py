"""The warm-up: inferences before the first real tick, so that no tick is the slow one. With CUDA graphs it is
the only place graphs are captured (fast_path.capture_window): every shape a tick can meet is captured here,
through the runtime's own ``infer``, and a tick never captures."""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Sequence

import numpy as np

from ..fast_path import EVICTED, FastPathError, capture_window, prompt_bucket
from ..observation import Observation
from ..policy.rtc import RTCSettings
from .chunk import ActionChunk
from .view import RuntimeView

LOG = logging.getLogger(__name__)


def neutral_state(runtime: RuntimeView) -> np.ndarray:
    """A state that normalises to zero."""
    return runtime.state_normalizer.unnormalize(np.zeros(runtime.config.state_dim, dtype=np.float32))


def chunking_modes(config: Any, rtc_modes: Sequence[str]) -> List[Dict[str, Any]]:
    """``infer`` keywords of every chunking mode a tick can ask for (``chunking`` and ``rtc_mode`` are live
    parameters): independent, and each RTC mode the family continues a chunk with (its capabilities'
    ``rtc_modes``), trained RTC only for a checkpoint trained for it. The leftover's values and the delay are
    tensor contents of the graph's inputs; only their presence shapes a graph. The leftover is not zero: a family
    may read trailing all-zero rows as padding (GR00T's inpainting), which would leave nothing to continue."""
    leftover = np.ones((1, 1))
    modes: List[Dict[str, Any]] = [{}]
    for mode in rtc_modes:
        if mode != 'trained':
            modes.append(dict(prev_chunk_left_over=leftover, inference_delay=0, rtc=RTCSettings(mode=mode)))
        elif config.rtc_training_max_delay > 0:
            modes.append(dict(prev_chunk_left_over=leftover, inference_delay=1, rtc=RTCSettings(mode=mode)))
    return modes


def bucket_prompts(runtime: RuntimeView, state: np.ndarray) -> Dict[int, str]:
    """An instruction per prompt bucket that a prompt can reach: 'a', 'a.', 'a a', 'a a.', ... tokenized as a
    tick would (with this state, which pi0.5 puts in the prompt) until the last bucket. A bucket smaller than
    the shortest prompt is reached by no prompt and needs no graph."""
    buckets = runtime.prompt_buckets
    normalized = runtime.policy.normalize_state(state)
    found: Dict[int, str] = {}
    for words in range(1, runtime.config.tokenizer_max_length + 2):
        for instruction in (' '.join(['a'] * words), ' '.join(['a'] * words) + '.'):
            _, mask = runtime.policy.prompt_tokens(instruction, normalized)
            found.setdefault(prompt_bucket(int(np.count_nonzero(mask)), buckets), instruction)
        if buckets[-1] in found:
            break
    return found


def warm_up(runtime: RuntimeView) -> ActionChunk:
    """One inference on a blank observation, outside the cache; with CUDA graphs, one per prompt bucket and
    chunking mode at the runtime's step count (``num_steps``), capturing the prefix and denoise graphs.

    Under ``cuda_graphs: on`` a capture failure, or a shape left without a graph (the byte budget), raises
    FastPathError (a configure error); under ``auto`` it is logged and that shape runs eagerly. A shape first
    met later (num_steps changed live) runs eagerly too, counted in /diagnostics: a tick never captures."""
    cfg = runtime.config
    height, width = cfg.image_resolution
    blank = {name: np.zeros((height, width, 3), dtype=np.uint8) for name in cfg.camera_names}
    state = neutral_state(runtime)
    runners = [runner for runner in (runtime._fast, runtime._prefix_graphs) if runner is not None and runner.graphs]
    if not runners:
        return runtime.infer(Observation(blank, state, 'warm up'), seed=0, use_cache=False)
    chunks = []
    prompts = bucket_prompts(runtime, state)
    unreached = [bucket for bucket in runtime.prompt_buckets if bucket not in prompts]
    if unreached:
        LOG.info('no warm-up prompt reaches prompt bucket(s) %s (the shortest prompt is longer, or tokens come '
                 'in steps); a prompt that does runs eagerly', unreached)
    with capture_window(runners, strict=runtime.cuda_graphs == 'on'):
        for _, instruction in sorted(prompts.items()):
            for continuation in chunking_modes(cfg, runtime.policy.capabilities.rtc_modes):
                chunks.append(runtime.infer(Observation(blank, state, instruction), seed=0, use_cache=False,
                                            **continuation))
    report_graphs(runtime, runners)
    return chunks[0]


def report_graphs(runtime: RuntimeView, runners: List[Any]) -> None:
    """Log what the warm-up captured. A shape left without a graph is FastPathError under ``on``; under ``auto``
    the evicted ones are warned of here (a failed or oversized capture was logged when it happened)."""
    missing = {f'{runner.what} ({name})': reason for runner in runners for name, reason in runner.uncached().items()}
    figures = runtime.fast_path_summary()
    LOG.info('CUDA graphs captured at warm-up: %d denoise, %d prefix; %d bytes with the workspaces (budget %d)',
             figures.get('graphs_cached', 0), figures.get('prefix_graphs', 0), figures.get('fast_path_bytes', 0),
             runners[0].cache.max_bytes)
    if missing and runtime.cuda_graphs == 'on':
        text = '; '.join(f'{shape}: {reason}' for shape, reason in sorted(missing.items()))
        raise FastPathError(f'cuda_graphs is "on", but {len(missing)} shape(s) have no graph: {text}')
    evicted = sorted(shape for shape, reason in missing.items() if reason == EVICTED)
    if evicted:
        LOG.warning('cuda_graphs %s: %d graph(s) captured at warm-up were evicted (max_graphs / max_graph_bytes); '
                    'those shapes run eagerly: %s', runtime.cuda_graphs, len(evicted), '; '.join(evicted))
