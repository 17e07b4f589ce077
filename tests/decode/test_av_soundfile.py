"""Audio clips through soundfile (libsndfile) when it is installed, PyAV otherwise: same clips."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
import torch
from energon_lite_dev.synthetic import make_audio

from megatron_energon_lite import DecodeError, SampleDecoder
from megatron_energon_lite.decode import av as av_module
from megatron_energon_lite.decode.av import AVDecoder, backend
from megatron_energon_lite.policy import ENERGON, PLAIN

RANGES = [(0.0, 0.25), (0.1, 0.3333), (0.9, 2.0), (0.999, 1.5), (1.0, 1.5), (5.0, 6.0)]


@pytest.fixture
def without_soundfile(monkeypatch):
    """As if soundfile were not installed: ``import soundfile`` fails."""
    monkeypatch.setitem(sys.modules, "soundfile", None)
    monkeypatch.setattr(av_module, "_soundfile_module", av_module._UNSET)


def clips_with(monkeypatch, soundfile, data: bytes, ranges, policy=ENERGON, **kwargs):
    """The clips of ``ranges``, read by soundfile (or, with ``soundfile`` None, by PyAV); under
    Energon's policy by default, so that ranges past the end give no clip."""
    monkeypatch.setattr(av_module, "_soundfile_module", soundfile)
    return AVDecoder(data, policy=policy).get_audio_clips(ranges, **kwargs)


def test_pyav_is_the_path_without_soundfile(without_soundfile, monkeypatch) -> None:
    assert av_module._soundfile() is None
    assert backend().startswith("pyav ")

    def must_not_run(*args, **kwargs):
        raise AssertionError("the soundfile path ran without soundfile")

    monkeypatch.setattr(AVDecoder, "_soundfile_audio_clips", must_not_run)
    clips, stamps = SampleDecoder().decode_part("wav", make_audio(1.0)).get_audio_clips([(0.25, 0.5)])
    assert clips[0].shape == (1, 4000) and clips[0].dtype == torch.int16
    assert stamps[0] == pytest.approx((0.25, 0.5))


def test_ranges_at_or_past_the_end_give_no_clip_as_energon(without_soundfile) -> None:
    """PyAV path: a range starting at or after the end gives no clip under Energon's policy (Energon
    drops it); ours names it."""
    ranges = [(1.0, 1.5), (5.0, 6.0), (0.5, 0.75)]
    clips, stamps = AVDecoder(make_audio(1.0), policy=ENERGON).get_audio_clips(ranges)
    assert [tuple(c.shape) for c in clips] == [(1, 4000)]
    assert stamps == [pytest.approx((0.5, 0.75))]
    with pytest.raises(DecodeError, match=r"audio clip range \(1\.0, 1\.5\) \(seconds\) starts at or after the end"):
        AVDecoder(make_audio(1.0)).get_audio_clips(ranges)


def stereo_flac_24() -> bytes:
    soundfile = pytest.importorskip("soundfile")
    samples = (np.random.default_rng(0).standard_normal((16000, 2)) * 0.2).astype(np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, 16000, format="FLAC", subtype="PCM_24")
    return buffer.getvalue()


@pytest.mark.parametrize("kind", ["wav", "flac", "flac24"])
def test_soundfile_gives_the_same_clips_as_pyav(monkeypatch, kind: str) -> None:
    soundfile = pytest.importorskip("soundfile")
    data = stereo_flac_24() if kind == "flac24" else make_audio(1.0, 16000, kind)
    calls = []
    original = AVDecoder._soundfile_audio_clips

    def counted(self, *args):
        result = original(self, *args)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(AVDecoder, "_soundfile_audio_clips", counted)
    fast, fast_stamps = clips_with(monkeypatch, soundfile, data, RANGES)
    assert calls == [True]  # soundfile read the clips
    slow, slow_stamps = clips_with(monkeypatch, None, data, RANGES)
    assert calls == [True]  # and the PyAV path did not call it
    channels = 2 if kind == "flac24" else 1
    # (1.0, 1.5) and (5.0, 6.0) start at the end: no clips.
    assert [tuple(c.shape) for c in fast] == [(channels, n) for n in (4000, 3733, 1600, 16)]
    for a, b in zip(fast, slow):
        assert a.dtype == (torch.int32 if kind == "flac24" else torch.int16) and a.is_contiguous() and torch.equal(a, b)
    assert np.allclose(fast_stamps, slow_stamps, atol=1e-6)
    fast, _ = clips_with(monkeypatch, soundfile, data, [(100, 4100)], audio_unit="samples")
    slow, _ = clips_with(monkeypatch, None, data, [(100, 4100)], audio_unit="samples")
    assert fast[0].shape == (channels, 4000) and torch.equal(fast[0], slow[0])
    for reader in (soundfile, None):  # ours: the first range past the end is named, on both paths
        with pytest.raises(DecodeError, match=r"audio clip range \(1\.0, 1\.5\) \(seconds\) starts at or after the end"):
            clips_with(monkeypatch, reader, data, RANGES, policy=PLAIN)


def test_soundfile_leaves_resampling_and_bad_files_to_pyav(monkeypatch) -> None:
    soundfile = pytest.importorskip("soundfile")
    data = make_audio(1.0)
    resampled, _ = clips_with(monkeypatch, soundfile, data, [(0.0, 0.5)], sample_rate=8000)
    assert abs(resampled[0].shape[1] - 4000) <= 64
    with pytest.raises(DecodeError, match="cannot open the media"):
        clips_with(monkeypatch, soundfile, b"RIFF\x00\x00\x00\x00WAVE garbage", [(0.0, 1.0)])
    decoder = AVDecoder(data, byte_budget=1000)
    monkeypatch.setattr(av_module, "_soundfile_module", soundfile)
    with pytest.raises(DecodeError, match="byte budget"):
        decoder.get_audio_clips([(0.0, 0.5)])
