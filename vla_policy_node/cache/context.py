"""The prefix context: what a family computes once per observation and every chunk of it reads, read-only.

A context is a named mapping of tensors with an explicit batch size and token length. Each tensor says where
its batch axis is and, when it runs over tokens, which axis and which token sequence (``ContextAxes``); each
sequence has a bool mask [B, T] among the tensors (True: a real token). The primary sequence is ``PREFIX``,
whose length is ``prefix_len``. Nothing here knows a family: a family's model names its own tensors.

- A K/V prefix (a VLM's per-layer keys and values, ``kv_prefix_context``) is one case: ``kv`` [L, 2, B, K, P, D]
  and ``pad_mask`` [B, P], plus tensors laid out like the K/V (a cross-attention stack's projected K/V).
- A feature context is another: processed backbone features [B, T, D] with their masks, and per-layer K/V
  gathered to a token subset with a mask of its own (a sequence of its own, so of its own length).

Because every tensor declares its axes, several robots' contexts of different token lengths stack into one
batch generically (``stack_contexts``: each sequence right-padded to the longest with masked zeros, then
concatenated along the batch axes; ``can_stack`` says whether they can), and one row of a batched context is a
context of its own (``context_row``: a prefix filled for several robots at once, stored per robot). Nothing
writes to the tensors after the family returns the context: the denoise reads them or copies them into its own
buffers, so one context serves any number of chunks and is shared through the cache.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Dict, Hashable, Iterator, Mapping, Optional, Sequence

import torch

# The primary token sequence of every context: its length is the context's prefix_len.
PREFIX = 'prefix'
# The names of the K/V case (kv_prefix_context).
KV = 'kv'
PAD_MASK = 'pad_mask'


@dataclass(frozen=True)
class ContextAxes:
    """Where one context tensor keeps its batch (``batch``) and, when it runs over a token sequence, that
    sequence's axis (``tokens``) and name (``sequence``; its mask is the context's ``masks[sequence]``)."""

    batch: int
    tokens: Optional[int] = None
    sequence: str = PREFIX


# [L, 2, B, K, P, D]: layer, (key, value), batch, kv heads, prefix tokens, head dim.
KV_AXES = ContextAxes(batch=2, tokens=4)
# [B, T] bool masks (and any [B, T, ...] tensor of the primary sequence).
MASK_AXES = ContextAxes(batch=0, tokens=1)


class PrefixContext(Mapping[str, torch.Tensor]):
    """A read-only mapping name -> tensor with ``batch_size`` and ``prefix_len`` (the PREFIX sequence's length).

    ``axes[name]`` says where tensor ``name`` keeps its batch and tokens; ``masks`` maps every token sequence
    a tensor runs over to the name of its bool mask [B, T] (``PREFIX`` always among them). The constructor
    checks every shape against these, so a context that says it is one robot of 200 tokens is one.
    """

    __slots__ = ('_tensors', '_axes', '_masks', '_batch_size', '_prefix_len')

    def __init__(self, tensors: Mapping[str, torch.Tensor], axes: Mapping[str, ContextAxes], *, batch_size: int,
                 prefix_len: int, masks: Mapping[str, str]) -> None:
        self._tensors = MappingProxyType(dict(tensors))
        self._axes = MappingProxyType(dict(axes))
        self._masks = MappingProxyType(dict(masks))
        self._batch_size, self._prefix_len = int(batch_size), int(prefix_len)
        self._check()

    def _check(self) -> None:
        if set(self._tensors) != set(self._axes):
            raise ValueError(f'every tensor needs its axes: tensors {sorted(self._tensors)}, axes {sorted(self._axes)}')
        if PREFIX not in self._masks:
            raise ValueError(f'masks must name the {PREFIX!r} sequence\'s mask, got {dict(self._masks)}')
        lengths = {}
        for sequence, name in self._masks.items():
            mask = self._tensors.get(name)
            if mask is None or mask.dtype != torch.bool or mask.dim() != 2 or mask.shape[0] != self._batch_size \
                    or self._axes[name] != ContextAxes(0, 1, sequence):
                raise ValueError(f'the mask of sequence {sequence!r} must be a tensor {name!r} [B={self._batch_size}, '
                                 f'T] bool with axes (0, 1, {sequence!r})')
            lengths[sequence] = int(mask.shape[1])
        if lengths[PREFIX] != self._prefix_len:
            raise ValueError(f'prefix_len {self._prefix_len} != the {PREFIX!r} mask length {lengths[PREFIX]}')
        for name, tensor in self._tensors.items():
            if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
                raise ValueError('a context maps names to tensors')
            axes = self._axes[name]
            if not -tensor.dim() <= axes.batch < tensor.dim() or tensor.shape[axes.batch] != self._batch_size:
                raise ValueError(f'{name} {tuple(tensor.shape)}: axis {axes.batch} must be the batch '
                                 f'({self._batch_size})')
            if axes.tokens is not None:
                if axes.sequence not in lengths:
                    raise ValueError(f'{name} runs over sequence {axes.sequence!r}, which has no mask')
                if not -tensor.dim() <= axes.tokens < tensor.dim() \
                        or tensor.shape[axes.tokens] != lengths[axes.sequence]:
                    raise ValueError(f'{name} {tuple(tensor.shape)}: axis {axes.tokens} must be the '
                                     f'{axes.sequence!r} tokens ({lengths[axes.sequence]})')

    # ---- the mapping ----------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    # A context is one entry: equal only to itself (a Mapping would compare tensors elementwise), hashable.
    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        shapes = ', '.join(f'{name}={list(tensor.shape)}' for name, tensor in self._tensors.items())
        return f'PrefixContext(batch_size={self._batch_size}, prefix_len={self._prefix_len}, {shapes})'

    # ---- what it is -----------------------------------------------------------------------------------
    @property
    def axes(self) -> Mapping[str, ContextAxes]:
        return self._axes

    @property
    def masks(self) -> Mapping[str, str]:
        """Token sequence -> the name of its bool mask [B, T]."""
        return self._masks

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def prefix_len(self) -> int:
        """Tokens of the primary sequence (``PREFIX``): a prompt bucket or a robot's own length."""
        return self._prefix_len

    @property
    def device(self) -> torch.device:
        return next(iter(self._tensors.values())).device

    @property
    def nbytes(self) -> int:
        """Device bytes held by this context, every tensor (what the cache budget counts)."""
        return sum(tensor.numel() * tensor.element_size() for tensor in self._tensors.values())

    def signature(self) -> Hashable:
        """What code specialised to this context depends on: each tensor's name, shape and dtype, in order."""
        return tuple((name, tuple(tensor.shape), str(tensor.dtype)) for name, tensor in self._tensors.items())

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> 'PrefixContext':
        """The same context with ``fn`` applied to every tensor (a clone, a device move); shapes must stay."""
        return PrefixContext({name: fn(tensor) for name, tensor in self._tensors.items()}, self._axes,
                             batch_size=self._batch_size, prefix_len=self._prefix_len, masks=self._masks)


def kv_prefix_context(kv: torch.Tensor, pad_mask: torch.Tensor, **like_kv: torch.Tensor) -> PrefixContext:
    """The K/V case: per-layer K/V ``kv`` [L, 2, B, K, P, D] (keys already rotated) and ``pad_mask`` [B, P] bool
    (False: a masked camera or padded text), plus the family's tensors laid out like the K/V ([.., 2, B, K', P,
    D'], e.g. a cross-attention stack's projected K/V), by name."""
    if kv.dim() != 6 or kv.shape[1] != 2:
        raise ValueError(f'kv must be [L, 2, B, K, P, D], got {tuple(kv.shape)}')
    if tuple(pad_mask.shape) != (kv.shape[2], kv.shape[4]):
        raise ValueError(f'pad_mask {tuple(pad_mask.shape)} does not match kv {tuple(kv.shape)}')
    tensors = {KV: kv, PAD_MASK: pad_mask, **like_kv}
    axes = {name: KV_AXES for name in tensors}
    axes[PAD_MASK] = MASK_AXES
    return PrefixContext(tensors, axes, batch_size=kv.shape[2], prefix_len=kv.shape[4], masks={PREFIX: PAD_MASK})


def can_stack(contexts: Sequence[PrefixContext]) -> bool:
    """Whether ``stack_contexts`` takes these: the same tensor names with the same axes and sequences, and each
    tensor of one dtype and device whose shape differs only along its batch axis and its token axis."""
    if not contexts:
        return False
    first = contexts[0]
    if any(dict(other.axes) != dict(first.axes) or dict(other.masks) != dict(first.masks) for other in contexts):
        return False
    for name, axes in first.axes.items():
        kept = [_kept_shape(context[name], axes) + (context[name].dtype, context[name].device)
                for context in contexts]
        if any(shape != kept[0] for shape in kept[1:]):
            return False
    return True


def _kept_shape(tensor: torch.Tensor, axes: ContextAxes) -> tuple:
    """The tensor's shape without its batch and token axes: what must agree for contexts to stack."""
    varying = {axes.batch % tensor.dim()} | ({axes.tokens % tensor.dim()} if axes.tokens is not None else set())
    return (tensor.dim(),) + tuple(size for axis, size in enumerate(tensor.shape) if axis not in varying)


def stack_contexts(contexts: Sequence[PrefixContext]) -> PrefixContext:
    """One context holding ``contexts`` one after the other along the batch: every token sequence right-padded
    to its longest with zeros (masks: False, so a padded token is a masked one), then each tensor concatenated
    along its batch axis. ValueError unless ``can_stack(contexts)``."""
    if not contexts:
        raise ValueError('nothing to stack')
    if not can_stack(contexts):
        raise ValueError('contexts of different layouts do not stack (names, axes, masks, dtypes or the sizes '
                         'besides batch and tokens differ)')
    first = contexts[0]
    lengths: Dict[str, int] = {sequence: max(c[name].shape[1] for c in contexts)
                               for sequence, name in first.masks.items()}
    stacked = {}
    for name, axes in first.axes.items():
        parts = [_pad_tokens(c[name], axes, lengths) for c in contexts]
        stacked[name] = torch.cat(parts, dim=axes.batch)
    return PrefixContext(stacked, first.axes, batch_size=sum(c.batch_size for c in contexts),
                         prefix_len=lengths[PREFIX], masks=first.masks)


def context_row(context: PrefixContext, row: int) -> PrefixContext:
    """Row ``row`` of a batched context as a context of one, every tensor copied (a cache entry must not keep the
    whole batch's storage alive, and the cache's budget counts what an entry holds). Token lengths stay: a row
    of ``stack_contexts``' output keeps its masked padding."""
    if not 0 <= row < context.batch_size:
        raise ValueError(f'row {row} of a context of {context.batch_size}')
    return PrefixContext({name: tensor.narrow(context.axes[name].batch, row, 1).clone()
                          for name, tensor in context.items()},
                         context.axes, batch_size=1, prefix_len=context.prefix_len, masks=context.masks)


def _pad_tokens(tensor: torch.Tensor, axes: ContextAxes, lengths: Mapping[str, int]) -> torch.Tensor:
    if axes.tokens is None:
        return tensor
    axis = axes.tokens % tensor.dim()
    missing = lengths[axes.sequence] - tensor.shape[axis]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = missing
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=axis)
