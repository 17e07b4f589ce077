"""``prepare-media`` on a folder on S3 (moto on 127.0.0.1): the same rows as a local run on the
same files, the same incremental behaviour (stamped by size and ETag), bounded ranged reads,
503s survived, and a storage failure that stops the run instead of being remembered."""

from __future__ import annotations

import io
import json
import sqlite3
import tempfile
import wave
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from energon_lite_dev.s3server import FaultProxy
from energon_lite_dev.synthetic import make_jpeg
from PIL import Image

from megatron_energon_lite.cache import SystemFileStore
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.errors import ConfigError, DatasetError, StorageError
from megatron_energon_lite.format.media_metadata import MediaFilter
from megatron_energon_lite.energon.media import filesystem_prepare
from megatron_energon_lite.energon.media.filesystem_prepare import (
    prepare_filesystem_dataset,
    prepare_media_folder,
)
from megatron_energon_lite.storage import RemotePath, configure_storage

EXTENSION = MediaFilter.by_extension()
HEADER = MediaFilter.by_header()
GLOB = MediaFilter.by_glob("*.png,sub/*")

try:
    import av  # noqa: F401

    HAVE_AV = True
except ImportError:  # pragma: no cover - the av extra is optional
    HAVE_AV = False


def _png(size: tuple[int, int], mode: str = "RGB", value: int = 0) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, value).save(out, format="PNG")
    return out.getvalue()


def _wav(samples: int = 800, seed: int = 0) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(np.random.default_rng(seed).integers(-1000, 1000, samples, dtype=np.int16).tobytes())
    return out.getvalue()


def _write(root: Path, rel: str, data: bytes) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)


def _make_folder(root: Path) -> None:
    _write(root, "a.png", _png((17, 9)))
    _write(root, ".hidden.png", _png((3, 5), "L"))
    _write(root, "sub/b.JPG", make_jpeg(20, 10, seed=1))
    _write(root, "sub/deep/c.png", _png((4, 6), "RGBA"))
    _write(root, "sub/sound.wav", _wav())
    _write(root, "broken.jpg", b"\xff\xd8 not really a jpeg")
    _write(root, "notes.txt", b"not media")
    _write(root, "sub/.nv-meta/skipped.png", _png((2, 2)))  # never read, locally or remotely
    if HAVE_AV:
        from energon_lite_dev.synthetic import make_video

        _write(root, "clip.mp4", make_video(frames=12, fps=4, size=(32, 24)))


@pytest.fixture
def media(s3_server, s3_url, tmp_path, monkeypatch):
    """The same media folder locally and on S3 (uploaded before any local run)."""
    monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ENERGON_LITE_BACKOFF_S", "0.001")
    local = tmp_path / "local"
    _make_folder(local)
    s3_server.upload_dir(local, s3_url)
    configure_storage("s3", storage_options=s3_server.storage_options())
    yield local, s3_url
    configure_storage("s3", storage_options={})


def _query(index: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


_ROWS = "SELECT entry_key, metadata_type, metadata_json FROM media_metadata ORDER BY entry_key"
_FILTERS = "SELECT filter_id, strategy, patterns FROM media_filters ORDER BY filter_id"


def _local_rows(local: Path) -> list[tuple]:
    return _query(local / ".nv-meta/index.sqlite", _ROWS)


def _remote_index(s3_server, url: str, tmp_path: Path) -> Path:
    """A fresh download of the remote index.sqlite (not the loader's cache)."""
    fs = s3_server.filesystem()
    copy = Path(tempfile.mkdtemp(dir=tmp_path)) / "index.sqlite"
    copy.write_bytes(fs.cat_file(f"{url}/.nv-meta/index.sqlite"))
    return copy


def _remote_rows(s3_server, url: str, tmp_path: Path) -> list[tuple]:
    return _query(_remote_index(s3_server, url, tmp_path), _ROWS)


def _remote_keys(s3_server, url: str) -> list[str]:
    fs = s3_server.filesystem()
    return sorted(name[len(url.split("://", 1)[1]) + 1 :] for name in fs.find(url))


@pytest.mark.parametrize(
    ("media_filter", "workers"),
    [(EXTENSION, 1), (EXTENSION, 2), (HEADER, 2), (GLOB, 1)],
    ids=["extension-1", "extension-2", "header-2", "glob-1"],
)
def test_remote_rows_equal_local_rows(media, s3_server, tmp_path, media_filter, workers) -> None:
    local, url = media
    here = prepare_media_folder(local, media_filter, progress=False, num_workers=1)
    there = prepare_media_folder(url, media_filter, progress=False, num_workers=workers)
    expected = _local_rows(local)
    assert len(expected) >= 4  # the comparison is not vacuous
    remote_index = _remote_index(s3_server, url, tmp_path)
    assert _query(remote_index, _ROWS) == expected
    assert _query(remote_index, _FILTERS)[0][1:] == _query(local / ".nv-meta/index.sqlite", _FILTERS)[0][1:]
    assert there.files == here.files and there.scanned == here.scanned and there.entries == here.entries
    assert there.skipped == here.skipped and len(there.failures) == len(here.failures)
    assert ("broken.jpg" in there.skipped) == media_filter.wants("broken.jpg")
    assert not any(key.startswith("sub/.nv-meta") for key, *_ in expected)
    assert str(there.index) == f"{url}/.nv-meta/index.sqlite"
    # On S3 only the index and the state file were added; nothing of a temporary build.
    assert [k for k in _remote_keys(s3_server, url) if k.startswith(".nv-meta/")] == [".nv-meta/.lite-prepare-media.json", ".nv-meta/index.sqlite"]
    state = json.loads(s3_server.filesystem().cat_file(f"{url}/.nv-meta/.lite-prepare-media.json"))
    size, version, outcome = state["files"]["a.png"]
    assert size == (local / "a.png").stat().st_size and isinstance(version, str) and version and outcome == "row"


def test_rerun_reads_only_what_changed_on_s3(media, s3_server, tmp_path) -> None:
    local, url = media
    # By header every file is a candidate, so a second run also shows that nothing under
    # .nv-meta (the index and state just written) is taken for a media file.
    first = prepare_media_folder(url, HEADER, progress=False, num_workers=2)
    assert first.scanned and "a.png" in first.scanned and "notes.txt" in first.scanned
    rows = _remote_rows(s3_server, url, tmp_path)

    again = prepare_media_folder(url, HEADER, progress=False, num_workers=2)
    assert again.scanned == [] and again.reused == sorted(first.scanned) and again.files == first.files
    assert again.skipped == first.skipped and again.failures == []  # remembered, not read again
    assert _remote_rows(s3_server, url, tmp_path) == rows

    # A changed file (new size): read again, its row changes, to what a local run finds.
    _write(local, "a.png", _png((31, 8)))
    s3_server.put_bytes(f"{url}/a.png", (local / "a.png").read_bytes())
    changed = prepare_media_folder(url, HEADER, progress=False, num_workers=2)
    assert changed.scanned == ["a.png"] and changed.removed == []
    new_rows = _remote_rows(s3_server, url, tmp_path)
    assert new_rows != rows
    assert [r for r in new_rows if r[0] != "a.png"] == [r for r in rows if r[0] != "a.png"]
    prepare_media_folder(local, HEADER, progress=False, num_workers=1)
    assert new_rows == _local_rows(local)
    assert json.loads({k: j for k, _, j in new_rows}["a.png"])["width"] == 31

    # Same size, other bytes: only the ETag tells, and it is enough.
    replacement = _wav(seed=1)
    assert len(replacement) == (local / "sub/sound.wav").stat().st_size
    s3_server.put_bytes(f"{url}/sub/sound.wav", replacement)
    same_size = prepare_media_folder(url, HEADER, progress=False, num_workers=1)
    assert same_size.scanned == ["sub/sound.wav"]

    # A removed file: nothing read, its row dropped.
    s3_server.filesystem().rm_file(f"{url}/sub/b.JPG")
    removed = prepare_media_folder(url, HEADER, progress=False, num_workers=2)
    assert removed.scanned == [] and removed.removed == ["sub/b.JPG"]
    final = _remote_rows(s3_server, url, tmp_path)
    assert "sub/b.JPG" not in {r[0] for r in final} and "sub/b.JPG" in {r[0] for r in new_rows}
    assert len(final) == len(new_rows) - 1


def test_files_are_copied_in_bounded_ranged_reads(media, monkeypatch) -> None:
    local, url = media
    piece = 1000
    monkeypatch.setattr(filesystem_prepare, "_FETCH_PIECE", piece)
    calls: list[tuple[str, int, int]] = []
    real_fetch = filesystem_prepare.fetch_range

    def spy(path, start, end):
        calls.append((path.url, start, end))
        return real_fetch(path, start, end)

    monkeypatch.setattr(filesystem_prepare, "fetch_range", spy)
    prepare_media_folder(url, HEADER, progress=False, num_workers=1)  # in this process: the spy sees every read
    by_file: dict[str, list[tuple[int, int]]] = {}
    for file_url, start, end in calls:
        by_file.setdefault(file_url[len(url) + 1 :], []).append((start, end))
    assert "sub/.nv-meta/skipped.png" not in by_file and not any(name.startswith(".nv-meta") for name in by_file)
    for name, ranges in by_file.items():
        size = (local / name).stat().st_size
        assert ranges[0] == (0, min(64, size)), name  # the header first
        assert all(end - start <= piece for start, end in ranges), name
        if name != "notes.txt":  # media: the rest follows, contiguous, up to the end
            assert [r[0] for r in ranges[1:]] == [r[1] for r in ranges[:-1]] and ranges[-1][1] == size, name
        else:
            assert len(ranges) == 1, name
    big = max(by_file, key=lambda n: (local / n).stat().st_size)
    assert len(by_file[big]) > 2


def test_503s_on_ranged_gets_change_nothing(media, s3_server, fault_proxy, monkeypatch, tmp_path) -> None:
    local, url = media
    monkeypatch.setenv("ENERGON_LITE_MAX_ATTEMPTS", "30")
    monkeypatch.setattr(filesystem_prepare, "_FETCH_PIECE", 1500)  # several GETs per file (forked workers inherit it)
    prepare_media_folder(local, EXTENSION, progress=False, num_workers=1)
    proxy = fault_proxy(error_rate=0.3, seed=3, faults_only_for=FaultProxy.ranged_gets)
    options = s3_server.storage_options(proxy.endpoint_url, config_kwargs={"proxies": {}, "retries": {"total_max_attempts": 1}})
    result = prepare_media_folder(RemotePath(url, options), EXTENSION, progress=False, num_workers=2)
    assert proxy.stats["errors_injected"] > 0, proxy.stats
    assert result.skipped == ["broken.jpg"]  # no file taken for undecodable because of a 503
    assert _remote_rows(s3_server, url, tmp_path) == _local_rows(local)


def test_a_storage_failure_stops_the_run_and_is_not_remembered(media, s3_server, fault_proxy, monkeypatch, tmp_path) -> None:
    _, url = media
    prepare_media_folder(url, EXTENSION, progress=False, num_workers=1)
    before = _remote_rows(s3_server, url, tmp_path)
    s3_server.put_bytes(f"{url}/a.png", _png((5, 5)))
    monkeypatch.setenv("ENERGON_LITE_MAX_ATTEMPTS", "2")
    target = "/" + url.split("://", 1)[1] + "/a.png"
    proxy = fault_proxy(error_rate=1.0, faults_only_for=lambda method, path, headers: method == "GET" and path.split("?")[0] == target)
    options = s3_server.storage_options(proxy.endpoint_url, config_kwargs={"proxies": {}, "retries": {"total_max_attempts": 1}})
    with pytest.raises(StorageError, match="a.png"):
        prepare_media_folder(RemotePath(url, options), EXTENSION, progress=False, num_workers=2)
    assert proxy.stats["errors_injected"] > 0
    assert _remote_rows(s3_server, url, tmp_path) == before  # the previous index stands
    after = prepare_media_folder(url, EXTENSION, progress=False, num_workers=1)
    assert after.scanned == ["a.png"] and after.skipped == ["broken.jpg"]
    assert json.loads({k: j for k, _, j in _remote_rows(s3_server, url, tmp_path)}["a.png"])["width"] == 5


def test_cli_prepare_media_on_s3(media, s3_server, tmp_path, monkeypatch) -> None:
    local, url = media
    configure_storage("s3", storage_options={})
    # The CLI reads endpoint and credentials the AWS way, from the environment.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    expected = prepare_media_folder(local, EXTENSION, progress=False, num_workers=1)
    args = ["prepare-media", url, "--media-metadata-by-extension", "--no-progress", "--num-workers", "2"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"Done. Stored metadata for {expected.entries} files." in result.output
    assert _remote_rows(s3_server, url, tmp_path) == _local_rows(local)
    again = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert again.exit_code == 0 and "(0 read," in again.output, again.output


def test_system_file_store_reads_the_metadata(media) -> None:
    local, url = media
    prepare_media_folder(local, EXTENSION, progress=False, num_workers=1)
    prepare_media_folder(url, EXTENSION, progress=False, num_workers=2)
    here, there = SystemFileStore(local), SystemFileStore(url)
    names = ["a.png", ".hidden.png", "sub/b.JPG", "sub/deep/c.png", "sub/sound.wav"] + (["clip.mp4"] if HAVE_AV else [])
    for name in names:
        assert there.get_media_metadata(name) == here.get_media_metadata(name), name
    assert there.get_media_metadata("a.png").width == 17
    assert there["sub/b.JPG"][0] == (local / "sub/b.JPG").read_bytes()


def test_tmp_path_holds_the_build(media, s3_server, tmp_path, monkeypatch) -> None:
    _, url = media
    build = tmp_path / "build" / "here"  # made when missing
    seen: list[str] = []
    real_extract = filesystem_prepare.extract_metadata_of_file

    def spy(media_type, path):
        seen.append(str(path))
        return real_extract(media_type, path)

    monkeypatch.setattr(filesystem_prepare, "extract_metadata_of_file", spy)
    result = prepare_media_folder(url, EXTENSION, progress=False, num_workers=1, tmp_path=build)
    assert seen and all(Path(p).parent.parent == build for p in seen), seen
    assert build.is_dir() and not any(build.iterdir())  # the build folder inside it is removed
    # Energon's function: index_sqlite_tmp_path names the file; its folder holds the build.
    s3_server.put_bytes(f"{url}/a.png", _png((7, 7)))
    seen.clear()
    count = prepare_filesystem_dataset(url, EXTENSION, progress=False, workers=1, index_sqlite_tmp_path=build / "index.sqlite")
    assert count == result.entries and seen and all(Path(p).parent.parent == build for p in seen)
    assert not any(build.iterdir())


def test_remote_root_checks(media, s3_server) -> None:
    _, url = media
    with pytest.raises(DatasetError, match="folder not found"):
        prepare_media_folder(f"{url}/nothing-here", EXTENSION, progress=False)
    with pytest.raises(DatasetError, match="takes a folder"):
        prepare_media_folder(f"{url}/a.png", EXTENSION, progress=False)
    with pytest.raises(ConfigError, match="no media filter chosen"):
        prepare_media_folder(url, None, progress=False)
    s3_server.put_bytes(f"{url}/.nv-meta/.info.json", b"{}")
    with pytest.raises(ConfigError, match="prepared tar dataset"):
        prepare_media_folder(url, EXTENSION, progress=False)
