"""A strict stand-in for CUDA graph capture on the CPU, so the fast path is proven as far as a CPU can prove it.

``with CaptureStandIn() as standin:`` replaces the ``torch.cuda`` calls the capture path makes (device
contexts, streams, events, ``CUDAGraph``, pool handles, synchronisation, memory figures, torch's private pool
calls) with fakes and lets 'cpu' be a capture device (graph_capture.CAPTURE_DEVICE_TYPES). Everything else is
the real code: ``PolicyRuntime.from_pretrained(..., device='cpu', cuda_graphs='on')`` configures, warms up and
captures through fast_path.py / graph_capture.py exactly as on a GPU, and ``torch.cuda.graph`` is torch's own
context manager (so its ``__exit__``, which leaves the capture stream current when ``capture_end`` raises, is
torch's). The stand-in works outside pytest too (bench/gpu_checks.py --device cpu --dry-run).

How it stands in for a device:

- CPU tensors stand for tensors of CUDA device ``device_index`` (0 unless told). The side-stream warm-up runs
  unchecked and for real, as on a GPU: it may allocate, synchronise, read values.
- Between ``capture_begin`` and ``capture_end`` a TorchFunctionMode and a TorchDispatchMode are active. Each
  operation is checked (below) and recorded on a tape: the op, its arguments (the very tensors) and the tensors
  it made. A replay runs the tape again on the same tensors, writing each op's results into the tensors the
  capture made, so, like a CUDA graph, it reads whatever its input memory holds at replay time and bakes in
  every Python value (a forgotten input is a stale result, a Python branch taken at capture is taken forever).
- After the capture the graph's own tensors are poisoned (NaN, or a sentinel for integers) and every tensor the
  capture wrote that existed before it is put back: a real capture launches nothing, so reading a result
  before the first replay is an error here as there.
- A capture begun while another device is current (a stream of the wrong device) records nothing, as CUDA
  records nothing of a device whose stream is not capturing: an empty graph whose replays leave stale outputs.
- The allocator's private pools are modelled (begin/end/release, use counts, each pool's bytes as the storages
  its capture made), so a failed capture that leaves the pool routing, or unreleased, shows.

What it forbids while capturing (raising CaptureViolation, and failing ``capture_end`` as CUDA invalidates the
capture even when the code swallows the first error):

- ``torch.tensor`` / ``torch.as_tensor`` / ``torch.asarray`` / ``new_tensor`` of Python or NumPy values and
  ``torch.from_numpy`` (a blocking host-to-device copy; at dispatch: ``aten::lift_fresh``);
- ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``.cuda()``, ``.pin_memory()``, ``bool()`` / ``int()`` /
  ``float()`` / ``__index__`` of a tensor (at dispatch: ``aten::_local_scalar_dense``, ``is_nonzero``, ``equal``);
- ``nonzero``, ``masked_select``, ``unique``, ``repeat_interleave`` by a tensor, boolean-mask indexing and
  assignment (data-dependent shapes: a host synchronisation), ``torch.cuda.synchronize``, stream and event
  synchronisation, ``empty_cache``;
- random numbers (every op tagged ``nondeterministic_seeded``, attention with ``dropout_p`` 0 excepted): noise
  is drawn before the graph and copied in;
- factory calls (``zeros``, ``ones``, ``empty``, ``full``, ``arange``, ``linspace``, ...) without an explicit
  ``device``, or with the host named as the string 'cpu';
- ``.to()`` / ``_to_copy`` / ``copy_`` to or from another device than the capture's, and any operation on a
  tensor of another device.

What it cannot see (only a device can show these; docs/gpu.md lists them for users):

- code that branches on ``device.type``: the CPU branch runs here (GemmaMLP's split gate/up instead of the fused
  GEMM, SmolVLA's MKL-packed linears), and fp8's ``torch._scaled_mm`` path (the CPU runs its reference);
- a host tensor mixed into a device op, and ``.to(torch.device('cpu'))`` named by object, when the capture device
  is itself the CPU: every tensor here is a host tensor;
- kernels that synchronise inside a library (cuBLAS/cuDNN workspace set-up, some SDPA back-ends), allocator
  behaviour (segment rounding, fragmentation: the pool figure here is the capture's storages, not the CUDA
  caching allocator's reserved segments), capture under another thread's CUDA work, and replay speed;
- numerics of CUDA kernels (bf16 GEMM accumulation order, TF32): a replay here recomputes with CPU kernels.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from vla_policy_node import graph_capture

aten = torch.ops.aten
HOST = 'cpu'
_active: Optional['CaptureStandIn'] = None


class CaptureViolation(RuntimeError):
    """An operation a CUDA graph capture forbids (or would silently get wrong)."""


# ---- what is forbidden -------------------------------------------------------------------------------------

HOST_READS = frozenset({'item', 'tolist', 'cpu', 'numpy', 'cuda', 'pin_memory', '__bool__', '__int__', '__float__',
                        '__index__', '__complex__'})
FROM_HOST = (torch.tensor, torch.as_tensor, torch.asarray, torch.from_numpy)
FACTORIES = (torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.linspace, torch.logspace,
             torch.eye, torch.rand, torch.randn, torch.randint, torch.randperm, torch.empty_strided,
             torch.scalar_tensor, torch.tril_indices, torch.triu_indices)
DATA_DEPENDENT = {aten.nonzero, aten.masked_select, aten._unique, aten._unique2, aten.unique_dim,
                  aten.unique_consecutive, aten.is_nonzero, aten.equal, aten._local_scalar_dense,
                  aten.lift_fresh, aten.lift_fresh_copy, aten.argwhere}
MASK_INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


def _qualname(func: Any) -> str:
    return getattr(func, '__qualname__', '') or getattr(func, '__name__', '')


def _argument(func: Any, args: tuple, kwargs: dict, name: str) -> Any:
    """The value of the op's argument ``name`` as called (its schema default when not passed; None if none)."""
    for index, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            if name in kwargs:
                return kwargs[name]
            if index < len(args) and not argument.kwarg_only:
                return args[index]
            return argument.default_value if argument.has_default_value() else None
    return None


def _tensors(value: Any) -> List[torch.Tensor]:
    return [item for item in tree_flatten(value)[0] if isinstance(item, torch.Tensor)]


def _storage_key(tensor: torch.Tensor) -> Optional[int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr() if storage.nbytes() else None


# ---- the modes --------------------------------------------------------------------------------------------

class _FunctionChecks(TorchFunctionMode):
    """Python-level calls: reads of tensor values on the host, tensors from host data, factories without a
    device, transfers named to the host."""

    def __init__(self, standin: 'CaptureStandIn') -> None:
        super().__init__()
        self.standin = standin

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _qualname(func)
        short = name.rsplit('.', 1)[-1]
        if name.startswith(('TensorBase.', 'Tensor.')) and short in HOST_READS:
            self.standin.violation(f'.{short}() of a tensor (a device-to-host read and a synchronisation)')
        if func in FROM_HOST or short == 'new_tensor':
            data = args[1] if short == 'new_tensor' and len(args) > 1 else (args[0] if args else kwargs.get('data'))
            if not isinstance(data, torch.Tensor):
                called = f'.{short}' if short == 'new_tensor' else f'torch.{short}'
                self.standin.violation(f'{called} of a Python or NumPy value (a blocking host-to-device copy)')
        if func in FACTORIES:
            device = kwargs.get('device')
            if device is None:
                self.standin.violation(f'torch.{short} without an explicit device (it allocates on the host)')
            self.standin.check_device(device, f'torch.{short}')
        if short == 'to' and name.startswith(('TensorBase.', 'Tensor.')):
            for value in list(args[1:]) + [kwargs.get('device')]:
                if isinstance(value, (str, torch.device)):
                    self.standin.check_device(value, '.to()')
        return func(*args, **kwargs)


class _DispatchChecks(TorchDispatchMode):
    """Every ATen op that reaches the dispatcher: checked, then run and recorded on the graph's tape."""

    def __init__(self, standin: 'CaptureStandIn', tape: '_Tape') -> None:
        super().__init__()
        self.standin, self.tape = standin, tape

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.standin.check_op(func, args, kwargs)
        self.tape.before(func, args, kwargs)
        out = func(*args, **kwargs)
        self.tape.record(func, args, kwargs, out)
        return out


# ---- the tape ---------------------------------------------------------------------------------------------

@dataclass
class _Tape:
    """The ops a capture ran, with the tensors they made (``made``: replayed into), the storages made during
    the capture (the graph's pool) and the pre-capture contents of older storages the capture wrote."""

    entries: List[Tuple[Any, tuple, dict, List[torch.Tensor]]] = field(default_factory=list)
    made: Dict[int, torch.Tensor] = field(default_factory=dict)
    saved: Dict[int, Tuple[Any, Any]] = field(default_factory=dict)

    def before(self, func, args, kwargs) -> None:
        for index, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = kwargs.get(argument.name, args[index] if index < len(args) else None)
            for tensor in _tensors(value):
                key = _storage_key(tensor)
                if key is not None and key not in self.made and key not in self.saved:
                    storage = tensor.untyped_storage()
                    self.saved[key] = (storage, storage.clone())

    @staticmethod
    def fresh(func, out) -> List[torch.Tensor]:
        """The tensors ``out`` holds that the op made (returns without alias annotation)."""
        returns = func._schema.returns
        values = out if len(returns) > 1 else (out,)
        made = []
        for ret, value in zip(returns, values):
            if ret.alias_info is None:
                made += _tensors(value)
        return made

    def record(self, func, args, kwargs, out) -> None:
        made = self.fresh(func, out)
        for tensor in made:
            key = _storage_key(tensor)
            if key is not None:
                self.made[key] = tensor
        self.entries.append((func, args, kwargs, made))

    @property
    def nbytes(self) -> int:
        return sum(tensor.untyped_storage().nbytes() for tensor in self.made.values())

    def end(self) -> None:
        """What a capture that launched nothing leaves: the graph's tensors uninitialised, the others as before."""
        for tensor in self.made.values():
            if tensor.is_floating_point() or tensor.is_complex():
                tensor.fill_(float('nan'))
            elif tensor.dtype != torch.bool:
                tensor.fill_(torch.iinfo(tensor.dtype).max)
        for storage, contents in self.saved.values():
            storage.copy_(contents)
        self.saved.clear()

    def replay(self) -> None:
        for func, args, kwargs, made in self.entries:
            out = func(*args, **kwargs)
            for old, new in zip(made, self.fresh(func, out)):
                old.copy_(new)


# ---- the fakes --------------------------------------------------------------------------------------------

class FakeStream:
    _ids = iter(range(1, 1 << 30))

    def __init__(self, device: Any = None, priority: int = 0, default: bool = False) -> None:
        standin = _standin()
        self.device_index = standin.index_of(device)
        self.device = torch.device('cuda', self.device_index)
        self.default = default
        self.stream_id = 0 if default else next(self._ids)
        if not default:
            standin.record('stream', self.device_index)

    def wait_stream(self, other: 'FakeStream') -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> 'FakeEvent':
        event = event or FakeEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        _standin().check_sync('Stream.synchronize()')

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f'<FakeStream {self.stream_id} on cuda:{self.device_index}>'


class FakeEvent:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.device_index: Optional[int] = None

    def record(self, stream: Optional[FakeStream] = None) -> None:
        standin = _standin()
        stream = stream or standin.current_stream()
        self.device_index = stream.device_index
        standin.record('event', stream.device_index)

    def synchronize(self) -> None:
        _standin().check_sync('Event.synchronize()')

    def wait(self, stream: Optional[FakeStream] = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: 'FakeEvent') -> float:
        return 0.0


class FakeDevice:
    """torch.cuda.device(d): makes a device current for the block (cpu: the device the CPU tensors stand for)."""

    def __init__(self, device: Any) -> None:
        self.index = None if device is None or device == -1 else _standin().index_of(device)

    def __enter__(self) -> None:
        standin = _standin()
        self.previous = standin.current_device()
        if self.index is not None:
            standin.set_device(self.index)
            standin.record('device', self.index)

    def __exit__(self, *exc) -> None:
        _standin().set_device(self.previous)


class FakeStreamContext:
    """torch.cuda.stream(s): makes s current (and its device) for the block; restores both on exit."""

    def __init__(self, stream: Optional[FakeStream]) -> None:
        self.stream = stream

    def __enter__(self) -> None:
        standin = _standin()
        self.previous_device = standin.current_device()
        if self.stream is None:
            return
        self.previous_stream = standin.current_stream(self.stream.device_index)
        standin.set_device(self.stream.device_index)
        standin.set_stream(self.stream)

    def __exit__(self, *exc) -> None:
        standin = _standin()
        if self.stream is not None:
            standin.set_stream(self.previous_stream)
        standin.set_device(self.previous_device)


@dataclass
class _Pool:
    use_count: int = 0
    recording: bool = False
    nbytes: int = 0


class FakeGraph:
    """torch.cuda.CUDAGraph: capture_begin / capture_end as torch's C++ (the checks, the pool's life), a tape."""

    def __init__(self, keep_graph: bool = False) -> None:
        self.standin = _standin()
        self.tape: Optional[_Tape] = None
        self.pool_id: Optional[Tuple[int, int]] = None
        self.ended = False
        self.empty = False
        self._modes: List[Any] = []

    def capture_begin(self, pool: Any = None, capture_error_mode: str = 'global', **_: Any) -> None:
        _standin().begin(self, pool)

    def capture_end(self) -> None:
        _standin().end(self)

    def replay(self) -> None:
        if not self.ended:
            raise RuntimeError('Called CUDAGraph::replay without a preceding successful capture.')
        _standin().replays += 1
        if not self.empty:
            with torch.inference_mode():
                self.tape.replay()

    def pool(self) -> Tuple[int, int]:
        if not self.ended:
            raise RuntimeError('Called CUDAGraph::pool() without a preceding successful capture.')
        return self.pool_id

    def reset(self) -> None:
        if self.ended:
            self.standin.release_pool(self.pool_id)
            self.ended = False
        self.tape = None

    def __del__(self) -> None:
        if self.standin is _active:
            self.reset()


def _standin() -> 'CaptureStandIn':
    if _active is None:
        raise RuntimeError('the capture stand-in is not installed')
    return _active


# ---- the stand-in -----------------------------------------------------------------------------------------

class CaptureStandIn:
    """Installs the fakes (a context manager); ``device_index``: the CUDA device the CPU tensors stand for.

    ``records``: (what, device index) for every device context entered, stream made, capture begun and event
    recorded; ``violations``: every forbidden operation met while capturing; ``captures`` / ``replays``."""

    def __init__(self, device_index: int = 0) -> None:
        self.device_index = device_index
        self.tensor_device = torch.device(HOST)
        self.records: List[Tuple[str, int]] = []
        self.violations: List[str] = []
        self.captures = self.replays = 0
        self.pools: Dict[Tuple[int, int], _Pool] = {}
        self.capturing: Optional[FakeGraph] = None
        self._local = threading.local()
        self._saved: List[Tuple[Any, str, Any]] = []
        self._default_streams: Dict[int, FakeStream] = {}

    # -- installing --
    def __enter__(self) -> 'CaptureStandIn':
        global _active
        if _active is not None:
            raise RuntimeError('a capture stand-in is installed already')
        _active = self
        cuda = torch.cuda
        fakes = {
            (cuda, 'device'): FakeDevice, (cuda, 'current_device'): self.current_device,
            (cuda, 'set_device'): lambda device: self.set_device(self.index_of(device)),
            (cuda, 'Stream'): FakeStream, (cuda, 'Event'): FakeEvent, (cuda, 'stream'): FakeStreamContext,
            (cuda, 'current_stream'): self.current_stream, (cuda, 'default_stream'): self.default_stream,
            (cuda, 'set_stream'): self.set_stream, (cuda, 'synchronize'): self.synchronize,
            (cuda, 'empty_cache'): self.empty_cache, (cuda, 'CUDAGraph'): FakeGraph,
            (cuda, 'graph_pool_handle'): self.graph_pool_handle, (cuda, 'memory_snapshot'): self.memory_snapshot,
            (cuda, 'memory_reserved'): self.memory_bytes, (cuda, 'memory_allocated'): self.memory_bytes,
            (cuda, 'is_current_stream_capturing'): lambda: self.capturing is not None,
            (torch._C, '_host_emptyCache'): lambda: None,
            (torch._C, '_cuda_endAllocateToPool'): self.end_allocate_to_pool,
            (torch._C, '_cuda_releasePool'): lambda device, pool: self.release_pool(tuple(pool)),
            (cuda.graph, 'default_capture_stream'): None,
            (graph_capture, 'CAPTURE_DEVICE_TYPES'): graph_capture.CAPTURE_DEVICE_TYPES + (HOST,),
        }
        for (owner, name), fake in fakes.items():
            self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
            setattr(owner, name, fake)
        return self

    def __exit__(self, *exc) -> None:
        global _active
        for owner, name, value in reversed(self._saved):
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        self._saved.clear()
        _active = None

    # -- devices and streams --
    def index_of(self, device: Any) -> int:
        if device is None:
            return self.current_device()
        if isinstance(device, int):
            return device
        device = torch.device(device)
        if device.type == HOST:
            return self.device_index
        if device.type != 'cuda':
            raise ValueError(f'Expected a cuda device, but got: {device}')
        return self.current_device() if device.index is None else device.index

    def current_device(self) -> int:
        return getattr(self._local, 'device', 0)

    def set_device(self, index: int) -> None:
        self._local.device = index

    def default_stream(self, device: Any = None) -> FakeStream:
        index = self.index_of(device)
        if index not in self._default_streams:
            self._default_streams[index] = FakeStream(index, default=True)
        return self._default_streams[index]

    def current_stream(self, device: Any = None) -> FakeStream:
        index = self.index_of(device)
        streams = self._local.__dict__.setdefault('streams', {})
        return streams.get(index) or self.default_stream(index)

    def set_stream(self, stream: FakeStream) -> None:
        self._local.__dict__.setdefault('streams', {})[stream.device_index] = stream

    def record(self, what: str, index: int) -> None:
        self.records.append((what, index))

    # -- synchronisation and memory --
    def check_sync(self, what: str) -> None:
        if self.capturing is not None:
            self.violation(f'{what} while capturing')

    def synchronize(self, device: Any = None) -> None:
        self.check_sync('torch.cuda.synchronize()')

    def empty_cache(self) -> None:
        self.check_sync('torch.cuda.empty_cache()')

    def graph_pool_handle(self) -> Tuple[int, int]:
        return (0, next(_HANDLES))

    def memory_snapshot(self, *args: Any, **kwargs: Any) -> List[Dict[str, Any]]:
        return [{'device': self.device_index, 'segment_pool_id': pool_id, 'total_size': pool.nbytes,
                 'allocated_size': pool.nbytes} for pool_id, pool in self.pools.items() if pool.nbytes]

    def memory_bytes(self, device: Any = None) -> int:
        return sum(pool.nbytes for pool in self.pools.values())

    def end_allocate_to_pool(self, device: int, pool_id: Any) -> None:
        pool = self.pools.get(tuple(pool_id))
        if pool is None or not pool.recording:
            raise RuntimeError('endAllocatePool: not currently recording to mempool_id')
        pool.recording = False

    def release_pool(self, pool_id: Tuple[int, int]) -> None:
        pool = self.pools.get(pool_id)
        if pool is None:
            raise RuntimeError(f'releasePool: no pool {pool_id}')
        pool.use_count -= 1
        if pool.use_count <= 0:
            del self.pools[pool_id]

    def allocator_state(self) -> Dict[Tuple[int, int], Tuple[int, bool]]:
        """Pool -> (use count, recording): what a failed capture must leave as it found it."""
        return {pool_id: (pool.use_count, pool.recording) for pool_id, pool in self.pools.items()}

    # -- the capture --
    def begin(self, graph: FakeGraph, pool: Any) -> None:
        stream = self.current_stream()
        if stream.default:
            raise RuntimeError('CUDA graphs must be captured on a non-default stream.')
        if self.capturing is not None:
            raise RuntimeError('a capture is underway already')
        graph.pool_id = tuple(pool) if pool is not None else (next(_HANDLES), 0)
        graph.stream, graph.device_index = stream, self.current_device()
        state = self.pools.setdefault(graph.pool_id, _Pool())
        state.use_count += 1
        state.recording = True
        self.record('capture', graph.device_index)
        self.capturing = graph
        self._violations_at_begin = len(self.violations)
        graph.tape = _Tape()
        # A capture on another device's stream records nothing of the tensors' device (an empty graph).
        graph.empty = graph.device_index != self.device_index
        if not graph.empty:
            graph._modes = [_FunctionChecks(self), _DispatchChecks(self, graph.tape)]
            for mode in graph._modes:
                mode.__enter__()

    def end(self, graph: FakeGraph) -> None:
        if self.current_stream() is not graph.stream:
            raise RuntimeError('Capture must end on the same stream it began on.')
        for mode in reversed(graph._modes):
            mode.__exit__(None, None, None)
        graph._modes = []
        self.capturing = None
        broken = self.violations[self._violations_at_begin:]
        if broken:
            raise RuntimeError('CUDA error: operation failed due to a previous error during capture '
                               f'(cudaErrorStreamCaptureInvalidated; first: {broken[0]})')
        pool = self.pools[graph.pool_id]
        pool.recording = False
        with torch.inference_mode():
            graph.tape.end()
        pool.nbytes = graph.tape.nbytes
        graph.ended = True
        self.captures += 1

    # -- the checks --
    def violation(self, what: str) -> None:
        self.violations.append(what)
        raise CaptureViolation(f'operation not permitted when stream is capturing: {what}')

    def check_device(self, device: Any, what: str) -> None:
        """A device named in a call: the string 'cpu' is the host; anything else must be the capture's."""
        if device is None:
            return
        if isinstance(device, str) and torch.device(device).type == HOST:
            self.violation(f'{what} on the host (device {device!r})')
        if torch.device(device) != self.tensor_device:
            self.violation(f'{what} on another device ({device})')

    def check_op(self, func: Any, args: tuple, kwargs: dict) -> None:
        packet = func.overloadpacket
        if packet in DATA_DEPENDENT:
            self.violation(f'{func} (a host read or a data-dependent shape)')
        if packet == aten.repeat_interleave and _argument(func, args, kwargs, 'output_size') is None \
                and isinstance(_argument(func, args, kwargs, 'repeats'), torch.Tensor):
            self.violation(f'{func} by a tensor without output_size (a data-dependent shape)')
        if packet in MASK_INDEXING:
            indices = _argument(func, args, kwargs, 'indices') or ()
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
                self.violation(f'{func} with a boolean mask (a nonzero: a data-dependent shape)')
        if torch.Tag.nondeterministic_seeded in func.tags and _argument(func, args, kwargs, 'dropout_p') != 0.0:
            self.violation(f'{func} draws random numbers (draw them before the graph and copy them in)')
        if 'device' in [argument.name for argument in func._schema.arguments]:
            device = _argument(func, args, kwargs, 'device')
            if device is not None and torch.device(device) != self.tensor_device:
                self.violation(f'{func} allocates on another device ({device})')
        for tensor in _tensors((args, kwargs)):
            if tensor.device != self.tensor_device:
                self.violation(f'{func} on a tensor of another device ({tensor.device})')


_MISSING = object()
_HANDLES = itertools.count(1)              # pool ids, unique across stand-ins (a graph may outlive its test)
