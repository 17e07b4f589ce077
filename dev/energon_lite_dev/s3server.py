"""A local S3-compatible server and a fault-injecting HTTP proxy, for tests and benchmarks.

Everything listens on and talks to ``127.0.0.1`` only; nothing here needs network access or real
credentials.

``LocalS3Server``
    moto's ``ThreadedMotoServer`` in a thread of this process, plus a small boto3 client for setup
    (buckets, uploads) and ``storage_options()`` for ``s3fs.S3FileSystem(**opts)``.

    moto keeps its state in *process-global* backends: two ``LocalS3Server`` objects in one process
    see the same buckets, ``reset()`` wipes all of them, and so does any ``moto.mock_aws`` block
    that starts or ends in the same process. Use one server per process (the test suite uses one
    per session) and unique bucket names or prefixes per test.

``FaultProxy``
    A threaded HTTP/1.1 reverse proxy (stdlib only) in front of an upstream such as the moto server.
    It keeps client connections alive like S3 does, so aiohttp's connection pool (s3fs uses
    aiobotocore/aiohttp) reuses them, and it can inject, per request:

    * ``error_rate``: answer ``503 Slow Down`` with an S3 XML error body (``<Code>SlowDown</Code>``)
      without contacting the upstream; the connection stays usable.
    * ``reset_rate``: close the connection abruptly before sending any response byte, with a TCP
      RST (``reset_mode="rst"``, the default) or a plain FIN (``reset_mode="close"``).
    * ``truncate_rate``: for successful GETs with a body, send the full headers (the real
      ``Content-Length``) but only a prefix of the body, then close the connection.
    * ``latency_s``: sleep this long before handling every request (all requests, not only those
      selected by ``faults_only_for``).

    By default only GET requests are eligible for faults, so setup uploads through the proxy are
    reliable; ``faults_only_for`` takes a method, a collection of methods, or a predicate
    ``(method, path, headers) -> bool`` (``FaultProxy.ranged_gets`` selects GETs with a Range).

    Fault choice is deterministic and independent of thread scheduling: the n-th request with the
    same (method, path and query, Range header) draws the same number for the same ``seed``, so
    concurrent readers see the same faults on every run. The rates are plain attributes and may be
    changed while the proxy runs. ``stats`` counts ``requests``, ``errors_injected``,
    ``resets_injected``, ``truncations_injected``, ``bytes_forwarded`` (upstream response body bytes
    handed to clients, including partial bodies, excluding injected error bodies) and
    ``upstream_errors`` (answered 502). It also counts requests and body bytes by kind
    (:data:`REQUEST_KINDS`: ``head``, ``get`` (a whole object), ``ranged_get``, ``list`` (a GET of
    a bucket: ListObjects), ``put`` (PUT and POST: uploads, multipart steps) and ``other``) as
    ``requests_<kind>`` and ``bytes_<kind>`` (response body bytes, as ``bytes_forwarded``; for
    ``put`` the request body bytes received instead). Every count is updated before the client can
    see the response, so it is exact as soon as a client call returns; ``reset_stats()`` zeroes
    them all.

What an s3fs client sees (s3fs 2026.9, aiobotocore 3.10, botocore 1.43 in the default "legacy"
retry mode, aiohttp 3.14; pinned down by ``tests/storage/test_s3_infra.py``). Three layers retry:

* aiohttp resends an idempotent request (GET/HEAD) once, at once, when the connection fails
  before a response (``ServerDisconnectedError`` or ``ClientOSError``), so one reset that the
  caller notices costs two requests.
* botocore retries 503s and connection errors: 5 attempts in all, sleeping ``random() *
  2**(attempt-1)`` s in between (up to 1, 2, 4, 8 s: slow; ``config_kwargs={"retries":
  {"total_max_attempts": 1}}`` switches it off).
* s3fs wraps each S3 call in ``_error_wrapper`` (``fs.retries`` attempts in all, default 5, sleeping
  ``0.1 * 1.7**i`` s), and ``cat_file``/``cat_ranges``/file reads wrap "call + read the body" in a
  second ``_error_wrapper``. ``retries`` is a class attribute, not a constructor argument: set
  ``fs.retries = n`` on the instance.

Per fault kind, for ``cat_file``, ``cat_ranges`` and ``open().read()``:

* **503 SlowDown** (``error_rate``): botocore retries; when its 5 attempts fail it raises
  ``ClientError`` (``SlowDown``), which the inner s3fs wrapper retries (it matches "SlowDown") and
  finally translates into ``OSError(errno.EBUSY, "Please reduce your request rate.")`` with the
  ``ClientError`` as ``__cause__``; the outer wrapper does not retry ``OSError``. So up to
  ``5 * fs.retries`` requests, and reads never return wrong bytes.
* **Reset with RST** (``reset_mode="rst"``, the default): aiohttp's ``ClientOSError`` (ECONNRESET)
  becomes botocore ``EndpointConnectionError`` (a ``botocore.exceptions.ConnectionError``, *not*
  an ``HTTPClientError``): botocore retries it (x2 for aiohttp's resend: 10 requests), s3fs does
  *not*, whatever ``fs.retries`` is; the ``EndpointConnectionError`` surfaces untranslated.
* **Reset with FIN** (``reset_mode="close"``): ``ServerDisconnectedError`` becomes botocore
  ``ConnectionClosedError`` (an ``HTTPClientError``): botocore retries it and both s3fs wrappers do
  too, up to ``10 * fs.retries**2`` requests (250 with the defaults); then the
  ``ConnectionClosedError`` surfaces untranslated.
* **Truncated body** (``truncate_rate``): headers arrive, so aiohttp and botocore see success and
  do not retry; ``await Body.read()`` raises aiohttp's ``ClientPayloadError`` ("Response payload is
  not completed ... ContentLengthError"), which the outer s3fs wrapper retries (``fs.retries``
  requests in all). It surfaces unwrapped (an ``aiohttp.ClientPayloadError``, not an ``OSError``)
  when all fail. s3fs never returns a short ``bytes`` object for a truncated body.

Gotchas: ``S3FileSystem`` instances are cached by their arguments (use
``skip_instance_cache=True``, as ``LocalS3Server.filesystem`` does, for a fresh connection pool);
``fs.cat_ranges`` returns per-range exceptions *in the result list* unless ``on_error="raise"``;
s3fs caches listings (``fs.invalidate_cache()`` after uploading with another client); fsspec runs
all s3fs I/O on one event-loop thread (``fsspecIO``) per process, resets it after ``fork`` and
refuses to use a filesystem instance created before the fork ("not fork-safe"), so create them in
the worker (the instance cache is keyed by pid, so ``S3FileSystem(**opts)`` does that).
"""

from __future__ import annotations

import hashlib
import http.client
import http.server
import logging
import os
import socket
import socketserver
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection
from email.message import Message
from pathlib import Path
from typing import Any, Optional, Union

__all__ = ["REQUEST_KINDS", "FaultProxy", "LocalS3Server", "S3ServerProcess", "free_port", "request_kind"]

log = logging.getLogger(__name__)

_HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        return s.getsockname()[1]


def _split_s3_url(url: str) -> tuple[str, str]:
    if not url.startswith("s3://"):
        raise ValueError(f"expected an s3:// URL, got {url!r}")
    bucket, _, key = url[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {url!r}")
    return bucket, key


# --------------------------------------------------------------------------------------------------
# Local S3 server (moto)
# --------------------------------------------------------------------------------------------------


class LocalS3Server:
    """moto's S3 in a thread of this process, on ``127.0.0.1``; a context manager.

    ``storage_options()`` gives keyword arguments for ``s3fs.S3FileSystem``; ``create_bucket``,
    ``put_bytes`` and ``upload_dir`` prepare data through a boto3 client that talks to the server
    directly (never through a proxy). See the module docstring for moto's process-global state.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        region: str = "us-east-1",
        access_key: str = "testing",
        secret_key: str = "testing",
    ) -> None:
        self.region = region
        self.access_key = access_key
        self.secret_key = secret_key
        self._requested_port = port
        self._moto: Any = None
        self._client: Any = None
        self._port: Optional[int] = None
        self._quieted_werkzeug = False
        self._session: Optional[tuple[int, Any]] = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> "LocalS3Server":
        if self._moto is not None:
            return self
        from moto.server import (
            ThreadedMotoServer,  # imported lazily: a dev-only dependency
        )

        # werkzeug logs every request at INFO to stderr unless its logger has a level already.
        werkzeug_log = logging.getLogger("werkzeug")
        if werkzeug_log.level == logging.NOTSET:
            werkzeug_log.setLevel(logging.WARNING)
            self._quieted_werkzeug = True
        moto = ThreadedMotoServer(ip_address=_HOST, port=self._requested_port, verbose=False)
        moto.start()
        self._moto = moto
        self._port = int(moto.get_host_and_port()[1])
        return self

    def stop(self) -> None:
        moto, self._moto = self._moto, None
        if moto is None:
            return
        try:
            # Dispose of moto's key buffers now; otherwise moto warns (ResourceWarning) when they
            # are garbage collected.
            self.reset()
        except OSError:  # pragma: no cover - server already unreachable
            log.debug("moto reset on stop failed", exc_info=True)
        finally:
            client, self._client = self._client, None
            if client is not None:
                client.close()
            moto.stop()
            server = getattr(moto, "_server", None)
            if server is not None:  # older moto versions do not close the listening socket
                server.server_close()
            if self._quieted_werkzeug:
                logging.getLogger("werkzeug").setLevel(logging.NOTSET)
                self._quieted_werkzeug = False

    def __enter__(self) -> "LocalS3Server":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses and options ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LocalS3Server is not started")
        return self._port

    @property
    def endpoint_url(self) -> str:
        return f"http://{_HOST}:{self.port}"

    def storage_options(self, endpoint_url: Optional[str] = None, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for ``s3fs.S3FileSystem(**opts)`` (or ``fsspec.filesystem("s3", ...)``).

        ``endpoint_url`` defaults to this server; pass a ``FaultProxy.endpoint_url`` to go through
        the proxy. Explicit key, secret, region and empty ``proxies`` keep botocore from looking at
        the environment, instance metadata or HTTP proxies, so nothing leaves 127.0.0.1.
        ``overrides`` replace top-level entries (e.g. ``skip_instance_cache=True``), except that
        dicts for ``client_kwargs`` and ``config_kwargs`` are merged into the defaults (e.g.
        ``config_kwargs={"retries": {"total_max_attempts": 1}}`` switches botocore's retries off).
        s3fs's own retry count is not an argument: set ``fs.retries`` on the instance. The result
        is a plain, picklable dict. s3fs caches filesystem instances by these arguments unless
        ``skip_instance_cache=True`` is passed.
        """
        opts: dict[str, Any] = {
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"endpoint_url": endpoint_url or self.endpoint_url, "region_name": self.region},
            "config_kwargs": {"proxies": {}},
            "use_ssl": False,
        }
        for name, value in overrides.items():
            if name in ("client_kwargs", "config_kwargs") and isinstance(value, dict):
                opts[name] = {**opts[name], **value}
            else:
                opts[name] = value
        return opts

    def filesystem(self, endpoint_url: Optional[str] = None, **overrides: Any) -> Any:
        """A fresh (uncached) ``s3fs.S3FileSystem`` for this server or a proxy in front of it.

        Its connection pool is its own; the aiobotocore session (which holds only configuration
        and the parsed service model) is shared by the filesystems this method makes in this
        process, which saves ~0.1 s of model loading per filesystem.
        """
        import aiobotocore.session
        import s3fs

        if self._session is None or self._session[0] != os.getpid():
            self._session = (os.getpid(), aiobotocore.session.AioSession())
        overrides.setdefault("skip_instance_cache", True)
        overrides.setdefault("session", self._session[1])
        return s3fs.S3FileSystem(**self.storage_options(endpoint_url, **overrides))

    # -- data setup ----------------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """A boto3 S3 client talking to the server directly (created on first use)."""
        if self._client is None:
            import boto3
            from botocore.config import Config

            session = boto3.session.Session(
                aws_access_key_id=self.access_key,
                aws_secret_access_key=self.secret_key,
                region_name=self.region,
            )
            self._client = session.client(
                "s3",
                endpoint_url=self.endpoint_url,
                config=Config(proxies={}, retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
            )
        return self._client

    def create_bucket(self, name: str) -> str:
        """Create a bucket (no error when it exists already); returns ``s3://name``."""
        try:
            self.client.create_bucket(Bucket=name)
        except self.client.exceptions.BucketAlreadyOwnedByYou:
            pass
        return f"s3://{name}"

    def put_bytes(self, url: str, data: bytes, *, in_process: bool = False) -> None:
        """One object; ``in_process``: straight into moto's backend (see :meth:`upload_dir`)."""
        bucket, key = _split_s3_url(url)
        if in_process:
            self._backend_put(bucket, key, data)
        else:
            self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def upload_dir(self, local_dir: Union[str, os.PathLike], url: str, *, in_process: bool = False) -> list[str]:
        """Upload every file under ``local_dir`` to ``url`` (``s3://bucket/prefix``), keeping paths
        relative to ``local_dir``; returns the uploaded URLs, sorted. The bucket must exist.

        ``in_process``: store the objects straight into moto's backend in this process (the one
        the server runs in) instead of one HTTP PUT each: ~150x faster (10,000 shards with their
        indexes in a few seconds instead of minutes), the same objects and ETags (MD5s) to a client.
        """
        root = Path(local_dir)
        if not root.is_dir():
            raise NotADirectoryError(str(root))
        bucket, prefix = _split_s3_url(url)
        prefix = prefix.strip("/")
        put = self._backend_put if in_process else lambda bucket, key, data: self.client.put_object(Bucket=bucket, Key=key, Body=data)
        uploaded = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            key = f"{prefix}/{rel}" if prefix else rel
            with open(path, "rb") as f:
                put(bucket, key, f.read())
            uploaded.append(f"s3://{bucket}/{key}")
        return uploaded

    def _backend_put(self, bucket: str, key: str, data: bytes) -> None:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        if self._moto is None:
            raise RuntimeError("LocalS3Server is not started")
        s3_backends[DEFAULT_ACCOUNT_ID]["global"].put_object(bucket, key, data)

    def reset(self) -> None:
        """Delete all buckets and objects (``POST /moto-api/reset``; all moto state of the process)."""
        conn = http.client.HTTPConnection(_HOST, self.port, timeout=30)
        try:
            conn.request("POST", "/moto-api/reset")
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise OSError(f"moto reset failed: HTTP {resp.status}")
        finally:
            conn.close()


# --------------------------------------------------------------------------------------------------
# Fault-injecting proxy
# --------------------------------------------------------------------------------------------------

FaultFilter = Union[None, str, Collection[str], Callable[[str, str, Message], bool]]

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
    }
)

_SINGLE_VALUED = frozenset({"server", "date", "content-type", "etag", "last-modified"})

_SLOWDOWN_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    "<Resource>{resource}</Resource><RequestId>{request_id}</RequestId>"
    "<HostId>faultproxy</HostId></Error>"
)

_CHUNK = 256 * 1024

#: The kinds of request the proxy counts apart (``stats["requests_<kind>"]``, ``stats["bytes_<kind>"]``).
REQUEST_KINDS = ("head", "get", "ranged_get", "list", "put", "other")


def request_kind(method: str, path: str, headers: Message) -> str:
    """One of :data:`REQUEST_KINDS` for an S3 request (path-style addressing, as the local server
    uses: ``/bucket`` or ``/bucket?list-type=2...`` is a bucket, ``/bucket/key`` an object)."""
    if method == "HEAD":
        return "head"
    if method in ("PUT", "POST"):
        return "put"
    if method != "GET":
        return "other"
    parts = urllib.parse.urlsplit(path)
    if "/" not in parts.path.strip("/"):  # a GET of the bucket itself: a listing, or a sub-resource
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        return "list" if not query or {"list-type", "prefix", "delimiter", "continuation-token", "marker"} & query.keys() else "other"
    return "ranged_get" if headers.get("Range") is not None else "get"


def _uniforms(seed: int, key: str, n: int) -> tuple[float, float]:
    digest = hashlib.blake2b(f"{seed}\0{key}\0{n}".encode(), digest_size=16).digest()
    return (
        int.from_bytes(digest[:8], "big") / 2.0**64,
        int.from_bytes(digest[8:], "big") / 2.0**64,
    )


class _ProxyServer(socketserver.TCPServer):
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, proxy: "FaultProxy", address: tuple[str, int]) -> None:
        self.proxy = proxy
        self._conn_lock = threading.Lock()
        self._open_conns: set[socket.socket] = set()
        self._aborted: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        super().__init__(address, _ProxyHandler)

    # One thread per client connection; tracked so close() can unblock and join them.
    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conn_lock:
            self._open_conns.add(request)
            self._threads = [t for t in self._threads if t.is_alive()]
            thread = threading.Thread(
                target=self._process_request_thread,
                args=(request, client_address),
                name=f"FaultProxy:{self.server_address[1]}-conn",
                daemon=True,
            )
            self._threads.append(thread)
        thread.start()

    def _process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def mark_abort(self, request: socket.socket) -> None:
        """Close ``request`` with a TCP RST instead of a FIN once its handler is done."""
        request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with self._conn_lock:
            self._aborted.add(request)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self._open_conns.discard(request)
            abort = request in self._aborted
            self._aborted.discard(request)
        if abort:
            request.close()  # SO_LINGER 0: RST
        else:
            super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("FaultProxy: error while handling %s", client_address, exc_info=True)

    def close_all(self, timeout: float) -> None:
        with self._conn_lock:
            conns = list(self._open_conns)
            threads = list(self._threads)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # unblocks a handler waiting for the next request
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.server_close()


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer
    timeout = 300  # idle keep-alive connections are closed after this long

    def setup(self) -> None:
        # Without TCP_NODELAY, Nagle's algorithm and delayed ACKs add ~40 ms to each response
        # written in more than one send().
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()
        self._upstream: Optional[http.client.HTTPConnection] = None

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self._close_upstream()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("FaultProxy: " + format, *args)

    def _close_upstream(self) -> None:
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None

    # Every method goes through _proxy.
    def do_GET(self) -> None:
        self._proxy()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    # -- request --------------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline(65537)
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _proxy(self) -> None:
        proxy = self.server.proxy
        try:
            body = self._read_body()
        except (OSError, ValueError):
            self.close_connection = True
            return
        if body and self.command in ("PUT", "POST"):
            proxy._count("bytes_put", len(body))
        if proxy.latency_s > 0:
            time.sleep(proxy.latency_s)
        fault = proxy._decide(self.command, self.path, self.headers)
        try:
            if fault == "reset":
                self.close_connection = True
                if proxy.reset_mode == "rst":
                    self.server.mark_abort(self.connection)
                return
            if fault == "error":
                self._send_slowdown()
                return
            self._forward(body, truncate_at=fault if isinstance(fault, float) else None)
        except OSError:  # client went away, or upstream failed after we started answering
            log.debug("FaultProxy: connection error", exc_info=True)
            self.close_connection = True
            self._close_upstream()

    # -- responses ------------------------------------------------------------------------------

    def _head(self, status: int, reason: str, headers: list[tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"{k}: {v}" for k, v in headers]
        lines.append("Connection: close" if self.close_connection else "Connection: keep-alive")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _send_slowdown(self) -> None:
        request_id = hashlib.blake2b(f"{time.monotonic_ns()}{id(self)}".encode(), digest_size=8).hexdigest()
        resource = urllib.parse.urlsplit(self.path).path
        payload = _SLOWDOWN_XML.format(resource=resource, request_id=request_id).encode()
        body = b"" if self.command == "HEAD" else payload
        head = self._head(
            503,
            "Slow Down",
            [
                ("Content-Type", "application/xml"),
                ("Content-Length", str(len(body))),
                ("x-amz-request-id", request_id),
                ("Retry-After", "0"),
            ],
        )
        self.wfile.write(head + body)

    def _send_bad_gateway(self, message: str) -> None:
        body = message.encode()
        head = self._head(502, "Bad Gateway", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        self.wfile.write(head + body)

    def _upstream_response(self, body: bytes) -> http.client.HTTPResponse:
        proxy = self.server.proxy
        dropped = _HOP_BY_HOP | ({"range"} if proxy.ignore_range else set())
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in dropped]
        for attempt in range(2):  # a kept-alive upstream connection may have been closed meanwhile
            fresh = self._upstream is None
            if fresh:
                self._upstream = http.client.HTTPConnection(proxy._up_host, proxy._up_port, timeout=120)
            conn = self._upstream
            try:
                if fresh:
                    conn.connect()
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in headers:
                    conn.putheader(k, v)
                if body or self.command in ("PUT", "POST", "PATCH"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._close_upstream()
                if fresh or attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def _forward(self, body: bytes, truncate_at: Optional[float]) -> None:
        proxy = self.server.proxy
        try:
            resp = self._upstream_response(body)
        except OSError as e:
            self._close_upstream()
            proxy._count("upstream_errors")
            self._send_bad_gateway(f"upstream error: {e!r}")
            return
        no_body = self.command == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        headers = []
        seen_single = set()
        for k, v in resp.getheaders():
            lower = k.lower()
            if lower in _HOP_BY_HOP:
                continue
            if lower in _SINGLE_VALUED:  # moto+werkzeug may send two Server headers, which
                if lower in seen_single:  # aiohttp's strict parser (python -X dev) rejects
                    continue
                seen_single.add(lower)
            headers.append((k, v))
        if no_body:
            resp.read()
            length_header = resp.getheader("Content-Length")
            if length_header is not None:
                headers.append(("Content-Length", length_header))
            self.wfile.write(self._head(resp.status, resp.reason, headers))
            self._finish_upstream(resp)
            return

        length = resp.length  # None when the upstream body is chunked or delimited by close
        if length is None:
            data = resp.read()
            length = len(data)
            chunks: Any = iter([data])
        else:
            chunks = iter(lambda: resp.read(_CHUNK), b"")

        kind = request_kind(self.command, self.path, self.headers)
        kind_bytes = None if kind == "put" else f"bytes_{kind}"  # bytes_put: what the client sent
        cut: Optional[int] = None
        if truncate_at is not None and length > 0 and resp.status in (200, 206):
            cut = int(truncate_at * length)  # 0 <= cut < length
            proxy._count("truncations_injected")

        headers.append(("Content-Length", str(length)))
        head = self._head(resp.status, resp.reason, headers)  # "keep-alive": a drop comes unannounced
        if cut is not None:
            self.close_connection = True
        sent = 0
        for chunk in chunks:
            if cut is not None:
                chunk = chunk[: max(0, cut - sent)]
            if chunk or head:
                # Counted before writing: a client may act on the bytes before the count changes.
                proxy._count("bytes_forwarded", len(chunk))
                if kind_bytes is not None:
                    proxy._count(kind_bytes, len(chunk))
                self.wfile.write(head + chunk)  # the head goes out with the first chunk
                head = b""
                sent += len(chunk)
            if cut is not None and sent >= cut:
                break
        if head:  # empty body
            self.wfile.write(head)
        if cut is not None:
            self._close_upstream()  # the rest of the upstream body was not read
        else:
            self._finish_upstream(resp)

    def _finish_upstream(self, resp: http.client.HTTPResponse) -> None:
        if resp.will_close:
            self._close_upstream()


class FaultProxy:
    """HTTP/1.1 reverse proxy on ``127.0.0.1`` that injects S3-style faults; a context manager.

    See the module docstring for the fault kinds, the determinism guarantee and ``stats``.
    ``error_rate + reset_rate + truncate_rate`` must not exceed 1; one uniform draw per eligible
    request picks at most one fault (reset first, then error, then truncation).
    """

    STAT_KEYS = (
        "requests",
        "errors_injected",
        "resets_injected",
        "truncations_injected",
        "bytes_forwarded",
        "upstream_errors",
        *(f"requests_{kind}" for kind in REQUEST_KINDS),
        *(f"bytes_{kind}" for kind in REQUEST_KINDS),
    )

    def __init__(
        self,
        upstream: str,
        *,
        error_rate: float = 0.0,
        reset_rate: float = 0.0,
        truncate_rate: float = 0.0,
        latency_s: float = 0.0,
        seed: int = 0,
        faults_only_for: FaultFilter = None,
        reset_mode: str = "rst",
        port: int = 0,
        ignore_range: bool = False,
    ) -> None:
        if reset_mode not in ("rst", "close"):
            raise ValueError(f"reset_mode must be 'rst' or 'close', got {reset_mode!r}")
        parts = urllib.parse.urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, got {upstream!r}")
        self.upstream = upstream
        self._up_host = parts.hostname
        self._up_port = parts.port or 80
        self.error_rate = error_rate
        self.reset_rate = reset_rate
        self.truncate_rate = truncate_rate
        self.latency_s = latency_s
        self.seed = seed
        self.faults_only_for = faults_only_for
        self.reset_mode = reset_mode
        self.ignore_range = ignore_range  # forward GETs without Range: 200 and the whole object
        self._requested_port = port
        self._lock = threading.Lock()
        self._attempts: dict[str, int] = {}
        self.stats: dict[str, int] = dict.fromkeys(self.STAT_KEYS, 0)
        #: When a list: ``(kind, path and query, Range header)`` of every request, appended in order
        #: of arrival (which objects a client read, for tests and benchmarks); None: not recorded.
        self.recorded: Optional[list[tuple[str, str, str]]] = None
        self._server: Optional[_ProxyServer] = None
        self._serve_thread: Optional[threading.Thread] = None
        self._thread_prefix: Optional[str] = None

    # -- fault filters ---------------------------------------------------------------------------

    @staticmethod
    def ranged_gets(method: str, path: str, headers: Message) -> bool:
        """``faults_only_for`` predicate: only GET requests with a Range header."""
        return method == "GET" and headers.get("Range") is not None

    def _eligible(self, method: str, path: str, headers: Message) -> bool:
        flt = self.faults_only_for
        if flt is None:
            return method == "GET"
        if isinstance(flt, str):
            return method == flt.upper()
        if callable(flt):
            return bool(flt(method, path, headers))
        return method in {m.upper() for m in flt}

    def _decide(self, method: str, path: str, headers: Message) -> Union[None, str, float]:
        """None (forward), "reset", "error", or a float in [0, 1): truncate the body at that fraction."""
        kind = request_kind(method, path, headers)
        self._count("requests")
        self._count(f"requests_{kind}")
        if self.recorded is not None:
            with self._lock:
                self.recorded.append((kind, urllib.parse.unquote(path), headers.get("Range", "")))
        if not self._eligible(method, path, headers):
            return None
        key = f"{method} {path} {headers.get('Range', '')}"
        with self._lock:
            n = self._attempts.get(key, 0)
            self._attempts[key] = n + 1
        u, frac = _uniforms(self.seed, key, n)
        reset, error, truncate = self.reset_rate, self.error_rate, self.truncate_rate
        if u < reset:
            self._count("resets_injected")
            return "reset"
        if u < reset + error:
            self._count("errors_injected")
            return "error"
        if method == "GET" and u < reset + error + truncate:
            return frac  # counted by the handler only if a body was actually cut
        return None

    def _count(self, key: str, amount: int = 1) -> None:
        with self._lock:
            self.stats[key] += amount

    def reset_stats(self) -> None:
        """Zero ``stats`` and empty ``recorded`` (the per-request attempt counters behind the fault
        choice are kept)."""
        with self._lock:
            for key in self.stats:
                self.stats[key] = 0
            if self.recorded is not None:
                self.recorded.clear()

    def set_rates(
        self,
        *,
        error_rate: Optional[float] = None,
        reset_rate: Optional[float] = None,
        truncate_rate: Optional[float] = None,
        latency_s: Optional[float] = None,
    ) -> None:
        """Change some rates at once (plain attribute assignment works too)."""
        if error_rate is not None:
            self.error_rate = error_rate
        if reset_rate is not None:
            self.reset_rate = reset_rate
        if truncate_rate is not None:
            self.truncate_rate = truncate_rate
        if latency_s is not None:
            self.latency_s = latency_s

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> "FaultProxy":
        if self._server is not None:
            return self
        server = _ProxyServer(self, (_HOST, self._requested_port))
        self._server = server
        self._thread_prefix = f"FaultProxy:{server.server_address[1]}-"
        self._serve_thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"FaultProxy:{server.server_address[1]}-serve",
            daemon=True,
        )
        self._serve_thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting, close all client connections, join all threads, close all sockets."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        assert self._serve_thread is not None
        self._serve_thread.join(timeout)
        self._serve_thread = None
        server.close_all(timeout)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FaultProxy is not started")
        return int(self._server.server_address[1])

    @property
    def endpoint_url(self) -> str:
        return f"http://{_HOST}:{self.port}"

    def threads(self) -> list[threading.Thread]:
        """The proxy's threads that are still alive (for leak checks)."""
        prefix = self._thread_prefix
        return [t for t in threading.enumerate() if prefix and t.name.startswith(prefix)]


def _serve(conn: Any, bucket: str, latencies: dict[str, float]) -> None:
    """The child of :class:`S3ServerProcess`: a server, one proxy per name, and a command loop."""
    with LocalS3Server() as server:
        server.create_bucket(bucket)
        proxies = {name: FaultProxy(server.endpoint_url, latency_s=latency).start() for name, latency in latencies.items()}
        try:
            conn.send({
                "options": server.storage_options(),
                "endpoints": {name: proxy.endpoint_url for name, proxy in proxies.items()},
                "key": server.access_key, "secret": server.secret_key, "region": server.region,
            })
            while True:
                command, *args = conn.recv()
                if command == "stop":
                    return
                if command == "upload":
                    server.upload_dir(*args, in_process=True)
                    conn.send(True)
                elif command == "stats":
                    conn.send(dict(proxies[args[0]].stats))
                elif command == "reset":
                    proxies[args[0]].reset_stats()
                    conn.send(True)
        finally:
            for proxy in proxies.values():
                proxy.close()


class S3ServerProcess:
    """A :class:`LocalS3Server` with named :class:`FaultProxy` s (``{name: latency_s}``) in a spawned
    process, so that benchmarks time the client alone.  ``info`` holds the server's
    ``storage_options``, each proxy's endpoint (``info["endpoints"][name]``) and the credentials;
    :meth:`call` sends ``("upload", local_dir, url)``, ``("stats", name)`` or ``("reset", name)``."""

    def __init__(self, bucket: str, latencies: dict[str, float]) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, bucket, dict(latencies)), daemon=True)
        self.process.start()
        if not self.conn.poll(120):
            self.process.kill()
            raise RuntimeError("the S3 server process did not start (see its output above)")
        self.info: dict[str, Any] = self.conn.recv()

    def options(self, proxy: str) -> dict[str, Any]:
        """``storage_options`` that reach the server through proxy ``proxy``."""
        base = self.info["options"]
        return {**base, "client_kwargs": {**base["client_kwargs"], "endpoint_url": self.info["endpoints"][proxy]}}

    def call(self, *command: Any) -> Any:
        self.conn.send(command)
        return self.conn.recv()

    def stop(self) -> None:
        try:
            self.conn.send(("stop",))
        except OSError:
            pass
        self.process.join(timeout=30)
