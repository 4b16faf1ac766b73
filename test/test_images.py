"""Tests for vla_policy_node.images: raw and compressed camera decoding."""

import array
import io
import json
import os
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from vla_policy_node.images import (
    SUPPORTED_ENCODINGS,
    CompressedFrame,
    ImageDecodeError,
    RawImage,
    check_frame,
    compressed_header,
    decode_frame,
    frame_buffer,
    frame_from_msg,
)
from vla_policy_node.policy.preprocess import image_to_unit_tensor
from runtime_fixtures import tiny_checkpoints  # noqa: F401

HEIGHT, WIDTH = 4, 5


def reference_rgb() -> np.ndarray:
    """A small RGB image whose channels all differ, so swaps are visible."""
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, size=(HEIGHT, WIDTH, 3), dtype=np.uint8)


def reference_alpha() -> np.ndarray:
    return np.full((HEIGHT, WIDTH, 1), 99, dtype=np.uint8)


def raw(pixels: np.ndarray, encoding: str, step=None, big_endian=False, data=None) -> RawImage:
    """Pack an [H, W, C] array into a RawImage the way a driver would."""
    height, width = pixels.shape[:2]
    row_bytes = pixels[0].size * pixels.dtype.itemsize
    step = row_bytes if step is None else step
    if data is None:
        order = ">" if big_endian else "<"
        stored = pixels.astype(pixels.dtype.newbyteorder(order))
        rows = stored.reshape(height, row_bytes // stored.dtype.itemsize).view(np.uint8)
        padded = np.full((height, step), 0xAB, dtype=np.uint8)  # garbage padding
        padded[:, :row_bytes] = rows
        data = padded.tobytes()
    return RawImage(height, width, encoding, step, big_endian, data)


def encoded(pixels: np.ndarray, pil_format: str) -> bytes:
    """Compress [H, W, C] pixels with Pillow, as image_transport would."""
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]  # Pillow wants grey as [H, W]
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=pil_format)
    return out.getvalue()


# --------------------------------------------------------------------------
# Raw encodings
# --------------------------------------------------------------------------


def stored_pixels_for(encoding: str, rgb: np.ndarray) -> np.ndarray:
    alpha = reference_alpha()
    bgr = rgb[:, :, ::-1]
    return {
        "rgb8": rgb,
        "bgr8": bgr,
        "rgba8": np.concatenate([rgb, alpha], axis=2),
        "bgra8": np.concatenate([bgr, alpha], axis=2),
    }[encoding]


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8"])
@pytest.mark.parametrize("padding", [0, 13])
def test_colour_encodings_decode_to_rgb(encoding, padding):
    rgb = reference_rgb()
    stored = stored_pixels_for(encoding, rgb)
    frame = raw(stored, encoding, step=WIDTH * stored.shape[2] + padding)

    decoded = decode_frame(frame)

    assert decoded.shape == (HEIGHT, WIDTH, 3)
    assert decoded.dtype == np.uint8
    np.testing.assert_array_equal(decoded, rgb)


@pytest.mark.parametrize("encoding", ["mono8", "8UC1"])
@pytest.mark.parametrize("padding", [0, 3])
def test_single_channel_encodings_decode_to_grey(encoding, padding):
    rng = np.random.default_rng(3)
    grey = rng.integers(0, 256, size=(HEIGHT, WIDTH, 1), dtype=np.uint8)
    frame = raw(grey, encoding, step=WIDTH + padding)

    decoded = decode_frame(frame)

    assert decoded.shape == (HEIGHT, WIDTH, 1)
    assert decoded.dtype == np.uint8
    np.testing.assert_array_equal(decoded, grey)


@pytest.mark.parametrize(
    "encoding, pixels, words",
    [
        ("32FC1", np.full((HEIGHT, WIDTH, 1), np.nan, dtype=np.float32), "32-bit float"),
        ("16UC1", np.full((HEIGHT, WIDTH, 1), 4097, dtype=np.uint16), "16-bit"),
        ("mono16", np.full((HEIGHT, WIDTH, 1), 65535, dtype=np.uint16), "16-bit"),
        ("rgb16", np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint16), "16-bit"),
        ("64FC1", np.zeros((HEIGHT, WIDTH, 1), dtype=np.float64), "64-bit float"),
    ],
)
def test_frames_wider_than_8_bits_are_refused_naming_the_encoding(encoding, pixels, words):
    # A NaN-filled depth frame on a colour camera must not reach the model as a black picture.
    frame = raw(pixels, encoding)
    for check in (check_frame, decode_frame):
        with pytest.raises(ImageDecodeError, match=f"'{encoding}' has {words} samples.*8-bit"):
            check(frame)


def test_big_endian_flag_is_ignored_for_8_bit_data():
    rgb = reference_rgb()
    np.testing.assert_array_equal(decode_frame(raw(rgb, "rgb8", big_endian=True)), rgb)


def test_rgb8_decode_is_a_view_of_the_message_buffer():
    rgb = reference_rgb()
    padded = np.zeros((HEIGHT, WIDTH * 3 + 13), dtype=np.uint8)
    padded[:, :WIDTH * 3] = rgb.reshape(HEIGHT, -1)
    source = padded.reshape(-1)
    frame = RawImage(HEIGHT, WIDTH, "rgb8", WIDTH * 3 + 13, False, source)

    decoded = decode_frame(frame)

    assert np.shares_memory(decoded, source)
    np.testing.assert_array_equal(decoded, rgb)


@pytest.mark.parametrize("encoding", ["bgr8", "bgra8", "rgba8"])
def test_reordered_encodings_are_views_too(encoding):
    stored = stored_pixels_for(encoding, reference_rgb())
    source = np.ascontiguousarray(stored).reshape(-1)
    frame = RawImage(HEIGHT, WIDTH, encoding, WIDTH * stored.shape[2], False, source)
    assert np.shares_memory(decode_frame(frame), source)


def test_extra_bytes_after_last_row_are_ignored():
    rgb = reference_rgb()
    frame = raw(rgb, "rgb8")
    longer = RawImage(HEIGHT, WIDTH, "rgb8", frame.step, False, frame.data + b"xyz")
    np.testing.assert_array_equal(decode_frame(longer), rgb)


@pytest.mark.parametrize(
    "make_data",
    [bytes, bytearray, memoryview, lambda b: array.array("B", b),
     lambda b: np.frombuffer(b, dtype=np.uint8)],
    ids=["bytes", "bytearray", "memoryview", "array", "ndarray"],
)
def test_any_byte_buffer_is_accepted(make_data):
    rgb = reference_rgb()
    frame = raw(rgb, "rgb8")
    frame = RawImage(HEIGHT, WIDTH, "rgb8", frame.step, False, make_data(frame.data))
    np.testing.assert_array_equal(decode_frame(frame), rgb)


# --------------------------------------------------------------------------
# Raw validation
# --------------------------------------------------------------------------


def test_truncated_data_names_expected_and_actual_byte_counts():
    frame = raw(reference_rgb(), "rgb8", step=WIDTH * 3 + 1)
    short = RawImage(HEIGHT, WIDTH, "rgb8", frame.step, False, frame.data[:-5])
    expected = frame.step * HEIGHT

    with pytest.raises(ImageDecodeError) as caught:
        decode_frame(short)

    message = str(caught.value)
    assert f"expected {expected} bytes" in message
    assert f"got {expected - 5}" in message


def test_unknown_encoding_is_named():
    frame = RawImage(HEIGHT, WIDTH, "yuv422_weird", WIDTH * 2, False, bytes(HEIGHT * WIDTH * 2))
    with pytest.raises(ImageDecodeError, match="yuv422_weird"):
        decode_frame(frame)


@pytest.mark.parametrize("encoding", ["8UC3", "8UC4"])
def test_generic_multichannel_encodings_are_rejected(encoding):
    frame = RawImage(HEIGHT, WIDTH, encoding, WIDTH * 4, False, bytes(HEIGHT * WIDTH * 4))
    with pytest.raises(ImageDecodeError, match=f"{encoding}.*channel order"):
        decode_frame(frame)


@pytest.mark.parametrize("height, width", [(0, 5), (4, 0), (-1, 5)])
def test_empty_size_is_rejected(height, width):
    frame = RawImage(height, width, "rgb8", max(width, 1) * 3, False, bytes(64))
    with pytest.raises(ImageDecodeError, match="empty size"):
        decode_frame(frame)


def test_step_shorter_than_a_row_is_rejected():
    frame = RawImage(HEIGHT, WIDTH, "rgb8", WIDTH * 3 - 1, False, bytes(1000))
    with pytest.raises(ImageDecodeError, match="step 14 is smaller"):
        decode_frame(frame)


def test_decode_rejects_non_frames():
    with pytest.raises(ImageDecodeError, match="RawImage or CompressedFrame"):
        decode_frame("not a frame")


# --------------------------------------------------------------------------
# Compressed images
# --------------------------------------------------------------------------


def test_jpeg_colour_keeps_red_red():
    red = np.zeros((16, 16, 3), dtype=np.uint8)
    red[:, :, 0] = 255
    frame = CompressedFrame("rgb8; jpeg compressed bgr8", encoded(red, "JPEG"))

    decoded = decode_frame(frame)

    assert decoded.shape == (16, 16, 3)
    assert decoded.dtype == np.uint8
    mean = decoded.reshape(-1, 3).mean(axis=0)
    assert mean[0] > 240 and mean[1] < 15 and mean[2] < 15


def test_jpeg_grey_decodes_to_one_channel():
    grey = np.full((16, 16, 1), 128, dtype=np.uint8)
    frame = CompressedFrame("mono8; jpeg compressed mono8", encoded(grey, "JPEG"))

    decoded = decode_frame(frame)

    assert decoded.shape == (16, 16, 1)
    assert decoded.dtype == np.uint8
    assert abs(float(decoded.mean()) - 128) < 3


def test_png_rgb_is_exact():
    rgb = reference_rgb()
    frame = CompressedFrame("bgr8; png compressed bgr8", encoded(rgb, "PNG"))
    np.testing.assert_array_equal(decode_frame(frame), rgb)


def test_png_rgba_drops_alpha():
    rgba = stored_pixels_for("rgba8", reference_rgb())
    frame = CompressedFrame("png", encoded(np.ascontiguousarray(rgba), "PNG"))
    np.testing.assert_array_equal(decode_frame(frame), reference_rgb())


def test_png_palette_converts_to_rgb():
    rgb = reference_rgb()
    palette_image = Image.fromarray(rgb).quantize(colors=256)
    out = io.BytesIO()
    palette_image.save(out, format="PNG")
    expected = np.asarray(palette_image.convert("RGB"))

    decoded = decode_frame(CompressedFrame("png", out.getvalue()))

    np.testing.assert_array_equal(decoded, expected)


def test_png_16_bit_is_refused():
    depth = np.array([[0, 1, 256], [4097, 40000, 65535]], dtype=np.uint16)
    out = io.BytesIO()
    Image.fromarray(depth).save(out, format="PNG")
    frame = CompressedFrame("mono16; png compressed mono16", out.getvalue())
    for check in (check_frame, decode_frame):
        with pytest.raises(ImageDecodeError, match="PNG image.*16-bit samples.*8-bit"):
            check(frame)


def test_compressed_depth_is_rejected_with_reason():
    frame = CompressedFrame("16UC1; compressedDepth png", bytes(12) + encoded(reference_rgb(), "PNG"))
    with pytest.raises(ImageDecodeError, match="compressedDepth.*12-byte"):
        decode_frame(frame)


def test_garbage_bytes_are_rejected_naming_the_format():
    frame = CompressedFrame("jpeg", b"definitely not an image")
    for check in (check_frame, decode_frame):
        with pytest.raises(ImageDecodeError, match="'jpeg'.*neither a JPEG nor a PNG"):
            check(frame)


def test_truncated_jpeg_is_rejected():
    data = encoded(reference_rgb(), "JPEG")
    with pytest.raises(ImageDecodeError, match="cannot decode"):
        decode_frame(CompressedFrame("jpeg", data[: len(data) // 2]))


def test_empty_compressed_data_is_rejected():
    for check in (check_frame, decode_frame):
        with pytest.raises(ImageDecodeError, match="no data"):
            check(CompressedFrame("png", b""))


# --------------------------------------------------------------------------
# Size from the header, before any decoding
# --------------------------------------------------------------------------


def jpeg_with_exif(pixels: np.ndarray, **options) -> bytes:
    out = io.BytesIO()
    exif = Image.Exif()
    exif[0x010E] = "x" * 3000               # ImageDescription: a long APP1 segment before the frame header
    Image.fromarray(pixels).save(out, format="JPEG", exif=exif, **options)
    return out.getvalue()


def big_png(width: int, height: int) -> bytes:
    """A complete, valid black RGB PNG, compressed row by row (12000 x 12000: about 420 KB, 432 MB decoded)."""
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return len(payload).to_bytes(4, "big") + kind + payload + zlib.crc32(kind + payload).to_bytes(4, "big")

    compressor = zlib.compressobj(9)
    row = bytes(1 + 3 * width)              # filter byte 0, then black pixels
    body = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


@pytest.mark.parametrize("options", [{}, {"progressive": True}, {"subsampling": 0, "quality": 95}],
                         ids=["baseline", "progressive", "444"])
def test_jpeg_header_gives_the_size_behind_other_segments(options):
    pixels = np.zeros((37, 53, 3), dtype=np.uint8)
    header = compressed_header(CompressedFrame("jpeg", jpeg_with_exif(pixels, **options)))
    assert (header.kind, header.width, header.height, header.bits) == ("JPEG", 53, 37, 8)


def test_png_header_gives_the_size():
    header = compressed_header(CompressedFrame("png", encoded(reference_rgb(), "PNG")))
    assert (header.kind, header.width, header.height, header.bits) == ("PNG", WIDTH, HEIGHT, 8)


def test_twelve_bit_jpeg_is_refused_from_its_header():
    # SOI, then a baseline-extended frame header (SOF1) with precision 12 for 16 x 16, 1 component.
    sof1 = b"\xff\xc1" + (11).to_bytes(2, "big") + bytes([12, 0, 16, 0, 16, 1, 1, 0x11, 0])
    with pytest.raises(ImageDecodeError, match="JPEG image.*12-bit samples"):
        check_frame(CompressedFrame("jpeg", b"\xff\xd8" + sof1 + b"\xff\xd9"))


@pytest.mark.parametrize("data", [b"\xff\xd8", b"\xff\xd8\xff\xe0\x00\x10JFIF", b"\xff\xd8\xff\xda\x00\x08",
                                  b"\xff\xd8garbage", b"\x89PNG\r\n\x1a\n\x00\x00"],
                         ids=["soi-only", "cut-in-app0", "scan-first", "no-marker", "png-cut"])
def test_unreadable_headers_are_refused(data):
    with pytest.raises(ImageDecodeError, match="header"):
        check_frame(CompressedFrame("jpeg", data))


def test_oversized_frames_are_refused_naming_the_size_before_decoding():
    # Raw: from width x height alone (these 16 bytes could never hold the pixels).
    huge_raw = RawImage(12000, 12000, "rgb8", 36000, False, bytes(16))
    with pytest.raises(ImageDecodeError, match="rgb8 image is 12000x12000 = 144000000 pixels, more than "
                                               "max_image_pixels 16777216"):
        check_frame(huge_raw, max_pixels=4096 * 4096)
    # Compressed: from the header of a real 12000 x 12000 PNG.
    data = big_png(12000, 12000)
    assert len(data) < 1_000_000
    with pytest.raises(ImageDecodeError, match="PNG image is 12000x12000 = 144000000 pixels"):
        check_frame(CompressedFrame("png", data), max_pixels=4096 * 4096)
    jpeg = CompressedFrame("jpeg", jpeg_with_exif(np.zeros((40, 30, 3), dtype=np.uint8)))
    with pytest.raises(ImageDecodeError, match="JPEG image is 30x40 = 1200 pixels, more than max_image_pixels 1199"):
        check_frame(jpeg, max_pixels=1199)
    check_frame(jpeg, max_pixels=1200)       # the bound is inclusive


# Runs in its own process, so the peak memory it measures is this check's alone.
PEAK_MEMORY_PROBE = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    import numpy as np
    from vla_policy_node.images import CompressedFrame
    from vla_policy_node.observation import Observation, ObservationError
    from vla_policy_node.runtime import PolicyRuntime

    runtime = PolicyRuntime.from_pretrained(sys.argv[1], device='cpu', dtype='float32')
    small = np.zeros((24, 40, 3), dtype=np.uint8)
    runtime.infer(Observation({'base_0_rgb': small}, np.zeros(6), 'go'), seed=0)           # warm
    frame = CompressedFrame('png', Path(sys.argv[2]).read_bytes())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        runtime.infer(Observation({'base_0_rgb': frame}, np.zeros(6), 'go'), seed=0)
        refused = ''
    except ObservationError as exc:
        refused = f'{exc.reason.value}: {exc}'
    growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before                # Linux: KiB
    print(json.dumps({'refused': refused, 'peak_growth_mib': growth_kib / 1024}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss is in KiB on Linux only")
def test_a_12000_by_12000_png_is_refused_by_the_runtime_without_decoding(tiny_checkpoints, tmp_path):
    # 420 KB on the wire, 432 MB as rgb8 and 1.7 GB as the float tensor: decoding it took ~5 GB at peak.
    png = tmp_path / "huge.png"
    png.write_bytes(big_png(12000, 12000))
    result = subprocess.run([sys.executable, "-c", PEAK_MEMORY_PROBE, str(tiny_checkpoints["pi0"]), str(png)],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["refused"].startswith("bad_image: images.base_0_rgb: compressed PNG image is 12000x12000")
    assert "max_image_pixels 16777216" in measured["refused"]
    assert measured["peak_growth_mib"] < 100, measured       # generous: the decoded frame alone is 412 MiB


# --------------------------------------------------------------------------
# Decoded array -> unit tensor (policy/preprocess.py, the one conversion the runtime uses)
# --------------------------------------------------------------------------


def unit(image):
    return image_to_unit_tensor(image, torch.device("cpu")).permute(1, 2, 0).numpy()


def test_unit_tensor_scales_8_bit_samples():
    np.testing.assert_allclose(unit(np.array([[[0, 255, 51]]], dtype=np.uint8)), [[[0.0, 1.0, 0.2]]], atol=1e-6)


@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
def test_unit_tensor_refuses_wider_samples(dtype):
    with pytest.raises(ValueError, match="uint8"):
        unit(np.zeros((2, 2, 1), dtype=dtype))


def test_unit_tensor_broadcasts_grey_and_accepts_read_only_views_from_decode():
    np.testing.assert_array_equal(unit(np.array([[[0], [255]]], dtype=np.uint8))[0, 1], [1.0, 1.0, 1.0])
    rgb = reference_rgb()
    decoded = decode_frame(raw(rgb[:, :, ::-1].copy(), "bgr8"))
    np.testing.assert_allclose(unit(decoded), rgb / 255.0, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 2), (2, 2, 4)])
def test_unit_tensor_rejects_non_canonical_arrays(shape):
    with pytest.raises(ValueError):
        unit(np.zeros(shape, dtype=np.uint8))


# --------------------------------------------------------------------------
# Messages and helpers
# --------------------------------------------------------------------------


def test_supported_encodings_lists_the_raw_encodings():
    for encoding in ("rgb8", "bgr8", "rgba8", "bgra8", "mono8", "8UC1"):
        assert encoding in SUPPORTED_ENCODINGS
    for encoding in ("8UC3", "mono16", "16UC1", "32FC1"):
        assert encoding not in SUPPORTED_ENCODINGS


def test_frame_from_msg_rejects_other_objects():
    with pytest.raises(ImageDecodeError, match="missing attributes.*height"):
        frame_from_msg(object())


def test_frame_buffer_does_not_copy_numpy_data():
    source = np.arange(10, dtype=np.uint8)
    view = frame_buffer(CompressedFrame("png", source))
    source[0] = 42
    assert view[0] == 42


def fill_image_msg(msg, rgb: np.ndarray, data):
    msg.height, msg.width = rgb.shape[:2]
    msg.encoding = "bgr8"
    msg.is_bigendian = 0
    msg.step = rgb.shape[1] * 3 + 7
    msg.data = data
    return msg


def bgr8_padded_bytes(rgb: np.ndarray) -> bytes:
    return raw(rgb[:, :, ::-1].copy(), "bgr8", step=rgb.shape[1] * 3 + 7).data


def test_frame_from_rclpy_image_decodes_without_copying():
    sensor_msgs = pytest.importorskip("sensor_msgs.msg")
    rgb = reference_rgb()
    msg = fill_image_msg(sensor_msgs.Image(), rgb, bgr8_padded_bytes(rgb))
    assert isinstance(msg.data, array.array)

    frame = frame_from_msg(msg)
    buffer = frame_buffer(frame)

    assert isinstance(frame, RawImage)
    assert frame.data is msg.data
    msg.data[0] ^= 0xFF  # a copy would not see this change
    assert buffer[0] == msg.data[0]
    msg.data[0] ^= 0xFF
    np.testing.assert_array_equal(decode_frame(frame), rgb)


def test_frame_from_rclpy_compressed_image():
    sensor_msgs = pytest.importorskip("sensor_msgs.msg")
    rgb = reference_rgb()
    msg = sensor_msgs.CompressedImage()
    msg.format = "rgb8; png compressed bgr8"
    msg.data = encoded(rgb, "PNG")

    frame = frame_from_msg(msg)

    assert isinstance(frame, CompressedFrame)
    assert frame.format == "rgb8; png compressed bgr8"
    np.testing.assert_array_equal(decode_frame(frame), rgb)


def test_rosbags_and_rclpy_messages_decode_to_the_same_pixels():
    typesys = pytest.importorskip("rosbags.typesys")
    store = typesys.get_typestore(typesys.Stores.ROS2_KILTED)
    types = store.types
    rgb = reference_rgb()
    data = bgr8_padded_bytes(rgb)
    header = types["std_msgs/msg/Header"](
        stamp=types["builtin_interfaces/msg/Time"](sec=1, nanosec=2), frame_id="cam"
    )
    built = types["sensor_msgs/msg/Image"](
        header=header, height=HEIGHT, width=WIDTH, encoding="bgr8", is_bigendian=0,
        step=WIDTH * 3 + 7, data=np.frombuffer(data, dtype=np.uint8),
    )
    typename = "sensor_msgs/msg/Image"
    from_bag = store.deserialize_cdr(store.serialize_cdr(built, typename), typename)

    bag_pixels = decode_frame(frame_from_msg(from_bag))

    np.testing.assert_array_equal(bag_pixels, rgb)
    sensor_msgs = pytest.importorskip("sensor_msgs.msg")
    rclpy_msg = fill_image_msg(sensor_msgs.Image(), rgb, data)
    np.testing.assert_array_equal(decode_frame(frame_from_msg(rclpy_msg)), bag_pixels)
