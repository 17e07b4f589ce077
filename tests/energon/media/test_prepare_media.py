"""``prepare-media``: media metadata of a plain folder, fresh and incremental, against Energon."""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import sqlite3
import wave
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import make_jpeg, write_tar
from PIL import Image

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.errors import (
    ConfigError,
    DatasetError,
    EmptyDatasetError,
    MissingDependencyError,
)
from megatron_energon_lite.format.media_metadata import MediaFilter, read_media_metadata
from megatron_energon_lite.energon.media import filesystem_prepare
from megatron_energon_lite.energon.media.filesystem_prepare import (
    prepare_filesystem_dataset,
    prepare_media_folder,
)

EXTENSION = MediaFilter.by_extension()


def _png(path: Path, size: tuple[int, int], mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, 0).save(path, format="PNG")


def _mp4(path: Path, frames: int = 5) -> None:
    av = pytest.importorskip("av")
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=5)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        for _ in range(frames):
            frame = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _wav(path: Path, samples: int = 800) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * samples)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Five files with media extensions (one broken), and one that is not media."""
    root = tmp_path / "media"
    _png(root / "a.png", (6, 4))
    (root / "sub").mkdir()
    (root / "sub/b.jpg").write_bytes(make_jpeg(8, 5, seed=1))
    _wav(root / "sub/s.wav")
    _mp4(root / "v.mp4")
    (root / "bad.png").write_bytes(b"not a png")
    (root / "readme.txt").write_text("not media")
    return root


def _rows(root: Path) -> dict[str, tuple[str, dict]]:
    db = sqlite3.connect(f"file:{root / '.nv-meta/index.sqlite'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT entry_key, metadata_type, metadata_json FROM media_metadata").fetchall()
    finally:
        db.close()
    return {key: (kind, json.loads(text)) for key, kind, text in rows}


def _filters(root: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(f"file:{root / '.nv-meta/index.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT strategy, patterns FROM media_filters ORDER BY filter_id").fetchall()
    finally:
        db.close()


def _prepare(root: Path, media_filter: MediaFilter = EXTENSION, workers: int = 2):
    return prepare_media_folder(root, media_filter, progress=False, num_workers=workers)


def _bump(path: Path) -> None:
    """A new mtime for sure, whatever the file system's time resolution."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def test_fresh_run(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        result = _prepare(folder)
    assert result.files == 5  # readme.txt has no media extension
    assert result.scanned == ["a.png", "bad.png", "sub/b.jpg", "sub/s.wav", "v.mp4"]
    assert result.reused == [] and result.removed == []
    assert result.entries == 4
    assert result.skipped == ["bad.png"] and len(result.failures) == 1
    assert str(folder / "bad.png") in caplog.text

    rows = _rows(folder)
    assert rows["a.png"] == ("image", {"width": 6, "height": 4, "format": "PNG", "mode": "RGB"})
    assert rows["sub/b.jpg"] == ("image", {"width": 8, "height": 5, "format": "JPEG", "mode": "RGB"})
    assert rows["sub/s.wav"] == ("av", {"audio_duration": 0.1, "audio_channels": 1, "audio_sample_rate": 8000, "audio_num_samples": 800})
    kind, video = rows["v.mp4"]
    assert kind == "av" and video["video_width"] == 16 and video["video_height"] == 16 and video["video_num_frames"] == 5
    assert set(rows) == {"a.png", "sub/b.jpg", "sub/s.wav", "v.mp4"}
    assert _filters(folder) == [("EXTENSION", "")]
    assert read_media_metadata(folder, "a.png") == rows["a.png"][1]
    # Only the index and our state file; no temporary left over.
    assert sorted(p.name for p in (folder / ".nv-meta").iterdir()) == [".lite-prepare-media.json", "index.sqlite"]


def test_incremental_rerun_reads_only_changes(folder: Path) -> None:
    _prepare(folder)
    _png(folder / "a.png", (10, 7))  # changed
    _bump(folder / "a.png")
    (folder / "sub/b.jpg").unlink()  # removed
    _png(folder / "sub/c.png", (3, 2), mode="L")  # added

    result = _prepare(folder)
    assert result.scanned == ["a.png", "sub/c.png"]
    assert result.reused == ["bad.png", "sub/s.wav", "v.mp4"]
    assert result.removed == ["sub/b.jpg"]
    assert result.entries == 4
    assert result.skipped == ["bad.png"] and result.failures == []  # remembered, not read again
    rows = _rows(folder)
    assert set(rows) == {"a.png", "sub/c.png", "sub/s.wav", "v.mp4"}
    assert rows["a.png"][1]["width"] == 10
    assert rows["sub/c.png"] == ("image", {"width": 3, "height": 2, "format": "PNG", "mode": "L"})

    again = _prepare(folder, workers=1)
    assert again.scanned == [] and len(again.reused) == 5 and again.entries == 4
    assert _rows(folder) == rows


def test_other_filter_or_foreign_index_reads_everything(folder: Path) -> None:
    _prepare(folder)
    by_header = _prepare(folder, MediaFilter.by_header())
    assert by_header.reused == [] and len(by_header.scanned) == 6  # every file is a candidate
    assert _filters(folder) == [("HEADER", "")]

    # An index changed by another tool (e.g. energon) is not trusted: everything is read again.
    db = sqlite3.connect(folder / ".nv-meta/index.sqlite")
    db.execute("INSERT INTO media_metadata VALUES ('gone.png', 'image', '{}')")
    db.commit()
    db.close()
    _bump(folder / ".nv-meta/index.sqlite")
    result = _prepare(folder, MediaFilter.by_header())
    assert result.reused == [] and "gone.png" not in _rows(folder)


def test_glob_and_header(folder: Path) -> None:
    _png(folder / "noext", (2, 2))  # an image without extension: only the header tells
    by_glob = _prepare(folder, MediaFilter.by_glob("*.png,sub/*"))
    assert set(_rows(folder)) == {"a.png", "sub/b.jpg", "sub/s.wav"}
    assert by_glob.skipped == ["bad.png"]
    assert _filters(folder) == [("GLOB", "*.png,sub/*")]

    _prepare(folder, MediaFilter.by_header())
    assert set(_rows(folder)) == {"a.png", "noext", "sub/b.jpg", "sub/s.wav", "v.mp4"}


def test_symlinks_and_meta_folders(folder: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.png"
    _png(outside, (5, 5))
    (folder / "out.png").symlink_to(outside)
    (folder / "dangling.png").symlink_to(folder / "nothing.png")
    (folder / "in.png").symlink_to("a.png")
    (folder / "sub/loop").symlink_to(folder, target_is_directory=True)  # a cycle: not walked again
    _png(folder / ".nv-meta/x.png", (1, 1))
    _png(folder / "sub/.nv-meta/y.png", (1, 1))

    result = _prepare(folder)
    assert "in.png" in _rows(folder) and _rows(folder)["in.png"] == _rows(folder)["a.png"]
    assert not {"out.png", "dangling.png", ".nv-meta/x.png", "sub/.nv-meta/y.png"} & set(_rows(folder))
    assert not any(key.startswith("sub/loop/") for key in _rows(folder))
    assert len(result.ignored) == 3
    assert any("sub/loop" in m and "not walked again" in m for m in result.ignored)
    assert any("out.png" in m and "outside" in m for m in result.ignored)
    assert any("dangling.png" in m for m in result.ignored)


def test_bad_input(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="folder not found") as missing:
        _prepare(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(missing.value) and "fix:" in str(missing.value)

    with pytest.raises(DatasetError, match="takes a folder"):
        _prepare(folder / "a.png")

    with pytest.raises(ConfigError, match="no media filter chosen"):
        prepare_media_folder(folder, None, progress=False)

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    with pytest.raises(EmptyDatasetError, match="no media files found"):
        _prepare(empty)
    assert not (empty / ".nv-meta").exists()

    tars = tmp_path / "tars"  # a tar dataset's index is never replaced by a folder index
    write_tar(tars / "p0.tar", [("k0", {"jpg": make_jpeg(4, 4, seed=0)})])
    (tars / ".nv-meta").mkdir()
    db = sqlite3.connect(tars / ".nv-meta/index.sqlite")
    db.execute("CREATE TABLE samples (tar_file_id INTEGER)")
    db.commit()
    db.close()
    before = (tars / ".nv-meta/index.sqlite").read_bytes()
    _png(tars / "x.png", (1, 1))
    with pytest.raises(DatasetError, match="more than media metadata"):
        _prepare(tars)
    assert (tars / ".nv-meta/index.sqlite").read_bytes() == before


def test_failed_run_keeps_previous_index(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _prepare(folder)
    index = folder / ".nv-meta/index.sqlite"
    before = index.read_bytes()
    _bump(folder / "v.mp4")

    def no_av(media_type, path):
        raise MissingDependencyError("PyAV is not installed")

    monkeypatch.setattr(filesystem_prepare, "extract_metadata_of_file", no_av)
    with pytest.raises(MissingDependencyError):
        _prepare(folder, workers=1)
    assert index.read_bytes() == before
    assert sorted(p.name for p in (folder / ".nv-meta").iterdir()) == [".lite-prepare-media.json", "index.sqlite"]


def test_energon_function_signature(folder: Path) -> None:
    assert prepare_filesystem_dataset(folder, EXTENSION, progress=False, workers=2) == 4
    ours = list(inspect.signature(prepare_filesystem_dataset).parameters)
    assert ours == ["root_path", "media_filter", "progress", "workers", "index_sqlite_tmp_path"]


@pytest.mark.energon
def test_energon_reads_ours(folder: Path) -> None:
    pytest.importorskip("megatron.energon")
    from megatron.energon.cache.file_store import SystemFileStore
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.metadata import (
        EnergonDatasetType,
        get_dataset_type,
    )

    _prepare(folder)
    assert get_dataset_type(EPath(folder)) == EnergonDatasetType.FILESYSTEM
    store = SystemFileStore(folder)
    for key, (kind, values) in _rows(folder).items():
        metadata = store.get_media_metadata(key)
        assert metadata.metadata_type.value == kind and metadata.to_dict() == values
    with pytest.raises(KeyError):
        store.get_media_metadata("bad.png")


@pytest.mark.energon
def test_ours_reads_energon(folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("megatron.energon")
    from megatron.energon.epathlib import EPath
    from megatron.energon.media.extractor import MediaFilterConfig
    from megatron.energon.media.filesystem_prepare import (
        prepare_filesystem_dataset as energon_prepare,
    )

    ours = tmp_path / "ours"
    shutil.copytree(folder, ours)
    _prepare(ours)
    energon_filter = MediaFilterConfig.parse(None, False, True)
    assert energon_prepare(EPath(folder), energon_filter, progress=False, workers=2) == 4
    assert _rows(folder) == _rows(ours)  # the same rows, byte for byte in JSON
    assert _filters(folder) == _filters(ours)
    for key, (_, values) in _rows(folder).items():
        assert read_media_metadata(folder, key) == values

    # A re-run of ours on Energon's index: no state of ours, so every file is read; the row of
    # a removed file goes (Energon keeps it).
    (folder / "sub/b.jpg").unlink()
    result = _prepare(folder)
    assert result.reused == [] and result.entries == 3
    assert set(_rows(folder)) == {"a.png", "sub/s.wav", "v.mp4"}


def _cli(*args: str):
    return CliRunner().invoke(cli, ["prepare-media", *args], catch_exceptions=False)


def test_cli(folder: Path, tmp_path: Path) -> None:
    first = _cli(str(folder), "--media-metadata-by-extension", "--no-progress", "--num-workers", "2")
    assert first.exit_code == 0, first.output
    assert "Considered 5 files (5 read, 0 unchanged)" in first.output
    assert "Stored media metadata of 4 entries (by extension)" in first.output
    assert "1 file could not be decoded" in first.output
    assert "Done. Stored metadata for 4 files." in first.output

    (folder / "a.png").unlink()
    second = _cli(str(folder), "--media-metadata-by-extension", "--no-progress")
    assert second.exit_code == 0, second.output
    assert "Considered 4 files (0 read, 4 unchanged, 1 file removed since the last run)" in second.output

    none = _cli(str(folder), "--no-progress")
    assert none.exit_code == 1 and "no media filter chosen" in none.output
    assert "--media-metadata-by-extension" in none.output  # names the filter of the existing index
    both = _cli(str(folder), "--media-metadata-by-extension", "--media-metadata-by-header")
    assert both.exit_code == 1 and "mutually exclusive" in both.output
    missing = _cli(str(tmp_path / "nope"), "--media-metadata-by-extension")
    assert missing.exit_code == 1 and "folder not found" in missing.output


def test_cli_on_tar_dataset(tmp_path: Path) -> None:
    root = tmp_path / "tars"
    write_tar(root / "p0.tar", [(f"k{i}", {"jpg": make_jpeg(8, 6, seed=i), "txt": b"x"}) for i in range(3)])
    prepared = CliRunner().invoke(cli, ["prepare", str(root), "--non-interactive", "--split-ratio", "1,0,0", "--no-progress"])
    assert prepared.exit_code == 0, prepared.output
    result = _cli(str(root), "--media-metadata-by-extension", "--no-progress", "--num-workers", "1")
    assert result.exit_code == 0, result.output
    assert "Done. Stored metadata for 3 files." in result.output
    assert read_media_metadata(root, "k1.jpg") == {"width": 8, "height": 6, "format": "JPEG", "mode": "RGB"}
