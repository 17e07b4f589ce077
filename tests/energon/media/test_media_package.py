"""megatron_energon_lite.energon.media: typed metadata and Energon's media filter names, checked against
Energon's own classes on the same files."""

from __future__ import annotations

import io

import pytest
from energon_lite_dev.synthetic import make_audio, make_video
from PIL import Image

from megatron_energon_lite.errors import ConfigError, DatasetError
from megatron_energon_lite.format.media_metadata import MediaFilter
from megatron_energon_lite.energon.media import (
    AVMetadata,
    ImageMetadata,
    MediaMetadataType,
    deserialize_media_metadata,
    serialize_media_metadata,
)
from megatron_energon_lite.energon.media.extractor import MediaFilterConfig, MediaFilterStrategy
from megatron_energon_lite.energon.media.metadata import extract_media_metadata


def png(width: int = 6, height: int = 4) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(out, "PNG")
    return out.getvalue()


def test_rows_round_trip() -> None:
    image = ImageMetadata(width=6, height=4, format="PNG", mode="RGB")
    kind, text = serialize_media_metadata(image)
    assert kind is MediaMetadataType.IMAGE and kind == "image" and text == '{"width":6,"height":4,"format":"PNG","mode":"RGB"}'
    assert deserialize_media_metadata("image", text) == image
    av = AVMetadata(video_fps=8.0, video_num_frames=16)
    assert serialize_media_metadata(av) == (MediaMetadataType.AV, '{"video_num_frames":16,"video_fps":8.0}')
    assert deserialize_media_metadata(MediaMetadataType.AV, serialize_media_metadata(av)[1]) == av


def test_bad_rows_are_dataset_errors() -> None:
    with pytest.raises(DatasetError, match="unknown media metadata type"):
        deserialize_media_metadata("hologram", "{}")
    with pytest.raises(DatasetError, match="does not know"):
        deserialize_media_metadata("av", '{"video_colour": 3}')


@pytest.mark.energon
def test_serialized_rows_equal_energons() -> None:
    theirs = pytest.importorskip("megatron.energon.media")
    assert serialize_media_metadata(ImageMetadata(width=1, height=2, format="JPEG", mode="L")) == theirs.serialize_media_metadata(
        theirs.ImageMetadata(width=1, height=2, format="JPEG", mode="L")
    )
    fields = dict(video_duration=2.0, video_fps=8.0, audio_channels=1)
    assert serialize_media_metadata(AVMetadata(**fields)) == theirs.serialize_media_metadata(theirs.AVMetadata(**fields))


@pytest.mark.energon
@pytest.mark.parametrize("name, data", [("x.png", png()), ("v.mp4", make_video(frames=8, fps=8)), ("a.wav", make_audio(0.5))])
def test_extracted_metadata_equals_energons(name: str, data: bytes) -> None:
    extractor = pytest.importorskip("megatron.energon.media.extractor")
    theirs = extractor.MediaFilterConfig(strategy=extractor.MediaFilterStrategy.EXTENSION).extract_metadata(data, name)
    ours = MediaFilterConfig(strategy=MediaFilterStrategy.EXTENSION).extract_metadata(data, name)
    assert type(ours).__name__ == type(theirs).__name__
    assert ours.to_dict() == pytest.approx(theirs.to_dict())


def test_extract_by_type_and_by_filter(tmp_path) -> None:
    assert extract_media_metadata("image", png(3, 5)) == ImageMetadata(width=3, height=5, format="PNG", mode="RGB")
    (tmp_path / "img.png").write_bytes(png())
    by_extension = MediaFilterConfig(strategy=MediaFilterStrategy.EXTENSION)
    assert by_extension.extract_metadata(tmp_path / "img.png") == ImageMetadata(width=6, height=4, format="PNG", mode="RGB")
    assert by_extension.extract_metadata(io.BytesIO(png()), "img.png").width == 6
    assert by_extension.extract_metadata(b"text", "notes.txt") is None
    assert by_extension.extract_metadata(b"not an image", "broken.png") is None  # unparsable: no metadata


def test_filter_config_is_a_media_filter() -> None:
    glob = MediaFilterConfig(strategy=MediaFilterStrategy.GLOB, patterns=["*.jpg", "*.wav"])
    assert isinstance(glob, MediaFilter) and glob.patterns == ("*.jpg", "*.wav") and glob.patterns_text == "*.jpg,*.wav"
    assert glob.should_consider_media("a/b.jpg") and not glob.should_consider_media("b.txt") and not glob.should_consider_all()
    assert MediaFilterConfig.parse("*.png,*.jpg", False, False) == MediaFilterConfig(strategy="GLOB", patterns=("*.png", "*.jpg"))
    assert MediaFilterConfig.parse(None, True, False).should_consider_all()
    with pytest.raises(ConfigError):
        MediaFilterConfig.parse(None, False, False)
    with pytest.raises(ConfigError):
        MediaFilterConfig.parse("*.png", True, False)
