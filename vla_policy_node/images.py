"""Decode ROS camera messages into numpy arrays.

The policy consumes camera frames that arrive either as ``sensor_msgs/Image``
(raw pixels) or ``sensor_msgs/CompressedImage`` (JPEG/PNG bytes). Messages may
come from rclpy (``data`` is an ``array.array('B')``) or from ``rosbags``
(``data`` is a uint8 ``np.ndarray``), so this module never imports rclpy and
only duck-types on message attributes.

Pipeline:

* :func:`frame_from_msg` turns a message into a :class:`RawImage` or
  :class:`CompressedFrame` without copying the pixel buffer.
* :func:`decode_frame` turns a frame into the canonical array: ``[H, W, 3]``
  RGB (or ``[H, W, 1]`` for grey/depth) with the source's dtype (uint8,
  uint16 or float32). Raw images are returned as views of the message buffer
  whenever the layout allows it, so decoding a 1080p frame costs no copy.
"""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass
from typing import Dict, Tuple, Union

import numpy as np

__all__ = [
    "SUPPORTED_ENCODINGS",
    "CompressedFrame",
    "Frame",
    "ImageDecodeError",
    "RawImage",
    "decode_frame",
    "frame_buffer",
    "frame_from_msg",
]


class ImageDecodeError(ValueError):
    """A camera message could not be turned into pixels; the message says why."""


@dataclass(frozen=True)
class RawImage:
    """The fields of ``sensor_msgs/Image`` that identify the pixels.

    ``data`` is any object exporting a byte buffer (bytes, bytearray,
    memoryview, ``array.array('B')``, uint8 ``np.ndarray``); it is kept as
    given so decoding can return views of it.
    """

    height: int
    width: int
    encoding: str
    step: int
    is_bigendian: bool
    data: object


@dataclass(frozen=True)
class CompressedFrame:
    """The fields of ``sensor_msgs/CompressedImage``."""

    format: str
    data: object


Frame = Union[RawImage, CompressedFrame]


@dataclass(frozen=True)
class _PixelLayout:
    """How one raw encoding lays out a pixel in memory."""

    dtype: np.dtype
    channels: int
    # Channel indices that produce RGB (or the single grey channel) from the
    # stored channels; a slice so the result stays a view.
    to_canonical: slice


_RGB = slice(0, 3)
_BGR_TO_RGB = slice(2, None, -1)  # channels 2, 1, 0; also drops alpha of bgra
_GREY = slice(0, 1)

_LAYOUTS: Dict[str, _PixelLayout] = {
    "rgb8": _PixelLayout(np.dtype(np.uint8), 3, _RGB),
    "bgr8": _PixelLayout(np.dtype(np.uint8), 3, _BGR_TO_RGB),
    "rgba8": _PixelLayout(np.dtype(np.uint8), 4, _RGB),
    "bgra8": _PixelLayout(np.dtype(np.uint8), 4, _BGR_TO_RGB),
    "mono8": _PixelLayout(np.dtype(np.uint8), 1, _GREY),
    # A single 8-bit channel has only one possible meaning, unlike 8UC3.
    "8UC1": _PixelLayout(np.dtype(np.uint8), 1, _GREY),
    "mono16": _PixelLayout(np.dtype(np.uint16), 1, _GREY),
    "16UC1": _PixelLayout(np.dtype(np.uint16), 1, _GREY),
    "32FC1": _PixelLayout(np.dtype(np.float32), 1, _GREY),
}

SUPPORTED_ENCODINGS: Tuple[str, ...] = tuple(_LAYOUTS)

# Generic multi-channel OpenCV types say nothing about channel order, so
# guessing BGR (as many drivers do) could silently swap red and blue.
_AMBIGUOUS_ENCODINGS = ("8UC2", "8UC3", "8UC4", "16UC3", "16UC4", "32FC3", "32FC4")

_HOST_IS_BIG_ENDIAN = sys.byteorder == "big"

_RAW_FIELDS = ("height", "width", "encoding", "step", "is_bigendian", "data")


# --------------------------------------------------------------------------
# Message -> frame
# --------------------------------------------------------------------------


def frame_from_msg(msg: object) -> Frame:
    """Build a frame from an Image/CompressedImage-like message.

    Anything with ``format`` and ``data`` is compressed; anything with the raw
    image fields is raw. ``data`` is kept as the message's own buffer.
    """
    if isinstance(msg, (RawImage, CompressedFrame)):
        return msg
    if hasattr(msg, "format") and hasattr(msg, "data"):
        return CompressedFrame(format=str(msg.format), data=msg.data)
    missing = [name for name in _RAW_FIELDS if not hasattr(msg, name)]
    if missing:
        raise ImageDecodeError(
            f"{type(msg).__name__} is neither a sensor_msgs/Image nor a "
            f"sensor_msgs/CompressedImage: missing attributes {', '.join(missing)}"
        )
    return RawImage(
        height=int(msg.height),
        width=int(msg.width),
        encoding=str(msg.encoding),
        step=int(msg.step),
        # rclpy and rosbags carry is_bigendian as a uint8, not a bool.
        is_bigendian=bool(msg.is_bigendian),
        data=msg.data,
    )


def frame_buffer(frame: Frame) -> memoryview:
    """Return a flat uint8 memoryview over ``frame.data``, copying only if needed.

    A copy happens only for data without a contiguous buffer (e.g. a list of
    ints or a strided array).
    """
    return _as_byte_view(frame.data)


def _as_byte_view(data: object) -> memoryview:
    if isinstance(data, np.ndarray):
        # view(np.uint8) also handles non-native dtypes that memoryview.cast
        # refuses; ascontiguousarray copies only a strided array.
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        return memoryview(flat)
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        return _copy_to_byte_view(data)
    if view.format == "B" and view.ndim == 1:
        return view
    if not view.c_contiguous:
        return memoryview(view.tobytes())
    try:
        return view.cast("B")
    except TypeError:
        return memoryview(view.tobytes())


def _copy_to_byte_view(data: object) -> memoryview:
    try:
        return memoryview(bytes(data))  # type: ignore[call-overload]
    except (TypeError, ValueError) as exc:
        raise ImageDecodeError(
            f"image data of type {type(data).__name__} is not a byte buffer: {exc}"
        ) from exc


# --------------------------------------------------------------------------
# Frame -> canonical array
# --------------------------------------------------------------------------


def decode_frame(frame: Frame) -> np.ndarray:
    """Decode a frame to the canonical ``[H, W, 3]`` RGB / ``[H, W, 1]`` grey array.

    The dtype is the source's (uint8, uint16 or float32). Raw images are views
    of the message buffer unless a byteswap is needed, so the result may be
    read-only and must not outlive assumptions about the message's lifetime.
    """
    if isinstance(frame, RawImage):
        return _decode_raw(frame)
    if isinstance(frame, CompressedFrame):
        return _decode_compressed(frame)
    raise ImageDecodeError(
        f"expected RawImage or CompressedFrame, got {type(frame).__name__}"
    )


def check_frame(frame: Frame) -> None:
    """Cheap validity check without decoding pixels (raises ImageDecodeError).

    Raw images: known encoding, sane geometry, enough bytes. Compressed: some
    bytes, not compressedDepth. Lets a caller reject a bad frame before it
    touches the prefix cache; a corrupt JPEG body is only found by decoding.
    """
    if isinstance(frame, RawImage):
        _check_raw_geometry(frame, _layout_for(frame.encoding), frame_buffer(frame).nbytes)
    elif isinstance(frame, CompressedFrame):
        _reject_compressed_depth(frame.format)
        if frame_buffer(frame).nbytes == 0:
            raise ImageDecodeError(f"compressed image ({frame.format}) has no data")
    else:
        raise ImageDecodeError(
            f"expected RawImage or CompressedFrame, got {type(frame).__name__}"
        )


def _layout_for(encoding: str) -> _PixelLayout:
    layout = _LAYOUTS.get(encoding)
    if layout is not None:
        return layout
    if encoding in _AMBIGUOUS_ENCODINGS:
        raise ImageDecodeError(
            f"encoding {encoding!r} has no defined channel order; "
            f"publish one of {', '.join(SUPPORTED_ENCODINGS)}"
        )
    raise ImageDecodeError(
        f"unsupported image encoding {encoding!r}; "
        f"supported: {', '.join(SUPPORTED_ENCODINGS)}"
    )


def _check_raw_geometry(frame: RawImage, layout: _PixelLayout, available: int) -> None:
    height, width, step = frame.height, frame.width, frame.step
    if height <= 0 or width <= 0:
        raise ImageDecodeError(
            f"{frame.encoding} image has empty size {width}x{height}"
        )
    itemsize = layout.dtype.itemsize
    row_bytes = width * layout.channels * itemsize
    if step < row_bytes:
        raise ImageDecodeError(
            f"{frame.encoding} image {width}x{height}: step {step} is smaller "
            f"than one row of pixels ({row_bytes} bytes)"
        )
    if step % itemsize:
        raise ImageDecodeError(
            f"{frame.encoding} image: step {step} is not a multiple of the "
            f"{itemsize}-byte sample size"
        )
    expected = step * height
    if available < expected:
        raise ImageDecodeError(
            f"{frame.encoding} image {width}x{height} step {step} is truncated: "
            f"expected {expected} bytes, got {available}"
        )


def _decode_raw(frame: RawImage) -> np.ndarray:
    layout = _layout_for(frame.encoding)
    buffer = frame_buffer(frame)
    _check_raw_geometry(frame, layout, buffer.nbytes)

    stored_order = ">" if frame.is_bigendian else "<"
    stored_dtype = layout.dtype.newbyteorder(stored_order)
    itemsize = layout.dtype.itemsize
    # Explicit strides express the row padding (step) without copying.
    stored = np.ndarray(
        shape=(frame.height, frame.width, layout.channels),
        dtype=stored_dtype,
        buffer=buffer,
        strides=(frame.step, layout.channels * itemsize, itemsize),
    )
    canonical = stored[:, :, layout.to_canonical]
    if itemsize > 1 and frame.is_bigendian != _HOST_IS_BIG_ENDIAN:
        return canonical.astype(layout.dtype.newbyteorder("="))
    return canonical


def _reject_compressed_depth(image_format: str) -> None:
    if "compresseddepth" in image_format.lower():
        raise ImageDecodeError(
            f"compressed format {image_format!r} is compressedDepth, whose "
            "payload starts with a 12-byte depth-quantisation header; "
            "it is not supported"
        )


def _decode_compressed(frame: CompressedFrame) -> np.ndarray:
    image_format = frame.format
    _reject_compressed_depth(image_format)
    image = _open_with_pillow(image_format, frame_buffer(frame))
    return _pillow_to_canonical(image, image_format)


def _open_with_pillow(image_format: str, buffer: memoryview):
    # Imported lazily so raw-only users do not pay for Pillow's import.
    from PIL import Image

    if buffer.nbytes == 0:
        raise ImageDecodeError(f"compressed image ({image_format!r}) has no data")
    try:
        image = Image.open(io.BytesIO(buffer), formats=("JPEG", "PNG"))
        image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageDecodeError(
            f"cannot decode compressed image with format {image_format!r} "
            f"({buffer.nbytes} bytes): {exc}"
        ) from exc
    return image


def _pillow_to_canonical(image, image_format: str) -> np.ndarray:
    mode = image.mode
    if mode in ("I;16", "I;16L", "I;16B", "I;16N"):
        return _as_grey(np.asarray(image).astype(np.uint16, copy=False))
    if mode == "I":
        # Older Pillow opens 16-bit grey PNG as 32-bit "I"; values fit uint16.
        pixels = np.asarray(image)
        return _as_grey(np.clip(pixels, 0, 65535).astype(np.uint16))
    if mode in ("L", "1"):
        return _as_grey(np.asarray(image.convert("L")))
    if mode != "RGB":
        image = image.convert("RGB")
    pixels = np.asarray(image)
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ImageDecodeError(
            f"compressed image ({image_format!r}) decoded to unexpected shape "
            f"{pixels.shape} from mode {mode!r}"
        )
    return pixels


def _as_grey(pixels: np.ndarray) -> np.ndarray:
    return pixels.reshape(pixels.shape[0], pixels.shape[1], 1)
