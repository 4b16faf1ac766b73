"""Where and in what precision a runtime computes: the ``device`` / ``dtype`` / ``cpu_threads`` settings."""
from __future__ import annotations

import torch


def resolve_device(device: str) -> torch.device:
    """'' or 'auto': CUDA where it is, else the CPU; a CUDA device asked for without CUDA is a ValueError."""
    if device in ('', 'auto'):
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    resolved = torch.device(device)
    if resolved.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f'device {device!r} requested but CUDA is not available')
    return resolved


def set_cpu_threads(threads: int) -> None:
    """Bound torch's CPU thread pool (0 leaves torch's default). Process-wide."""
    if threads > 0:
        torch.set_num_threads(int(threads))


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto': bf16 on CUDA, fp32 elsewhere."""
    # No float16: the finite attention-mask value overflows to -inf there (NaN on fully masked rows).
    names = {'float32': torch.float32, 'fp32': torch.float32, 'bfloat16': torch.bfloat16, 'bf16': torch.bfloat16}
    if dtype in ('', 'auto'):
        return torch.bfloat16 if device.type == 'cuda' else torch.float32
    try:
        return names[dtype]
    except KeyError:
        raise ValueError(f'unknown dtype {dtype!r}; use auto, float32 or bfloat16') from None
