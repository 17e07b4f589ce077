"""Video and audio parts: a lazy :class:`AVDecoder` over the part's bytes (PyAV / FFmpeg).

Nothing is decoded until a method asks for it.  Clips are read by seeking to the keyframe at or
before the clip start and decoding forward only until the clip end, so sampling a few frames of
a long video never holds the whole decoded video; every request is also checked against a byte
budget (:data:`DEFAULT_BYTE_BUDGET` per call, configurable per decoder) and exceeding it is a
:class:`~megatron_energon_lite.errors.DecodeError`, not an out-of-memory kill.  The decoder reads
from the bytes in memory (no temporary files) and pickles as those bytes, so it can cross from a
dataloader worker to the main process or be rebuilt by ``restore_sample``.

Units and ranges follow Energon's ``AVDecoder``: video ranges in seconds (or frame numbers),
inclusive of the end, at least one frame per range; audio ranges in seconds (or samples).  A
range past the end of the stream is clamped to the stream (documented behaviour, not an error);
a range that starts after the end yields the last frame (video) or an empty clip (audio).

Inside dataloader workers FFmpeg decodes with one thread, so forked workers cannot deadlock on
FFmpeg's thread pool.

Audio clips of WAV, FLAC and Ogg files are read with ``soundfile`` (libsndfile) when it is
installed: the same float32 ``(channels, samples)`` clips and timestamps, without FFmpeg's demuxer.
Without it, or where libsndfile cannot read a file or a clip must be resampled, PyAV decodes.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import os
import threading
from typing import Any, Literal, Optional, Sequence

import numpy as np
import torch

from ..errors import DecodeError, MissingDependencyError, format_message

__all__ = [
    "AV_EXTENSIONS",
    "DEFAULT_BYTE_BUDGET",
    "AVData",
    "AVDecoder",
    "AVMetadata",
    "backend",
    "get_clips_uniform",
    "get_single_frames_uniform",
]

logger = logging.getLogger(__name__)

AV_EXTENSIONS = ("mp4", "avi", "mov", "webm", "mkv", "flac", "mp3", "wav", "ogg", "m4a", "flv", "opus", "aac")
_AUDIO_ONLY = ("flac", "mp3", "wav", "ogg", "m4a", "opus", "aac")
#: Most bytes one request may decode into (frames or samples kept): 1 GiB.
DEFAULT_BYTE_BUDGET = 1 << 30
_reported = False


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
    """The AV backend as recorded in config fingerprints (``"pyav <version>"``), or ``"none"``."""
    try:
        import av
    except ImportError:
        return "none"
    return f"pyav {av.__version__}"


_UNSET: Any = object()
_soundfile_module: Any = _UNSET


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
    ``(channels, samples)`` float32, each with its ``(start, end)`` seconds."""

    video_clips: Optional[list[torch.Tensor]]
    video_timestamps: Optional[list[tuple[float, float]]]
    audio_clips: Optional[list[torch.Tensor]]
    audio_timestamps: Optional[list[tuple[float, float]]]


@dataclasses.dataclass
class AVMetadata:
    """Stream facts read without decoding (Energon's field names)."""

    video_duration: float | None = None
    video_num_frames: int | None = None
    video_fps: float | None = None
    video_width: int | None = None
    video_height: int | None = None
    audio_duration: float | None = None
    audio_channels: int | None = None
    audio_sample_rate: int | None = None
    audio_num_samples: int | None = None


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


def _float_samples(frame) -> np.ndarray | None:
    """``(channels, samples)`` float32 of a PCM or float frame; None for other formats."""
    name = frame.format.name
    scale = _SAMPLE_SCALE.get(name.rstrip("p"))
    if scale is None:
        return None
    array = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if not frame.format.is_planar:  # packed: (1, samples * channels), interleaved
        array = array.reshape(-1, channels).T
    return (array.astype(np.float32) * np.float32(scale)) if scale != 1.0 or array.dtype != np.float32 else array


def _in_worker() -> bool:
    return torch.utils.data.get_worker_info() is not None


class AVDecoder:
    """Lazy access to the video and audio of one sample part."""

    def __init__(self, data: bytes, *, name: str = "?", byte_budget: int = DEFAULT_BYTE_BUDGET, extension: str | None = None) -> None:
        self.data = bytes(data)
        self.name = name  # "sample key, part" for messages
        self.byte_budget = byte_budget
        self.extension = extension  # the part's extension, a hint for opening

    def __getstate__(self) -> dict:
        return {"data": self.data, "name": self.name, "byte_budget": self.byte_budget, "extension": self.extension}

    def __setstate__(self, state: dict) -> None:
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

    def get_metadata(self, get_video_frame_count: bool = False) -> AVMetadata:
        """Durations, rates and sizes from the container; frame count from the stream header, or
        by counting packets (no decoding) with ``get_video_frame_count=True`` when it is missing."""
        meta = AVMetadata()
        with self._open() as container:
            if container.streams.video:
                stream = container.streams.video[0]
                meta.video_fps = float(stream.average_rate or stream.base_rate or 0) or None
                meta.video_width, meta.video_height = stream.codec_context.width, stream.codec_context.height
                meta.video_duration = self._duration(container, stream)
                frames = stream.frames or None
                if frames is None and get_video_frame_count:
                    frames = sum(1 for packet in container.demux(stream) if packet.size)
                meta.video_num_frames = frames
            if container.streams.audio:
                stream = container.streams.audio[0]
                meta.audio_sample_rate = stream.codec_context.sample_rate
                meta.audio_channels = stream.codec_context.channels
                meta.audio_duration = self._duration(container, stream)
                if meta.audio_duration is not None and meta.audio_sample_rate:
                    meta.audio_num_samples = int(round(meta.audio_duration * meta.audio_sample_rate))
        return meta

    @staticmethod
    def _duration(container, stream) -> float | None:
        if stream.duration is not None and stream.time_base is not None:
            return float(stream.duration * stream.time_base)
        if container.duration is not None:
            return container.duration / 1_000_000
        return None

    def get_video_fps(self) -> float:
        return self.get_metadata().video_fps or 0.0

    def get_audio_samples_per_second(self) -> int:
        return self.get_metadata().audio_sample_rate or 0

    def get_video_duration(self, get_frame_count: bool = False):
        meta = self.get_metadata(get_video_frame_count=get_frame_count)
        return (meta.video_duration, meta.video_num_frames) if get_frame_count else meta.video_duration

    def get_audio_duration(self) -> float | None:
        return self.get_metadata().audio_duration

    # --- video ---------------------------------------------------------------------------------
    def get_video_clips(
        self,
        video_clip_ranges: Sequence[tuple[float, float]],
        video_unit: Literal["frames", "seconds"] = "seconds",
        video_out_frame_size: Optional[tuple[int, int]] = None,
    ) -> tuple[list[torch.Tensor], list[tuple[float, float]]]:
        """Frames of each ``(start, end)`` range (end inclusive), as ``(frames, 3, h, w)`` uint8;
        ``video_out_frame_size`` is ``(width, height)`` to resize while decoding."""
        if video_unit not in ("frames", "seconds"):
            raise self._error(f"unknown video_unit {video_unit!r}", fix='use "seconds" or "frames"')
        clips, stamps, used = [], [], 0
        with self._open() as container:
            stream = self._stream(container, "video")
            fps = float(stream.average_rate or stream.base_rate or 0) or 1.0
            time_base = stream.time_base
            for start, end in video_clip_ranges:
                if video_unit == "frames":
                    start, end = start / fps, end / fps
                if end < start:
                    raise self._error(f"video clip range ends before it starts: ({start}, {end})", fix="pass (start, end) with end >= start")
                frames, times = self._decode_range(container, stream, time_base, start, end, video_out_frame_size)
                used += sum(f.nbytes for f in frames)
                self._check_budget(used)
                clips.append(torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous())
                stamps.append((times[0], times[-1]))
        return clips, stamps

    def _decode_range(self, container, stream, time_base, start: float, end: float, size) -> tuple[list[np.ndarray], list[float]]:
        """Seeks to the keyframe at or before ``start`` and decodes until past ``end``."""
        try:
            container.seek(max(0, int(start / time_base)), stream=stream, backward=True, any_frame=False)
            frames: list[np.ndarray] = []
            times: list[float] = []
            last = None
            kwargs: dict[str, int] = {}
            if size is not None:
                kwargs.update(width=int(size[0]), height=int(size[1]))
            for frame in container.decode(stream):
                t = float(frame.pts * time_base) if frame.pts is not None else float(frame.time or 0)
                if t > end + 1e-6:
                    if not frames:  # no frame inside the range: the first one after it
                        frames.append(_to_rgb(frame, **kwargs))
                        times.append(t)
                    break
                if t + 1e-6 >= start:
                    frames.append(_to_rgb(frame, **kwargs))
                    times.append(t)
                    self._check_budget(sum(f.nbytes for f in frames))
                else:
                    last = (frame, t)
            if not frames and last is not None:  # the range starts after the last frame: clamp
                frames.append(_to_rgb(last[0], **kwargs))
                times.append(last[1])
        except DecodeError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error("cannot decode the video", exc) from exc
        if not frames:
            raise self._error("the video stream has no frames")
        return frames, times

    def get_video(self) -> AVData:
        return self.get_frames(video_decode_audio=False)

    # --- audio ---------------------------------------------------------------------------------
    def get_audio_clips(
        self,
        audio_clip_ranges: Sequence[tuple[float, float]],
        audio_unit: Literal["samples", "seconds"] = "seconds",
        sample_rate: int | None = None,
    ) -> tuple[list[torch.Tensor], list[tuple[float, float]]]:
        """Samples of each ``[start, end)`` range as ``(channels, samples)`` float32; with
        ``sample_rate`` the audio is resampled to it first (ranges are in the source's units)."""
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
            for start, end in audio_clip_ranges:
                if audio_unit == "samples":
                    start, end = start / source_rate, end / source_rate
                if end < start:
                    raise self._error(f"audio clip range ends before it starts: ({start}, {end})", fix="pass (start, end) with end >= start")
                try:
                    container.seek(max(0, int(start / stream.time_base)), stream=stream, backward=True, any_frame=False)
                    # Resample only when asked to; plain PCM/float frames convert in numpy.
                    resampler = av.AudioResampler(format="fltp", layout=stream.codec_context.layout.name, rate=rate) if rate != source_rate else None
                    chunks, first_time = [], None
                    for frame in container.decode(stream):
                        t = float(frame.pts * stream.time_base) if frame.pts is not None else 0.0
                        if t > end:
                            break
                        if first_time is None:
                            first_time = t
                        converted = _float_samples(frame) if resampler is None else None
                        if converted is not None:
                            chunks.append(converted)
                        else:
                            resampler = resampler or av.AudioResampler(format="fltp", layout=stream.codec_context.layout.name, rate=rate)
                            chunks.extend(out.to_ndarray() for out in resampler.resample(frame))
                        used += chunks[-1].nbytes if chunks else 0
                        self._check_budget(used)
                    if resampler is not None:
                        chunks.extend(out.to_ndarray() for out in resampler.resample(None))
                except DecodeError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    raise self._error("cannot decode the audio", exc) from exc
                if not chunks and first_time is None and start > 0 and self._has_samples(container, stream):
                    # The range starts at or after the end of the audio: an empty clip.
                    chunks, first_time = [np.zeros((stream.codec_context.channels, 0), np.float32)], start
                if not chunks:
                    raise self._error("the audio stream has no samples in this range" if first_time is not None else "the audio stream has no samples", fix="check the file, or ask for a range inside the audio")
                audio = np.concatenate(chunks, axis=1)
                # Cut to the range: the first decoded frame starts at first_time (at or before start).
                offset = max(0, int(round((start - first_time) * rate)))
                length = int(round((end - start) * rate)) if math.isfinite(end) else audio.shape[1]
                clip = audio[:, offset : offset + length]  # clamped at the end of the stream
                clips.append(torch.from_numpy(np.ascontiguousarray(clip, dtype=np.float32)))
                stamps.append((first_time + offset / rate, first_time + (offset + clip.shape[1]) / rate))
        return clips, stamps

    def _has_samples(self, container, stream) -> bool:
        try:
            container.seek(0, stream=stream, backward=True, any_frame=False)
            return any(frame.samples for frame in container.decode(stream))
        except Exception:  # noqa: BLE001 - unreadable counts as empty: the caller raises
            return False

    def _soundfile_audio_clips(self, ranges, unit: str, sample_rate: int | None):
        """:meth:`get_audio_clips` through libsndfile, with the same clips and timestamps as the
        PyAV path; None where the PyAV path must do it (resampling, or a file libsndfile cannot
        read: PyAV then decodes it or reports the error)."""
        try:
            file = _soundfile().SoundFile(io.BytesIO(self.data))
        except Exception:  # noqa: BLE001 - e.g. a codec this libsndfile lacks
            return None
        with file:
            rate, total, channels = file.samplerate, file.frames, file.channels
            if sample_rate not in (None, rate) or total <= 0:
                return None
            clips, stamps, used = [], [], 0
            for start, end in ranges:
                if unit == "samples":
                    start, end = start / rate, end / rate
                if end < start:
                    raise self._error(f"audio clip range ends before it starts: ({start}, {end})", fix="pass (start, end) with end >= start")
                first = max(0, int(round(start * rate)))
                length = int(round((end - start) * rate)) if math.isfinite(end) else total
                count = max(0, min(length, total - first))  # clamped at the end of the audio
                used += count * channels * 4
                self._check_budget(used)
                samples = np.zeros((0, channels), np.float32)
                try:
                    if count:
                        file.seek(first)
                        samples = file.read(count, dtype="float32", always_2d=True)
                except Exception:  # noqa: BLE001
                    return None
                clip = torch.from_numpy(np.ascontiguousarray(samples.T))
                clips.append(clip)
                stamps.append((first / rate, (first + clip.shape[1]) / rate))
        return clips, stamps

    def get_audio(self) -> AVData:
        duration = self.get_audio_duration()
        clips, stamps = self.get_audio_clips([(0.0, duration if duration else math.inf)])
        return AVData(None, None, clips, stamps)

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
        """Everything: all video frames (and the audio with ``video_decode_audio``), or the audio
        of an audio-only file."""
        meta = self.get_metadata()
        if meta.video_duration is None and meta.video_width is None:
            return self.get_audio()
        video, video_times = self.get_video_clips([(0.0, math.inf)])
        audio = audio_times = None
        if video_decode_audio and meta.audio_sample_rate:
            audio, audio_times = self.get_audio_clips([(0.0, meta.audio_duration or math.inf)])
        return AVData(video, video_times, audio, audio_times)

    def get_video_with_audio(self) -> AVData:
        return self.get_frames(video_decode_audio=True)


def get_clips_uniform(
    av_decoder: AVDecoder,
    clip_duration_seconds: float,
    num_clips: int,
    request_video: bool = False,
    request_audio: bool = False,
    video_out_frame_size: Optional[tuple[int, int]] = None,
) -> AVData:
    """``num_clips`` clips of ``clip_duration_seconds`` each, spread evenly from start to end."""
    if not (request_video or request_audio):
        raise DecodeError(format_message("get_clips_uniform needs request_video or request_audio", where=av_decoder.name))
    if num_clips < 1:
        raise DecodeError(format_message("num_clips must be at least 1", where=av_decoder.name, found=repr(num_clips)))
    meta = av_decoder.get_metadata()
    durations = [d for d, asked in ((meta.video_duration, request_video), (meta.audio_duration, request_audio)) if asked and d is not None]
    duration = min(durations) if durations else 0.0
    last_start = max(0.0, duration - clip_duration_seconds)
    starts = [last_start * i / (num_clips - 1) if num_clips > 1 else 0.0 for i in range(num_clips)]
    ranges = [(s, s + clip_duration_seconds) for s in starts]
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
    """``num_frames`` single frames spread evenly over the video, as ``(num_frames, 3, h, w)``."""
    data = get_clips_uniform(av_decoder, 0.0, num_frames, request_video=True, video_out_frame_size=video_out_frame_size)
    frames = torch.stack([clip[0] for clip in data.video_clips])
    if return_timestamps:
        return frames, [start for start, _ in data.video_timestamps]
    return frames


def decode_av(data: bytes, decoder: Any, *, name: str = "?") -> Any:
    """The decoder-table entry: an :class:`AVDecoder` (default), its full decode (``"torch"``) or
    the opened PyAV container (``"pyav"``), per the SampleDecoder's ``av_decode``."""
    av_decoder = AVDecoder(data, name=name, byte_budget=getattr(decoder, "av_byte_budget", DEFAULT_BYTE_BUDGET))
    mode = getattr(decoder, "av_decode", "AVDecoder")
    if mode == "torch":
        return av_decoder.get_frames(video_decode_audio=getattr(decoder, "video_decode_audio", False))
    if mode == "pyav":
        return av_decoder._open()
    return av_decoder
