"""megatron_energon_lite.energon.av: Energon's import paths for the video/audio decoder."""

from __future__ import annotations

import importlib

import pytest
from energon_lite_dev.synthetic import make_audio, make_video

from megatron_energon_lite.energon import av as av_package
from megatron_energon_lite.decode import av as decode_av
from megatron_energon_lite.errors import ConfigError, NotSupportedError


def test_names_are_the_decoders_own_objects() -> None:
    assert av_package.AVDecoder is decode_av.AVDecoder
    assert av_package.AVData is decode_av.AVData
    assert av_package.get_clips_uniform is decode_av.get_clips_uniform
    assert av_package.get_single_frames_uniform is decode_av.get_single_frames_uniform
    assert importlib.import_module("megatron_energon_lite.energon.av.av_decoder").AVDecoder is decode_av.AVDecoder


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
