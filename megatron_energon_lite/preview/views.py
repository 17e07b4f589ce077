"""Field value -> what a preview shows of it: an image, a few video frames, a waveform, text, or a
one-line summary.

Every renderer (terminal, HTML, grid) draws from these views, so media is decoded once and the
three agree on what a field is. Conversion never raises: a field that cannot be shown (a broken
video part decodes lazily, so its error only comes here) becomes an :class:`ErrorView`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from ..decode.av import AVData, AVDecoder, get_single_frames_uniform
from ..samples import format_value

__all__ = [
    "AudioView",
    "ErrorView",
    "ImageView",
    "TextView",
    "ValueView",
    "VideoView",
    "View",
    "fit",
    "flatten",
    "peaks",
    "strip",
    "view_of",
    "waveform",
]

#: Images are kept at most this large (long side): every renderer draws smaller than this.
MAX_IMAGE_SIDE = 512
#: Frames a video shows, spread evenly over its duration.
VIDEO_FRAMES = 4
#: Long side of a decoded video frame.
FRAME_SIDE = 160
#: Audio past this is neither decoded for the waveform nor embedded in the HTML page.
MAX_AUDIO_SECONDS = 30.0
#: The levels of a one-line waveform, quietest first.
LEVELS = "▁▂▃▄▅▆▇█"
#: Longest pretty-printed JSON kept for the HTML page.
MAX_DETAIL_CHARS = 4000


@dataclass(frozen=True)
class View:
    """``summary``: the one-line text of the field (``format_value`` style)."""

    summary: str


@dataclass(frozen=True)
class ImageView(View):
    image: Image.Image  # RGB or RGBA, at most MAX_IMAGE_SIDE


@dataclass(frozen=True)
class VideoView(View):
    frames: tuple[Image.Image, ...]  # RGB, evenly spread over the video


@dataclass(frozen=True)
class AudioView(View):
    samples: np.ndarray  # float32 (channels, samples) in [-1, 1], at most MAX_AUDIO_SECONDS
    rate: int
    duration: float  # of the whole recording, seconds


@dataclass(frozen=True)
class TextView(View):
    text: str


@dataclass(frozen=True)
class ValueView(View):
    detail: str | None = None  # a longer rendering (pretty JSON) where one helps


@dataclass(frozen=True)
class ErrorView(View):
    """A field (or a whole sample) that could not be loaded or shown; ``summary`` is the message."""


def view_of(value: Any) -> View:
    """The view of one field value; an :class:`ErrorView` where showing it fails."""
    try:
        return _view(value)
    except Exception as exc:  # noqa: BLE001 - a preview shows the failure in place and goes on
        return ErrorView(f"{type(exc).__name__}: {exc}")


def _view(value: Any) -> View:
    if isinstance(value, str):
        return TextView(format_value(value), value)
    if isinstance(value, Image.Image):
        return ImageView(format_value(value), _small(_normalized(value), MAX_IMAGE_SIDE))
    if isinstance(value, AVDecoder):
        return _av_view(value)
    if isinstance(value, AVData):
        return _avdata_view(value)
    if _is_array(value):
        return _array_view(value)
    if isinstance(value, (dict, list)):
        return ValueView(format_value(value), _pretty(value))
    return ValueView(format_value(value))


def _pretty(value: Any) -> str | None:
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=format_value)
    except (TypeError, ValueError):
        return None
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS] + f"\n... ({len(text)} chars)"


# -- images ----------------------------------------------------------------------------------------


def _normalized(image: Image.Image) -> Image.Image:
    """RGB, or RGBA where the image has transparency; 16-bit and float images scaled to 8 bits."""
    if image.mode in ("RGB", "RGBA"):
        return image
    if image.mode in ("LA", "PA", "La") or (image.mode == "P" and "transparency" in image.info):
        return image.convert("RGBA")
    if image.mode.startswith("I") or image.mode == "F":  # Pillow's own convert would clip at 255
        array = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") else max(float(array.max()), 1.0)
        return Image.fromarray((np.clip(array / top, 0, 1) * 255).astype(np.uint8)).convert("RGB")
    return image.convert("RGB")


def _small(image: Image.Image, side: int) -> Image.Image:
    if max(image.size) <= side:
        return image
    image = image.copy()
    image.thumbnail((side, side))
    return image


def flatten(image: Image.Image, background: tuple[int, int, int] = (0, 0, 0)) -> Image.Image:
    """RGB: transparency composited over ``background``."""
    if image.mode != "RGBA":
        return image.convert("RGB")
    base = Image.new("RGB", image.size, background)
    base.paste(image, mask=image.getchannel("A"))
    return base


def fit(image: Image.Image, width: int, height: int, *, max_upscale: int = 4) -> Image.Image:
    """``image`` scaled to fit ``width`` x ``height``, keeping its aspect ratio. Small images grow
    (by whole pixels, at most ``max_upscale`` times) so that a 16 px icon is still visible."""
    w, h = image.size
    scale = min(width / w, height / h)
    if scale >= 1:
        factor = max(1, min(int(scale), max_upscale))
        return image if factor == 1 else image.resize((w * factor, h * factor), Image.Resampling.NEAREST)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return image.resize(size, Image.Resampling.BOX)


def strip(frames: tuple[Image.Image, ...] | list[Image.Image], gap: int = 2) -> Image.Image:
    """Frames side by side, ``gap`` black pixels apart, all at the height of the first."""
    height = frames[0].height
    scaled = [f if f.height == height else f.resize((max(1, round(f.width * height / f.height)), height)) for f in frames]
    out = Image.new("RGB", (sum(f.width for f in scaled) + gap * (len(scaled) - 1), height))
    x = 0
    for frame in scaled:
        out.paste(frame.convert("RGB"), (x, 0))
        x += frame.width + gap
    return out


# -- arrays and tensors ----------------------------------------------------------------------------


def _is_array(value: Any) -> bool:
    module = type(value).__module__
    return (module.startswith("torch") or module.startswith("numpy")) and hasattr(value, "shape") and hasattr(value, "dtype")


def _numpy(value: Any) -> np.ndarray:
    if type(value).__module__.startswith("torch"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _to_uint8(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.uint8:
        return array
    array = array.astype(np.float32)
    if float(array.max(initial=0.0)) > 1.0 + 1e-3:  # 0..255 floats rather than 0..1
        array = array / 255.0
    return (np.clip(array, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)


def _image_shaped(shape: tuple[int, ...]) -> bool:
    """(3, H, W) with a real picture's sides: (3, 2) or (3, 3, 3) stay numbers."""
    return len(shape) == 3 and shape[0] == 3 and shape[1] >= 4 and shape[2] >= 4


def _drawable_dtype(dtype: Any) -> bool:
    name = str(dtype).removeprefix("torch.")
    return name == "uint8" or name.startswith(("float", "bfloat"))


def _array_view(value: Any) -> View:
    """CHW images (uint8, or float in 0..1) as images, (T, 3, H, W) uint8 as video; else shape."""
    shape = tuple(value.shape)
    if _drawable_dtype(value.dtype) and _image_shaped(shape):
        array = _to_uint8(_numpy(value.float() if str(value.dtype) == "torch.bfloat16" else value))
        image = Image.fromarray(np.ascontiguousarray(array.transpose(1, 2, 0)))
        return ImageView(format_value(value), _small(image, MAX_IMAGE_SIDE))
    if str(value.dtype).endswith("uint8") and len(shape) == 4 and shape[0] >= 1 and _image_shaped(shape[1:]):
        return VideoView(format_value(value), _frames(_numpy(value)))
    return ValueView(format_value(value))


def _frames(clip: np.ndarray) -> tuple[Image.Image, ...]:
    """VIDEO_FRAMES frames of ``(T, 3, H, W)`` uint8, evenly spread."""
    picks = sorted(set(np.linspace(0, clip.shape[0] - 1, min(VIDEO_FRAMES, clip.shape[0])).round().astype(int)))
    return tuple(_small(Image.fromarray(np.ascontiguousarray(clip[i].transpose(1, 2, 0))), FRAME_SIDE) for i in picks)


# -- video and audio -------------------------------------------------------------------------------


def _av_view(decoder: AVDecoder) -> View:
    meta = decoder.get_metadata(get_video_frame_count=True)
    if meta.video_width:
        w, h = meta.video_width, meta.video_height or meta.video_width
        scale = min(1.0, FRAME_SIDE / max(w, h))
        size = (max(2, round(w * scale)), max(2, round(h * scale)))
        count = min(VIDEO_FRAMES, meta.video_num_frames or VIDEO_FRAMES)
        frames = get_single_frames_uniform(decoder, count, video_out_frame_size=size)
        facts = [f"video {w}x{h}"]
        if meta.video_fps:
            facts.append(f"{meta.video_fps:g} fps")
        if meta.video_duration is not None:
            facts.append(f"{meta.video_duration:.2f} s")
        if meta.video_num_frames:
            facts.append(f"{meta.video_num_frames} frames")
        if meta.audio_sample_rate:
            facts.append(f"audio {meta.audio_sample_rate} Hz")
        return VideoView(", ".join(facts), _frames(frames.numpy()))
    clips, _ = decoder.get_audio_clips([(0.0, MAX_AUDIO_SECONDS)])
    samples = _float_audio(_numpy(clips[0])) if clips else np.zeros((meta.audio_channels or 1, 0), np.float32)
    rate = int(meta.audio_sample_rate or 0)
    duration = meta.audio_duration if meta.audio_duration is not None else samples.shape[1] / max(rate, 1)
    return _audio_view(samples, rate, duration)


def _avdata_view(data: AVData) -> View:
    """``av_decode="torch"``: the decoded clips (video first; audio when there is no video)."""
    if data.video_clips:
        frames = np.concatenate([_numpy(clip) for clip in data.video_clips])
        return VideoView(f"AVData(video: {len(data.video_clips)} clips, {frames.shape[0]} frames {frames.shape[3]}x{frames.shape[2]})", _frames(frames))
    if data.audio_clips:
        samples = _float_audio(_numpy(data.audio_clips[0]))
        start, end = data.audio_timestamps[0]
        rate = round(samples.shape[1] / (end - start)) if end > start else 0  # AVData keeps no rate
        return _audio_view(samples[:, : int(MAX_AUDIO_SECONDS * rate) or None], rate, end - start)
    return ValueView("AVData(empty)")


def _float_audio(samples: np.ndarray) -> np.ndarray:
    """(channels, samples) in [-1, 1] float32, from the stream's own sample type."""
    samples = np.atleast_2d(samples)
    if np.issubdtype(samples.dtype, np.integer):
        info = np.iinfo(samples.dtype)
        middle = (info.max + info.min + 1) / 2  # 0 for signed, 128 for unsigned 8-bit
        return ((samples.astype(np.float32) - middle) / (info.max - middle + 1)).astype(np.float32)
    return np.clip(samples.astype(np.float32), -1.0, 1.0)


def _audio_view(samples: np.ndarray, rate: int, duration: float) -> AudioView:
    channels = samples.shape[0]
    peak = float(np.abs(samples).max(initial=0.0))
    level = f"peak {20 * math.log10(peak):.1f} dBFS" if peak > 0 else "silent"
    summary = f"audio {rate} Hz, {channels} channel{'s' if channels != 1 else ''}, {duration:.2f} s, {level}"
    return AudioView(summary, samples, rate, duration)


def peaks(samples: np.ndarray, columns: int) -> np.ndarray:
    """The loudest absolute sample (over all channels) in each of ``columns`` equal stretches,
    in [0, 1] of full scale; zeros where a stretch is empty (audio shorter than ``columns``)."""
    loudest = np.abs(samples).max(axis=0) if samples.size else np.zeros(0, np.float32)
    out = np.zeros(columns, np.float32)
    edges = np.linspace(0, loudest.shape[0], columns + 1).astype(int)
    for column, (start, end) in enumerate(zip(edges[:-1], edges[1:])):
        if end > start:
            out[column] = loudest[start:end].max()
    return np.clip(out, 0.0, 1.0)


def waveform(samples: np.ndarray, columns: int) -> str:
    """One character per column: the column's peak (of full scale) as one of :data:`LEVELS`."""
    levels = np.minimum((peaks(samples, columns) * len(LEVELS)).astype(int), len(LEVELS) - 1)
    return "".join(LEVELS[level] for level in levels)
