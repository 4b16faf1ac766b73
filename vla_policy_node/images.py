"""Decode ROS camera messages into numpy arrays.

The policy consumes camera frames that arrive either as ``sensor_msgs/Image``
(raw pixels) or ``sensor_msgs/CompressedImage`` (JPEG/PNG bytes). Messages may
come from rclpy (``data`` is an ``array.array('B')``) or from ``rosbags``
(``data`` is a uint8 ``np.ndarray``), so this module never imports rclpy and
only duck-types on message attributes.

Pipeline:

* :func:`frame_from_msg` turns a message into a :class:`RawImage` or
  :class:`CompressedFrame` without copying the pixel buffer.
* :func:`check_frame` is the runtime's one check of a frame before any
  decoding: encoding, size (``max_pixels``, read from the raw message or from
  the JPEG/PNG header bytes) and geometry.
* :func:`decode_frame` turns a frame into the canonical array: ``[H, W, 3]``
  RGB (or ``[H, W, 1]`` grey), uint8. Raw images are returned as views of the
  message buffer whenever the layout allows it, so decoding a 1080p frame
  costs no copy.

Camera frames are 8-bit: the policies are trained on 8-bit colour frames
(lerobot's camera and dataset frames are uint8). A 16-bit or float frame
(mono16, 16UC1, 32FC1: depth, thermal) on a camera input is refused, naming
its encoding, rather than squeezed into [0, 1] by a guess (a 32FC1 depth
frame full of NaN would otherwise reach the model as a black picture).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

import numpy as np

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "MAX_PIXELS_LIMIT",
    "SUPPORTED_ENCODINGS",
    "CompressedFrame",
    "CompressedHeader",
    "Frame",
    "ImageDecodeError",
    "RawImage",
    "check_frame",
    "compressed_header",
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
class CompressedHeader:
    """What the first bytes of a JPEG or PNG say, read without decoding."""

    kind: str        # 'JPEG' or 'PNG'
    width: int
    height: int
    bits: int        # per sample: 8 for the frames cameras take


@dataclass(frozen=True)
class _PixelLayout:
    """How one raw 8-bit encoding lays out a pixel in memory."""

    channels: int
    # Channel indices that produce RGB (or the single grey channel) from the
    # stored channels; a slice so the result stays a view.
    to_canonical: slice


_RGB = slice(0, 3)
_BGR_TO_RGB = slice(2, None, -1)  # channels 2, 1, 0; also drops alpha of bgra
_GREY = slice(0, 1)

_LAYOUTS: Dict[str, _PixelLayout] = {
    "rgb8": _PixelLayout(3, _RGB),
    "bgr8": _PixelLayout(3, _BGR_TO_RGB),
    "rgba8": _PixelLayout(4, _RGB),
    "bgra8": _PixelLayout(4, _BGR_TO_RGB),
    "mono8": _PixelLayout(1, _GREY),
    # A single 8-bit channel has only one possible meaning, unlike 8UC3.
    "8UC1": _PixelLayout(1, _GREY),
}

SUPPORTED_ENCODINGS: Tuple[str, ...] = tuple(_LAYOUTS)

# Generic multi-channel OpenCV types say nothing about channel order, so
# guessing BGR (as many drivers do) could silently swap red and blue.
_AMBIGUOUS_ENCODINGS = ("8UC2", "8UC3", "8UC4")

# sensor_msgs/image_encodings names with wider samples: 16UC1, 32FC1, 64FC3 ...
# (OpenCV style) and mono16, rgba16, bayer_rggb16 ... (16-bit ROS names).
_OPENCV_ENCODING = re.compile(r"^(\d+)([USF])C(\d+)$")
_SIXTEEN_BIT_ENCODING = re.compile(r"^(mono|rgb|bgr|rgba|bgra|bayer_[a-z]+)16$")

# Frames above DEFAULT_MAX_PIXELS are refused before decoding: 4096 x 4096 is above any robot camera
# (4K UHD is 8.3 Mpx, a 12 Mpx sensor 4000 x 3000) and bounds one decoded rgb8 frame to 48 MiB (192 MiB
# as the float tensor resized on the device); a Jetson shares its 8-16 GB between CPU and GPU.
# MAX_PIXELS_LIMIT (8192 x 8192) stays below Pillow's decompression-bomb warning (89.5 Mpx).
DEFAULT_MAX_PIXELS = 4096 * 4096
MAX_PIXELS_LIMIT = 8192 * 8192

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (ITU T.81 table B.1): every SOFn but DHT (C4), JPG (C8) and DAC (CC).
_JPEG_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field: TEM, RST0-7, SOI.
_JPEG_STANDALONE_MARKERS = frozenset([0x01, 0xD8] + list(range(0xD0, 0xD8)))

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


def same_frame(a: object, b: object) -> bool:
    """Two camera messages (or frames) that carry the same picture: the same object, or the same fields and
    raw bytes (what the prefix cache key hashes, cache/key.py); anything unreadable is not the same."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    try:
        first, second = frame_from_msg(a), frame_from_msg(b)
    except ImageDecodeError:
        return False
    if type(first) is not type(second):
        return False
    fields = ('format',) if isinstance(first, CompressedFrame) else _RAW_FIELDS[:-1]
    if any(getattr(first, name) != getattr(second, name) for name in fields):
        return False
    return np.array_equal(np.frombuffer(frame_buffer(first), dtype=np.uint8),
                          np.frombuffer(frame_buffer(second), dtype=np.uint8))


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
    """Decode a frame to the canonical uint8 ``[H, W, 3]`` RGB / ``[H, W, 1]`` grey array.

    Raw images are views of the message buffer, so the result may be read-only
    and must not outlive assumptions about the message's lifetime. Call
    ``check_frame`` first to bound the size.
    """
    if isinstance(frame, RawImage):
        return _decode_raw(frame)
    if isinstance(frame, CompressedFrame):
        return _decode_compressed(frame)
    raise ImageDecodeError(
        f"expected RawImage or CompressedFrame, got {type(frame).__name__}"
    )


def check_frame(frame: Frame, max_pixels: Optional[int] = None) -> None:
    """The one validity check of a frame, without decoding pixels (raises ImageDecodeError).

    Raw images: a known 8-bit encoding, at most ``max_pixels`` pixels, sane
    geometry, enough bytes. Compressed: a JPEG or PNG whose header (a few
    bytes, read without decoding) gives an 8-bit image of at most
    ``max_pixels`` pixels; not compressedDepth. Lets a caller refuse a bad or
    huge frame before it touches the prefix cache or allocates pixels; a
    corrupt JPEG body is only found by decoding.
    """
    if isinstance(frame, RawImage):
        layout = _layout_for(frame.encoding)
        _check_size(f"{frame.encoding} image", frame.width, frame.height, max_pixels)
        _check_raw_geometry(frame, layout, frame_buffer(frame).nbytes)
    elif isinstance(frame, CompressedFrame):
        header = compressed_header(frame)
        _check_size(f"compressed {header.kind} image", header.width, header.height, max_pixels)
    else:
        raise ImageDecodeError(
            f"expected RawImage or CompressedFrame, got {type(frame).__name__}"
        )


def _check_size(what: str, width: int, height: int, max_pixels: Optional[int]) -> None:
    if max_pixels is not None and width * height > max_pixels:
        raise ImageDecodeError(
            f"{what} is {width}x{height} = {width * height} pixels, more than "
            f"max_image_pixels {max_pixels}; refused before decoding"
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
    wide = _wide_samples(encoding)
    if wide:
        raise ImageDecodeError(
            f"encoding {encoding!r} has {wide} samples (a depth or high-bit-depth "
            f"frame?): camera inputs are 8-bit, one of {', '.join(SUPPORTED_ENCODINGS)}"
        )
    raise ImageDecodeError(
        f"unsupported image encoding {encoding!r}; "
        f"supported: {', '.join(SUPPORTED_ENCODINGS)}"
    )


def _wide_samples(encoding: str) -> str:
    """'16-bit', '32-bit float' ... for an encoding with samples wider than 8 bits; '' otherwise."""
    if _SIXTEEN_BIT_ENCODING.match(encoding):
        return "16-bit"
    opencv = _OPENCV_ENCODING.match(encoding)
    if opencv and opencv.group(1) != "8":
        kind = {"U": "", "S": " signed", "F": " float"}[opencv.group(2)]
        return f"{opencv.group(1)}-bit{kind}"
    return ""


def _check_raw_geometry(frame: RawImage, layout: _PixelLayout, available: int) -> None:
    height, width, step = frame.height, frame.width, frame.step
    if height <= 0 or width <= 0:
        raise ImageDecodeError(
            f"{frame.encoding} image has empty size {width}x{height}"
        )
    row_bytes = width * layout.channels
    if step < row_bytes:
        raise ImageDecodeError(
            f"{frame.encoding} image {width}x{height}: step {step} is smaller "
            f"than one row of pixels ({row_bytes} bytes)"
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
    # Explicit strides express the row padding (step) without copying; 8-bit
    # samples have no byte order, so is_bigendian does not matter.
    stored = np.ndarray(
        shape=(frame.height, frame.width, layout.channels),
        dtype=np.uint8,
        buffer=buffer,
        strides=(frame.step, layout.channels, 1),
    )
    return stored[:, :, layout.to_canonical]


# --------------------------------------------------------------------------
# Compressed frames
# --------------------------------------------------------------------------


def compressed_header(frame: CompressedFrame) -> CompressedHeader:
    """Kind, size and sample depth from the first bytes of a JPEG or PNG (raises ImageDecodeError).

    Only the header is read (PNG: the IHDR chunk; JPEG: marker segments up to
    the first start-of-frame), so a frame can be refused before any pixel is
    allocated. Also refuses compressedDepth and anything wider than 8 bits.
    """
    _reject_compressed_depth(frame.format)
    data = frame_buffer(frame)
    if data.nbytes == 0:
        raise ImageDecodeError(f"compressed image ({frame.format!r}) has no data")
    if bytes(data[:8]) == _PNG_SIGNATURE:
        header = _png_header(data, frame.format)
    elif bytes(data[:2]) == b"\xff\xd8":
        header = _jpeg_header(data, frame.format)
    else:
        raise ImageDecodeError(
            f"compressed image ({frame.format!r}, {data.nbytes} bytes) is neither "
            "a JPEG nor a PNG"
        )
    if header.width <= 0 or header.height <= 0:
        raise ImageDecodeError(
            f"compressed {header.kind} image ({frame.format!r}) has no size in its "
            f"header ({header.width}x{header.height})"
        )
    if header.bits > 8:
        raise ImageDecodeError(
            f"compressed {header.kind} image ({frame.format!r}) has {header.bits}-bit "
            "samples (a depth or high-bit-depth frame?): camera inputs are 8-bit"
        )
    return header


def _png_header(data: memoryview, image_format: str) -> CompressedHeader:
    # Signature, then the IHDR chunk first (PNG spec 5.2/11.2.2): length, type,
    # width, height (big-endian uint32), bit depth, colour type ...
    if data.nbytes < 26 or bytes(data[12:16]) != b"IHDR":
        raise ImageDecodeError(
            f"PNG image ({image_format!r}, {data.nbytes} bytes) has no IHDR header"
        )
    width = int.from_bytes(data[16:20], "big")
    height = int.from_bytes(data[20:24], "big")
    return CompressedHeader("PNG", width, height, int(data[24]))


def _jpeg_header(data: memoryview, image_format: str) -> CompressedHeader:
    # Marker segments after SOI: 0xFF, marker, big-endian length (counting
    # itself) and payload; the frame header (SOFn) holds precision, height,
    # width (ITU T.81 B.2.2). Each step moves on by at least 2 bytes.
    position, size = 2, data.nbytes
    while position < size:
        if data[position] != 0xFF:
            break
        while position < size and data[position] == 0xFF:  # fill bytes
            position += 1
        if position >= size:
            break
        marker = data[position]
        position += 1
        if marker in _JPEG_STANDALONE_MARKERS:
            continue
        if marker in (0xD9, 0xDA) or position + 2 > size:  # EOI or start of scan before any frame header
            break
        length = int.from_bytes(data[position:position + 2], "big")
        if marker in _JPEG_SOF_MARKERS and length >= 8 and position + 7 <= size:
            precision = int(data[position + 2])
            height = int.from_bytes(data[position + 3:position + 5], "big")
            width = int.from_bytes(data[position + 5:position + 7], "big")
            return CompressedHeader("JPEG", width, height, precision)
        if length < 2:
            break
        position += length
    raise ImageDecodeError(
        f"JPEG image ({image_format!r}, {data.nbytes} bytes) has no readable frame header"
    )


def _reject_compressed_depth(image_format: str) -> None:
    if "compresseddepth" in image_format.lower():
        raise ImageDecodeError(
            f"compressed format {image_format!r} is compressedDepth, whose "
            "payload starts with a 12-byte depth-quantisation header; "
            "it is not supported"
        )


def _decode_compressed(frame: CompressedFrame) -> np.ndarray:
    compressed_header(frame)                    # JPEG or PNG, 8-bit: what Pillow may open
    image = _open_with_pillow(frame.format, frame_buffer(frame))
    return _pillow_to_canonical(image, frame.format)


def _open_with_pillow(image_format: str, buffer: memoryview):
    # Imported lazily so raw-only users do not pay for Pillow's import.
    from PIL import Image

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
    if mode in ("L", "1"):
        pixels = np.asarray(image.convert("L"))
        return pixels.reshape(pixels.shape[0], pixels.shape[1], 1)
    if mode != "RGB":
        image = image.convert("RGB")            # palette, alpha, CMYK, YCbCr; 8-bit all
    pixels = np.asarray(image)
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ImageDecodeError(
            f"compressed image ({image_format!r}) decoded to unexpected shape "
            f"{pixels.shape} from mode {mode!r}"
        )
    return pixels
