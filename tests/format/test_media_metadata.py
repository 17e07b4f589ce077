"""Media metadata at prepare time (Energon's ``--media-metadata-by-{extension,glob,header}``).

Real media is encoded here with Pillow and PyAV (tiny: 8 frames of 32x32 video, 1 s of audio),
packed into tars, prepared, and the stored rows are checked against what was encoded; the
``energon`` tests prepare the same tars with Energon's CLI and compare row by row.
"""

from __future__ import annotations

import io
import json
import logging
import math
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import make_jpeg, make_png, write_tar

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.errors import ConfigError, MissingDependencyError
from megatron_energon_lite.format.media_metadata import (
    AV,
    IMAGE,
    MediaFilter,
    MediaStrategy,
    av_metadata,
    read_media_filter,
    read_media_metadata,
    sniff_media_type,
)
from megatron_energon_lite.format.prepare import prepare_dataset

av = pytest.importorskip("av")

# --------------------------------------------------------------------------------------------
# Media, encoded here
# --------------------------------------------------------------------------------------------


def make_video(*, frames: int = 8, size: tuple[int, int] = (32, 32), fps: int = 8, codec: str = "mpeg4", audio_rate: int | None = None) -> bytes:
    """An mp4 of ``frames`` grey frames (and optionally a silent AAC track)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        video = container.add_stream(codec, rate=fps)
        video.width, video.height = size
        video.pix_fmt = "yuv420p"
        audio = container.add_stream("aac", rate=audio_rate, layout="mono") if audio_rate else None
        for i in range(frames):
            image = np.full((size[1], size[0], 3), 20 * i, dtype=np.uint8)
            container.mux(video.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(video.encode())
        if audio is not None:
            samples = np.zeros((1, audio_rate * frames // fps), dtype=np.float32)
            frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
            frame.sample_rate = audio_rate
            container.mux(audio.encode(frame))
            container.mux(audio.encode())
    return buffer.getvalue()


def make_audio(*, fmt: str = "wav", codec: str = "pcm_s16le", rate: int = 16000, seconds: float = 1.0, stereo: bool = False) -> bytes:
    """A sine tone as WAV (pcm_s16le) or FLAC."""
    count = int(rate * seconds)
    tone = (np.sin(2 * np.pi * 440 * np.arange(count) / rate) * 10000).astype(np.int16)
    layout = "stereo" if stereo else "mono"
    data = np.repeat(tone, 2)[None, :] if stereo else tone[None, :]  # packed s16
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(data, format="s16", layout=layout)
        frame.sample_rate = rate
        container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buffer.getvalue()


@pytest.fixture(scope="module")
def media() -> dict[str, bytes]:
    return {
        "jpg": make_jpeg(12, 10, seed=1),
        "png": make_png(7, 5, seed=2, mode="L"),
        "mp4": make_video(),
        "h264": make_video(codec="libx264", size=(48, 32), fps=10, frames=10),
        "avmp4": make_video(audio_rate=16000),
        "wav": make_audio(),
        "flac": make_audio(fmt="flac", codec="flac", rate=22050, seconds=0.5, stereo=True),
    }


def build_raw(root: Path, media: dict[str, bytes]) -> None:
    """Two shards: every media kind, media under non-media names, a broken jpg, text parts.

    Nothing here makes Energon fail a shard (see ``test_header_false_positive_is_skipped``).
    """
    write_tar(
        root / "shards/media-0.tar",
        [
            ("v_000", {"jpg": media["jpg"], "mp4": media["mp4"], "wav": media["wav"], "txt": b"a caption"}),
            ("v_001", {"png": media["png"], "mp4": media["h264"], "flac": media["flac"], "json": b'{"a": 1}'}),
        ],
    )
    write_tar(
        root / "shards/media-1.tar",
        [
            ("w_000", {"mov": media["avmp4"], "bin": media["png"], "dat": media["wav"]}),
            ("sub/w_001", {"jpg": b"this is not a jpeg", "JPG": media["jpg"], "txt": b"a caption"}),
        ],
    )


def _image(width: int, height: int, fmt: str, mode: str) -> dict:
    return {"width": width, "height": height, "format": fmt, "mode": mode}


def _video(frames: int, fps: float, width: int, height: int) -> dict:
    return {"video_duration": frames / fps, "video_num_frames": frames, "video_fps": fps, "video_width": width, "video_height": height}


def _audio(rate: int, channels: int, samples: int) -> dict:
    return {"audio_duration": samples / rate, "audio_channels": channels, "audio_sample_rate": rate, "audio_num_samples": samples}


# What each entry holds, as encoded above (the AAC track of "w_000.mov" is checked separately).
ENCODED = {
    "v_000.jpg": (IMAGE, _image(12, 10, "JPEG", "RGB")),
    "v_000.mp4": (AV, _video(8, 8.0, 32, 32)),
    "v_000.wav": (AV, _audio(16000, 1, 16000)),
    "v_001.png": (IMAGE, _image(7, 5, "PNG", "L")),
    "v_001.mp4": (AV, _video(10, 10.0, 48, 32)),
    "v_001.flac": (AV, _audio(22050, 2, 11025)),
    "w_000.mov": (AV, _video(8, 8.0, 32, 32)),
    "w_000.bin": (IMAGE, _image(7, 5, "PNG", "L")),
    "w_000.dat": (AV, _audio(16000, 1, 16000)),
    "sub/w_001.JPG": (IMAGE, _image(12, 10, "JPEG", "RGB")),
}
BY_EXTENSION = {"v_000.jpg", "v_000.mp4", "v_000.wav", "v_001.png", "v_001.mp4", "v_001.flac", "w_000.mov", "sub/w_001.JPG"}
# Energon's glob rule: the name must match as written and lowercased ("sub/w_001.JPG" does not).
GLOB = "*.jpg,*.wav,*.bin"
BY_GLOB = {"v_000.jpg", "v_000.wav", "w_000.bin"}  # selected by name, typed by content
BY_HEADER = BY_EXTENSION | {"w_000.bin", "w_000.dat"}


@pytest.fixture
def raw(tmp_path: Path, media: dict[str, bytes]) -> Path:
    root = tmp_path / "media_ds"
    build_raw(root, media)
    return root


def _rows(root: Path) -> dict[str, tuple[str, dict]]:
    db = sqlite3.connect(root / ".nv-meta/index.sqlite")
    try:
        rows = db.execute("SELECT entry_key, metadata_type, metadata_json FROM media_metadata").fetchall()
    finally:
        db.close()
    return {key: (kind, json.loads(text)) for key, kind, text in rows}


def _filters(root: Path) -> list[tuple]:
    db = sqlite3.connect(root / ".nv-meta/index.sqlite")
    try:
        return db.execute("SELECT filter_id, strategy, patterns, created_at_utc FROM media_filters").fetchall()
    finally:
        db.close()


def _assert_close(found: dict, expected: dict, where: str) -> None:
    assert set(found) == set(expected), where
    for name, value in expected.items():
        if isinstance(value, float):
            assert math.isclose(found[name], value, rel_tol=1e-3, abs_tol=1e-3), f"{where}: {name}"
        else:
            assert found[name] == value and type(found[name]) is type(value), f"{where}: {name}"


def _check_rows(root: Path, expected_keys: set[str]) -> dict[str, tuple[str, dict]]:
    rows = _rows(root)
    assert set(rows) == expected_keys
    for key, (kind, values) in rows.items():
        expected_kind, expected = ENCODED[key]
        assert kind == expected_kind, key
        if key == "w_000.mov":  # video with an AAC track: the audio fields exist as well
            assert values["audio_sample_rate"] == 16000 and values["audio_channels"] == 1
            assert 0.9 < values["audio_duration"] < 1.2 and values["audio_num_samples"] > 15000
            values = {k: v for k, v in values.items() if k.startswith("video_")}
        _assert_close(values, expected, key)
    return rows


# --------------------------------------------------------------------------------------------
# Filters and sniffing
# --------------------------------------------------------------------------------------------


def test_sniff_recognises_real_media(media: dict[str, bytes]) -> None:
    assert sniff_media_type(media["jpg"]) == IMAGE
    assert sniff_media_type(media["png"]) == IMAGE
    for name in ("mp4", "h264", "avmp4", "wav", "flac"):
        assert sniff_media_type(media[name]) == AV, name
    for fmt in ("GIF", "WEBP", "BMP", "TIFF"):
        out = io.BytesIO()
        from PIL import Image

        Image.new("RGB", (3, 2)).save(out, format=fmt)
        assert sniff_media_type(out.getvalue()) == IMAGE, fmt


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"\x1a\x45\xdf\xa3" + b"\0" * 28, AV),  # WebM / Matroska
        (b"\0\0\0\x14ftypqt  " + b"\0" * 20, AV),  # MOV
        (b"\0\0\0\x18ftypheic" + b"\0" * 20, IMAGE),  # HEIF still image
        (b"OggS\0\x02" + b"\0" * 26, AV),
        (b"ID3\x04\0\0" + b"\0" * 26, AV),
        (b"\xff\xfb\x90\x64" + b"\0" * 28, AV),  # MP3 frame sync
        (b"RIFF\x24\0\0\0WAVEfmt " + b"\0" * 16, AV),
        (b'{"json": true}', None),
        (b"plain text", None),
        (b"", None),
    ],
)
def test_sniff_magic_numbers(head: bytes, expected: str | None) -> None:
    assert sniff_media_type(head) == expected


def test_filter_rules() -> None:
    ext = MediaFilter.by_extension()
    assert ext.wants("a/b.JPG") and ext.wants("x.detail.webm") and not ext.wants("x.json")
    assert ext.media_type("a.Png", b"") == IMAGE and ext.media_type("a.txt", b"\x89PNG\r\n\x1a\n") is None
    glob = MediaFilter.by_glob(" *.jpg , *.WAV,")
    assert glob.patterns == ("*.jpg", "*.WAV") and glob.patterns_text == "*.jpg,*.WAV"
    assert glob.wants("d/k.jpg") and not glob.wants("k.JPG") and not glob.wants("k.wav") and not glob.wants("k.WAV")
    assert MediaFilter.by_glob("*.bin").media_type("k.bin", b"OggS\0\x02") == AV
    assert MediaFilter.by_glob("*.bin").media_type("k.mp4", b"OggS\0\x02") is None
    header = MediaFilter.by_header()
    assert header.wants("k.txt") and header.media_type("k.bin", b"fLaC\0\0\0\x22") == AV
    assert header.media_type("k.mp4", b"unknown bytes") == AV  # falls back to the extension
    assert header.media_type("k.txt", b"unknown bytes") is None
    assert MediaFilter.from_row("GLOB", "*.jpg,*.wav") == MediaFilter.by_glob("*.jpg,*.wav")
    assert MediaFilter.from_row("EXTENSION", "") == ext


def test_options_are_mutually_exclusive() -> None:
    assert MediaFilter.from_options() is None
    assert MediaFilter.from_options(extension=True).strategy is MediaStrategy.EXTENSION
    with pytest.raises(ConfigError, match="mutually exclusive") as info:
        MediaFilter.from_options(glob="*.jpg", header=True)
    assert "--media-metadata-by-glob, --media-metadata-by-header" in str(info.value)
    with pytest.raises(ConfigError, match="empty glob"):
        MediaFilter.from_options(glob=" , ")


def test_missing_pyav_names_the_extra(monkeypatch: pytest.MonkeyPatch, media: dict[str, bytes]) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # makes ``import av`` raise ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install megatron-energon-lite\[av\]"):
        av_metadata(media["wav"])


# --------------------------------------------------------------------------------------------
# prepare with each strategy
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("media_filter", "expected", "stored", "skipped"),
    [
        (MediaFilter.by_extension(), BY_EXTENSION, ("EXTENSION", ""), 1),
        (MediaFilter.by_glob(GLOB), BY_GLOB, ("GLOB", GLOB), 1),
        (MediaFilter.by_header(), BY_HEADER, ("HEADER", ""), 1),
    ],
    ids=["extension", "glob", "header"],
)
def test_prepare_stores_metadata(raw: Path, media_filter: MediaFilter, expected: set[str], stored: tuple, skipped: int, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="megatron_energon_lite"):
        result = prepare_dataset(raw, split_ratio=(1, 0, 0), num_workers=2, progress=False, media_filter=media_filter)
    _check_rows(raw, expected)
    assert result.media_entries == len(expected)
    [(filter_id, strategy, patterns, created)] = _filters(raw)
    assert (filter_id, strategy, patterns) == (1, *stored)
    assert len(created) == 19 and created[4] == "-" and created[10] == " "  # SQLite CURRENT_TIMESTAMP
    assert read_media_filter(raw / ".nv-meta/index.sqlite") == media_filter
    # The broken "sub/w_001.jpg" is skipped (as Energon does) with a warning naming it.
    assert result.media_skipped == skipped
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == skipped
    assert "part 'jpg' of sample 'sub/w_001'" in warnings[0] and "shards/media-1.tar" in warnings[0]
    assert read_media_metadata(raw, "v_000.jpg") == ENCODED["v_000.jpg"][1]
    assert read_media_metadata(raw, "v_000.txt") is None


def test_no_filter_writes_no_media_tables(raw: Path) -> None:
    prepare_dataset(raw, split_ratio=(1, 0, 0), num_workers=1, progress=False)
    db = sqlite3.connect(raw / ".nv-meta/index.sqlite")
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    db.close()
    assert "media_metadata" not in tables and "media_filters" not in tables
    assert read_media_metadata(raw, "v_000.jpg") is None


def test_reprepare_reuses_or_reextracts(raw: Path, media: dict[str, bytes]) -> None:
    kwargs = dict(split_ratio=(1, 0, 0), num_workers=1, progress=False, force_overwrite=True)
    first = prepare_dataset(raw, media_filter=MediaFilter.by_extension(), **kwargs)
    assert len(first.scanned) == 2
    rows = _rows(raw)

    same = prepare_dataset(raw, media_filter=MediaFilter.by_extension(), **kwargs)
    assert same.scanned == [] and _rows(raw) == rows and same.media_entries == len(rows)

    kept = prepare_dataset(raw, **kwargs)  # no filter given: the index's filter is kept
    assert kept.scanned == [] and kept.media_filter == MediaFilter.by_extension() and _rows(raw) == rows

    other = prepare_dataset(raw, media_filter=MediaFilter.by_glob(GLOB), **kwargs)
    assert len(other.scanned) == 2 and set(_rows(raw)) == BY_GLOB
    assert [f[1:3] for f in _filters(raw)] == [("GLOB", GLOB)]

    # One shard changes: only it is scanned again, the other's rows are copied.
    prepare_dataset(raw, media_filter=MediaFilter.by_extension(), **kwargs)
    write_tar(raw / "shards/media-1.tar", [("w_000", {"wav": make_audio(rate=8000, seconds=0.25)})])
    changed = prepare_dataset(raw, media_filter=MediaFilter.by_extension(), **kwargs)
    assert changed.scanned == ["shards/media-1.tar"] and changed.reused == ["shards/media-0.tar"]
    now = _rows(raw)
    assert set(now) == {k for k in BY_EXTENSION if k.startswith("v_")} | {"w_000.wav"}
    _assert_close(now["w_000.wav"][1], _audio(8000, 1, 2000), "w_000.wav")
    assert all(now[k] == rows[k] for k in now if k.startswith("v_"))


def test_cli_flags_and_info(raw: Path) -> None:
    runner = CliRunner()
    base = ["prepare", str(raw), "--non-interactive", "--no-progress", "--split-ratio", "1,0,0", "--sample-type", "CrudeWebdataset"]
    both = runner.invoke(cli, [*base, "--media-metadata-by-extension", "--media-metadata-by-header"])
    assert both.exit_code == 1 and "mutually exclusive" in both.output
    assert not (raw / ".nv-meta/index.sqlite").exists()
    result = runner.invoke(cli, [*base, "--media-metadata-by-glob", GLOB], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Stored media metadata of 3 entries (by glob), 1 media parts could not be parsed" in result.output
    info = runner.invoke(cli, ["info", str(raw)], catch_exceptions=False)
    assert info.exit_code == 0, info.output
    assert "media:       3 entries with metadata, av: 1, image: 2" in info.output


def test_header_false_positive_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Text that starts like a BMP: no row and a warning (Energon 7.4.1 drops the whole shard)."""
    root = tmp_path / "ds"
    write_tar(root / "a.tar", [("k0", {"txt": b"BM is not a bitmap header", "png": make_png(3, 2, seed=0)})])
    with caplog.at_level(logging.WARNING, logger="megatron_energon_lite"):
        result = prepare_dataset(root, split_ratio=(1, 0, 0), num_workers=1, progress=False, media_filter=MediaFilter.by_header())
    assert set(_rows(root)) == {"k0.png"} and result.media_skipped == 1
    assert "part 'txt' of sample 'k0'" in caplog.text and "OSError" in caplog.text


# --------------------------------------------------------------------------------------------
# Energon as the oracle
# --------------------------------------------------------------------------------------------

_ENERGON_SCRIPT = Path(sys.executable).with_name("energon")
ENERGON_CMD = (
    [str(_ENERGON_SCRIPT)]
    if _ENERGON_SCRIPT.is_file()
    else [sys.executable, "-c", "import sys; from megatron.energon.cli.main import main; sys.exit(main())"]
)
LITE_CMD = [sys.executable, "-m", "megatron_energon_lite.cli.main"]
STRATEGY_FLAGS = {
    "extension": ["--media-metadata-by-extension"],
    "glob": ["--media-metadata-by-glob", GLOB],
    "header": ["--media-metadata-by-header"],
}


def _energon_available() -> bool:
    try:
        import megatron.energon  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "no oracle"
        return False
    return True


energon_only = pytest.mark.skipif(not _energon_available(), reason="megatron.energon does not import")


@dataclass
class Prepared:
    lite: Path
    energon: Path
    energon_output: str
    energon_ok: bool


@pytest.fixture(scope="module")
def both_prepared(tmp_path_factory: pytest.TempPathFactory, media: dict[str, bytes]) -> dict[str, Prepared]:
    """Each strategy, prepared once by Energon's CLI and once by ours (all runs concurrent)."""
    base = tmp_path_factory.mktemp("media_compat")
    raw = base / "raw"
    build_raw(raw, media)
    flags = ["prepare", "--non-interactive", "--no-progress", "--num-workers", "1", "--split-ratio", "1,0,0", "--sample-type", "CrudeWebdataset"]
    jobs = []
    for strategy, extra in STRATEGY_FLAGS.items():
        for tool, command in (("energon", ENERGON_CMD), ("lite", LITE_CMD)):
            copy = base / tool / strategy
            shutil.copytree(raw, copy)
            cmd = [*command, *flags, *extra, str(copy)]
            jobs.append((strategy, tool, copy, cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=base)))
    found: dict[str, dict] = {}
    failures = []
    for strategy, tool, copy, cmd, process in jobs:
        output = process.communicate(timeout=180)[0].decode(errors="replace")
        found.setdefault(strategy, {})[tool] = (copy, output, process.returncode == 0)
        if tool == "lite" and process.returncode != 0:
            failures.append(f"$ {' '.join(cmd)}\n{output}")
    assert not failures, "\n\n".join(failures)
    return {
        strategy: Prepared(runs["lite"][0], runs["energon"][0], runs["energon"][1], runs["energon"][2])
        for strategy, runs in found.items()
    }


@pytest.mark.energon
@energon_only
@pytest.mark.parametrize("strategy", ["extension", "header"])
def test_rows_match_energon(both_prepared: dict[str, Prepared], strategy: str) -> None:
    prepared = both_prepared[strategy]
    assert prepared.energon_ok, prepared.energon_output
    ours_rows, their_rows = _rows(prepared.lite), _rows(prepared.energon)
    assert set(ours_rows) == set(their_rows)
    for key, (kind, values) in their_rows.items():
        assert ours_rows[key][0] == kind, key
        _assert_close(ours_rows[key][1], values, key)
    assert [f[1:3] for f in _filters(prepared.lite)] == [f[1:3] for f in _filters(prepared.energon)]
    _check_rows(prepared.energon, {"extension": BY_EXTENSION, "header": BY_HEADER}[strategy])


@pytest.mark.energon
@energon_only
def test_energon_glob_strategy_fails(both_prepared: dict[str, Prepared]) -> None:
    """Energon 7.4.1 cannot prepare with --media-metadata-by-glob when a part matches; we can."""
    prepared = both_prepared["glob"]
    assert not prepared.energon_ok and "Unexpected media filter strategy" in prepared.energon_output
    assert set(_rows(prepared.lite)) == BY_GLOB
    assert [f[1:3] for f in _filters(prepared.lite)] == [("GLOB", GLOB)]


@pytest.mark.energon
@energon_only
def test_energon_reads_our_metadata(both_prepared: dict[str, Prepared]) -> None:
    from megatron.energon.cache.file_store import WebdatasetFileStore
    from megatron.energon.epathlib import EPath

    ours = both_prepared["header"].lite
    rows = _rows(ours)
    store = WebdatasetFileStore(EPath(ours))
    for key in BY_HEADER:
        metadata = store.get_media_metadata(key)
        assert type(metadata).__name__ == ("ImageMetadata" if ENCODED[key][0] == IMAGE else "AVMetadata")
        _assert_close(metadata.to_dict(), rows[key][1], key)
    with pytest.raises(KeyError):
        store.get_media_metadata("v_000.txt")
