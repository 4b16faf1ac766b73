"""How a local runtime describes itself: /diagnostics and the replay summary (``describe``), the configure
log line (``summary``), the fast path's figures and the analytic size of one cached prefix."""
from __future__ import annotations

from typing import Any, Dict

import torch

from ..policy.quant import KERNELS, model_bytes
from .view import RuntimeView


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace('torch.', '')


def prefix_bytes(config: Any, dtype: torch.dtype) -> int:
    """Analytic device bytes of one cached prefix (K/V only, the family's extra K/V included)."""
    element = torch.tensor([], dtype=dtype).element_size()
    return config.kv_entry_bytes(element)


def fast_path_summary(runtime: RuntimeView) -> Dict[str, object]:
    """The fast path's figures (fast_path.py): cuda_graphs mode, prompt buckets, graphs captured, replayed and
    cached, eager fallbacks with their reasons, workspace copies, and the bytes max_graph_bytes bounds
    (``fast_path_bytes``: the graphs' pools and static inputs and the workspaces)."""
    summary: Dict[str, Any] = {'cuda_graphs_mode': runtime.cuda_graphs,
                               'prompt_buckets': list(runtime.prompt_buckets)}
    for runner in (runtime._fast, runtime._prefix_graphs):
        if runner is not None:
            summary.update(runner.describe())
    if runtime._fast is not None and runtime._prefix_graphs is not None:
        summary['fast_path_bytes'] = (summary['graph_bytes'] + summary['workspace_bytes']
                                      + summary['prefix_graph_bytes'])
    return summary


def describe(runtime: RuntimeView) -> Dict[str, Any]:
    """The family's own description (policy type, cameras, prefix length, cache entry bytes ...) plus where
    and how it runs."""
    return dict(runtime.policy.describe(), backend='local', checkpoint_path=runtime.checkpoint_path,
                device=str(runtime.device), dtype=dtype_name(runtime.dtype), model_revision=runtime.model_revision,
                prefix_entry_bytes=prefix_bytes(runtime.config, runtime.dtype), **quantization_summary(runtime),
                **fast_path_summary(runtime))


def quantization_summary(runtime: RuntimeView) -> Dict[str, Any]:
    """The weights' mode, the kernel that runs it (policy/quant.py KERNELS) and the model's bytes as loaded."""
    return {'quantization': runtime.quantization, 'quantization_kernel': KERNELS[runtime.quantization_kernel],
            'weight_bytes': model_bytes(runtime.model)}


def summary(runtime: RuntimeView) -> str:
    """The backend's part of the configure log line."""
    return (f'loaded {runtime.config.policy_type} from {runtime.checkpoint_path or "a checkpoint"} on '
            f'{runtime.device} ({runtime.dtype}{quantized(runtime)}); one cached prefix = '
            f'{prefix_bytes(runtime.config, runtime.dtype) / 2**20:.2f} MiB')


def quantized(runtime: RuntimeView) -> str:
    """', int8_weights: <kernel>' for the configure line; '' unquantized."""
    if runtime.quantization == 'none':
        return ''
    return f', {runtime.quantization}: {KERNELS[runtime.quantization_kernel]}'
