"""The local S3 test infrastructure, and what s3fs does with each fault the proxy injects.

``energon_lite_dev.s3server``'s module docstring describes the client's view in
prose; these tests pin it down (s3fs 2026.9, aiobotocore 3.10, botocore 1.43 legacy retry mode,
aiohttp 3.14), so an upgrade that changes it fails here first:

* 503 SlowDown: retried by botocore (5 attempts, random exponential backoff) and then by s3fs's
  inner wrapper; surfaces as ``OSError(errno.EBUSY)`` caused by a ``ClientError`` (``SlowDown``).
* Reset with RST: aiohttp resends once, botocore retries; s3fs does not. Surfaces as botocore
  ``EndpointConnectionError``.
* Reset with FIN: aiohttp resends once, botocore retries, s3fs retries (twice nested). Surfaces as
  botocore ``ConnectionClosedError``.
* Truncated body: only s3fs retries (``fs.retries`` attempts). Surfaces as
  ``aiohttp.ClientPayloadError``; never as a short result.

Fault choices are seeded and independent of thread interleaving, so every count asserted here is
exact. botocore's backoff sleeps are random but only ever delay, and tests that need botocore's
retries pick seeds whose longest run of consecutive faults per request is short.
"""

from __future__ import annotations

import errno
import http.client
import pickle
import time
import urllib.parse
import xml.etree.ElementTree as ET
from pathlib import Path

import aiohttp
import botocore.exceptions
import pytest
from energon_lite_dev.s3server import FaultProxy, LocalS3Server, _uniforms

NO_BOTOCORE_RETRY = {"retries": {"total_max_attempts": 1}}

DATA = bytes((i * 7 + i // 251) % 256 for i in range(200_000))


def _ranges(n: int, size: int = 1000, stride: int = 4001) -> list[tuple[int, int]]:
    return [((i * stride) % (len(DATA) - size), (i * stride) % (len(DATA) - size) + size) for i in range(n)]


def _key(url: str) -> str:
    return url[len("s3://") :]


def _fault_runs(seed: int, keys: list[str], rate: float) -> list[int]:
    """For each request key: how many leading draws fall below ``rate`` (faults before success)."""
    runs = []
    for key in keys:
        n = 0
        while _uniforms(seed, key, n)[0] < rate:
            n += 1
        runs.append(n)
    return runs


def _pick_seed(keys: list[str], rate: float, max_run: int, min_faults: int = 8) -> tuple[int, int]:
    """A seed under which at least ``min_faults`` faults happen, none more than ``max_run`` in a row."""
    for seed in range(1000):
        runs = _fault_runs(seed, keys, rate)
        if max(runs) <= max_run and sum(runs) >= min_faults:
            return seed, sum(runs)
    raise AssertionError("no suitable seed")


def _range_keys(url: str, ranges: list[tuple[int, int]]) -> list[str]:
    # The proxy's key for a request: method, path, Range header (s3fs sends an inclusive end).
    return [f"GET /{_key(url)} bytes={s}-{e - 1}" for s, e in ranges]


@pytest.fixture
def data_url(s3_server: LocalS3Server, s3_url: str) -> str:
    url = f"{s3_url}/data.bin"
    s3_server.put_bytes(url, DATA)
    return url


# --------------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------------


def test_upload_dir_and_read_back(s3_server: LocalS3Server, s3_url: str, tmp_path: Path) -> None:
    files = {"a.txt": b"alpha", "sub/b.bin": DATA[:5000], "sub/deeper/c.json": b'{"c": 1}', "empty": b""}
    for rel, content in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(content)

    uploaded = s3_server.upload_dir(tmp_path, s3_url + "/")
    assert uploaded == sorted(f"{s3_url}/{rel}" for rel in files)

    fs = s3_server.filesystem()
    prefix = _key(s3_url)
    assert sorted(fs.find(prefix)) == sorted(f"{prefix}/{rel}" for rel in files)
    for rel, content in files.items():
        assert fs.cat_file(f"{prefix}/{rel}") == content
    assert fs.cat_file(f"{prefix}/sub/b.bin", start=100, end=1100) == DATA[100:1100]
    assert fs.cat_file(f"{prefix}/sub/b.bin", start=4990) == DATA[4990:5000]
    assert fs.cat_file(f"{prefix}/sub/b.bin", start=-10) == DATA[4990:5000]
    with fs.open(f"{prefix}/sub/b.bin", "rb", block_size=1024) as f:
        f.seek(3000)
        assert f.read(1500) == DATA[3000:4500]
    assert fs.info(f"{prefix}/sub/b.bin")["size"] == 5000


def test_storage_options_and_instance_cache(s3_server: LocalS3Server, data_url: str) -> None:
    import s3fs

    opts = s3_server.storage_options()
    assert opts["client_kwargs"] == {"endpoint_url": s3_server.endpoint_url, "region_name": "us-east-1"}
    assert pickle.loads(pickle.dumps(opts)) == opts
    merged = s3_server.storage_options("http://127.0.0.1:1", config_kwargs=NO_BOTOCORE_RETRY)
    assert merged["client_kwargs"]["endpoint_url"] == "http://127.0.0.1:1"
    assert merged["config_kwargs"] == {"proxies": {}, **NO_BOTOCORE_RETRY}
    assert s3_server.endpoint_url.startswith("http://127.0.0.1:")
    # Equal arguments give the same cached instance; skip_instance_cache gives a fresh one.
    assert s3fs.S3FileSystem(**opts) is s3fs.S3FileSystem(**s3_server.storage_options())
    fresh = s3fs.S3FileSystem(**s3_server.storage_options(skip_instance_cache=True))
    assert fresh is not s3fs.S3FileSystem(**opts)
    assert fresh.cat_file(_key(data_url), start=5, end=9) == DATA[5:9]


def test_reset_wipes_state(s3_server: LocalS3Server, s3_url: str) -> None:
    fs = s3_server.filesystem()
    s3_server.put_bytes(f"{s3_url}/x", b"x")
    assert fs.cat_file(_key(s3_url) + "/x") == b"x"
    s3_server.reset()
    fs.invalidate_cache()
    assert not fs.exists(_key(s3_url).split("/")[0])
    with pytest.raises(FileNotFoundError):
        fs.cat_file(_key(s3_url) + "/x")
    s3_server.create_bucket(_key(s3_url).split("/")[0])  # for the tests that follow


# --------------------------------------------------------------------------------------------------
# The proxy: pass-through, lifecycle, error responses
# --------------------------------------------------------------------------------------------------


def test_proxy_passthrough_keepalive_and_clean_close(s3_server: LocalS3Server, data_url: str) -> None:
    t0 = time.monotonic()
    proxy = FaultProxy(s3_server.endpoint_url).start()
    assert time.monotonic() - t0 < 2
    try:
        fs = s3_server.filesystem(proxy.endpoint_url)
        ranges = _ranges(50)
        got = fs.cat_ranges([_key(data_url)] * len(ranges), [s for s, _ in ranges], [e for _, e in ranges], on_error="raise")
        assert got == [DATA[s:e] for s, e in ranges]
        # Uploads and listings pass through too.
        fs.pipe_file(_key(data_url) + ".copy", DATA[:777])
        assert fs.cat_file(_key(data_url) + ".copy") == DATA[:777]
        assert proxy.stats["bytes_forwarded"] == 50 * 1000 + 777
        assert proxy.stats["errors_injected"] == proxy.stats["resets_injected"] == 0
        assert proxy.threads()  # idle keep-alive connections from aiohttp's pool are still open
    finally:
        t0 = time.monotonic()
        proxy.close()
        assert time.monotonic() - t0 < 2
    assert proxy.threads() == []


def test_error_response_is_s3_xml_and_keeps_connection(s3_server: LocalS3Server, fault_proxy, data_url: str) -> None:
    proxy = fault_proxy(error_rate=1.0)
    bucket, _, key = _key(data_url).partition("/")
    presigned = s3_server.client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key})
    target = urllib.parse.urlsplit(presigned)._replace(scheme="", netloc="").geturl()  # path and query
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", target, headers={"Range": "bytes=0-9"})
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 503
        assert resp.getheader("Content-Type") == "application/xml"
        root = ET.fromstring(body)
        assert root.tag == "Error" and root.findtext("Code") == "SlowDown"
        assert root.findtext("RequestId")
        # Same connection, faults off: the request is forwarded.
        proxy.error_rate = 0.0
        conn.request("GET", target, headers={"Range": "bytes=0-9"})
        resp = conn.getresponse()
        assert resp.status == 206 and resp.read() == DATA[:10]
    finally:
        conn.close()
    assert proxy.stats["requests"] == 2 and proxy.stats["errors_injected"] == 1


def test_faults_only_for(s3_server: LocalS3Server, fault_proxy, data_url: str) -> None:
    key = _key(data_url)
    # Default: GETs only; PUT and HEAD through a proxy that fails every GET still work.
    proxy = fault_proxy(error_rate=1.0)
    fs = s3_server.filesystem(proxy.endpoint_url, config_kwargs=NO_BOTOCORE_RETRY)
    fs.retries = 1
    fs.pipe_file(key + ".put", b"uploaded")
    assert fs.info(key + ".put")["size"] == 8
    with pytest.raises(OSError):
        fs.cat_file(key, start=0, end=10)

    # Predicate: only ranged GETs.
    proxy = fault_proxy(error_rate=1.0, faults_only_for=FaultProxy.ranged_gets)
    fs = s3_server.filesystem(proxy.endpoint_url, config_kwargs=NO_BOTOCORE_RETRY)
    fs.retries = 1
    assert fs.cat_file(key + ".put") == b"uploaded"
    with pytest.raises(OSError):
        fs.cat_file(key, start=0, end=10)

    # A set of methods.
    proxy = fault_proxy(error_rate=1.0, faults_only_for={"HEAD"})
    fs = s3_server.filesystem(proxy.endpoint_url, config_kwargs=NO_BOTOCORE_RETRY)
    fs.retries = 1
    assert fs.cat_file(key, start=0, end=10) == DATA[:10]
    with pytest.raises(OSError):
        fs.info(key)


def test_latency(s3_server: LocalS3Server, fault_proxy, data_url: str) -> None:
    proxy = fault_proxy(latency_s=0.15)
    fs = s3_server.filesystem(proxy.endpoint_url)
    t0 = time.monotonic()
    for i in range(3):
        assert fs.cat_file(_key(data_url), start=i, end=i + 10) == DATA[i : i + 10]
    assert time.monotonic() - t0 >= 3 * 0.15
    assert proxy.stats["requests"] == 3
    proxy.latency_s = 0.0
    t0 = time.monotonic()
    fs.cat_file(_key(data_url), start=0, end=10)
    assert time.monotonic() - t0 < 0.15


# --------------------------------------------------------------------------------------------------
# 503 SlowDown
# --------------------------------------------------------------------------------------------------


def test_slowdown_is_retried_by_botocore(s3_server: LocalS3Server, fault_proxy, data_url: str) -> None:
    ranges = _ranges(40)
    # One retry at most per range keeps botocore's random backoff (up to 1 s, then 2 s) short.
    seed, expected_errors = _pick_seed(_range_keys(data_url, ranges), 0.3, max_run=1)
    proxy = fault_proxy(error_rate=0.3, seed=seed)
    fs = s3_server.filesystem(proxy.endpoint_url)
    fs.retries = 1  # no s3fs retries: every recovery below is botocore's
    got = fs.cat_ranges([_key(data_url)] * len(ranges), [s for s, _ in ranges], [e for _, e in ranges], on_error="raise")
    assert got == [DATA[s:e] for s, e in ranges]
    assert proxy.stats["errors_injected"] == expected_errors > 5
    assert proxy.stats["requests"] == len(ranges) + expected_errors
    assert proxy.stats["bytes_forwarded"] == 1000 * len(ranges)


def test_slowdown_exhausted_surfaces_as_oserror(s3_server: LocalS3Server, fault_proxy, data_url: str) -> None:
    from botocore.exceptions import ClientError

    proxy = fault_proxy(error_rate=1.0)
    fs = s3_server.filesystem(proxy.endpoint_url, config_kwargs=NO_BOTOCORE_RETRY)
    fs.retries = 3  # s3fs's inner wrapper retries SlowDown ClientErrors; the outer one sees OSError
    with pytest.raises(OSError) as info:
        fs.cat_file(_key(data_url), start=0, end=100)
    assert type(info.value) is OSError and info.value.errno == errno.EBUSY
    assert isinstance(info.value.__cause__, ClientError)
    assert info.value.__cause__.response["Error"]["Code"] == "SlowDown"
    assert proxy.stats["requests"] == proxy.stats["errors_injected"] == 3


# --------------------------------------------------------------------------------------------------
# Connection resets
# --------------------------------------------------------------------------------------------------


def test_reset_rst_is_not_retried_by_s3fs(s3_server: LocalS3Server, fault_proxy, data_url: str) -> None:
    proxy = fault_proxy(reset_rate=1.0, reset_mode="rst")
    fs = s3_server.filesystem(proxy.endpoint_url, config_kwargs=NO_BOTOCORE_RETRY)
    fs.retries = 3
    with pytest.raises(botocore.exceptions.EndpointConnectionError):
        fs.cat_file(_key(data_url), start=0, end=100)
    # aiohttp resends once by itself; neither botocore (switched off) nor s3fs retries.
    assert proxy.stats["requests"] == proxy.stats["resets_injected"] == 2


def test_reset_fin_is_retried_by_s3fs(s3_server: LocalS3Server, fault_proxy, data_url: str) -> None:
    proxy = fault_proxy(reset_rate=1.0, reset_mode="close")
    fs = s3_server.filesystem(proxy.endpoint_url, config_kwargs=NO_BOTOCORE_RETRY)
    fs.retries = 2
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        fs.cat_file(_key(data_url), start=0, end=100)
    # aiohttp's resend (x2) inside s3fs's inner (x2) and outer (x2) wrappers.
    assert proxy.stats["requests"] == proxy.stats["resets_injected"] == 8


@pytest.mark.parametrize("mode", ["rst", "close"])
def test_resets_recovered_by_retries(s3_server: LocalS3Server, fault_proxy, data_url: str, mode: str) -> None:
    ranges = _ranges(30)
    # aiohttp's immediate resend absorbs most single resets; botocore sleeps only after two in a row.
    seed, expected_resets = _pick_seed(_range_keys(data_url, ranges), 0.3, max_run=2)
    proxy = fault_proxy(reset_rate=0.3, reset_mode=mode, seed=seed)
    fs = s3_server.filesystem(proxy.endpoint_url)
    fs.retries = 1
    got = fs.cat_ranges([_key(data_url)] * len(ranges), [s for s, _ in ranges], [e for _, e in ranges], on_error="raise")
    assert got == [DATA[s:e] for s, e in ranges]
    assert proxy.stats["resets_injected"] == expected_resets > 5
    assert proxy.stats["requests"] == len(ranges) + expected_resets


# --------------------------------------------------------------------------------------------------
# Truncated bodies
# --------------------------------------------------------------------------------------------------


def test_truncation_retried_by_s3fs_and_deterministic(s3_server: LocalS3Server, fault_proxy, data_url: str) -> None:
    ranges = _ranges(40, size=3000)
    seed, expected = _pick_seed(_range_keys(data_url, ranges), 0.3, max_run=2)
    stats = []
    for _ in range(2):
        proxy = fault_proxy(truncate_rate=0.3, seed=seed)
        fs = s3_server.filesystem(proxy.endpoint_url)
        got = fs.cat_ranges([_key(data_url)] * len(ranges), [s for s, _ in ranges], [e for _, e in ranges], on_error="raise")
        assert got == [DATA[s:e] for s, e in ranges]
        stats.append(dict(proxy.stats))
    assert stats[0] == stats[1]  # same seed, same faults, whatever the interleaving
    assert stats[0]["truncations_injected"] == expected > 5
    assert stats[0]["requests"] == len(ranges) + expected
    assert stats[0]["bytes_forwarded"] > 3000 * len(ranges)  # partial bodies count too


def test_truncation_exhausted_raises_payload_error(s3_server: LocalS3Server, fault_proxy, data_url: str) -> None:
    proxy = fault_proxy(truncate_rate=1.0)
    fs = s3_server.filesystem(proxy.endpoint_url)
    fs.retries = 2
    with pytest.raises(aiohttp.ClientPayloadError):
        fs.cat_file(_key(data_url), start=0, end=1000)
    assert proxy.stats["requests"] == proxy.stats["truncations_injected"] == 2
    assert 0 <= proxy.stats["bytes_forwarded"] < 2 * 1000

    # File objects read through the same path (plus one unfaulted HEAD for the size).
    proxy.reset_stats()
    with pytest.raises(aiohttp.ClientPayloadError):
        with fs.open(_key(data_url), "rb", block_size=4096) as f:
            f.read(100)
    assert proxy.stats["truncations_injected"] == 2

    # Rates can change at runtime.
    proxy.truncate_rate = 0.0
    assert fs.cat_file(_key(data_url), start=0, end=1000) == DATA[:1000]
