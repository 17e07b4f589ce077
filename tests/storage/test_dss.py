"""``dss://NAME@VERSION/path`` in the storage layer alone: parsed there, looked up in the cache
folder that epathlib's ``NVDATASET_CACHE_DIR`` names, or the environment variable without it.
(EPath's view of the same URLs: tests/test_epathlib.py; through a metadataset:
tests/cache/test_aux_energon_compat.py.)"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

import megatron_energon_lite.energon.epathlib.epath as epath_module
from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.storage import as_path
from megatron_energon_lite.storage import dss


def test_parsing_resolves_dots_and_needs_a_version() -> None:
    assert dss.split_dss_url("dss://charts@v0/a/./b/../c.tar") == PurePosixPath("/charts@v0/a/c.tar")
    assert dss.dss_url(PurePosixPath("/charts@v0/a")) == "dss://charts@v0/a"
    assert dss.cache_parts(PurePosixPath("/charts@v0/a/c.tar")) == ["charts", "v0", "a", "c.tar"]
    with pytest.raises(ConfigError, match="version separated by '@'"):
        dss.split_dss_url("dss://charts/a")
    with pytest.raises(AssertionError, match="version separated by '@'"):  # what Energon raises there
        dss.split_dss_url("dss://charts/a")
    with pytest.raises(ConfigError, match="goes above the root"):
        dss.split_dss_url("dss://charts@v0/../../x")


def test_without_epathlib_the_environment_names_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dss, "_cache_dir_lookup", dss._from_environment)
    monkeypatch.setenv("NVDATASET_CACHE_DIR", str(tmp_path))
    assert as_path("dss://charts@v0/images") == tmp_path / "charts" / "v0" / "images"
    monkeypatch.delenv("NVDATASET_CACHE_DIR")
    with pytest.raises(ConfigError, match="NVDATASET_CACHE_DIR") as error:
        as_path("dss://charts@v0/images")
    assert "dss://charts@v0/images" in str(error.value)


def test_epathlib_global_is_read_at_every_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(epath_module, "NVDATASET_CACHE_DIR", epath_module.EPath(tmp_path / "one"))
    assert as_path("dss://charts@v0") == tmp_path / "one" / "charts" / "v0"
    monkeypatch.setattr(epath_module, "NVDATASET_CACHE_DIR", str(tmp_path / "two"))
    assert as_path("dss://charts@v0") == tmp_path / "two" / "charts" / "v0"
