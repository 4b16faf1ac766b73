"""Prefix cache keys: a 128-bit hash of everything that determines the prefix context.

The key is built from the *raw* camera message bytes (plus the fields that say
how to read them), not from preprocessed tensors, so a hit needs no decoding,
resizing or normalisation at all. Every field is length-prefixed so that two
different observations can never serialise to the same byte stream.
"""
from __future__ import annotations

import struct
from typing import Sequence, Tuple

import numpy as np
import xxhash

from ..images import CompressedFrame, RawImage, frame_buffer

# Bump when anything about how a prefix is laid out or computed changes
# (slot order rules, preprocessing, position ids): old keys then never match.
PREFIX_LAYOUT_VERSION = 1

CameraInput = object  # RawImage | CompressedFrame | np.ndarray [H, W, 3] uint8 RGB | None (masked)


def _put_bytes(hasher: 'xxhash.xxh3_128', data: object) -> None:
    view = memoryview(data).cast('B') if not isinstance(data, (bytes, bytearray)) else data
    hasher.update(struct.pack('<Q', len(view)))
    hasher.update(view)


def _put_text(hasher: 'xxhash.xxh3_128', text: str) -> None:
    _put_bytes(hasher, text.encode('utf-8'))


def _put_camera(hasher: 'xxhash.xxh3_128', frame: CameraInput) -> None:
    if frame is None:
        _put_text(hasher, 'masked')
    elif isinstance(frame, RawImage):
        layout = f'{frame.encoding}:{frame.height}:{frame.width}:{frame.step}:{int(bool(frame.is_bigendian))}'
        _put_text(hasher, 'raw:' + layout)
        _put_bytes(hasher, frame_buffer(frame))
    elif isinstance(frame, CompressedFrame):
        _put_text(hasher, f'compressed:{frame.format}')
        _put_bytes(hasher, frame_buffer(frame))
    elif isinstance(frame, np.ndarray):
        _put_text(hasher, f'array:{frame.dtype.str}:{frame.shape}')
        _put_bytes(hasher, np.ascontiguousarray(frame))
    else:
        raise TypeError(f'cannot key a camera input of type {type(frame).__name__}')


class PrefixKeyBuilder:
    """Keys for one loaded model: the model-level part is hashed once, up front."""

    def __init__(self, model_revision: str, tokenizer_identity: str, dtype: str,
                 layout_version: int = PREFIX_LAYOUT_VERSION, quantization: str = 'none', processor: str = '') -> None:
        """``quantization``: the weights' mode (policy/quant.py); the same checkpoint quantized otherwise computes
        another prefix, so it is part of the model identity (``none`` adds nothing: unquantized keys unchanged).
        ``processor``: the family's processor settings that turn raw frames and the prompt into the model's
        inputs and that neither the weights nor the tokens fix (PolicyFamily.processor_identity; '' adds
        nothing)."""
        header = xxhash.xxh3_128()
        parts = [f'layout:{layout_version}', f'model:{model_revision}', f'tokenizer:{tokenizer_identity}',
                 f'dtype:{dtype}'] + ([f'quantization:{quantization}'] if quantization != 'none' else []) \
            + ([f'processor:{processor}'] if processor else [])
        for part in parts:
            _put_text(header, part)
        self._model_digest = header.digest()

    def key(self, cameras: Sequence[Tuple[str, CameraInput]], tokens: np.ndarray, token_mask: np.ndarray) -> str:
        """cameras: (name, frame or None) in model slot order; tokens/token_mask as fed to the model."""
        hasher = xxhash.xxh3_128()
        hasher.update(self._model_digest)
        hasher.update(struct.pack('<Q', len(cameras)))
        for name, frame in cameras:
            _put_text(hasher, name)
            _put_camera(hasher, frame)
        _put_bytes(hasher, np.ascontiguousarray(tokens, dtype=np.int64))
        _put_bytes(hasher, np.ascontiguousarray(token_mask, dtype=np.bool_))
        return hasher.hexdigest()


def weights_digest(path: str, chunk_bytes: int = 16 << 20) -> str:
    """xxh3-128 of a weights file's bytes: the model revision, independent of the file's name."""
    hasher = xxhash.xxh3_128()
    with open(path, 'rb') as handle:
        for chunk in iter(lambda: handle.read(chunk_bytes), b''):
            hasher.update(chunk)
    return hasher.hexdigest()
