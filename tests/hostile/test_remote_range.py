"""A server that ignores ``Range`` (answers a ranged GET with 200 and the whole object) must not
make a ranged read keep the object's first bytes: every S3 aux member read that way was another
member's bytes, silently. The proxy in front of moto drops the Range header, as such a server does."""

from __future__ import annotations

import pytest
from energon_lite_dev.synthetic import write_numbered_shards
from storage.conftest import fault_proxy, s3_server, s3_url  # noqa: F401 - tests/storage's S3 fixtures

from megatron_energon_lite.cache import WebdatasetFileStore
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.storage import as_path, configure_storage
from megatron_energon_lite.storage.remote import fetch_range

CRUDE = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"


@pytest.fixture
def ignoring_range(s3_server, s3_url, fault_proxy, tmp_path, monkeypatch):
    """A prepared dataset on S3, read through a proxy that drops every Range header."""
    monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(tmp_path / "cache"))
    write_numbered_shards(tmp_path / "ds", offset=0)
    prepare_dataset(tmp_path / "ds", split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CRUDE)
    s3_server.upload_dir(tmp_path / "ds", f"{s3_url}/ds")
    proxy = fault_proxy(ignore_range=True)
    configure_storage("s3", storage_options=s3_server.storage_options(proxy.endpoint_url, config_kwargs={"proxies": {}}))
    yield tmp_path / "ds", f"{s3_url}/ds"
    configure_storage("s3", storage_options={})


def test_a_ranged_read_gets_the_bytes_asked_for_from_a_whole_object_reply(ignoring_range) -> None:
    local, url = ignoring_range
    shard = "parts/data-1.tar"
    data = (local / shard).read_bytes()
    for start, end in [(0, 512), (512, 1024), (1536, 1537), (len(data) - 700, len(data) - 3)]:
        assert fetch_range(as_path(f"{url}/{shard}"), start, end) == data[start:end]


def test_aux_members_read_from_such_a_server_are_the_members_asked_for(ignoring_range) -> None:
    local, url = ignoring_range
    remote, here = WebdatasetFileStore(url), WebdatasetFileStore(local)
    for i in range(12):
        name = f"{i:06d}.txt"
        assert remote[name][0] == here[name][0] == str(i).encode()
