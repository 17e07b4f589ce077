"""Which samples a preview shows: crude parts decoded by extension, metadataset leaves with their
weights, errors in place of bad samples, the unprepared-folder message, JSONL, object storage."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from energon_lite_dev.synthetic import (
    TEXT_SAMPLE_YAML,
    make_jpeg,
    write_jsonl,
    write_tar,
)
from PIL import Image
from preview_helpers import (
    CAPTIONING_YAML,
    COLOURS,
    CRUDE_YAML,
    encoded,
    loud_then_silent,
    make_dataset,
    png,
    run,
    solid,
    wav_bytes,
)

from megatron_energon_lite.preview import collect
from megatron_energon_lite.preview.grid import CELL_SIZE, THUMB_SIZE
from megatron_energon_lite.preview.views import (
    AudioView,
    ImageView,
    TextView,
    ValueView,
    VideoView,
)
from megatron_energon_lite.storage import as_path


def _views(section) -> list[dict]:
    return [{field.name: field.view for field in sample.fields} for sample in section.samples]


def test_crude_parts_are_decoded_by_extension(tmp_path: Path) -> None:
    av = pytest.importorskip("av")  # noqa: F841 - wav/flac/mp3/mp4/webm parts need PyAV
    from energon_lite_dev.synthetic import make_audio, make_video

    image = solid(COLOURS[1], (20, 10))
    parts = {
        "jpg": make_jpeg(16, 8, seed=1),
        "png": png(image),
        "webp": encoded(image, "WEBP"),
        "txt": "hello".encode(),
        "json": b'{"a": [1, 2]}',
        "wav": wav_bytes(loud_then_silent(8000, 0.25), 8000),
        "flac": make_audio(0.5, 16000, "flac"),
        "mp3": _mp3(),
        "mp4": make_video(frames=4, fps=4, size=(32, 24)),
        "webm": _webm(),
        "cls": b"3",
        "index": b"7",
        "bin": b"\x00\x01\x02",
    }
    root = make_dataset(tmp_path / "crude", [("s0", parts)], CRUDE_YAML)
    (section,) = collect(root, ["train"], num_samples=1)
    (views,) = _views(section)
    assert views["__key__"].summary == "'s0'" and views["__shard__"].summary == "'shards/part_0.tar'"
    assert {"__restore_key__", "__sources__", "__subflavors__"}.isdisjoint(views)
    for name, size in (("jpg", (16, 8)), ("png", (20, 10)), ("webp", (20, 10))):
        assert isinstance(views[name], ImageView) and views[name].image.size == size, name
    assert np.asarray(views["png"].image)[0, 0].tolist() == list(COLOURS[1])
    assert isinstance(views["txt"], TextView) and views["txt"].text == "hello"
    assert isinstance(views["json"], ValueView) and views["json"].summary == "{'a': [1, 2]}" and json.loads(views["json"].detail) == {"a": [1, 2]}
    for name, rate, seconds in (("wav", 8000, 0.25), ("flac", 16000, 0.5), ("mp3", 16000, 0.5)):
        view = views[name]
        assert isinstance(view, AudioView) and view.rate == rate and abs(view.duration - seconds) < 0.1, (name, view)
    assert isinstance(views["mp4"], VideoView) and len(views["mp4"].frames) == 4 and views["mp4"].frames[0].size == (32, 24)
    assert isinstance(views["webm"], VideoView) and views["webm"].summary.startswith("video 32x24")
    assert views["cls"].summary == "3" and views["index"].summary == "7"
    assert views["bin"].summary == "bytes(len=3)"


def _mp3() -> bytes:
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp3") as container:
        stream = container.add_stream("libmp3lame", rate=16000)
        stream.layout = "mono"
        samples = (np.sin(np.arange(8000) * 0.1) * 0.5).astype(np.float32)[None, :]
        for start in range(0, 8000, 1152):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start : start + 1152]), format="fltp", layout="mono")
            frame.sample_rate = 16000
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def _webm() -> bytes:
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="webm") as container:
        stream = container.add_stream("libvpx", rate=4)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
        for i in range(4):
            frame = av.VideoFrame.from_ndarray(np.full((24, 32, 3), 40 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def test_crude_broken_part_shows_its_error_next_to_the_others(tmp_path: Path) -> None:
    samples = [("b0", {"jpg": b"\xff\xd8\xff not a jpeg", "txt": b"still here"}), ("b1", {"jpg": make_jpeg(8, 8, seed=0), "txt": b"next"})]
    root = make_dataset(tmp_path / "crude", samples, CRUDE_YAML)
    result = run("preview", str(root))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith(" - jpg: error: DecodeError: cannot decode part 'jpg' of sample 'b0'") for line in lines)
    assert " - txt: 'still here'" in lines and " - txt: 'next'" in lines
    assert " - jpg: PIL.Image(size=(8, 8), mode=RGB)" in lines


def test_typed_corrupt_sample_shows_its_error_and_the_preview_goes_on(tmp_path: Path) -> None:
    samples = [(f"t{i}", {"png": png(solid(COLOURS[i])), "txt": f"caption {i}".encode()}) for i in range(4)]
    samples[1] = ("t1", {"png": b"\x89PNG\r\n\x1a\n truncated", "txt": b"caption 1"})
    root = make_dataset(tmp_path / "typed", samples, CAPTIONING_YAML)
    result = run("preview", str(root), "-n", "4")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    bad = lines.index("Sample 1")
    assert lines[bad + 1] == " ! cannot load this sample (key 't1', shard 'shards/part_0.tar'):"
    assert lines[bad + 2].startswith("   DecodeError: cannot decode part 'png' of sample 't1'")
    assert "caption 1" not in result.output
    for i in (2, 3):
        assert f"Sample {i}" in lines and f" - caption (<class 'str'>): 'caption {i}'" in lines
    out = tmp_path / "page.html"
    assert run("preview", str(root), "-n", "4", "--html", str(out)).exit_code == 0
    page = out.read_text()
    assert page.count("class=\"thumb\"") == 3 and "cannot load this sample: DecodeError" in page


def test_unprepared_folder_gives_the_message_info_gives(tmp_path: Path) -> None:
    write_tar(tmp_path / "raw/shards/a.tar", [("k0", {"txt": b"x"})])
    info = run("info", str(tmp_path / "raw"))
    for args in ((), ("--split-parts", "train"), ("--html", str(tmp_path / "x.html"))):
        preview = run("preview", str(tmp_path / "raw"), *args)
        assert preview.exit_code == info.exit_code == 1
        assert preview.output == info.output and "run `energon-lite prepare" in preview.output
    assert not (tmp_path / "x.html").exists()


def _text_dataset(root: Path, name: str, count: int) -> Path:
    return make_dataset(root / name, [(f"{name}{i}", {"txt": f"{name} text {i}".encode()}) for i in range(count)], TEXT_SAMPLE_YAML)


def test_metadataset_leaves_with_weights_and_their_samples(tmp_path: Path) -> None:
    _text_dataset(tmp_path, "alpha", 5)
    _text_dataset(tmp_path, "beta", 3)
    yaml = tmp_path / "blend.yaml"
    yaml.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 3, path: alpha}\n      - {weight: 1, path: beta, subflavors: {src: b}}\n"
        "  val:\n    path: beta\n    split_part: train\n"
    )
    result = run("preview", str(yaml), "-n", "2")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"Metadataset {yaml} split train: blend, 2 datasets"
    alpha = lines.index(f"== {yaml}: splits.train.blend[0], weight 75.0%")
    beta = lines.index(f"== {yaml}: splits.train.blend[1], weight 25.0%")
    assert lines[alpha + 1] == f"{tmp_path / 'alpha'} split train: samples 0..1 of 5"
    assert lines[beta + 1] == f"{tmp_path / 'beta'} split train: samples 0..1 of 3"
    assert " - text (<class 'str'>): 'alpha text 1'" in lines[alpha:beta] and " - text (<class 'str'>): 'beta text 0'" in lines[beta:]
    assert "'alpha text 2'" not in result.output  # -n per leaf

    val = run("preview", str(yaml), "--split-parts", "val", "--offset", "2")
    assert val.exit_code == 0 and "split val: single, 1 dataset" in val.output and "'beta text 2'" in val.output

    out = tmp_path / "blend.html"
    assert run("preview", str(yaml), "-n", "2", "--html", str(out)).exit_code == 0
    page = out.read_text()
    assert "splits.train.blend[0], weight 75.0%" in page and "splits.train.blend[1], weight 25.0%" in page
    assert page.count('class="sample"') == 4


def test_metadataset_subset_range_is_where_the_leaf_starts(tmp_path: Path) -> None:
    _text_dataset(tmp_path, "gamma", 10)
    yaml = tmp_path / "subset.yaml"
    yaml.write_text("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: gamma\n    subset: {range: [4, 8]}\n")
    result = run("preview", str(yaml), "-n", "10", "--offset", "1")
    assert result.exit_code == 0, result.output
    assert f"{tmp_path / 'gamma'} split train: samples 5..7 of 4" in result.output
    shown = [line for line in result.output.splitlines() if line.startswith(" - text")]
    assert shown == [f" - text (<class 'str'>): 'gamma text {i}'" for i in (5, 6, 7)]


def test_jsonl_records_are_shown(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    write_jsonl(path, [{"q": "why?", "i": i} for i in range(3)])
    assert run("prepare", str(path)).exit_code == 0
    result = run("preview", str(path), "-n", "2", "--offset", "1")
    assert result.exit_code == 0, result.output
    assert " - json: {'q': 'why?', 'i': 1}" in result.output.splitlines() and "'i': 0" not in result.output


def test_remote_dataset_preview_and_html(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from energon_lite_dev.s3server import LocalS3Server

    from megatron_energon_lite.storage import remote

    local = make_dataset(tmp_path / "local", [(f"r{i}", {"png": png(solid(COLOURS[i])), "txt": f"remote {i}".encode()}) for i in range(3)], CAPTIONING_YAML)
    with LocalS3Server() as server:
        server.create_bucket("preview")
        for file in local.rglob("*"):
            if file.is_file():
                server.put_bytes(f"s3://preview/ds/{file.relative_to(local)}", file.read_bytes())
        # What configure_storage sets, undone after the test.
        monkeypatch.setitem(remote._CONFIGURED, "s3", (server.storage_options(), None))
        result = run("preview", "s3://preview/ds", "-n", "3")
        assert result.exit_code == 0, result.output
        assert " - caption (<class 'str'>): 'remote 2'" in result.output.splitlines()
        assert run("preview", "s3://preview/ds", "-n", "3", "--grid", "s3://preview/out/sheet.png").exit_code == 0
        sheet = Image.open(io.BytesIO(as_path("s3://preview/out/sheet.png").read_bytes()))
        pixels = np.asarray(sheet.convert("RGB")).astype(int)
        assert sheet.size == (3 * CELL_SIZE[0], CELL_SIZE[1])
        assert np.abs(pixels[8 + THUMB_SIZE[1] // 2, CELL_SIZE[0] + 8 + THUMB_SIZE[0] // 2] - COLOURS[1]).max() <= 2
