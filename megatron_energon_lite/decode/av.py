"""Video and audio parts: a lazy :class:`AVDecoder` over the part's bytes (PyAV / FFmpeg).

Nothing is decoded until a method asks for it.  Clips are read by seeking to the keyframe at or
before the clip start and decoding forward only until the clip end, so sampling a few frames of
a long video never holds the whole decoded video; every request is also checked against a byte
budget (:data:`DEFAULT_BYTE_BUDGET` per call, configurable per decoder) and exceeding it is a
:class:`~megatron_energon_lite.errors.DecodeError`, not an out-of-memory kill.  The decoder reads
from the bytes in memory (no temporary files) and pickles as those bytes, so it can cross from a
dataloader worker to the main process or be rebuilt by ``restore_sample``.  Like Energon's, it can
be made from a binary file object (``AVDecoder(io.BytesIO(data))``) as well as from bytes.

Ranges, units and results follow Energon's ``AVDecoder`` (checked against it on generated files):

* video ranges in seconds (or frame numbers), end inclusive: a clip holds every frame shown during
  ``[start, end]`` (the frame on screen at ``start`` through the one on screen at ``end``); its
  timestamps are the start of its first frame and the end of its last frame;
* audio ranges in seconds (or samples): ``int(seconds * rate + 0.5)`` samples from the sample at
  ``start``, in the stream's own sample type (``int16`` for 16-bit PCM, ``float32`` for float
  codecs, ...); ``sample_rate=`` (ours) resamples and gives ``float32`` in [-1, 1];
* a range that holds no frame or sample (it starts at or after the end) gives no clip: the list
  of clips is shorter than the list of ranges.  A range that ends after the end is cut there.

Seeking trusts FFmpeg in MP4/MOV and Matroska/WebM, whose indexes hold presentation times.  Other
containers (AVI, ...) are probed first (:class:`AVProbeIndex`: one pass over the packets, no
decoding, once per decoder): clips start from the index's keyframe, stepping back a keyframe
where FFmpeg's seek (by decode times) lands after it, and frame numbers count the frames shown
(exact with dropped frames or a variable frame rate).

Inside dataloader workers FFmpeg decodes with one thread, so forked workers cannot deadlock on
FFmpeg's thread pool.

Audio clips of WAV and FLAC files are read with ``soundfile`` (libsndfile) when it is installed:
the same clips (the same sample type and values) and timestamps, without FFmpeg's demuxer.
Without it, or where libsndfile reads the file in another sample type than FFmpeg (8-bit PCM,
Vorbis, ...) or a clip must be resampled, PyAV decodes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import io
import itertools
import logging
import math
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, Optional, Sequence

import numpy as np

from ..errors import DecodeError, MissingDependencyError, format_message
from ..format.media_metadata import last_end, stream_seconds
from ..format.media_types import (
    AVMetadata,  # the one typed metadata class (Energon's media.AVMetadata)
)
from ..policy import PLAIN, Policy

if TYPE_CHECKING:  # torch is imported where a tensor is made, so decoding text or images never loads it
    import torch

__all__ = [
    "AV_EXTENSIONS",
    "DEFAULT_BYTE_BUDGET",
    "AVData",
    "AVDecoder",
    "AVMetadata",
    "AVProbeIndex",
    "AVProbeIndexEntry",
    "backend",
    "get_clips_uniform",
    "get_single_frames_uniform",
]

logger = logging.getLogger(__name__)

AV_EXTENSIONS = ("mp4", "avi", "mov", "webm", "mkv", "flac", "mp3", "wav", "ogg", "m4a", "flv", "opus", "aac")
_AUDIO_ONLY = ("flac", "mp3", "wav", "ogg", "m4a", "opus", "aac")
#: Most bytes one request may decode into (frames or samples kept): 1 GiB.
DEFAULT_BYTE_BUDGET = 1 << 30
_reported = False  # process-wide, not per run: the backend's version is logged once per process


def _av():
    try:
        import av
    except ImportError as exc:
        raise MissingDependencyError(
            format_message(
                "decoding video and audio needs PyAV",
                found=f"{type(exc).__name__}: {exc}",
                fix="pip install megatron-energon-lite[av]",
            )
        ) from exc
    global _reported
    if not _reported:
        _reported = True
        logger.info("video/audio backend: PyAV %s (FFmpeg %s)", av.__version__, ".".join(map(str, av.library_versions.get("libavcodec", ()))))
    return av


def backend() -> str:
    """The AV backend as recorded in config fingerprints (``"pyav <version>"``), or ``"none"``.

    Read from the installed package's metadata: importing PyAV (0.15 s) only to name it would
    slow every loader's start, video or not."""
    module = sys.modules.get("av")
    if module is not None:
        return f"pyav {module.__version__}"
    return _installed_backend()


@functools.lru_cache(maxsize=1)
def _installed_backend() -> str:
    # Reading package metadata costs ~2 ms; every loader (and every topology an elastic restore
    # rebuilds) asks for it.
    try:
        return f"pyav {importlib.metadata.version('av')}"
    except importlib.metadata.PackageNotFoundError:
        return "none"


_UNSET: Any = object()
_soundfile_module: Any = _UNSET  # process-wide, not per run: an optional module, imported once


def _soundfile():
    """The ``soundfile`` module if it is installed and its libsndfile loads, else None (looked up once)."""
    global _soundfile_module
    if _soundfile_module is _UNSET:
        try:
            import soundfile
        except (ImportError, OSError):  # OSError: the package is there but libsndfile is not
            soundfile = None
        _soundfile_module = soundfile
    return _soundfile_module


def _sndfile_container(data: bytes) -> bool:
    """Whether the bytes are a WAV, FLAC or Ogg file: the audio-only containers soundfile reads."""
    return (data[:4] == b"RIFF" and data[8:12] == b"WAVE") or data[:4] in (b"fLaC", b"OggS")


@dataclasses.dataclass
class AVData:
    """Decoded clips: video clips ``(frames, 3, height, width)`` uint8, audio clips
    ``(channels, samples)`` in the stream's sample type (float32 when resampled), each with its
    ``(start, end)`` seconds.  A part that was not asked for is an empty list (as Energon)."""

    video_clips: Optional[list[torch.Tensor]]
    video_timestamps: Optional[list[tuple[float, float]]]
    audio_clips: Optional[list[torch.Tensor]]
    audio_timestamps: Optional[list[tuple[float, float]]]


@dataclasses.dataclass(frozen=True, slots=True)
class AVProbeIndexEntry:
    """One packet of a probed video stream: its presentation timestamp (in the stream's time base)
    and whether a keyframe starts there."""

    timestamp: int
    is_keyframe: bool


class AVProbeIndex:
    """Every packet with a timestamp of one video stream, in the container's order, found by
    demuxing (reading packets, not decoding them): where the keyframes are, and which frame is the
    n-th on screen.  Energon's ``megatron.energon.av.av_reader.AVProbeIndex``: the same constructor,
    ``len``, indexing, iteration and :meth:`search_timestamp`.

    The decoder seeks through it in containers that FFmpeg seeks by decode timestamps or by a
    missing index (AVI, FLV, MPEG-TS, ...; not MP4/MOV or Matroska/WebM, which carry an exact
    index), and counts frames with it.  It is built from the start of the stream whatever the
    container's position, and leaves the container at the start.
    """

    def __init__(self, container, stream_idx: int = 0) -> None:
        stream = container.streams.video[stream_idx]
        stamps: list[int] = []
        keyframes: list[bool] = []
        last = None
        container.seek(0)
        for packet in container.demux(stream):
            if packet.pts is None:  # the demuxer's final empty packet, or a packet without a time
                continue
            stamps.append(packet.pts)
            keyframes.append(packet.is_keyframe)
            last = packet
        container.seek(0)
        self._stamps = np.array(stamps, dtype=np.int64)
        self._keyframes = np.array(keyframes, dtype=bool)
        #: Where the last packet with a timestamp ends (stream ticks), or None if it has no duration.
        self.end: int | None = last_end([last]) if last is not None else None
        # (entry numbers, their timestamps) sorted by timestamp (stable: equal timestamps keep the
        # container's order), for all frames (the presentation order) and for keyframes only.
        order = np.argsort(self._stamps, kind="stable")
        key_order = order[self._keyframes[order]]
        self._frames_by_time = (order, self._stamps[order])
        self._keyframes_by_time = (key_order, self._stamps[key_order])

    def __len__(self) -> int:
        return len(self._stamps)

    def __getitem__(self, idx: int) -> AVProbeIndexEntry:
        return AVProbeIndexEntry(int(self._stamps[idx]), bool(self._keyframes[idx]))

    def __iter__(self):
        return (AVProbeIndexEntry(int(stamp), bool(key)) for stamp, key in zip(self._stamps, self._keyframes))

    @property
    def presentation_timestamps(self) -> np.ndarray:
        """The timestamps in presentation order: element n is when the n-th frame is shown."""
        return self._frames_by_time[1]

    def search_timestamp(self, timestamp: int, *, backward: bool = True, any_frame: bool = False) -> int:
        """The entry number of the keyframe (with ``any_frame``, of any frame) at or before
        ``timestamp`` (with ``backward=False``: at or after it), in the stream's time base.

        As Energon's: when nothing is at or before the timestamp, entry 0 (decode from the start);
        when nothing is at or after it, -1.  Of several entries with the same timestamp, the first.
        """
        pool, stamps = self._frames_by_time if any_frame else self._keyframes_by_time
        if not len(pool):
            return -1
        if backward:
            pos = int(np.searchsorted(stamps, timestamp, side="right")) - 1
            if pos < 0:
                return 0
        else:
            pos = int(np.searchsorted(stamps, timestamp, side="left"))
            if pos == len(pool):
                return -1
        return int(pool[np.searchsorted(stamps, stamps[pos], side="left")])


#: Demuxers that seek by an exact index of presentation timestamps: the decoder trusts FFmpeg's
#: seek there and probes other containers (as Energon picks its seeking mode).
_INDEXED_FORMATS = frozenset({"mov", "mp4", "matroska", "webm"})


def _seeks_exactly(container) -> bool:
    return not _INDEXED_FORMATS.isdisjoint(container.format.name.split(","))


_local = threading.local()
_PROBE_BYTES = 4096


def _incomplete(stream) -> bool:
    context = stream.codec_context
    if stream.type == "video":
        return not context.width or not context.height
    if stream.type == "audio":
        return not context.sample_rate or not context.channels
    return False


def _to_rgb(frame, **size) -> np.ndarray:
    """An RGB array of ``frame``, converted by FFmpeg's scaler on the calling thread only.

    ``frame.to_ndarray`` set up a scaler with a thread pool for every call (~1 ms each, and a
    pool that a forked worker must not inherit).  One single-threaded reformatter per thread and
    process keeps the scaler between frames and files.
    """
    pid = os.getpid()
    cached = getattr(_local, "reformatter", None)
    if cached is None or cached[0] != pid:
        from av.video.reformatter import VideoReformatter

        cached = _local.reformatter = (pid, VideoReformatter())
    return cached[1].reformat(frame, format="rgb24", threads=1, **size).to_ndarray()


#: PCM/float sample formats -> scale to [-1, 1] (float formats are already there).
_SAMPLE_SCALE = {"s16": 1 / 32768, "s32": 1 / 2147483648, "flt": 1.0, "dbl": 1.0}
#: libsndfile subtypes whose samples FFmpeg decodes to the same values, and their numpy type.
_SNDFILE_NATIVE = {"PCM_16": "int16", "PCM_S8": "int16", "PCM_24": "int32", "PCM_32": "int32", "FLOAT": "float32", "DOUBLE": "float64"}


def _native_samples(frame) -> np.ndarray:
    """``(channels, samples)`` of an audio frame in its own sample type (Energon's layout)."""
    array = frame.to_ndarray()
    if not frame.format.is_planar:  # packed: (1, samples * channels), interleaved
        array = array.reshape(-1, len(frame.layout.channels)).T
    return array


def _float_samples(frame) -> np.ndarray | None:
    """``(channels, samples)`` float32 in [-1, 1] of a PCM or float frame; None for other formats."""
    scale = _SAMPLE_SCALE.get(frame.format.name.rstrip("p"))
    if scale is None:
        return None
    array = _native_samples(frame)
    return (array.astype(np.float32) * np.float32(scale)) if scale != 1.0 or array.dtype != np.float32 else array


def _frame_time(frame, stream) -> float:
    return float(frame.pts * stream.time_base) if frame.pts is not None else 0.0


def _half_up(value: float) -> int:
    """Energon's rounding of sample positions: ``int(value + 0.5)``."""
    return int(value + 0.5)


def _in_worker() -> bool:
    import torch.utils.data

    return torch.utils.data.get_worker_info() is not None


def _read_stream(stream: Any) -> bytes:
    """All bytes of a binary file object, from its start (Energon's AVDecoder takes a stream)."""
    if isinstance(stream, io.TextIOBase) or "t" in str(getattr(stream, "mode", "rb")):
        raise DecodeError(format_message("AVDecoder needs a binary stream", found=f"{type(stream).__name__} opened in text mode", fix="open the file with mode 'rb', or pass its bytes"))
    if getattr(stream, "seekable", lambda: False)():
        stream.seek(0)
    data = stream.read()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(format_message("AVDecoder needs a binary stream", found=f"read() returned {type(data).__name__}", fix="pass bytes or a file opened with mode 'rb'"))
    return bytes(data)


class AVDecoder:
    """Lazy access to the video and audio of one sample part.

    ``AVDecoder(stream)`` takes the part's bytes or, as Energon's, a binary file object (read
    once, from its start).  ``suppress_warnings`` is accepted for Energon's signature (this
    decoder has no seeking warnings to suppress).  ``policy``: a clip range that starts at or
    after the end of its stream is a :class:`DecodeError` (ours, :data:`~megatron_energon_lite.
    policy.PLAIN`) or gives no clip, so that the clips no longer line up with the ranges
    (Energon's, under the as_energon switch: a loader's decoder passes its policy on).
    """

    def __init__(
        self,
        stream: bytes | bytearray | memoryview | BinaryIO,
        suppress_warnings: bool = False,
        *,
        name: str = "?",
        byte_budget: int = DEFAULT_BYTE_BUDGET,
        extension: str | None = None,
        policy: Policy = PLAIN,
    ) -> None:
        self.data = bytes(stream) if isinstance(stream, (bytes, bytearray, memoryview)) else _read_stream(stream)
        self.suppress_warnings = suppress_warnings
        self.name = name  # "sample key, part" for messages
        self.byte_budget = byte_budget
        self.extension = extension  # the part's extension, a hint for opening
        self.policy = policy
        self._probe: AVProbeIndex | None = None  # built on first need; the bytes never change

    @property
    def stream(self) -> io.BytesIO:
        """The media as a fresh binary stream (Energon's attribute), e.g. for ``av.open``."""
        return io.BytesIO(self.data)

    def __getstate__(self) -> dict:
        return {"data": self.data, "name": self.name, "byte_budget": self.byte_budget, "extension": self.extension, "suppress_warnings": self.suppress_warnings, "policy": self.policy}

    def __setstate__(self, state: dict) -> None:
        self.suppress_warnings = False
        self.policy = PLAIN
        self._probe = None
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AVDecoder({self.name}, {len(self.data)} bytes)"

    # --- plumbing ------------------------------------------------------------------------------
    def _error(self, what: str, exc: BaseException | None = None, fix: str | None = None) -> DecodeError:
        return DecodeError(
            format_message(
                what + (f": {type(exc).__name__}: {exc}" if exc is not None else ""),
                where=self.name,
                found=f"{len(self.data)} bytes starting with {self.data[:12]!r}",
                fix=fix or "check the file (re-encode it with ffmpeg), or drop the sample; the loader skips and counts it",
            )
        )

    def _open(self):
        av = _av()
        try:
            # FFmpeg probes up to 5 MB by default, decoding a WAV's samples to do it (~3 ms per
            # open); audio headers fit in 4 KiB. (Video keeps the default: a short probe made
            # H.264 decoding slower.) Streams left incomplete by a short probe reopen fully.
            options = {"probesize": str(_PROBE_BYTES)} if self.extension in _AUDIO_ONLY else {}
            container = av.open(io.BytesIO(self.data), mode="r", options=options)
            if options and any(_incomplete(stream) for stream in container.streams):
                container.close()
                container = av.open(io.BytesIO(self.data), mode="r")
        except Exception as exc:  # noqa: BLE001 - every FFmpeg error becomes one clear error
            raise self._error("cannot open the media", exc) from exc
        if _in_worker():
            for stream in container.streams:
                stream.codec_context.thread_count = 1
        return container

    def _stream(self, container, kind: str):
        streams = container.streams.video if kind == "video" else container.streams.audio
        if not streams:
            raise self._error(f"the media has no {kind} stream", fix=f"ask for {'audio' if kind == 'video' else 'video'} only, or check the file")
        return streams[0]

    def _probe_index(self, container) -> AVProbeIndex:
        """The first video stream's :class:`AVProbeIndex`, demuxed once per decoder."""
        if self._probe is None:
            self._probe = AVProbeIndex(container, 0)
        return self._probe

    def _range_past_the_end(self, kind: str, requested: tuple, unit: str, ends: str) -> None:
        """A clip range with nothing of the stream in it: under Energon's policy it gives no clip
        (the caller goes on); ours raises, naming the sample, the range and where the stream ends."""
        if self.policy.as_energon:
            return
        raise DecodeError(
            format_message(
                f"the {kind} clip range {requested!r} ({unit}) starts at or after the end of the {kind}, so it has no clip",
                where=self.name,
                expected=f"ranges that start before the end: {ends}",
                found=f"range {requested!r} in {unit}",
                fix="keep the ranges within get_metadata()'s duration (get_clips_uniform does); under the as_energon switch "
                "such a range gives no clip and the list of clips is shorter than the list of ranges, as in Energon",
            )
        )

    @staticmethod
    def _stream_end(container, stream) -> str:
        """Where a stream ends, for messages."""
        seconds = stream_seconds(stream.duration, stream) if stream.duration is not None else (container.duration / 1_000_000 if container.duration else None)
        frames = f", {stream.frames} frames" if getattr(stream, "frames", 0) else ""
        return f"the stream lasts {seconds:.6g} s{frames}" if seconds is not None else f"the stream's duration is unknown{frames}"

    def _check_budget(self, used: int) -> None:
        if used > self.byte_budget:
            raise self._error(
                f"decoding this request needs more than the byte budget of {self.byte_budget:,} bytes",
                fix="ask for shorter clips, fewer frames or a smaller video_out_frame_size, or raise the decoder's byte_budget",
            )

    # --- facts ---------------------------------------------------------------------------------
    def has_video_stream(self) -> bool:
        with self._open() as container:
            return bool(container.streams.video)

    def has_audio_stream(self) -> bool:
        with self._open() as container:
            return bool(container.streams.audio)

    def get_metadata(
        self,
        get_video: bool = True,
        get_video_duration: bool = True,
        get_video_frame_count: bool = True,
        get_video_frame_size: bool = True,
        get_audio: bool = True,
        get_audio_duration: bool = True,
        get_audio_num_samples: bool = False,
    ) -> AVMetadata:
        """Durations, rates and sizes of the first video and audio stream (Energon's arguments).

        Header values come first; what the header lacks is computed only when asked:
        ``get_video_duration`` / ``get_audio_duration`` read the packets (no decoding),
        ``get_video_frame_count`` counts the packets with a timestamp (Energon's rule: an AVI
        header also counts dropped frames),
        ``get_video_frame_size`` decodes the first frame when the header has no size, and
        ``get_audio_num_samples`` counts the samples (libsndfile's count for WAV/FLAC, else by
        decoding).  ``get_video=False`` / ``get_audio=False`` leave that stream's fields None.
        """
        meta = AVMetadata()
        try:
            with self._open() as container:
                if get_video and container.streams.video:
                    self._video_metadata(container, meta, get_video_duration, get_video_frame_count, get_video_frame_size)
                if get_audio and container.streams.audio:
                    self._audio_metadata(container, meta, get_audio_duration, get_audio_num_samples)
        except DecodeError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error("cannot read the media's metadata", exc) from exc
        return meta

    def _video_metadata(self, container, meta: AVMetadata, duration: bool, frame_count: bool, frame_size: bool) -> None:
        # Energon's rules: the frame count is the number of packets with a timestamp (never the
        # header's count, which an AVI with a dropped frame overstates); the duration is the
        # header's, else where the last packet ends (packets are read, not decoded).
        stream = container.streams.video[0]
        ticks = stream.duration
        if ticks is None and duration:
            index = self._probe_index(container)
            meta.video_num_frames, ticks = len(index), index.end  # Energon fills both then
        meta.video_duration = stream_seconds(ticks, stream)
        if frame_count and meta.video_num_frames is None:
            meta.video_num_frames = len(self._probe_index(container))
        rate = stream.average_rate
        if rate:
            meta.video_fps = float(rate)
        elif meta.video_num_frames and meta.video_duration:
            meta.video_fps = meta.video_num_frames / meta.video_duration
        if frame_size:
            meta.video_width, meta.video_height = stream.codec_context.width or None, stream.codec_context.height or None
            if meta.video_width is None or meta.video_height is None:
                container.seek(0)
                for frame in container.decode(stream):
                    meta.video_width, meta.video_height = frame.width, frame.height
                    break

    def _audio_metadata(self, container, meta: AVMetadata, duration: bool, num_samples: bool) -> None:
        stream = container.streams.audio[0]
        meta.audio_sample_rate = stream.codec_context.sample_rate or None
        meta.audio_channels = stream.codec_context.channels or None
        meta.audio_duration = stream_seconds(stream.duration, stream)
        if num_samples:
            counted = self._sndfile_frames()
            if counted is None:
                counted, last = 0, []
                container.seek(0)
                for frame in container.decode(stream):
                    counted += frame.samples
                    if frame.pts is not None:
                        last[:] = [frame]
                end = last_end(last)
                if end is not None:  # Energon takes the duration from the last frame then
                    meta.audio_duration = stream_seconds(end, stream)
            meta.audio_num_samples = counted
            if meta.audio_duration is None and meta.audio_sample_rate:
                meta.audio_duration = counted / meta.audio_sample_rate
        if meta.audio_duration is None and duration:
            container.seek(0)
            meta.audio_duration = stream_seconds(last_end(container.demux(stream)), stream)

    def _sndfile_frames(self) -> int | None:
        if _soundfile() is None or not _sndfile_container(self.data):
            return None
        try:
            with _soundfile().SoundFile(io.BytesIO(self.data)) as file:
                return int(file.frames)
        except Exception:  # noqa: BLE001 - libsndfile cannot read it: count by decoding
            return None

    def get_video_fps(self) -> float:
        return self.get_metadata(get_video_duration=False, get_video_frame_count=False, get_video_frame_size=False, get_audio=False).video_fps or 0.0

    def get_audio_samples_per_second(self) -> int:
        return self.get_metadata(get_video=False, get_audio_duration=False).audio_sample_rate or 0

    def get_video_duration(self, get_frame_count: bool = False) -> tuple[float | None, int | None]:
        """``(duration in seconds, number of frames or None)``: the count is computed with
        ``get_frame_count``, and given without it when finding the duration counted the frames
        anyway (as Energon)."""
        meta = self.get_metadata(get_video_frame_count=get_frame_count, get_video_frame_size=False, get_audio=False)
        return meta.video_duration, meta.video_num_frames

    def get_audio_duration(self) -> float | None:
        return self.get_metadata(get_video=False).audio_duration

    # --- video ---------------------------------------------------------------------------------
    def get_video_clips(
        self,
        video_clip_ranges: Sequence[tuple[float, float]],
        video_unit: Literal["frames", "seconds"] = "seconds",
        video_out_frame_size: Optional[tuple[int, int]] = None,
    ) -> tuple[list[torch.Tensor], list[tuple[float, float]]]:
        """The frames shown during each ``[start, end]`` range (end inclusive) as
        ``(frames, 3, h, w)`` uint8, with ``(start of the first frame, end of the last frame)`` in
        seconds; a range with no frame in it gives no clip.  ``video_out_frame_size`` is
        ``(width, height)`` to resize while decoding."""
        import torch

        if video_unit not in ("frames", "seconds"):
            raise self._error(f"unknown video_unit {video_unit!r}", fix='use "seconds" or "frames"')
        clips, stamps, used = [], [], 0
        with self._open() as container:
            stream = self._stream(container, "video")
            fps = float(stream.average_rate or stream.base_rate or 0) or 1.0
            time_base = stream.time_base
            index = None if _seeks_exactly(container) else self._probe_index(container)
            for start, end in video_clip_ranges:
                requested = (start, end)
                if end < start:
                    raise self._error(f"video clip range ends before it starts: ({start}, {end})", fix="pass (start, end) with end >= start")
                exact = video_unit == "frames" and index is not None
                if exact:
                    # Frame n is the n-th frame on screen (as Energon counts them here), also when
                    # the frame rate varies or frames were dropped; its timestamp is exact.
                    shown = index.presentation_timestamps
                    first_frame = max(0, int(start))
                    last_frame = len(shown) - 1 if math.isinf(end) else min(int(end), len(shown) - 1)
                    if first_frame > last_frame:
                        self._range_past_the_end("video", requested, video_unit, f"the video has {len(shown)} frames")
                        continue  # no such frame: no clip (Energon's policy)
                    start, end = int(shown[first_frame]) * time_base, int(shown[last_frame]) * time_base
                elif video_unit == "frames":
                    start, end = int(start) / fps, (end if math.isinf(end) else int(end)) / fps
                frames, first, last = self._decode_range(container, stream, index, fps, start, end, video_out_frame_size, exact)
                if not frames:
                    self._range_past_the_end("video", requested, video_unit, self._stream_end(container, stream))
                    continue  # nothing is shown during the range: no clip (Energon's policy)
                used += sum(f.nbytes for f in frames)
                self._check_budget(used)
                clips.append(torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous())
                stamps.append((first, last))
        return clips, stamps

    def _decode_range(self, container, stream, index, fps: float, start, end, size, exact: bool) -> tuple[list[np.ndarray], float, float]:
        """Decodes, from the keyframe at or before ``start``, the frames shown during ``[start,
        end]``: those that start at or before ``end`` and end after ``start``; with ``exact`` the
        frames that start within ``[start, end]`` (exact timestamps of frames from the index)."""
        frames: list[np.ndarray] = []
        first = last = 0.0
        eps = 0 if exact else 1e-6
        time_base = stream.time_base
        try:
            kwargs: dict[str, int] = {}
            if size is not None:
                kwargs.update(width=int(size[0]), height=int(size[1]))
            for frame in self._seek(container, stream, index, int(start / time_base)):
                t = frame.pts * time_base if frame.pts is not None else float(frame.time or 0)
                if t > end + eps:
                    break
                duration = float(frame.duration * time_base) if getattr(frame, "duration", None) else 1.0 / fps
                if (t >= start) if exact else (t + duration > start + eps):
                    if not frames:
                        first = float(t)
                    frames.append(_to_rgb(frame, **kwargs))
                    last = float(t) + duration
                    self._check_budget(sum(f.nbytes for f in frames))
        except DecodeError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error("cannot decode the video", exc) from exc
        return frames, first, last

    @staticmethod
    def _seek(container, stream, index: AVProbeIndex | None, target: int):
        """The decoded frames from a keyframe at or before ``target`` (stream ticks) on.

        Without a probe index FFmpeg's seek finds the keyframe (MP4, Matroska: exact indexes).  With
        one, the decoder seeks to the index's keyframe; a demuxer that seeks by decode timestamps
        (AVI) can land on the keyframe after it, so while the first frame decoded is later than the
        keyframe aimed at, it aims at the keyframe before (finally at the start of the stream).
        """
        if index is None or not len(index):
            container.seek(max(0, target), stream=stream, backward=True, any_frame=False)
            return container.decode(stream)
        aim = index[index.search_timestamp(target)].timestamp
        while True:
            container.seek(aim, stream=stream, backward=True, any_frame=False)
            frames = container.decode(stream)
            head = next(frames, None)
            if head is None or head.pts is None or head.pts <= aim:
                return itertools.chain([] if head is None else [head], frames)
            earlier = index[index.search_timestamp(aim - 1)].timestamp
            if earlier >= aim:  # no keyframe before it: decode from the start
                container.seek(0)
                return container.decode(stream)
            aim = earlier

    def get_video(self) -> AVData:
        """All frames of the video stream (Energon: no audio)."""
        clips, stamps = self.get_video_clips([(0.0, math.inf)])
        return AVData(clips, stamps, [], [])

    # --- audio ---------------------------------------------------------------------------------
    def get_audio_clips(
        self,
        audio_clip_ranges: Sequence[tuple[float, float]],
        audio_unit: Literal["samples", "seconds"] = "seconds",
        sample_rate: int | None = None,
    ) -> tuple[list[torch.Tensor], list[tuple[float, float]]]:
        """Samples of each ``[start, end)`` range as ``(channels, samples)`` in the stream's own
        sample type, with ``(start, end)`` seconds (the end cut at the end of the audio); a range
        starting at or after the end gives no clip.  With ``sample_rate`` (ours) the audio is
        resampled to it first and the clips are float32 (ranges are in the source's units)."""
        import torch

        if audio_unit not in ("samples", "seconds"):
            raise self._error(f"unknown audio_unit {audio_unit!r}", fix='use "seconds" or "samples"')
        if _soundfile() is not None and _sndfile_container(self.data):
            read = self._soundfile_audio_clips(audio_clip_ranges, audio_unit, sample_rate)
            if read is not None:
                return read
        av = _av()
        clips, stamps, used = [], [], 0
        with self._open() as container:
            stream = self._stream(container, "audio")
            source_rate = stream.codec_context.sample_rate
            rate = sample_rate or source_rate
            as_float = sample_rate is not None
            for start, end in audio_clip_ranges:
                requested = (start, end)
                if audio_unit == "samples":
                    start, end = start / source_rate, end / source_rate
                if end < start:
                    raise self._error(f"audio clip range ends before it starts: ({start}, {end})", fix="pass (start, end) with end >= start")
                try:
                    # Seek as Energon does (the container, in AV_TIME_BASE units), so that a codec
                    # with overlapping frames (AAC) decodes the same values; decode from the start
                    # if the seek lands after the range start.
                    container.seek(max(0, int(start * av.time_base)))
                    # Resample only when asked to; plain PCM/float frames convert in numpy.
                    resampler = av.AudioResampler(format="fltp", layout=stream.codec_context.layout.name, rate=rate) if rate != source_rate else None
                    chunks, first_time, last_end = [], None, 0.0
                    frames = iter(container.decode(stream))
                    head = next(frames, None)
                    if head is not None and start > 0 and _frame_time(head, stream) > start:
                        container.seek(0)
                        frames = iter(container.decode(stream))
                        head = next(frames, None)
                    for frame in itertools.chain([head] if head is not None else [], frames):
                        t = _frame_time(frame, stream)
                        if t > end:
                            break
                        if first_time is None:
                            first_time = t
                        last_end = t + (float(frame.duration * stream.time_base) if frame.duration else frame.samples / source_rate)
                        if resampler is None:
                            converted = _float_samples(frame) if as_float else _native_samples(frame)
                            if converted is None:
                                resampler = av.AudioResampler(format="fltp", layout=stream.codec_context.layout.name, rate=rate)
                        if resampler is not None:
                            chunks.extend(out.to_ndarray() for out in resampler.resample(frame))
                        else:
                            chunks.append(converted)
                        used += chunks[-1].nbytes if chunks else 0
                        self._check_budget(used)
                    if resampler is not None:
                        chunks.extend(out.to_ndarray() for out in resampler.resample(None))
                except DecodeError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    raise self._error("cannot decode the audio", exc) from exc
                if not chunks:
                    self._range_past_the_end("audio", requested, audio_unit, self._stream_end(container, stream))
                    continue  # the range starts at or after the end of the audio: no clip (Energon's policy)
                audio = np.concatenate(chunks, axis=1)
                # Cut to the range: the first decoded frame starts at first_time (at or before start).
                offset = max(0, _half_up((start - first_time) * rate))
                length = _half_up((end - start) * rate) if math.isfinite(end) else audio.shape[1]
                clip = audio[:, offset : offset + length]  # cut at the end of the stream
                if clip.shape[1] == 0 and length > 0:
                    self._range_past_the_end("audio", requested, audio_unit, self._stream_end(container, stream))
                    continue
                clips.append(torch.from_numpy(np.ascontiguousarray(clip)))
                complete = math.isfinite(end) and clip.shape[1] >= length
                stamps.append((float(max(start, first_time)), end if complete else last_end))  # cut: where the last frame ends
        return clips, stamps

    def _soundfile_audio_clips(self, ranges, unit: str, sample_rate: int | None):
        """:meth:`get_audio_clips` through libsndfile, with the same clips and timestamps as the
        PyAV path; None where the PyAV path must do it (resampling, a sample type FFmpeg decodes
        differently, or a file libsndfile cannot read: PyAV then decodes it or reports the error)."""
        import torch

        try:
            file = _soundfile().SoundFile(io.BytesIO(self.data))
        except Exception:  # noqa: BLE001 - e.g. a codec this libsndfile lacks
            return None
        with file:
            rate, total, channels = file.samplerate, file.frames, file.channels
            dtype = "float32" if sample_rate is not None else _SNDFILE_NATIVE.get(file.subtype)
            if sample_rate not in (None, rate) or total <= 0 or dtype is None:
                return None
            clips, stamps, used = [], [], 0
            for start, end in ranges:
                requested = (start, end)
                if unit == "samples":
                    start, end = start / rate, end / rate
                if end < start:
                    raise self._error(f"audio clip range ends before it starts: ({start}, {end})", fix="pass (start, end) with end >= start")
                first = max(0, _half_up(start * rate))
                length = _half_up((end - start) * rate) if math.isfinite(end) else total
                count = max(0, min(length, total - first))  # cut at the end of the audio
                if first >= total or (count == 0 and length > 0):
                    self._range_past_the_end("audio", requested, unit, f"the audio lasts {total / rate:.6g} s, {total} samples")
                    continue  # the range starts at or after the end: no clip (Energon's policy)
                used += count * channels * np.dtype(dtype).itemsize
                self._check_budget(used)
                samples = np.zeros((0, channels), dtype)
                try:
                    if count:
                        file.seek(first)
                        samples = file.read(count, dtype=dtype, always_2d=True)
                except Exception:  # noqa: BLE001
                    return None
                clips.append(torch.from_numpy(np.ascontiguousarray(samples.T)))
                complete = math.isfinite(end) and count >= length
                stamps.append((float(start), end if complete else (first + count) / rate))
        return clips, stamps

    def get_audio(self) -> AVData:
        """All samples of the audio stream (Energon: no video)."""
        clips, stamps = self.get_audio_clips([(0.0, math.inf)])
        return AVData([], [], clips, stamps)

    # --- both ----------------------------------------------------------------------------------
    def get_clips(
        self,
        video_clip_ranges: Optional[Sequence[tuple[float, float]]] = None,
        audio_clip_ranges: Optional[Sequence[tuple[float, float]]] = None,
        video_unit: Literal["frames", "seconds"] = "seconds",
        audio_unit: Literal["samples", "seconds"] = "seconds",
        video_out_frame_size: Optional[tuple[int, int]] = None,
    ) -> AVData:
        video, video_times = self.get_video_clips(video_clip_ranges, video_unit, video_out_frame_size) if video_clip_ranges is not None else ([], [])
        audio, audio_times = self.get_audio_clips(audio_clip_ranges, audio_unit) if audio_clip_ranges is not None else ([], [])
        return AVData(video, video_times, audio, audio_times)

    def get_frames(self, video_decode_audio: bool = False) -> AVData:
        """Everything: all video frames (and the audio with ``video_decode_audio``, when the file
        has an audio stream), or the audio of an audio-only file."""
        with self._open() as container:
            has_video, has_audio = bool(container.streams.video), bool(container.streams.audio)
        if not has_video:
            return self.get_audio()
        if video_decode_audio and has_audio:
            return self.get_video_with_audio()
        return self.get_video()

    def get_video_with_audio(self) -> AVData:
        """All video frames and all audio samples."""
        return self.get_clips(video_clip_ranges=[(0.0, math.inf)], audio_clip_ranges=[(0.0, math.inf)])


def get_clips_uniform(
    av_decoder: AVDecoder,
    clip_duration_seconds: float,
    num_clips: int,
    request_video: bool = False,
    request_audio: bool = False,
    video_out_frame_size: Optional[tuple[int, int]] = None,
) -> AVData:
    """``num_clips`` clips of ``clip_duration_seconds`` each, spread evenly (Energon's placement).

    The clips start at ``numpy.linspace(0, duration - clip_duration_seconds, num_clips)``, the
    duration being the shorter of the requested streams'.  Clips of zero duration (single
    frames) sit at the middle of frames: from half a frame after the start to half a frame before
    the end.
    """
    if not (request_video or request_audio):
        raise DecodeError(format_message("get_clips_uniform needs request_video or request_audio", where=av_decoder.name))
    if num_clips < 1:
        raise DecodeError(format_message("num_clips must be at least 1", where=av_decoder.name, found=repr(num_clips)))
    meta = av_decoder.get_metadata(get_video=request_video, get_video_frame_count=False, get_video_frame_size=False, get_audio=request_audio)
    durations = []
    for asked, duration, what in ((request_video, meta.video_duration, "video"), (request_audio, meta.audio_duration, "audio")):
        if asked:
            if duration is None:
                raise DecodeError(format_message(f"the {what} has no duration", where=av_decoder.name, fix=f"check that the file has a {what} stream"))
            durations.append(duration)
    total = min(durations)
    if clip_duration_seconds == 0:
        half_frame = 0.5 / (meta.video_fps or 1.0) if request_video else 0.0
        first, last = half_frame, total - half_frame
    else:
        first, last = 0.0, total - clip_duration_seconds
    ranges = [(float(start), float(start + clip_duration_seconds)) for start in np.linspace(first, last, num_clips)]
    return av_decoder.get_clips(
        video_clip_ranges=ranges if request_video else None,
        audio_clip_ranges=ranges if request_audio else None,
        video_out_frame_size=video_out_frame_size,
    )


def get_single_frames_uniform(
    av_decoder: AVDecoder,
    num_frames: int,
    *,
    video_out_frame_size: Optional[tuple[int, int]] = None,
    return_timestamps: bool = False,
):
    """``num_frames`` single frames spread evenly over the video, as ``(num_frames, 3, h, w)``
    (with ``return_timestamps``, also the start time of each frame)."""
    import torch

    data = get_clips_uniform(av_decoder, 0.0, num_frames, request_video=True, video_out_frame_size=video_out_frame_size)
    if not data.video_clips:
        raise DecodeError(format_message("the video has no frames", where=av_decoder.name))
    frames = torch.cat(data.video_clips, dim=0)
    if return_timestamps:
        return frames, [start for start, _ in data.video_timestamps]
    return frames


def decode_av(data: bytes, decoder: Any, *, name: str = "?") -> Any:
    """The decoder-table entry: an :class:`AVDecoder` (default), its full decode (``"torch"``) or
    the opened PyAV container (``"pyav"``), per the SampleDecoder's ``av_decode``."""
    av_decoder = AVDecoder(data, name=name, byte_budget=getattr(decoder, "av_byte_budget", DEFAULT_BYTE_BUDGET), policy=getattr(decoder, "policy", PLAIN))
    mode = getattr(decoder, "av_decode", "AVDecoder")
    if mode == "torch":
        return av_decoder.get_frames(video_decode_audio=getattr(decoder, "video_decode_audio", False))
    if mode == "pyav":
        return av_decoder._open()
    return av_decoder
