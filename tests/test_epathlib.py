"""EPath on local files and dataset-cache (dss://) paths, checked against Energon's EPath where it
is the oracle. Object storage paths: tests/storage/test_epathlib_remote.py."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from megatron_energon_lite.energon.epathlib import DEFAULT_PROFILE_NAME, EPath
from megatron_energon_lite.energon.epathlib import epath as epath_module
from megatron_energon_lite.energon.epathlib.epath import _match
from megatron_energon_lite.errors import ConfigError


def energon_epath():
    return pytest.importorskip("megatron.energon.epathlib").EPath


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``file.txt``, ``subdir/{file2.txt,file3.blob}``, ``.hidden/h.txt`` and ``symlink`` -> ``subdir``."""
    (tmp_path / "subdir").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "file.txt").write_text("dummy")
    (tmp_path / "subdir" / "file2.txt").write_text("dummy2")
    (tmp_path / "subdir" / "file3.blob").write_text("dummy3")
    (tmp_path / ".hidden" / "h.txt").write_text("h")
    (tmp_path / "symlink").symlink_to(tmp_path / "subdir", target_is_directory=True)
    return tmp_path


@pytest.mark.parametrize(
    "text",
    ["/tmp", "/tmp/a/../b/./c.txt", "rel/x", "./rel/../y", "nonexisting/../file.bin", f"msc://{DEFAULT_PROFILE_NAME}/etc/hosts", ""],
)
def test_local_names_match_energon(text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    theirs = energon_epath()(text)
    ours = EPath(text)
    assert str(ours) == str(theirs) and ours.url == theirs.url
    assert ours.name == theirs.name and str(ours.parent) == str(theirs.parent)
    assert str(ours.with_suffix(".idx")) == str(theirs.with_suffix(".idx")) if ours.name else True


def test_pathlib_paths_and_file_urls_are_local(tmp_path: Path) -> None:
    assert str(EPath(tmp_path / "a")) == str(tmp_path / "a")
    assert str(EPath(f"file://{tmp_path}/a/../b")) == str(tmp_path / "b")
    assert EPath(EPath(tmp_path)) == EPath(str(tmp_path))
    assert EPath(tmp_path).is_local() and EPath(tmp_path).local_path() == tmp_path


def test_urls_keep_their_protocol_and_resolve_dots() -> None:
    p = EPath("msc://s3/tmp/path/.././subpath.txt")
    assert str(p) == "msc://s3/tmp/subpath.txt" and repr(p) == "EPath('msc://s3/tmp/subpath.txt')"
    assert str(p.parent / "../bla/bla/../../no/../subpath2.txt") == "msc://s3/subpath2.txt"
    assert str(EPath("s3://bucket/a/../b/c.tar")) == "s3://bucket/b/c.tar"
    assert EPath("s3://bucket/b/c.tar").name == "c.tar" and str(EPath("s3://bucket/b/c.tar").parent) == "s3://bucket/b"
    assert not EPath("s3://bucket/x").is_local()
    with pytest.warns(FutureWarning, match="deprecated"):
        assert str(EPath("rclone://s3/tmp/path/../x")) == "msc://s3/tmp/x"


def test_going_above_the_root_is_an_error() -> None:
    with pytest.raises(ConfigError, match="above the root"):
        EPath("/a") / "../../b"
    with pytest.raises(ConfigError, match="above the root"):
        EPath("s3://bucket/../..")


def test_join_replaces_with_absolute_and_url_right_sides(tmp_path: Path) -> None:
    base = EPath(tmp_path)
    assert base / "a" / "b.txt" == EPath(tmp_path / "a" / "b.txt")
    assert base / "/etc/hosts" == EPath("/etc/hosts")
    assert base / "s3://bucket/k" == EPath("s3://bucket/k")
    other = EPath("/elsewhere")
    assert (base / other) is other
    assert base / Path("x") == EPath(tmp_path / "x")


def test_equality_hash_order_and_pickle() -> None:
    paths = [EPath("/b"), EPath("msc://prof/a"), EPath("/a"), EPath("s3://bucket/k")]
    assert sorted(paths)[:2] == [EPath("/a"), EPath("/b")]
    assert len({EPath("/a"), EPath("/a/x/.."), EPath("msc://prof/a")}) == 2
    for p in paths:
        copy = pickle.loads(pickle.dumps(p))
        assert copy == p and hash(copy) == hash(p) and str(copy) == str(p)
    assert b"secret" not in pickle.dumps(EPath("msc://prof/a"))


def test_relative_to_gives_a_string_and_refuses_other_places(tmp_path: Path) -> None:
    root = EPath(tmp_path)
    assert (root / "a" / "b.txt").relative_to(root) == "a/b.txt"
    with pytest.raises(ConfigError, match="same place"):
        EPath("msc://prof/a/b").relative_to(EPath("/a"))


def test_write_creates_folders_and_reads_back(tmp_path: Path) -> None:
    p = EPath(tmp_path) / "new" / "deeper" / "f.txt"
    assert not p.exists() and not p.is_file()
    p.write_text("hello")
    assert p.is_file() and p.exists() and p.read_text() == "hello" and p.size() == 5
    assert p.parent.is_dir() and not p.is_dir()
    (p.parent / "g.bin").write_bytes(b"\x00\x01")
    assert (p.parent / "g.bin").read_bytes() == b"\x00\x01"
    with (p.parent / "other" / "h.bin").open("wb") as f:
        f.write(b"abc")
    with (p.parent / "other" / "h.bin").open("rb") as f:
        assert f.read() == b"abc"
    with p.open() as f:
        assert f.read() == "hello"
    stat = p.stat()
    assert stat.content_length == 5 and stat.type == "file" and stat.last_modified is not None
    with open(p) as f:  # __fspath__
        assert f.read() == "hello"


def test_mkdir_unlink_move_and_copy(tmp_path: Path) -> None:
    root = EPath(tmp_path)
    (root / "a" / "b").mkdir()
    assert (root / "a" / "b").is_dir()
    f = root / "a" / "f.txt"
    f.write_text("x")
    f.move(root / "moved" / "f.txt")
    assert not f.is_file() and (root / "moved" / "f.txt").read_text() == "x"
    (root / "moved" / "f.txt").copy(root / "copied" / "f.txt")
    (root / "moved").copy(root / "tree_copy")
    assert (root / "copied" / "f.txt").read_text() == "x" and (root / "tree_copy" / "f.txt").read_text() == "x"
    (root / "copied" / "f.txt").unlink()
    assert not (root / "copied" / "f.txt").is_file()
    with pytest.raises(FileNotFoundError):
        (root / "copied" / "f.txt").unlink()
    (root / "copied" / "f.txt").unlink(missing_ok=True)


def test_walk_and_glob_list_files_following_symlinks_as_energon_does(tree: Path) -> None:
    theirs, ours = energon_epath()(str(tree)), EPath(tree)
    assert [x.relative_to(ours) for x in ours.walk()] == [
        ".hidden/h.txt", "file.txt", "subdir/file2.txt", "subdir/file3.blob", "symlink/file2.txt", "symlink/file3.blob",
    ]
    assert sorted(str(x) for x in ours.walk()) == sorted(str(x) for x in theirs.walk())
    for pattern in ("**/*.txt", "symlink/*.txt", "*.txt", "sub*/file[23].*", "nothing/*"):
        assert [str(x) for x in ours.glob(pattern)] == sorted(str(x) for x in theirs.glob(pattern)), pattern
    assert all(isinstance(x, EPath) and x.is_file() for x in ours.glob("**/*"))


def test_glob_matcher_for_object_storage_listings() -> None:
    assert _match(["**", "*.txt"], "a.txt") and _match(["**", "*.txt"], "x/y/a.txt")
    assert not _match(["*.txt"], "x/a.txt") and _match(["x", "*.txt"], "x/a.txt")
    assert _match(["data-[0-3].tar"], "data-2.tar") and not _match(["data-[0-3].tar"], "data-7.tar")
    assert not _match(["*"], ".hidden") and not _match(["**", "*.txt"], ".h/a.txt") and _match([".h", "*.txt"], ".h/a.txt")


def test_dss_paths_live_in_the_dataset_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    (cache / "charts" / "v0" / "images").mkdir(parents=True)
    (cache / "charts" / "v0" / "images" / "000.jpg").write_bytes(b"j")
    (cache / "charts" / "v0" / "images" / "001.txt").write_bytes(b"t")
    monkeypatch.setattr(epath_module, "NVDATASET_CACHE_DIR", EPath(cache))
    root = EPath("dss://charts@v0")
    assert root.url == "dss://charts@v0" and root.display_name == "charts@v0"
    assert root.local_path() == cache / "charts" / "v0" and root.is_dir()
    assert [str(p) for p in root.glob("**/*.jpg")] == ["dss://charts@v0/images/000.jpg"]
    assert [p.relative_to(root) for p in root.walk()] == ["images/000.jpg", "images/001.txt"]
    assert (root / "images" / "000.jpg").read_bytes() == b"j"
    with pytest.raises(ConfigError, match="version separated by '@'"):
        EPath("dss://charts")
    monkeypatch.setattr(epath_module, "NVDATASET_CACHE_DIR", None)
    with pytest.raises(ConfigError, match="NVDATASET_CACHE_DIR"):
        root.is_dir()


def test_remote_paths_have_no_local_path() -> None:
    p = EPath("s3://bucket/key")
    with pytest.raises(TypeError, match="remote"):
        os.fspath(p)
    with pytest.raises(ConfigError, match="remote"):
        p.local_path()
