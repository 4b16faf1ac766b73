"""The GPU fast path: a static workspace, the whole denoise loop as one CUDA graph, the prefix as a
graph, prompt-length buckets. Runtime-side and family-agnostic.

A family supplies three calls (declared by policy/family.py, PolicyModel and PolicyFamily; the seam in
docs/architecture.md):

    workspace_spec(context) -> ((prefix tensor [.., P, D], full length), ...)
        the workspaces its loop reads: each is one of the entry's named tensors (a K/V prefix, projected
        cross K/V, ...) extended along its token axis (the one before last) to the full length; a family
        whose loop only reads its context gives none.
    chunk_setup(context, state, noise, num_steps, *, rtc keywords, workspace=buffers) -> chunk
        per chunk, eager: the state part of the workspace, the suffix layout, the time terms, the RTC
        guide. ``workspace`` are buffers this module owns whose prefix parts already hold the entry's.
    euler_loop(chunk) -> actions [B, H, A] fp32
        every Euler step (and the closed-form RTC guidance) from the chunk's tensors only: no host sync,
        no Python branch on a tensor value, so it can be captured as one CUDA graph.

This module owns the buffers, the capture and the replay, one job each:

- ``StaticWorkspace``: the workspaces at one prefix length (bucket); the entry's tensors are copied in
  only when the workspace does not already hold that entry, decided by an ``EntryToken`` (cache key +
  generation counter), never by ``id()``.
- ``tree_signature`` / ``tree_clone`` / ``tree_copy_``: a chunk (dataclasses, lists, dicts, tensors, contexts)
  as static inputs: cloned once at capture, copied into on every replay (noise, state part, RTC leftover and weights).
- ``GraphCache``: captured graphs, LRU, bounded by count and by bytes: every graph's private pool and
  static inputs plus the static workspaces (once each), one budget for the denoise and the prefix.
- ``StaticDenoiser``: the denoise through the workspace; ``graphs=False`` runs the very code a graph
  replays eagerly (the CPU path and the tests), ``graphs=True`` replays one graph per (family,
  cameras, bucket, num_steps, chunking mode, dtype).
- ``PrefixGraphs``: fill_prefix over the family's prefix inputs as a graph per input shape (families whose
  capabilities say the prefix is capturable); every replay's output is copied into a fresh context, so no
  cache entry is ever graph-owned memory.
- Graphs are captured only inside ``capture_window``, which the warm-up opens (runtime/warmup.py: every
  bucket, every chunking mode); a tick never captures. A shape without a graph runs eagerly, counted per
  reason (not captured at warm-up, capture failed: its cause, evicted, larger than the budget) for
  /diagnostics; a failed capture logs its cause once and that shape is never tried again (``strict``, for
  ``cuda_graphs: on``: it raises instead). The capture itself is graph_capture.py.
- ``prompt_bucket`` / ``fit_to_bucket``: the language tokens padded (masked) to the smallest bucket that
  holds them; by default one bucket at tokenizer_max_length (what the tokenizer already pads to).

Manual ``torch.cuda.graph`` capture (Jetson's aarch64 wheels ship without Triton); ``torch.compile`` of
the loop is an option, off by default. Sources of the pattern: sglang's VLA cuda_graph.py (static
context, digest-guarded copy-in), Dexmal realtime-vla (all steps in one graph); see
../shared/reference/gpu-fast-path.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, Iterable, Iterator, Optional, Sequence, Set, Tuple

import numpy as np
import torch

from .cache.context import PrefixContext
from . import graph_capture
from .graph_capture import CapturedGraph, GraphCapturer, failure_reason

LOG = logging.getLogger(__name__)

CUDA_GRAPH_MODES = ('auto', 'on', 'off')
DEFAULT_MAX_GRAPHS = 16
DEFAULT_MAX_GRAPH_BYTES = 2 << 30


class FastPathError(ValueError):
    """The fast path was required (``cuda_graphs: on``) and cannot work here (a configure error)."""


def resolve_cuda_graphs(mode: str, device: torch.device) -> bool:
    """'auto': graphs on a CUDA device; 'on': required (refused without CUDA); 'off': never."""
    if mode not in CUDA_GRAPH_MODES:
        raise ValueError(f'cuda_graphs must be one of {CUDA_GRAPH_MODES}, got {mode!r}')
    capturable = device.type in graph_capture.CAPTURE_DEVICE_TYPES
    if mode == 'on' and not capturable:
        raise FastPathError(f'cuda_graphs is "on", but the policy runs on {device.type}: CUDA graphs need a CUDA '
                            'device. Use cuda_graphs "auto" (graphs only where CUDA is) or "off".')
    return mode != 'off' and capturable


def denoise_program(policy: Any) -> Optional[Any]:
    """The loaded family (policy/family.py PolicyFamily: ``workspace_spec``, ``chunk_setup(..., workspace=)``,
    ``euler_loop``) when its capabilities say the loop is capturable, else None (it then runs eagerly)."""
    return policy if policy.capabilities.capturable_denoise else None


# ---- prompt-length buckets ------------------------------------------------------------------------------

def prompt_bucket(valid_tokens: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``valid_tokens`` (buckets ascending; the last is tokenizer_max_length)."""
    for bucket in buckets:
        if valid_tokens <= bucket:
            return int(bucket)
    return int(buckets[-1])


def check_buckets(buckets: Optional[Sequence[int]], max_length: int) -> Tuple[int, ...]:
    """Buckets ascending, unique, in (0, max_length], ending at max_length (added when missing)."""
    values = sorted({int(b) for b in (buckets or ())} | {int(max_length)})
    if values[0] < 1 or values[-1] > max_length:
        raise ValueError(f'prompt buckets must be in [1, {max_length}] (tokenizer_max_length), got {list(buckets)}')
    return tuple(values)


def fit_to_bucket(tokens: np.ndarray, mask: np.ndarray, buckets: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
    """Right-padded ids/mask [L] -> [bucket]: only masked padding is dropped (the valid tokens always fit)."""
    valid = int(np.count_nonzero(mask))
    bucket = prompt_bucket(valid, buckets)
    if bucket >= len(tokens):
        return tokens, mask
    if mask[bucket:].any():
        raise ValueError('the prompt mask is not right-padded')
    return tokens[:bucket], mask[:bucket]


# ---- chunk trees as static inputs ------------------------------------------------------------------------

def tree_signature(obj: Any) -> Hashable:
    """What a graph captured on ``obj`` depends on: structure, tensor shapes/dtypes/devices, plain values."""
    if isinstance(obj, torch.Tensor):
        return ('tensor', tuple(obj.shape), str(obj.dtype), str(obj.device))
    if isinstance(obj, PrefixContext):
        return ('context',) + tuple((name, tree_signature(tensor)) for name, tensor in obj.items())
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__,) + tuple(tree_signature(item) for item in obj)
    if isinstance(obj, dict):
        return ('dict',) + tuple((key, tree_signature(obj[key])) for key in sorted(obj))
    if dataclasses.is_dataclass(obj):
        fields = tuple((f.name, tree_signature(getattr(obj, f.name))) for f in dataclasses.fields(obj))
        return (type(obj).__qualname__,) + fields
    raise TypeError(f'cannot use a {type(obj).__name__} as a graph input')


def tree_clone(obj: Any, keep: Tuple[torch.Tensor, ...] = ()) -> Any:
    """A copy of ``obj`` with every tensor cloned (fresh storage), except the tensors in ``keep`` (by object)."""
    if isinstance(obj, torch.Tensor):
        return obj if any(obj is kept for kept in keep) else obj.clone()
    if isinstance(obj, PrefixContext):
        return obj.map(lambda tensor: tree_clone(tensor, keep))
    if isinstance(obj, list):
        return [tree_clone(item, keep) for item in obj]
    if isinstance(obj, tuple):
        return tuple(tree_clone(item, keep) for item in obj)
    if isinstance(obj, dict):
        return {key: tree_clone(value, keep) for key, value in obj.items()}
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{f.name: tree_clone(getattr(obj, f.name), keep)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def tree_copy_(dst: Any, src: Any) -> None:
    """Copy every tensor of ``src`` into the same place of ``dst`` (same signature), in place."""
    if isinstance(dst, torch.Tensor):
        if dst is not src:
            dst.copy_(src)
    elif isinstance(dst, (list, tuple)):
        for d, s in zip(dst, src):
            tree_copy_(d, s)
    elif isinstance(dst, (dict, PrefixContext)):
        for key, value in dst.items():
            tree_copy_(value, src[key])
    elif dataclasses.is_dataclass(dst):
        for f in dataclasses.fields(dst):
            tree_copy_(getattr(dst, f.name), getattr(src, f.name))


def tree_nbytes(obj: Any, exclude: Tuple[torch.Tensor, ...] = ()) -> int:
    """Bytes of the tensors of ``obj``, each storage once, except the tensors in ``exclude`` (by object)."""
    storages: Dict[int, int] = {}
    for tensor in _tree_tensors(obj):
        if not any(tensor is excluded for excluded in exclude):
            storage = tensor.untyped_storage()
            storages[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(storages.values())


def _tree_tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tree_tensors(item)
    elif isinstance(obj, (dict, PrefixContext)):
        for value in obj.values():
            yield from _tree_tensors(value)
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _tree_tensors(getattr(obj, f.name))


# ---- the static K/V workspace ------------------------------------------------------------------------------

@dataclass(frozen=True)
class EntryToken:
    """Which prefix a context is: its cache key (None for an uncached one) and the generation the runtime
    gave it when fill_prefix made it. A recomputed entry under the same key gets a new generation."""

    key: Optional[str]
    generation: int


class Generations:
    """Generation numbers for contexts: a new one per fill_prefix result, remembered per cache key."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)
        self._by_key: Dict[str, int] = {}
        self._lock = threading.Lock()

    def new(self, key: Optional[str]) -> EntryToken:
        with self._lock:
            generation = next(self._counter)
            if key is not None:
                self._by_key[key] = generation
            return EntryToken(key, generation)

    def token(self, key: str) -> Optional[EntryToken]:
        """The token of the entry stored under ``key`` (a hit), or None when this key was never filled here."""
        with self._lock:
            generation = self._by_key.get(key)
        return None if generation is None else EntryToken(key, generation)

    def forget_unless(self, alive: Callable[[str], bool]) -> None:
        """Drop the keys for which ``alive`` is False (those no longer in the cache): bounds the table."""
        with self._lock:
            for key in [k for k in self._by_key if not alive(k)]:
                del self._by_key[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)


class StaticWorkspace:
    """The buffers a family's loop reads (``workspace_spec``) at one prefix length P (a bucket).

    ``load(spec, token)`` copies the entry's prefix tensors into the prefix parts unless the workspace already
    holds that entry (same token). The rest of each buffer is the family's (state token, action tokens),
    written per chunk or per step.
    """

    def __init__(self, spec: Sequence[Tuple[torch.Tensor, int]]) -> None:
        self.buffers: Tuple[torch.Tensor, ...] = tuple(
            source.new_zeros(*source.shape[:-2], int(length), source.shape[-1]) for source, length in spec)
        self.resident: Optional[EntryToken] = None
        self.copies = 0

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def load(self, spec: Sequence[Tuple[torch.Tensor, int]], token: EntryToken) -> bool:
        """Make the prefix parts hold the entry ``spec`` describes; returns whether a copy was needed."""
        if self.resident == token:
            return False
        self.resident = None                     # a failed copy leaves nothing claimed
        for buffer, (source, _) in zip(self.buffers, spec):
            buffer[..., :source.shape[-2], :].copy_(source)
        self.resident = token
        self.copies += 1
        return True


# ---- graph cache ----------------------------------------------------------------------------------------------

class GraphCache:
    """Captured graphs in LRU order, bounded by ``max_graphs`` and by ``max_bytes`` together with ``held()``,
    the bytes the budget holds outside this cache (the static workspaces, the other runner's graphs): a graph
    that does not fit beside them is not kept. Evicted graphs are dropped (their pools go back to the
    allocator)."""

    def __init__(self, max_graphs: int = DEFAULT_MAX_GRAPHS, max_bytes: int = DEFAULT_MAX_GRAPH_BYTES,
                 held: Callable[[], int] = lambda: 0) -> None:
        if max_graphs < 0 or max_bytes < 0:
            raise ValueError('graph cache bounds must be >= 0')
        self.max_graphs, self.max_bytes = int(max_graphs), int(max_bytes)
        self.held = held
        self._entries: 'OrderedDict[Hashable, CapturedGraph]' = OrderedDict()
        self.bytes = 0
        self.evictions = 0

    def get(self, key: Hashable) -> Optional[CapturedGraph]:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: Hashable, entry: CapturedGraph) -> bool:
        held = self.held()
        if self.max_graphs == 0 or entry.nbytes + held > self.max_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        self._entries[key] = entry
        self.bytes += entry.nbytes
        while len(self._entries) > self.max_graphs or self.bytes + held > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.nbytes
            self.evictions += 1
        return True

    def keys(self):
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


# ---- the runners' shared part ------------------------------------------------------------------------------

# Why a shape runs eagerly although graphs are on (/diagnostics counts the eager runs per reason).
NOT_CAPTURED = 'not captured at warm-up'
EVICTED = 'evicted from the graph cache'
TOO_LARGE = 'larger than the graph budget'


class _GraphRunner:
    """What the denoise and the prefix share: a graph cache, a capturer, ``strict`` (``cuda_graphs: on``: a
    failure raises) and ``capturing``, which only the warm-up sets (warmup.py, ``capture_window``): a tick
    never captures. A shape without a graph runs eagerly, counted per reason in ``fallbacks``; a shape whose
    capture failed or that the cache rejected is never captured again (``failed``, logged once)."""

    what = ''

    def __init__(self, family: Any, graphs: bool, strict: bool, max_graphs: int, max_graph_bytes: int,
                 capturer: Optional[GraphCapturer]) -> None:
        self.family = family
        self.graphs = bool(graphs)
        self.strict = bool(strict)
        self.capturing = False
        self.cache = GraphCache(max_graphs, max_graph_bytes)
        self.capturer = capturer or GraphCapturer()
        self.failed: Dict[Hashable, str] = {}            # shape -> why it stays eager (bounded: warm-up shapes)
        self.captured: Set[Hashable] = set()             # shapes captured once (absent from the cache: evicted)
        self.names: Dict[Hashable, str] = {}              # shape -> how logs and warm-up name it
        self.fallbacks: 'Counter[str]' = Counter()       # eager runs per reason
        self.captures = self.replays = 0

    def graph_for(self, key: Hashable, fn: Callable[[Any], Any], inputs: Any,
                  keep: Tuple[torch.Tensor, ...] = ()) -> Optional[CapturedGraph]:
        """The cached graph for ``key``; while capturing (warm-up), captured now from a static copy of
        ``inputs`` (tensors in ``keep`` are static already) when missing. None: run it eagerly."""
        entry = self.cache.get(key)
        if entry is not None:
            return entry
        if not self.capturing or key in self.failed:
            self.fallbacks[self.missing_reason(key)] += 1
            return None
        return self._capture(key, fn, inputs, keep)

    def missing_reason(self, key: Hashable) -> str:
        return self.failed.get(key) or (EVICTED if key in self.captured else NOT_CAPTURED)

    def shape_name(self, key: Hashable, inputs: Any) -> str:
        """How logs and the warm-up name a shape (subclasses say more than the key's repr)."""
        return str(key)

    def _capture(self, key: Hashable, fn: Callable[[Any], Any], inputs: Any,
                 keep: Tuple[torch.Tensor, ...]) -> Optional[CapturedGraph]:
        self.names[key] = name = self.shape_name(key, inputs)
        static = tree_clone(inputs, keep)
        try:
            entry = self.capturer.capture(fn, static)
        except Exception as exc:  # noqa: BLE001 - any capture failure: eager for that shape (strict: raise)
            reason = f'capture failed: {failure_reason(exc)}'
            self.failed[key] = reason
            if self.strict:
                raise FastPathError(f'cuda_graphs is "on" and the {self.what} graph ({name}) {reason}') from exc
            self.fallbacks[reason] += 1
            LOG.warning('the %s graph (%s): %s (then %s); that shape runs eagerly from now on', self.what, name,
                        reason, type(exc).__name__)
            return None
        entry.nbytes += tree_nbytes(static, exclude=keep)
        self.captures += 1
        self.captured.add(key)
        if not self.cache.put(key, entry):
            self.failed[key] = TOO_LARGE
            LOG.warning('the %s graph (%s) holds %d bytes; with %d bytes held already that is more than '
                        'max_graph_bytes (%d): that shape runs eagerly (this call replays it once)', self.what, name,
                        entry.nbytes, self.cache.held(), self.cache.max_bytes)
        return entry

    def uncached(self) -> Dict[str, str]:
        """Shapes met while capturing that have no graph now (by name), with the reason (what warm-up reports)."""
        keys = set(self.failed) | (self.captured - set(self.cache.keys()))
        return {self.names.get(key, str(key)): self.missing_reason(key) for key in keys}

    @property
    def capture_failures(self) -> int:
        """Shapes whose capture failed (a graph the budget rejected was captured: not a failure)."""
        return sum(reason != TOO_LARGE for reason in self.failed.values())

    def fallback_figures(self, prefix: str = '') -> Dict[str, Any]:
        reasons = '; '.join(f'{reason} x{count}' for reason, count in sorted(self.fallbacks.items()))
        return {f'{prefix}eager_fallbacks': sum(self.fallbacks.values()),
                f'{prefix}eager_fallback_reasons': reasons or 'none'}

    def replay(self, entry: CapturedGraph, inputs: Any) -> Any:
        """Copy ``inputs`` into the graph's static inputs, replay; returns the graph-owned output."""
        tree_copy_(entry.inputs, inputs)
        entry.graph.replay()
        self.replays += 1
        return entry.output


# ---- the denoise ------------------------------------------------------------------------------------------

class StaticDenoiser(_GraphRunner):
    """The denoise through a static workspace, eagerly (``graphs=False``) or as replayed CUDA graphs.

    ``family``: what ``denoise_program`` returns (``workspace_spec``, ``chunk_setup(..., workspace=)``,
    ``euler_loop``, a ``config``); ``family_name`` and the camera count go into the graph key.
    """

    what = 'denoise loop'

    def __init__(self, family: Any, *, family_name: str, graphs: bool, strict: bool = False,
                 max_graphs: int = DEFAULT_MAX_GRAPHS, max_graph_bytes: int = DEFAULT_MAX_GRAPH_BYTES,
                 compile_loop: bool = False, capturer: Optional[GraphCapturer] = None) -> None:
        super().__init__(family, graphs, strict, max_graphs, max_graph_bytes, capturer)
        self.family_name = family_name
        self.workspaces: Dict[Hashable, StaticWorkspace] = {}
        self.cache.held = lambda: self.workspace_bytes       # the workspaces count once, beside the graphs
        self.eager_runs = 0
        loop = family.euler_loop
        self._loop: Callable[[Any], torch.Tensor] = torch.compile(loop) if compile_loop else loop

    @property
    def workspace_bytes(self) -> int:
        """The static workspaces' bytes, each once (every graph of a bucket reads the same one)."""
        return sum(workspace.nbytes for workspace in self.workspaces.values())

    def workspace_for(self, spec: Sequence[Tuple[torch.Tensor, int]]) -> StaticWorkspace:
        """One workspace per shape (prefix length, batch, dtype, device): a bucket has one, shared by its graphs."""
        key = tuple((tuple(source.shape), int(length), str(source.dtype), str(source.device))
                    for source, length in spec)
        workspace = self.workspaces.get(key)
        if workspace is None:
            workspace = StaticWorkspace(spec)
            self.workspaces[key] = workspace
        return workspace

    def graph_key(self, context: PrefixContext, chunk: Any) -> Hashable:
        """(family, cameras, bucket, the context's dtypes, the chunk's signature: num_steps, chunking mode, tensor
        shapes and dtypes and everything else a graph bakes in)."""
        cameras = len(self.family.config.all_camera_names)
        dtypes = '/'.join(sorted({str(tensor.dtype).replace('torch.', '') for tensor in context.values()}))
        return (self.family_name, cameras, context.prefix_len, dtypes, tree_signature(chunk))

    def denoise(self, context: PrefixContext, token: EntryToken, state: Optional[torch.Tensor],
                noise: torch.Tensor, num_steps: int, **continuation: Any) -> torch.Tensor:
        """Normalised actions [B, H, A] fp32, as ``family.denoise`` gives them (bit for bit, eagerly)."""
        spec = self.family.workspace_spec(context)
        workspace = self.workspace_for(spec)
        workspace.load(spec, token)
        chunk = self.family.chunk_setup(context, state, noise, num_steps, workspace=workspace.buffers,
                                        **continuation)
        entry = self.graph_for(self.graph_key(context, chunk), self._loop, chunk, workspace.buffers) \
            if self.graphs else None
        if entry is not None:
            return self.replay(entry, chunk).clone()
        self.eager_runs += 1
        return self._loop(chunk)

    def shape_name(self, key: Hashable, inputs: Any) -> str:
        guide = getattr(inputs, 'guide', None)
        trained = getattr(guide, 'clamp', None) is not None
        mode = 'plain' if guide is None else ('RTC trained' if trained else 'RTC guided')
        return f'{self.family_name}, bucket {key[2]}, {getattr(inputs, "num_steps", "?")} steps, {mode}, {key[3]}'

    def describe(self) -> Dict[str, Any]:
        return {'cuda_graphs': self.graphs, 'graphs_cached': len(self.cache), 'graph_bytes': self.cache.bytes,
                'workspace_bytes': self.workspace_bytes, 'graph_evictions': self.cache.evictions,
                'graph_captures': self.captures, 'graph_replays': self.replays,
                'graph_capture_failures': self.capture_failures, **self.fallback_figures(),
                'workspace_copies': sum(w.copies for w in self.workspaces.values())}


# ---- the prefix ---------------------------------------------------------------------------------------------

class PrefixGraphs(_GraphRunner):
    """fill_prefix over the family's prefix inputs (PolicyFamily.prefix_inputs: a tuple of tensors), one graph
    per input signature; the output is cloned into a fresh context. ``graphs`` False (the runtime's choice for
    a family whose capabilities say its prefix is not capturable): the family's fill_prefix, eagerly."""

    what = 'prefix'

    def __init__(self, family: Any, *, graphs: bool, strict: bool = False, max_graphs: int = 4,
                 max_graph_bytes: int = DEFAULT_MAX_GRAPH_BYTES, capturer: Optional[GraphCapturer] = None) -> None:
        super().__init__(family, graphs, strict, max_graphs, max_graph_bytes, capturer)

    def _fill(self, inputs: Tuple[torch.Tensor, ...]) -> PrefixContext:
        return self.family.fill_prefix(*inputs)

    def fill_prefix(self, *inputs: torch.Tensor) -> PrefixContext:
        entry = self.graph_for(tree_signature(inputs), self._fill, inputs) if self.graphs else None
        if entry is None:
            return self._fill(inputs)
        return tree_clone(self.replay(entry, inputs))          # never graph-owned memory in the cache

    def shape_name(self, key: Hashable, inputs: Any) -> str:
        return 'inputs ' + ', '.join(f'{list(tensor.shape)} {str(tensor.dtype).replace("torch.", "")}'
                                     for tensor in inputs)

    def describe(self) -> Dict[str, Any]:
        return {'prefix_graphs': len(self.cache), 'prefix_graph_bytes': self.cache.bytes,
                'prefix_captures': self.captures, 'prefix_replays': self.replays,
                'prefix_capture_failures': self.capture_failures, **self.fallback_figures('prefix_')}


# ---- one runtime's fast path --------------------------------------------------------------------------------

def build_fast_path(program: Any, policy: Any, *, family_name: str, graphs: bool, device: torch.device,
                    max_graphs: int = DEFAULT_MAX_GRAPHS, max_graph_bytes: int = DEFAULT_MAX_GRAPH_BYTES,
                    compile_loop: bool = False, prefix_graphs: bool = True) -> Tuple[StaticDenoiser, PrefixGraphs]:
    """The denoise and prefix runners of one runtime, capturing on ``device`` and sharing one byte budget:
    ``max_graph_bytes`` bounds every graph's pool and static inputs and the static workspaces, together.
    ``prefix_graphs`` False (a family whose capabilities say its prefix is not capturable): the prefix runs
    eagerly even with graphs."""
    capturer = GraphCapturer(device)
    denoiser = StaticDenoiser(program, family_name=family_name, graphs=graphs, max_graphs=max_graphs,
                              max_graph_bytes=max_graph_bytes, compile_loop=compile_loop, capturer=capturer)
    prefix = PrefixGraphs(policy, graphs=graphs and prefix_graphs, max_graphs=max_graphs,
                          max_graph_bytes=max_graph_bytes, capturer=capturer)
    denoiser.cache.held = lambda: denoiser.workspace_bytes + prefix.cache.bytes
    prefix.cache.held = lambda: denoiser.workspace_bytes + denoiser.cache.bytes
    return denoiser, prefix


@contextlib.contextmanager
def capture_window(runners: Iterable[_GraphRunner], strict: bool) -> Iterator[None]:
    """While inside, the runners capture the shapes they meet (the warm-up); ``strict``: a capture failure
    raises FastPathError (``cuda_graphs: on``). Outside, a missing shape runs eagerly."""
    runners = [runner for runner in runners if runner is not None]
    for runner in runners:
        runner.capturing, runner.strict = True, strict
    try:
        yield
    finally:
        for runner in runners:
            runner.capturing = runner.strict = False
