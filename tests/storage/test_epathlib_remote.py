"""EPath over object storage: s3:// through s3fs and msc:// through Multi-Storage Client, both
against the session's local S3 server (moto)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from megatron_energon_lite.energon.epathlib import EPath
from megatron_energon_lite.storage import configure_storage


@pytest.fixture
def s3_root(s3_server, s3_url):
    configure_storage("s3", storage_options=s3_server.storage_options())
    yield EPath(s3_url)
    configure_storage("s3", storage_options={})


def test_s3_write_read_list_and_delete(s3_root: EPath, tmp_path: Path) -> None:
    p = s3_root / "dir" / "file.txt"
    assert not p.is_file() and not p.exists()
    p.write_text("dummy")
    (s3_root / "parts" / "data-0.tar").write_bytes(b"shard0")
    (s3_root / "parts" / "data-1.tar").write_bytes(b"shard1")
    assert p.is_file() and p.size() == 5 and p.read_text() == "dummy" and (s3_root / "dir").is_dir()
    assert str(p) == f"{s3_root}/dir/file.txt"
    assert [x.relative_to(s3_root) for x in s3_root.walk()] == ["dir/file.txt", "parts/data-0.tar", "parts/data-1.tar"]
    assert [x.name for x in s3_root.glob("**/*.tar")] == ["data-0.tar", "data-1.tar"]
    assert [x.relative_to(s3_root) for x in s3_root.glob("parts/data-[1].tar")] == ["parts/data-1.tar"]
    with (s3_root / "parts" / "data-0.tar").open("rb") as f:
        assert f.read(5) == b"shard"
    with (s3_root / "w.txt").open("w") as f:
        f.write("written")
    assert (s3_root / "w.txt").read_text() == "written"
    stat = p.stat()
    assert stat.content_length == 5 and stat.last_modified is not None and stat.etag

    local = EPath(tmp_path) / "copy" / "file.txt"
    p.copy(local)
    assert local.read_text() == "dummy"
    local.copy(s3_root / "up.txt")
    (s3_root / "up.txt").move(s3_root / "moved.txt")
    assert not (s3_root / "up.txt").is_file() and (s3_root / "moved.txt").read_text() == "dummy"
    p.unlink()
    assert not p.is_file()
    assert pickle.loads(pickle.dumps(p)) == p


def test_msc_profile_paths(s3_server, s3_url, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    msc_shortcuts = pytest.importorskip("multistorageclient.shortcuts")
    config = {
        "profiles": {
            "lite": {
                "storage_provider": {
                    "type": "s3",
                    "options": {"base_path": s3_url.removeprefix("s3://"), "endpoint_url": s3_server.endpoint_url, "region_name": "us-east-1"},
                },
                "credentials_provider": {
                    "type": "S3Credentials",
                    "options": {"access_key": s3_server.access_key, "secret_key": s3_server.secret_key},
                },
            }
        }
    }
    (tmp_path / "msc.json").write_text(json.dumps(config))
    monkeypatch.setenv("MSC_CONFIG", str(tmp_path / "msc.json"))
    monkeypatch.setattr(msc_shortcuts, "_STORAGE_CLIENT_CACHE", {})
    monkeypatch.setattr(msc_shortcuts, "_PATH_MAPPING_CACHE", {}, raising=False)

    root = EPath("msc://lite/ds")
    f = root / "sub" / "a.txt"
    f.write_text("hey")
    assert str(f) == "msc://lite/ds/sub/a.txt" and f.read_text() == "hey" and f.size() == 3
    assert [str(x) for x in root.glob("**/*.txt")] == ["msc://lite/ds/sub/a.txt"]
    assert (root / "sub").is_dir()
    f.unlink()
    assert not f.is_file() and not (root / "sub").is_dir()
