"""Camera streams as lerobot encodes them, through PyAV; and read back, frame by frame.

The encoder is lerobot's default (lerobot 7427f318 ``src/lerobot/configs/video.py`` ``VideoEncoderConfig`` /
``RGBEncoderConfig``): libsvtav1, pix_fmt yuv420p, GOP ``g`` 2, ``crf`` 30, ``preset`` 12
(``LIBSVTAV1_DEFAULT_PRESET``), ``svtav1-params`` "fast-decode=0" (``get_codec_options``), written as
``datasets/video_utils.py`` ``encode_video_frames`` does: an mp4 stream at the dataset's fps fed RGB frames,
which PyAV converts to the stream's pixel format.

Fallback: a PyAV build without libsvtav1 (``av.codecs_available``) gets the next codec lerobot both encodes
(``VALID_VIDEO_CODECS``) and decodes with PyAV or torchcodec: libaom-av1 (still AV1, crf 30), then h264
(libx264, crf 30), both yuv420p with g 2. The codec used is recorded in each video feature's ``info``
(``video.codec``, from the stream, as ``get_video_info`` probes it) and in meta/vla_policy_node_conversion.json.

Episodes follow each other in one mp4 per camera (lerobot concatenates per-episode files the same way):
frame k of the file has pts k at time base 1/fps, so an episode's frames sit at
``from_timestamp + frame_index / fps``, where lerobot's readers (``decode_video_frames_pyav`` by time,
``decode_video_frames_torchcodec`` by index ``round(t * fps)``) look for them.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from . import DatasetError

PIX_FMT = 'yuv420p'
GOP = 2
CRF = 30
SVTAV1_PRESET = 12
# In preference order: lerobot's default, then codecs lerobot decodes (see the module docstring).
CODEC_PREFERENCE = ('libsvtav1', 'libaom-av1', 'h264')
# FFmpeg's name of the libx264 encoder is 'libx264'; lerobot's config calls it 'h264'.
_ENCODER_LIBRARY = {'h264': 'libx264'}


@dataclass(frozen=True)
class Encoder:
    """A codec and its options, as lerobot's VideoEncoderConfig(vcodec=...) gives them."""

    vcodec: str
    pix_fmt: str = PIX_FMT
    options: Dict[str, str] = field(default_factory=dict)
    fallback: bool = False              # not lerobot's default codec

    def info(self) -> Dict[str, Any]:
        """The encoder part of a video feature's info (get_video_info with the encoder config: every
        VideoEncoderConfig field but vcodec, as ``video.<field>``)."""
        return {'video.g': GOP, 'video.crf': CRF, 'video.preset': SVTAV1_PRESET if self.vcodec == 'libsvtav1' else None,
                'video.fast_decode': 0, 'video.video_backend': 'pyav', 'video.extra_options': {}}


def encoder_options(vcodec: str) -> Dict[str, str]:
    """lerobot's ``get_codec_options(as_strings=True)`` for the default settings and this codec."""
    options = {'g': str(GOP), 'crf': str(CRF)}
    if vcodec == 'libsvtav1':
        options.update({'preset': str(SVTAV1_PRESET), 'svtav1-params': 'fast-decode=0'})
    return options


def choose_encoder(available: Optional[frozenset] = None) -> Encoder:
    """lerobot's default codec where this PyAV has it, else the first fallback it has (DatasetError: none)."""
    import av
    codecs = set(av.codecs_available) if available is None else set(available)
    for vcodec in CODEC_PREFERENCE:
        if _ENCODER_LIBRARY.get(vcodec, vcodec) in codecs:
            return Encoder(vcodec, options=encoder_options(vcodec), fallback=vcodec != CODEC_PREFERENCE[0])
    raise DatasetError(f'this PyAV ({av.__version__}) has none of the video encoders {list(CODEC_PREFERENCE)} '
                       'that lerobot reads; install a PyAV wheel with libsvtav1 (pip install av)')


REAL_TIME_POLICIES = tuple(getattr(os, name) for name in ('SCHED_FIFO', 'SCHED_RR') if hasattr(os, name))


def _thread_policies() -> Dict[int, int]:
    policies = {}
    for task in os.listdir('/proc/self/task'):
        with contextlib.suppress(OSError):          # a thread that ended meanwhile
            policies[int(task)] = os.sched_getscheduler(int(task))
    return policies


@contextlib.contextmanager
def normal_scheduling() -> Iterator[None]:
    """Undo what an encoder call did to this process's scheduling: SVT-AV1, run as root (a robot's Docker
    container), moves the calling thread and its own threads to SCHED_FIFO at priority 99. A converting process
    would then starve every normal process on the machine, the robot's controllers included, and every process it
    starts later inherits the policy (a pytest worker's DDS nodes starved behind a busy loop). Threads the call
    moved to a real-time policy go back to SCHED_OTHER; a thread that was real-time before keeps its policy."""
    if not REAL_TIME_POLICIES or not os.path.isdir('/proc/self/task'):
        yield
        return
    before = _thread_policies()
    try:
        yield
    finally:
        for task, policy in _thread_policies().items():
            if policy in REAL_TIME_POLICIES and before.get(task) not in REAL_TIME_POLICIES:
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(task, os.SCHED_OTHER, os.sched_param(0))


class VideoFile:
    """One mp4 being written: frames appended at pts 0, 1, 2 ... (time base 1/fps)."""

    def __init__(self, path: Path, encoder: Encoder, fps: int, height: int, width: int) -> None:
        import av
        # SVT-AV1 prints a banner and warnings to stderr for every stream; keep its errors only (a
        # user's own SVT_LOG wins).
        os.environ.setdefault('SVT_LOG', '1')
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.frames = 0
        self._container = av.open(str(path), 'w')
        try:
            with normal_scheduling():
                self._stream = self._container.add_stream(encoder.vcodec, rate=fps, options=dict(encoder.options))
                self._stream.pix_fmt = encoder.pix_fmt
                self._stream.width = width
                self._stream.height = height
                self._stream.codec_context.time_base = Fraction(1, fps)
        except Exception as err:
            self._container.close()
            raise DatasetError(f'cannot open a {encoder.vcodec} stream of {width}x{height} at {fps} fps in {path}: '
                               f'{err}') from err

    def append(self, rgb: np.ndarray) -> None:
        import av
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format='rgb24')
        frame.pts = self.frames
        with normal_scheduling():           # the encoder starts its threads at the first frame
            packets = self._stream.encode(frame)
        for packet in packets:
            self._container.mux(packet)
        self.frames += 1

    def size_bytes(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def close(self) -> None:
        """Flush the encoder and finish the file (safe to call twice)."""
        if self._container is None:
            return
        try:
            with normal_scheduling():
                packets = self._stream.encode()
            for packet in packets:
                self._container.mux(packet)
        finally:
            with normal_scheduling():
                self._container.close()
            self._container = None


def stream_codec(path: Path) -> Dict[str, Any]:
    """What get_video_info reads from a written file: size, codec name, pixel format, fps, channels, audio."""
    import av
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        info = {'video.height': int(stream.height), 'video.width': int(stream.width),
                'video.codec': stream.codec_context.codec.canonical_name, 'video.pix_fmt': stream.pix_fmt,
                'video.fps': int(stream.base_rate), 'video.channels': len(av.VideoFormat(stream.pix_fmt).components),
                'has_audio': bool(container.streams.audio)}
    return info


def decode_frames(path: Path, first: int, count: int) -> Iterator[Tuple[float, np.ndarray]]:
    """(time s, RGB uint8 [H, W, 3]) of frames ``first`` .. ``first + count - 1`` of an mp4 written above."""
    import av
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        fps = float(stream.base_rate)
        start = first / fps
        if first > 0:
            # Seek to the keyframe at or before the first wanted frame, then decode forward (as lerobot's pyav reader).
            container.seek(max(0, int(round(start / stream.time_base)) - 1), backward=True, any_frame=False,
                           stream=stream)
        wanted = 0
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            index = int(round(float(frame.pts * stream.time_base) * fps))
            if index < first:
                continue
            if index != first + wanted:
                raise DatasetError(f'{path}: frame {first + wanted} is missing (the stream goes on with {index})')
            yield index / fps, frame.to_ndarray(format='rgb24')
            wanted += 1
            if wanted == count:
                return
    if wanted < count:
        raise DatasetError(f'{path}: only {wanted} of frames {first}..{first + count - 1} are in the file')


def frame_errors(decoded: np.ndarray, source: np.ndarray) -> Dict[str, float]:
    """How far a decoded frame is from its source: max and mean absolute error (0-255), PSNR in dB."""
    difference = decoded.astype(np.int16) - source.astype(np.int16)
    mse = float(np.mean(difference.astype(np.float64) ** 2))
    return {'max_abs': float(np.abs(difference).max()), 'mean_abs': float(np.abs(difference).mean()),
            'psnr_db': float('inf') if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))}
