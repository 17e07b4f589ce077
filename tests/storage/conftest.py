"""Shared fixtures for object-storage tests: one local S3 server per session, fault proxies per test.

* ``s3_server``: session-scoped ``LocalS3Server`` (moto on 127.0.0.1) with the bucket ``S3_BUCKET``.
* ``s3_url``: ``s3://<S3_BUCKET>/<test name>``, a prefix of its own for each test; it (re)creates
  the bucket, so a test that calls ``s3_server.reset()`` does not break the others.
* ``fault_proxy``: factory ``fault_proxy(**FaultProxy kwargs) -> FaultProxy`` in front of
  ``s3_server``; every proxy is closed at the end of the test.
* ``captioning_on_s3``: factory ``captioning_on_s3(**generate_captioning_dataset kwargs) ->
  (local folder, s3 URL)``: the same captioning set prepared locally and at ``s3_url``, S3
  configured for the test (reset at its end), a cache folder and short back-offs of its own.

moto's state is process-global (see ``energon_lite_dev.s3server``): do not use
``moto.mock_aws`` in this process, and keep each test's data under its own prefix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from energon_lite_dev.s3server import FaultProxy, LocalS3Server  # noqa: E402
from energon_lite_dev.synthetic import generate_captioning_dataset  # noqa: E402

from megatron_energon_lite.format.prepare import prepare_dataset  # noqa: E402
from megatron_energon_lite.storage import configure_storage  # noqa: E402
from megatron_energon_lite.synthetic import CAPTIONING_SAMPLE_YAML  # noqa: E402

S3_BUCKET = "energon-lite-test"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[LocalS3Server]:
    with LocalS3Server() as server:
        server.create_bucket(S3_BUCKET)
        yield server


@pytest.fixture
def s3_url(s3_server: LocalS3Server, request: pytest.FixtureRequest) -> str:
    s3_server.create_bucket(S3_BUCKET)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", request.node.name).strip("_")
    return f"s3://{S3_BUCKET}/{name}"


@pytest.fixture
def fault_proxy(s3_server: LocalS3Server) -> Iterator[Callable[..., FaultProxy]]:
    proxies: list[FaultProxy] = []

    def make(**kwargs: Any) -> FaultProxy:
        proxy = FaultProxy(s3_server.endpoint_url, **kwargs).start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def captioning_on_s3(s3_server: LocalS3Server, s3_url: str, tmp_path, monkeypatch) -> Iterator[Callable[..., tuple[Any, str]]]:
    def make(**generate: Any) -> tuple[Any, str]:
        monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setenv("ENERGON_LITE_BACKOFF_S", "0.001")
        local = tmp_path / "local"
        generate_captioning_dataset(local, **generate)
        s3_server.upload_dir(local, s3_url)
        configure_storage("s3", storage_options=s3_server.storage_options())
        for root in (local, s3_url):
            prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, dataset_yaml=CAPTIONING_SAMPLE_YAML)
        return local, s3_url

    yield make
    configure_storage("s3", storage_options={})
