"""The openpi msgpack-numpy wire codec, written here (openpi-client pins numpy < 2), with bounds.

As openpi defines it (packages/openpi-client/src/openpi_client/msgpack_numpy.py, openpi 15a9616):
an ndarray is the map ``{b"__ndarray__": True, b"data": tobytes(), b"dtype": dtype.str, b"shape": shape}``
and a numpy scalar ``{b"__npgeneric__": True, b"data": item(), b"dtype": dtype.str}``; the marker keys
are *bytes*. Object, void and complex dtypes are refused both ways, and nothing is ever unpickled (msgpack
has no pickle path; we never call pickle). Beyond openpi: a frame larger than ``max_bytes`` is refused
before msgpack reads it, only bool/int/uint/float arrays decode, and an array's byte length must match its
dtype and shape exactly (no array bigger than the frame that carried it).
"""
from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

ALLOWED_KINDS = 'biuf'          # bool, signed, unsigned, float: what observations and actions are made of
MAX_NDIM = 8


class CodecError(ValueError):
    """A frame that is not a valid, bounded msgpack-numpy message."""


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)):
        if obj.dtype.kind not in ALLOWED_KINDS:
            raise CodecError(f'dtype {obj.dtype} is not sent (only bool, int, uint and float)')
        if isinstance(obj, np.ndarray):
            # The bytes of tobytes() (C order), without its copy: msgpack copies the buffer once into the frame.
            data = memoryview(np.ascontiguousarray(obj)).cast('B') if obj.size else b''
            return {b'__ndarray__': True, b'data': data, b'dtype': obj.dtype.str, b'shape': list(obj.shape)}
        return {b'__npgeneric__': True, b'data': obj.item(), b'dtype': obj.dtype.str}
    raise CodecError(f'cannot send a {type(obj).__name__}')


def _dtype(name: Any) -> np.dtype:
    if not isinstance(name, str) or len(name) > 8:
        raise CodecError(f'bad dtype {name!r}')
    try:
        dtype = np.dtype(name)
    except TypeError as exc:
        raise CodecError(f'bad dtype {name!r}') from exc
    if dtype.kind not in ALLOWED_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise CodecError(f'dtype {name!r} is refused (only bool, int, uint and float)')
    return dtype


def _unpack_hook(obj: dict) -> Any:
    if b'__ndarray__' in obj:
        dtype, shape, data = _dtype(obj.get(b'dtype')), obj.get(b'shape'), obj.get(b'data')
        if (not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
            raise CodecError(f'bad array shape {shape!r}')
        if not isinstance(data, bytes) or len(data) != math.prod(shape) * dtype.itemsize:
            raise CodecError(f'array data does not match dtype {dtype.str} and shape {list(shape)}')
        return np.frombuffer(data, dtype=dtype).reshape(shape)       # read-only, on the received bytes
    if b'__npgeneric__' in obj:
        value = obj.get(b'data')
        if isinstance(value, (dict, list, bytes, str)) or value is None:
            raise CodecError('bad numpy scalar')
        try:
            return _dtype(obj.get(b'dtype')).type(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise CodecError(f'bad numpy scalar: {exc}') from exc
    return obj


def packb(obj: Any) -> bytes:
    """One binary frame; CodecError for what the wire cannot carry."""
    return msgpack.packb(obj, default=_pack_default, use_bin_type=True)


def unpackb(data: bytes, max_bytes: int) -> Any:
    """Decode one frame of at most ``max_bytes``; CodecError for anything else (never a crash)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f'expected a binary frame, got {type(data).__name__}')
    if len(data) > max_bytes:
        raise CodecError(f'frame of {len(data)} bytes exceeds the limit of {max_bytes}')
    try:
        # msgpack bounds every container and string by the frame's length itself (max_*_len default).
        return msgpack.unpackb(data, object_hook=_unpack_hook, raw=False, ext_hook=_refuse_ext)
    except CodecError:
        raise
    except Exception as exc:      # ValueError, ExtraData, FormatError, StackError, UnicodeDecodeError ...
        raise CodecError(f'not a msgpack frame: {type(exc).__name__}: {exc}') from exc


def _refuse_ext(code: int, data: bytes) -> Any:
    raise CodecError(f'msgpack extension type {code} is refused')
