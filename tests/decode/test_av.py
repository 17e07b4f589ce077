"""Video and audio decoding with real files made by PyAV in memory."""

from __future__ import annotations

import dataclasses
import io
import itertools
import pickle
import tracemalloc

import av
import numpy as np
import pytest
import torch
from energon_lite_dev.synthetic import make_audio, make_tone, make_video

from megatron_energon_lite import DecodeError, SampleDecoder
from megatron_energon_lite.decode.av import (
    AVData,
    AVDecoder,
    AVProbeIndex,
    get_clips_uniform,
    get_single_frames_uniform,
)
from megatron_energon_lite.policy import ENERGON


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
    clips, stamps = decoder.get_video_clips([(0.5, 1.0), (1.5, 1.75), (0.3, 0.6)])
    # Every frame shown during [start, end], 8 fps: the frame on screen at 0.3 s (2) through the
    # one on screen at 0.6 s (4); timestamps from the first frame's start to the last one's end.
    assert [gray(c) for c in clips] == [[4, 5, 6, 7, 8], [12, 13, 14], [2, 3, 4]]
    assert stamps == [pytest.approx((0.5, 1.125)), pytest.approx((1.5, 1.875)), pytest.approx((0.25, 0.625))]
    by_frame, _ = decoder.get_video_clips([(3, 5)], video_unit="frames", video_out_frame_size=(32, 16))
    assert gray(by_frame[0]) == [3, 4, 5] and by_frame[0].shape == (3, 3, 16, 32)


def test_ranges_past_the_end_are_cut_or_dropped_as_energon(video: bytes) -> None:
    """Under Energon's policy: a range running past the end is cut there; one starting after it gives no clip."""
    clips, stamps = AVDecoder(video, policy=ENERGON).get_video_clips([(1.8, 9.0), (5.0, 6.0), (2.0, 3.0), (0.0, 0.0)])
    assert [gray(c) for c in clips] == [[14, 15], [0]] and stamps == [pytest.approx((1.75, 2.0)), pytest.approx((0.0, 0.125))]
    by_frame, _ = AVDecoder(video, policy=ENERGON).get_video_clips([(14, 40), (16, 20)], video_unit="frames")
    assert [gray(c) for c in by_frame] == [[14, 15]]


@pytest.mark.parametrize(
    ("kind", "call", "message"),
    [
        ("mp4", lambda d: d.get_video_clips([(1.8, 9.0), (5.0, 6.0)]), r"video clip range \(5\.0, 6\.0\) \(seconds\).*\n.*'k7', part 'mp4'.*\n.*lasts 2 s"),
        ("mp4", lambda d: d.get_video_clips([(14, 40), (16, 20)], video_unit="frames"), r"video clip range \(16, 20\) \(frames\)"),
        ("wav", lambda d: d.get_audio_clips([(0.5, 0.75), (1.0, 1.5)]), r"audio clip range \(1\.0, 1\.5\) \(seconds\).*\n.*'k7', part 'wav'.*\n.*lasts 1 s"),
        ("flac", lambda d: d.get_audio_clips([(16000, 17000)], audio_unit="samples"), r"audio clip range \(16000, 17000\) \(samples\)"),
    ],
)
def test_a_range_that_starts_after_the_end_is_an_error(video: bytes, kind: str, call, message: str) -> None:
    """Ours: the clips would no longer line up with the ranges, so the range is named instead."""
    data = video if kind == "mp4" else make_audio(1.0, 16000, kind)
    with pytest.raises(DecodeError, match=message):
        call(SampleDecoder().decode_part(kind, data, key="k7"))
    assert len(call(SampleDecoder().under(ENERGON).decode_part(kind, data, key="k7"))[0]) == (1 if kind != "flac" else 0)


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
    assert clips[0].shape == (1, 4000) and clips[1].shape == (1, 1600)  # the second is cut at the end
    assert len(clips) == 2
    assert stamps == [pytest.approx((0.25, 0.5)), pytest.approx((0.9, 1.0))]
    # 16-bit PCM comes as int16, the samples as written (Energon's sample type).
    assert clips[0].dtype == torch.int16
    expected = (make_tone(1.0, 16000) * 32767).astype(np.int16)[:, 4000:8000]
    assert np.array_equal(clips[0].numpy(), expected)
    resampled, _ = decoder.get_audio_clips([(0.0, 0.5)], sample_rate=8000)
    assert abs(resampled[0].shape[1] - 4000) <= 64 and resampled[0].dtype == torch.float32
    as_float, _ = decoder.get_audio_clips([(0.25, 0.5)], sample_rate=16000)  # ours: float32 in [-1, 1]
    assert as_float[0].dtype == torch.float32 and np.allclose(as_float[0].numpy(), make_tone(1.0, 16000)[:, 4000:8000], atol=2e-3)
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


def test_zero_length_audio_has_no_clips() -> None:
    import struct

    header = b"RIFF" + struct.pack("<I", 36) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16) + b"data" + struct.pack("<I", 0)
    with pytest.raises(DecodeError, match=r"audio clip range \(0\.0, 1\.0\) .*after the end.*\n.*sample 'empty'"):
        AVDecoder(header, name="sample 'empty'").get_audio_clips([(0.0, 1.0)])
    assert AVDecoder(header, name="sample 'empty'", policy=ENERGON).get_audio_clips([(0.0, 1.0)]) == ([], [])


# --- the probe index; AVI, which FFmpeg seeks by decode timestamps ----------------------------


def packet_times(data: bytes) -> list[float]:
    """Seconds at which each frame is shown, in presentation order, as PyAV's demuxer reports them."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        return sorted(float(p.pts * stream.time_base) for p in container.demux(stream) if p.pts is not None)


def test_the_probe_index_lists_the_packets_and_finds_keyframes() -> None:
    data = make_video(frames=24, fps=8, gop=8)  # keyframes at frames 0, 8 and 16
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        next(container.demux(stream))  # the index reads from the start, whatever the position
        index = AVProbeIndex(container, 0)
        tick = round(1 / (8 * stream.time_base))  # one frame in the stream's time base
        assert len(index) == 24 == stream.frames
        assert [e.timestamp for e in index] == [i * tick for i in range(24)]
        assert [i for i, e in enumerate(index) if e.is_keyframe] == [0, 8, 16]
        assert [index.search_timestamp(8 * tick), index.search_timestamp(11 * tick), index.search_timestamp(11 * tick, backward=False)] == [8, 8, 16]
        assert index.search_timestamp(11 * tick, any_frame=True) == 11 and index.search_timestamp(11 * tick + 1, backward=False, any_frame=True) == 12
        assert index.search_timestamp(-5) == 0 and index.search_timestamp(17 * tick, backward=False) == -1
        assert index[-1].timestamp == 23 * tick and index.end == 24 * tick
        # It leaves the container at the start: every frame decodes after it.
        assert len(list(container.decode(stream))) == 24


@pytest.mark.parametrize("gop", [1, 4])
def test_every_frame_of_an_avi_is_found_by_its_time(gop: int) -> None:
    """A clip starting at a frame holds that frame.  FFmpeg seeks AVI by decode timestamps, which
    H.264 puts a frame before the presentation ones: seeking to a keyframe's time can land on the
    next keyframe (every frame, with gop=1); the decoder then seeks to the keyframe before."""
    data = make_video(frames=16, fps=8, gop=gop, container_format="avi")
    times = packet_times(data)
    decoder = AVDecoder(data)
    assert gray(decoder.get_video().video_clips[0]) == list(range(16))
    clips, stamps = decoder.get_video_clips([(t, t) for t in times] + [(t + 0.06, t + 0.06) for t in times])
    assert [gray(c) for c in clips] == [[i] for i in range(16)] * 2
    assert [start for start, _ in stamps] == times * 2


@pytest.fixture(scope="module")
def avi_dropped() -> bytes:
    """24 frames at 8 fps, frame 5 dropped: 23 frames, and a gap in the timestamps."""
    return make_video(frames=24, fps=8, gop=8, container_format="avi", dropped=[5])


def test_frame_numbers_count_the_frames_shown(avi_dropped: bytes) -> None:
    """Frame n is the n-th frame on screen (Energon's numbering where it probes), not the frame
    shown at n / fps seconds: after a dropped frame, or with a variable frame rate, they differ."""
    times = packet_times(avi_dropped)
    ranges = [(3, 5), (21, 40), (23, 30), (0, float("inf")), (-3, 1)]
    clips, stamps = AVDecoder(avi_dropped, policy=ENERGON).get_video_clips(ranges, video_unit="frames")
    shown = [0, 1, 2, 3, 4] + list(range(6, 24))
    assert [gray(c) for c in clips] == [[3, 4, 6], [22, 23], shown, [0, 1]]  # frames 23.. do not exist: no clip
    assert [start for start, _ in stamps] == [times[3], times[21], times[0], times[0]]
    with pytest.raises(DecodeError, match=r"video clip range \(23, 30\) \(frames\).*\n.*\n.*the video has 23 frames"):
        AVDecoder(avi_dropped).get_video_clips(ranges, video_unit="frames")


def test_frame_count_and_durations_follow_energons_rules(avi_dropped: bytes) -> None:
    """The AVI header counts the dropped frame's slot; Energon counts the packets with a timestamp.
    Durations are Energon's floats, to the last bit."""
    with av.open(io.BytesIO(avi_dropped)) as container:
        assert container.streams.video[0].frames == 24
    decoder = AVDecoder(avi_dropped)
    meta = decoder.get_metadata()
    assert meta.video_num_frames == 23 and decoder.get_video_duration(get_frame_count=True) == (meta.video_duration, 23)
    theirs = energon_av().AVDecoder(io.BytesIO(avi_dropped))
    assert dataclasses.asdict(meta) == dataclasses.asdict(theirs.get_metadata())
    assert decoder.get_video_duration(get_frame_count=True) == theirs.get_video_duration(get_frame_count=True)


def test_the_probe_index_is_energons(avi_dropped: bytes, video: bytes) -> None:
    their_index = pytest.importorskip("megatron.energon.av.av_reader").AVProbeIndex
    for data in (avi_dropped, video, make_video(frames=16, gop=1, container_format="avi")):
        with av.open(io.BytesIO(data)) as a, av.open(io.BytesIO(data)) as b:
            ours, theirs = AVProbeIndex(a, 0), their_index(b, 0)
            assert [(e.timestamp, e.is_keyframe) for e in ours] == [(e.timestamp, e.is_keyframe) for e in theirs]
            last = ours[len(ours) - 1].timestamp
            for stamp in range(-1, last + 3, max(1, last // 50)):
                for backward, any_frame in itertools.product((True, False), repeat=2):
                    kwargs = {"backward": backward, "any_frame": any_frame}
                    assert ours.search_timestamp(stamp, **kwargs) == theirs.search_timestamp(stamp, **kwargs), (stamp, kwargs)


# --- Energon's AVDecoder on the same files ---------------------------------------------------------


def mkv(video: bytes) -> bytes:
    """The same frames remuxed into Matroska (Energon seeks these by timestamp, not frame index)."""
    out = io.BytesIO()
    with av.open(io.BytesIO(video)) as src, av.open(out, "w", format="matroska") as dst:
        template = src.streams.video[0]
        stream = dst.add_stream_from_template(template)
        for packet in src.demux(template):
            if packet.dts is not None:
                packet.stream = stream
                dst.mux(packet)
    return out.getvalue()


def energon_av():
    return pytest.importorskip("megatron.energon.av")


def same_clips(theirs: tuple, ours: tuple) -> None:
    (their_clips, their_stamps), (our_clips, our_stamps) = theirs, ours
    assert len(our_clips) == len(their_clips) and len(our_stamps) == len(their_stamps)
    assert all(ours == pytest.approx(theirs) for ours, theirs in zip(our_stamps, their_stamps)), (our_stamps, their_stamps)
    for a, b in zip(their_clips, our_clips):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


VIDEO_RANGES = [[(0.5, 1.0), (1.5, 1.75)], [(1.8, 9.0), (5.0, 6.0)], [(0.0, float("inf"))], [(0.0, 0.0), (1.0, 1.0)], [(0.3, 0.6)]]
FRAME_RANGES = [[(3, 5)], [(0, 15)], [(14, 40)], [(20, 30)]]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # Energon warns about seconds vs frames seeking
@pytest.mark.parametrize("container", ["mp4", "mkv"])
def test_video_clips_are_energons(video: bytes, container: str) -> None:
    data = video if container == "mp4" else mkv(video)
    theirs, ours = energon_av().AVDecoder(io.BytesIO(data)), AVDecoder(data, policy=ENERGON)
    for ranges in VIDEO_RANGES:
        same_clips(theirs.get_video_clips(ranges), ours.get_video_clips(ranges))
    for ranges in FRAME_RANGES:
        same_clips(theirs.get_video_clips(ranges, video_unit="frames"), ours.get_video_clips(ranges, video_unit="frames"))
    same_clips(theirs.get_video_clips([(0.5, 1.0)], video_out_frame_size=(32, 24)), ours.get_video_clips([(0.5, 1.0)], video_out_frame_size=(32, 24)))


@pytest.mark.parametrize("kind", ["wav", "flac", "aac"])
def test_audio_clips_are_energons(kind: str) -> None:
    data = make_video(audio_rate=16000) if kind == "aac" else make_audio(1.0, 16000, kind)
    theirs, ours = energon_av().AVDecoder(io.BytesIO(data)), AVDecoder(data, policy=ENERGON)
    for ranges in ([(0.25, 0.5), (0.9, 2.5)], [(0.0, float("inf"))], [(1.0, 1.5), (5.0, 6.0), (0.5, 0.75)], [(0.1, 0.3333)]):
        same_clips(theirs.get_audio_clips(ranges), ours.get_audio_clips(ranges))
    same_clips(theirs.get_audio_clips([(100, 4100)], audio_unit="samples"), ours.get_audio_clips([(100, 4100)], audio_unit="samples"))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_uniform_helpers_are_energons() -> None:
    energon = energon_av()
    from megatron.energon.av.utils import get_clips_uniform as their_clips
    from megatron.energon.av.utils import get_single_frames_uniform as their_frames

    data = make_video(audio_rate=16000)
    for n in (1, 3, 4, 7):
        a, a_times = their_frames(energon.AVDecoder(io.BytesIO(data)), n, return_timestamps=True)
        b, b_times = get_single_frames_uniform(AVDecoder(data), n, return_timestamps=True)
        assert torch.equal(a, b) and a_times == pytest.approx(b_times)
    for seconds, n in ((0.25, 3), (0.5, 4), (2.0, 2)):
        a = their_clips(energon.AVDecoder(io.BytesIO(data)), seconds, n, request_video=True, request_audio=True)
        b = get_clips_uniform(AVDecoder(data), seconds, n, request_video=True, request_audio=True)
        same_clips((a.video_clips, a.video_timestamps), (b.video_clips, b.video_timestamps))
        same_clips((a.audio_clips, a.audio_timestamps), (b.audio_clips, b.audio_timestamps))


METADATA_FLAGS = [
    {},
    {"get_video": False},
    {"get_audio": False},
    {"get_video_frame_count": False, "get_video_frame_size": False},
    {"get_audio_num_samples": True},
    {"get_video_duration": False, "get_audio_duration": False},
]


@pytest.mark.parametrize("kind", ["mp4", "mp4+aac", "wav", "flac"])
def test_metadata_keywords_are_energons(kind: str) -> None:
    data = {"mp4": make_video(), "mp4+aac": make_video(audio_rate=16000), "wav": make_audio(1.0), "flac": make_audio(1.0, fmt="flac")}[kind]
    theirs, ours = energon_av().AVDecoder(io.BytesIO(data)), AVDecoder(data)
    for flags in METADATA_FLAGS:
        assert dataclasses.asdict(ours.get_metadata(**flags)) == pytest.approx(dataclasses.asdict(theirs.get_metadata(**flags))), flags
    if "mp4" in kind:
        assert ours.get_video_duration() == theirs.get_video_duration()
        assert ours.get_video_duration(get_frame_count=True) == theirs.get_video_duration(get_frame_count=True)
    assert ours.get_audio_duration() == pytest.approx(theirs.get_audio_duration())
    if kind != "mp4":
        assert ours.get_audio_samples_per_second() == theirs.get_audio_samples_per_second() == 16000


def test_a_decoder_from_a_stream_as_energon(video: bytes, tmp_path) -> None:
    stream = io.BytesIO(video)
    stream.seek(100)  # read from the start, whatever the position
    from_stream = AVDecoder(stream)
    assert from_stream.data == video and gray(from_stream.get_video_clips([(1.0, 1.0)])[0][0]) == [8]
    path = tmp_path / "v.mp4"
    path.write_bytes(video)
    with open(path, "rb") as f:
        assert AVDecoder(f).get_metadata().video_num_frames == 16
    with open(path, encoding="latin-1") as f, pytest.raises(DecodeError, match="binary stream"):
        AVDecoder(f)
    assert AVDecoder(video).stream.read() == video  # Energon's attribute: a fresh binary stream
    assert AVDecoder(io.BytesIO(video), suppress_warnings=True).suppress_warnings
