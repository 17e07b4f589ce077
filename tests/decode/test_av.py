"""Video and audio decoding with real files made by PyAV in memory."""

from __future__ import annotations

import pickle
import tracemalloc

import av
import numpy as np
import pytest
import torch

from megatron_energon_lite import DecodeError, SampleDecoder
from megatron_energon_lite.decode.av import AVData, AVDecoder, get_clips_uniform, get_single_frames_uniform
from megatron_energon_lite.synthetic import make_audio, make_tone, make_video


@pytest.fixture(scope="module")
def video() -> bytes:
    return make_video()


def gray(clip: torch.Tensor) -> list[int]:
    """The gray value of each frame, rounded to the frame number it encodes."""
    return [round(float(frame.float().mean()) / 8) for frame in clip]


def test_the_decoder_table_returns_a_lazy_decoder(video: bytes) -> None:
    decoded = SampleDecoder().decode_part("mp4", video, key="k1")
    assert isinstance(decoded, AVDecoder) and "k1" in decoded.name
    meta = decoded.get_metadata(get_video_frame_count=True)
    assert (meta.video_width, meta.video_height, meta.video_fps, meta.video_num_frames) == (64, 48, 8.0, 16)
    assert meta.video_duration == pytest.approx(2.0, abs=0.13)


def test_all_frames_in_order(video: bytes) -> None:
    data = AVDecoder(video).get_frames()
    assert isinstance(data, AVData) and data.video_clips[0].shape == (16, 3, 48, 64) and data.video_clips[0].dtype == torch.uint8
    assert gray(data.video_clips[0]) == list(range(16))


def test_clips_by_seconds_and_frames_with_timestamps(video: bytes) -> None:
    decoder = AVDecoder(video)
    clips, stamps = decoder.get_video_clips([(0.5, 1.0), (1.5, 1.75)])
    assert [gray(c) for c in clips] == [[4, 5, 6, 7, 8], [12, 13, 14]]  # ends inclusive, 8 fps
    assert stamps[0] == pytest.approx((0.5, 1.0)) and stamps[1] == pytest.approx((1.5, 1.75))
    by_frame, _ = decoder.get_video_clips([(3, 5)], video_unit="frames", video_out_frame_size=(32, 16))
    assert gray(by_frame[0]) == [3, 4, 5] and by_frame[0].shape == (3, 3, 16, 32)


def test_ranges_past_the_end_are_clamped(video: bytes) -> None:
    clips, _ = AVDecoder(video).get_video_clips([(1.8, 9.0), (5.0, 6.0)])
    assert gray(clips[0]) == [15] and gray(clips[1]) == [15]


def test_uniform_clips_and_single_frames(video: bytes) -> None:
    frames, times = get_single_frames_uniform(AVDecoder(video), 4, return_timestamps=True)
    assert frames.shape == (4, 3, 48, 64) and gray(frames)[0] == 0 and times == sorted(times)
    data = get_clips_uniform(AVDecoder(video), 0.25, 3, request_video=True)
    # Clips start at 0, 0.875 and 1.75 s; the last one is cut by the end of the video (1.875 s).
    assert [gray(c) for c in data.video_clips] == [[0, 1, 2], [7, 8, 9], [14, 15]]


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_audio_clips_lengths_and_resampling(fmt: str) -> None:
    decoder = SampleDecoder().decode_part(fmt, make_audio(1.0, 16000, fmt))
    meta = decoder.get_metadata()
    assert (meta.audio_sample_rate, meta.audio_channels) == (16000, 1) and meta.audio_duration == pytest.approx(1.0, abs=0.01)
    clips, stamps = decoder.get_audio_clips([(0.25, 0.5), (0.9, 2.0)])
    assert clips[0].shape == (1, 4000) and clips[1].shape == (1, 1600)  # the second is clamped at the end
    assert stamps[0] == pytest.approx((0.25, 0.5), abs=1e-3)
    expected = make_tone(1.0, 16000)[:, 4000:8000]
    assert np.allclose(clips[0].numpy(), expected, atol=2e-3)
    resampled, _ = decoder.get_audio_clips([(0.0, 0.5)], sample_rate=8000)
    assert abs(resampled[0].shape[1] - 4000) <= 64
    whole = decoder.get_frames()
    assert whole.audio_clips[0].shape[1] == pytest.approx(16000, abs=2)


def test_video_with_audio() -> None:
    data = AVDecoder(make_video(audio_rate=16000)).get_frames(video_decode_audio=True)
    assert data.video_clips[0].shape[0] == 16 and abs(data.audio_clips[0].shape[1] - 32000) < 2048


def test_torch_and_pyav_modes(video: bytes) -> None:
    data = SampleDecoder(av_decode="torch").decode_part("mp4", video)
    assert isinstance(data, AVData) and data.video_clips[0].shape[0] == 16
    container = SampleDecoder(av_decode="pyav").decode_part("mp4", video)
    assert container.streams.video[0].codec_context.width == 64
    container.close()


def test_the_decoder_pickles_as_its_bytes(video: bytes) -> None:
    decoder = SampleDecoder().decode_part("mp4", video, key="k")
    copy = pickle.loads(pickle.dumps(decoder))
    assert copy.data == video and copy.name == decoder.name
    assert gray(copy.get_video_clips([(1.0, 1.0)])[0][0]) == [8]


def test_a_few_frames_of_a_long_video_stay_small() -> None:
    """Seeking: 8 frames of a 60 s video decode only around those frames, not the whole video."""
    long_video = make_video(frames=480, fps=8, size=(160, 120), gop=16)
    decoder = AVDecoder(long_video)
    full_size = 480 * 160 * 120 * 3
    tracemalloc.start()
    frames = get_single_frames_uniform(decoder, 8)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert frames.shape == (8, 3, 120, 160)
    assert peak < full_size / 4, f"peak {peak:,} bytes vs {full_size:,} for all frames"


def test_the_byte_budget_is_a_clear_error(video: bytes) -> None:
    decoder = AVDecoder(video, name="sample 'k', part 'mp4'", byte_budget=64 * 48 * 3 * 4)
    assert decoder.get_video_clips([(0.0, 0.3)])[0][0].shape[0] == 3
    with pytest.raises(DecodeError, match=r"byte budget(.|\n)*sample 'k', part 'mp4'"):
        decoder.get_frames()
    small = SampleDecoder(av_byte_budget=1000).decode_part("mp4", video)
    with pytest.raises(DecodeError, match="byte budget"):
        small.get_frames()


@pytest.mark.parametrize(
    ("data", "call", "message"),
    [
        (b"\x00\x00\x00\x18ftypmp42 truncated", lambda d: d.get_frames(), "cannot open the media"),
        (None, lambda d: d.get_video_clips([(0, 1)]), "no video stream"),
        ("truncated", lambda d: d.get_frames(), "cannot"),
    ],
)
def test_bad_media_are_clear_errors(video: bytes, data, call, message: str) -> None:
    if data is None:
        data = make_audio(0.5)
    elif data == "truncated":
        data = video[: len(video) // 3]
    with pytest.raises(DecodeError, match=message):
        call(AVDecoder(data, name="sample 'bad'"))


def test_zero_length_audio_is_an_error() -> None:
    import struct

    header = b"RIFF" + struct.pack("<I", 36) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16) + b"data" + struct.pack("<I", 0)
    with pytest.raises(DecodeError, match="no samples"):
        AVDecoder(header, name="sample 'empty'").get_audio_clips([(0.0, 1.0)])
