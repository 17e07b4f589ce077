"""megatron_energon_lite.energon.av: Energon's import paths for the video/audio decoder."""

from __future__ import annotations

import importlib
import io
import pickle

import pytest
from energon_lite_dev.synthetic import make_audio, make_video

from megatron_energon_lite import energon_mode
from megatron_energon_lite.decode import av as decode_av
from megatron_energon_lite.energon import av as av_package
from megatron_energon_lite.errors import ConfigError, DecodeError, NotSupportedError


def test_names_are_the_decoders_own_objects() -> None:
    assert av_package.AVData is decode_av.AVData
    assert av_package.get_clips_uniform is decode_av.get_clips_uniform
    assert av_package.get_single_frames_uniform is decode_av.get_single_frames_uniform
    assert importlib.import_module("megatron_energon_lite.energon.av.av_decoder").AVDecoder is av_package.AVDecoder
    # Energon's AVDecoder is ours made with the switch's policy; every decoder of ours is one.
    assert issubclass(av_package.AVDecoder, decode_av.AVDecoder) and issubclass(decode_av.AVDecoder, av_package.AVDecoder)
    assert isinstance(decode_av.AVDecoder(make_audio(0.25)), av_package.AVDecoder)


@pytest.mark.parametrize("switch", [False, True])
def test_energons_decoder_follows_the_switch_for_ranges_past_the_end(switch: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the switch a range that starts after the end gives no clip (Energon's own tests rely
    on it); without it, the plain import's error, also through Energon's names."""
    monkeypatch.setattr(energon_mode, "_enabled", switch)
    video = make_video(frames=8, fps=8)
    ranges = [(0.0, 0.1), (5.0, 6.0)]
    made = [av_package.AVDecoder(io.BytesIO(video)), av_package.AVWebdatasetDecoder(False)("mp4", video), av_package.AVWebdatasetDecoder(False).read_av_data(video)]
    for decoder in made + [pickle.loads(pickle.dumps(made[0]))]:
        if switch:
            clips, stamps = decoder.get_video_clips(ranges)
            assert len(clips) == len(stamps) == 1
        else:
            with pytest.raises(DecodeError, match=r"video clip range \(5\.0, 6\.0\) \(seconds\) starts at or after the end"):
                decoder.get_video_clips(ranges)


@pytest.mark.energon
def test_public_names_cover_energons() -> None:
    theirs = pytest.importorskip("megatron.energon.av")
    assert set(theirs.__all__) <= set(av_package.__all__)


def test_pyav_is_still_importable_as_av() -> None:
    import av

    assert hasattr(av, "open") and av.__name__ == "av"


def test_webdataset_decoder_modes() -> None:
    video = make_video(frames=8, fps=8)
    lazy = av_package.AVWebdatasetDecoder(video_decode_audio=False)
    assert lazy("notes.txt", b"text") is None
    decoder = lazy("sample.MP4", video)
    assert isinstance(decoder, av_package.AVDecoder) and decoder.get_metadata().video_width == 64
    data = av_package.AVWebdatasetDecoder(video_decode_audio=False, av_decode="torch")("mp4", video)
    assert isinstance(data, av_package.AVData) and data.video_clips[0].shape[0] == 8
    assert av_package.AVWebdatasetDecoder(False).read_av_data(make_audio(0.25)).has_audio_stream()
    with pytest.raises(ConfigError, match="av_decode"):
        av_package.AVWebdatasetDecoder(False, av_decode="numpy")


def test_reader_internals_are_named_but_not_supported() -> None:
    from megatron_energon_lite.energon.av.av_reader import AVProbeIndex, AVReaderByFrames

    assert AVProbeIndex is decode_av.AVProbeIndex  # the probe index is ours (tests/decode/test_av.py)
    with pytest.raises(NotSupportedError, match="AVReaderByFrames is not implemented"):
        AVReaderByFrames(None, 0)
    assert issubclass(NotSupportedError, NotImplementedError)
