"""The prefix context: per-layer K/V of one observation's prefix, read-only by contract."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch


@dataclass(frozen=True)
class PrefixContext:
    """K/V that the language model wrote for a prefix, plus which prefix tokens are real.

    kv [L, 2, B, K, P, D]: layer, (key, value), batch, kv heads, prefix tokens, head dim;
    keys already carry RoPE. pad_mask [B, P] bool: False for masked cameras and
    padded text. ``extra``: tensors the family keeps beside the K/V, by name (a
    family's model reads its own names: SmolVLA's ``cross_kv``, the cross-attention
    layers' projected K/V), counted in ``nbytes`` like the rest.
    Nothing writes to these tensors after ``fill_prefix`` returns: the denoise
    reads them or copies them into its own buffer, so one context can serve any
    number of chunks and be shared through the cache.
    """

    kv: torch.Tensor
    pad_mask: torch.Tensor
    extra: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kv.dim() != 6 or self.kv.shape[1] != 2:
            raise ValueError(f'kv must be [L, 2, B, K, P, D], got {tuple(self.kv.shape)}')
        if tuple(self.pad_mask.shape) != (self.kv.shape[2], self.kv.shape[4]):
            raise ValueError(f'pad_mask {tuple(self.pad_mask.shape)} does not match kv {tuple(self.kv.shape)}')
        if not all(isinstance(name, str) and isinstance(tensor, torch.Tensor) for name, tensor in self.extra.items()):
            raise ValueError('extra must map names to tensors')

    @property
    def batch_size(self) -> int:
        return int(self.kv.shape[2])

    @property
    def prefix_len(self) -> int:
        return int(self.kv.shape[4])

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    @property
    def device(self) -> torch.device:
        return self.kv.device

    @property
    def nbytes(self) -> int:
        """Device bytes held by this context (what the cache budget counts)."""
        tensors = (self.kv, self.pad_mask) + tuple(self.extra.values())
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)
