"""``preview --html``: one self-contained page; its images and audio decode back to the data, and
text from the dataset cannot inject markup."""

from __future__ import annotations

import base64
import io
import wave
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from preview_helpers import (
    COLOURS,
    CRUDE_YAML,
    loud_then_silent,
    make_dataset,
    png,
    run,
    solid,
    wav_bytes,
)

from megatron_energon_lite.preview import (
    PreviewField,
    PreviewSample,
    Section,
    render_html,
)
from megatron_energon_lite.preview.views import view_of


class Tags(HTMLParser):
    """Every start tag with its attributes, and the page's text."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def all(self, tag: str, css_class: str | None = None) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and (css_class is None or css_class in a.get("class", "").split())]


def data_uri(uri: str) -> tuple[str, bytes]:
    head, _, payload = uri.partition(",")
    assert head.startswith("data:") and head.endswith(";base64"), head
    return head[5:-7], base64.b64decode(payload)


def test_one_thumbnail_per_sample_decodes_to_its_image(colour_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    result = run("preview", str(colour_dataset), "-n", "4", "--html", str(out))
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"Wrote 4 samples to {out}"
    page = out.read_text()
    tags = Tags(page)
    thumbs = tags.all("img", "thumb")
    assert len(thumbs) == 4
    for colour, attrs in zip(COLOURS, thumbs):
        mime, data = data_uri(attrs["src"])
        image = Image.open(io.BytesIO(data))
        assert mime == "image/jpeg" and image.format == "JPEG" and image.size == (40, 30)
        assert (int(attrs["width"]), int(attrs["height"])) == (160, 120)  # shown 4x, pixelated
        assert np.abs(np.asarray(image.convert("RGB")).astype(int) - colour).max() <= 12
    text = " ".join(tags.text)
    for i in range(4):
        assert f"c{i:03d}" in text and f"colour {i}" in text  # keys and captions
    assert "shards/part_0.tar" in text and "shards/part_1.tar" in text  # shard names
    # Self-contained: nothing is fetched, no script runs.
    assert all(a.get("src", "data:").startswith("data:") for _, a in tags.tags)
    assert not tags.all("script") and not tags.all("link")
    assert tags.all("meta") and any("default-src 'none'" in a.get("content", "") for a in tags.all("meta"))


def test_dataset_text_cannot_inject_markup(tmp_path: Path) -> None:
    evil = '<script>alert(1)</script><img src=x onerror=alert(2)>"\'&'
    samples = [("k<b>0", {"txt": evil.encode(), "json": b'{"x": "</pre><script>alert(3)</script>"}', "png": png(solid((1, 2, 3)))})]
    root = make_dataset(tmp_path / "evil", samples, CRUDE_YAML)
    out = tmp_path / "page.html"
    assert run("preview", str(root), "--html", str(out)).exit_code == 0
    page = out.read_text()
    assert "<script" not in page.lower() and "<img src=x" not in page and "<b>" not in page
    tags = Tags(page)
    assert not tags.all("script") and not tags.all("b")
    assert [a.get("src", "")[:5] for a in tags.all("img")] == ["data:"]  # only our thumbnail
    text = "".join(tags.text)
    assert evil in text and "k<b>0" in text and "</pre><script>alert(3)</script>" in text  # shown, as text


def test_audio_is_an_embedded_wav_and_video_frames_are_images(tmp_path: Path) -> None:
    pytest.importorskip("av")
    from energon_lite_dev.synthetic import make_video

    samples = [("a0", {"wav": wav_bytes(loud_then_silent(8000, 0.5), 8000)}), ("v0", {"mp4": make_video(frames=8, fps=8, size=(32, 24))})]
    root = make_dataset(tmp_path / "media", samples, CRUDE_YAML)
    out = tmp_path / "page.html"
    assert run("preview", str(root), "--html", str(out)).exit_code == 0
    tags = Tags(out.read_text())
    (audio,) = tags.all("audio")
    assert "controls" in audio
    mime, data = data_uri(audio["src"])
    with wave.open(io.BytesIO(data)) as wav:
        assert mime == "audio/wav" and wav.getframerate() == 8000 and wav.getnframes() == 4000 and wav.getnchannels() == 1
        decoded = np.frombuffer(wav.readframes(4000), "<i2")
    np.testing.assert_allclose(decoded / 32767, loud_then_silent(8000, 0.5), atol=2e-4)
    frames = tags.all("img", "frame")
    assert len(frames) == 4
    grays = [int(np.asarray(Image.open(io.BytesIO(data_uri(f["src"])[1])).convert("L")).mean()) for f in frames]
    assert grays == sorted(grays) and grays[-1] - grays[0] > 20  # later frames are lighter
    assert "audio 8000 Hz, 1 channel, 0.50 s" in " ".join(tags.text)


def test_large_images_shrink_and_transparent_ones_stay_png() -> None:
    # The CLI decodes images to RGB (image_decode="pil", as Energon's preview); an RGBA image
    # reaches the page from a sample field that holds one.
    image = Image.new("RGBA", (300, 150), (10, 20, 30, 0))
    sample = PreviewSample(0, "t0", "s.tar", (PreviewField("image", None, view_of(image)),))
    (thumb,) = Tags(render_html([Section("t", (sample,))], title="x")).all("img", "thumb")
    mime, data = data_uri(thumb["src"])
    decoded = Image.open(io.BytesIO(data))
    assert mime == "image/png" and decoded.mode == "RGBA" and decoded.size == (256, 128)  # shrunk to 256
    assert (thumb["width"], thumb["height"]) == ("256", "128")
