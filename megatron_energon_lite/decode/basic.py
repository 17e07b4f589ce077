"""Decoders for non-media parts: text, ints, JSON, numpy, torch, pickle, msgpack, CBOR.

Each decoder is ``fn(data: bytes, decoder: SampleDecoder) -> value`` and is registered by
extension in :mod:`megatron_energon_lite.decode`. Unpickling runs code stored in the data, so
nothing here unpickles unless :func:`pickle_allowed` says so: the decoder was built with
``allow_pickle=True``, the environment sets ``ENERGON_LITE_TRUST_PICKLE=1`` (for programs you
cannot edit), or its loader runs as Energon (``import megatron_energon_lite.as_energon``: the
decoder's policy), which unpickles like Energon does. Otherwise:

* a ``pkl pickle pyd`` part is refused with :class:`UntrustedDataError` naming the opt-ins
  (``SampleDecoder`` checks this before calling :func:`decode_pickle`);
* ``npy``/``npz`` object arrays fail to decode;
* ``pth`` is read with ``torch.load(weights_only=True)``, which loads tensors and plain containers.

``mp msg msgpack`` and ``cbor`` are decoded when ``msgpack`` (resp. ``cbor2`` or ``cbor``) can be
imported; otherwise they stay bytes (a warning is logged once).

Every container is bounded by one byte limit, ``SampleDecoder(max_decompressed_bytes=...)``
(:data:`DEFAULT_MAX_DECOMPRESSED_BYTES` = 1 GiB by default), before it takes the memory: a part
that would decode past it is refused with
:class:`~megatron_energon_lite.errors.DecompressionBombError`. Each layer of a part (``.gz``, then
the ``.npy``/``.npz``/``.pth`` inside) is held to the limit on its own.

* ``.gz``: :func:`gunzip` decompresses incrementally and stops once the output passes the limit
  (a small gzip stream can expand a thousandfold: 2 MB of zeros -> 2 GiB);
* ``.npy``: the header's shape times the item size is checked against the limit, and against
  the bytes the part holds, before the array is allocated (a 200-byte header can declare
  petabytes);
* ``.npz``: members must be stored or deflated (what numpy writes); the members' declared sizes,
  each ``.npy`` member's header and the bytes actually inflated all count against one budget
  per part, read in bounded steps (a 1 MB deflated member can hold 1 GiB of zeros);
* ``.pth`` (torch's zip container): the members' declared sizes, which torch allocates before
  inflating, must add up to at most the limit, checked before ``torch.load`` runs.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import math
import pickle
import struct
import zipfile
import zlib
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, DecodeError, DecompressionBombError, format_message

if TYPE_CHECKING:
    from . import SampleDecoder

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "TRUST_PICKLE_ENV",
    "UntrustedDataError",
    "decode_cbor",
    "decode_int",
    "decode_json",
    "decode_msgpack",
    "decode_npy",
    "decode_npz",
    "decode_pickle",
    "decode_pth",
    "decode_text",
    "gunzip",
    "pickle_allowed",
]

#: Set to 1 to unpickle pickle-based parts without editing the program (``allow_pickle=True``).
TRUST_PICKLE_ENV = "ENERGON_LITE_TRUST_PICKLE"


#: Default for ``SampleDecoder(max_decompressed_bytes=...)``: a ``.gz`` part may expand to 1 GiB.
#: Energon (webdataset) has no limit; 1 GiB is far above any text, JSON or array part that a
#: training sample holds, and low enough that a gzip bomb cannot take a worker's memory.
DEFAULT_MAX_DECOMPRESSED_BYTES = 1 << 30

# Output produced per zlib call: the limit bounds the total, this bounds one step's overshoot.
_GUNZIP_STEP = 16 << 20
# Input handed to zlib per call (zlib copies the part it has not used yet on every call).
_GUNZIP_INPUT = 1 << 20
# Bytes read from a zip member per call: small enough to stay in cache on the way to the array
# (16 MiB steps made reading a 32 MB .npz 20% slower than numpy.load).
_ZIP_READ = 1 << 18


def bomb_error(what: str, *, expected: str, found: str, fix: str, where: str | None = None) -> DecompressionBombError:
    """A :class:`DecompressionBombError`; ``details`` keeps the pieces so that
    :meth:`SampleDecoder.decode_part` can add where (sample, part, dataset) it happened."""
    error = DecompressionBombError(format_message(what, where=where, expected=expected, found=found, fix=fix))
    error.details = {"what": what, "expected": expected, "found": found, "fix": fix}  # type: ignore[attr-defined]
    return error


_BYTES_FIX = (
    "if the part is genuine, raise the limit: SampleDecoder(max_decompressed_bytes=<bytes>) as the task "
    "encoder's decoder (None for no limit); otherwise the sample is skipped by the loader's error policy"
)


def _over_byte_limit(what: str, max_bytes: int, found: str) -> DecompressionBombError:
    return bomb_error(
        f"{what} expands past the limit of {max_bytes:,} bytes; refused (a decompression bomb guard)",
        expected=f"at most {max_bytes:,} decompressed bytes (SampleDecoder max_decompressed_bytes)",
        found=found,
        fix=_BYTES_FIX,
    )


class _ByteBudget:
    """The bytes one part may still decode to (``max_bytes``; None: no limit)."""

    __slots__ = ("max_bytes", "used")

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.used = 0

    def take(self, count: int, what: str) -> None:
        """Counts ``count`` more bytes of ``what``; :class:`DecompressionBombError` past the limit."""
        self.used += count
        if self.max_bytes is not None and self.used > self.max_bytes:
            raise _over_byte_limit(what, self.max_bytes, f"{what}: {self.used:,} bytes")


class _CappedReader(io.RawIOBase):
    """A binary stream over ``source`` whose reads count against ``budget``: the bytes actually
    produced, whatever the container declared. ``tell`` is the bytes handed out so far;
    ``peek`` looks ahead without consuming."""

    def __init__(self, source: Any, budget: _ByteBudget, what: str) -> None:
        super().__init__()
        self._source, self._budget, self._what = source, budget, what
        self._pending = b""  # peeked, not yet handed out
        self._position = 0

    def readable(self) -> bool:
        return True

    def _pull(self, size: int) -> bytes:
        data = self._source.read(min(size, _ZIP_READ))
        self._budget.take(len(data), self._what)
        return data

    def peek(self, size: int) -> bytes:
        while len(self._pending) < size:
            data = self._pull(size - len(self._pending))
            if not data:
                break
            self._pending += data
        return self._pending[:size]

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._pending:
            data, self._pending = self._pending[: len(view)], self._pending[len(view) :]
        else:
            data = self._pull(len(view))
        view[: len(data)] = data
        self._position += len(data)
        return len(data)

    def readall(self) -> bytes:
        chunks = [self._pending]
        self._pending = b""
        while chunk := self._pull(_ZIP_READ):
            chunks.append(chunk)
        data = b"".join(chunks)
        self._position += len(data)
        return data

    def tell(self) -> int:
        return self._position


def gunzip(data: bytes, max_bytes: int | None = DEFAULT_MAX_DECOMPRESSED_BYTES) -> bytes:
    """The decompressed content of a gzip stream (several members are concatenated, NUL padding
    between them is skipped, as :func:`gzip.decompress` does), produced incrementally.

    Raises :class:`~megatron_energon_lite.errors.DecompressionBombError` as soon as the output
    would exceed ``max_bytes`` (None: no limit), having held at most about ``max_bytes`` of output;
    ``zlib.error`` / ``EOFError`` for a corrupt or truncated stream.
    """
    chunks: list[bytes] = []
    total = 0
    stream = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip header and trailer only
    pos, tail = 0, b""

    def produce(piece: bytes) -> bytes:
        """Decompresses ``piece`` (b"": what zlib still holds) within the limit."""
        nonlocal total
        step = _GUNZIP_STEP if max_bytes is None else min(_GUNZIP_STEP, max_bytes - total + 1)
        chunk = stream.decompress(piece, step)
        total += len(chunk)
        if max_bytes is not None and total > max_bytes:
            raise _over_byte_limit("gzip data", max_bytes, f"{len(data):,} compressed bytes that expand to more than {max_bytes:,} bytes")
        chunks.append(chunk)
        return chunk

    while True:
        if not tail:  # the input goes in in pieces, so that what zlib keeps of it stays small
            if pos >= len(data):
                break
            tail = data[pos : pos + _GUNZIP_INPUT]
            pos += len(tail)
        if stream.eof:  # the next member, after optional NUL padding
            tail = tail.lstrip(b"\x00")
            if not tail:
                continue
            stream = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        produce(tail)
        tail = stream.unused_data if stream.eof else stream.unconsumed_tail
    while data and not stream.eof:  # the output zlib still holds, up to the end of the member
        if not produce(b""):
            raise EOFError("compressed data ended before the end-of-stream marker was reached")
    return b"".join(chunks)


class UntrustedDataError(DecodeError, ConfigError):
    """A part needs unpickling, which runs code stored in the dataset, and nothing allowed it.

    A :class:`DecodeError` that is also a :class:`ConfigError`: every sample with such a part
    would fail the same way, so the loader stops at the first one instead of skipping them all.
    """


logger = logging.getLogger(__name__)

_warned: set[str] = set()


def _warn_once(topic: str, message: str, *args: Any) -> None:
    if topic not in _warned:
        _warned.add(topic)
        logger.warning(message, *args)


def decode_text(data: bytes, decoder: SampleDecoder) -> str:
    """UTF-8 text (``txt text transcript``)."""
    return data.decode("utf-8")


def decode_int(data: bytes, decoder: SampleDecoder) -> int:
    """A decimal integer, surrounding whitespace allowed (``cls cls2 index inx id``)."""
    return int(data)


def decode_json(data: bytes, decoder: SampleDecoder) -> Any:
    """Parsed JSON (``json jsn``)."""
    return json.loads(data)


def pickle_allowed(decoder: SampleDecoder) -> bool:
    """Whether ``decoder`` may unpickle: ``allow_pickle=True``, ``ENERGON_LITE_TRUST_PICKLE=1`` or
    Energon's policy (read on every call, so setting the variable after import works)."""
    return decoder.allow_pickle or decoder.policy.opted_in(TRUST_PICKLE_ENV)


def decode_npy(data: bytes, decoder: SampleDecoder) -> Any:
    """A numpy array from ``.npy`` bytes; object arrays only when :func:`pickle_allowed`. The
    header's declared size is checked (limit, bytes present) before the array is allocated."""
    stream = io.BytesIO(data)
    return _read_npy(stream, decoder.max_decompressed_bytes, allow_pickle=pickle_allowed(decoder), available=len(data), what="the .npy array")


def _npy_header(stream: Any) -> tuple[tuple[int, ...], bool, Any]:
    """``(shape, fortran_order, dtype)`` from the ``.npy`` header at the stream's position."""
    import numpy as np

    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(stream)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(stream)
    if version != (3, 0):
        raise ValueError(f"unsupported .npy format version {version}")
    # 3.0 is 2.0 with a UTF-8 header (numpy has no public reader for it).
    (length,) = struct.unpack("<I", stream.read(4))
    if length > 10_000:  # numpy's own bound on a header
        raise ValueError(f".npy header of {length:,} bytes is too large to read safely")
    header = stream.read(length)
    fields = ast.literal_eval(header.decode("utf-8")) if len(header) == length else None
    if not isinstance(fields, dict) or fields.keys() != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"malformed .npy header {header[:200]!r}")
    shape, fortran = fields["shape"], fields["fortran_order"]
    if not isinstance(shape, tuple) or not all(isinstance(n, int) for n in shape) or not isinstance(fortran, bool):
        raise ValueError(f"malformed .npy header {header[:200]!r}")
    return shape, fortran, np.lib.format.descr_to_dtype(fields["descr"])


def _read_npy(stream: Any, max_bytes: int | None, *, allow_pickle: bool, available: int | None = None, what: str = "the .npy array") -> Any:
    """The array of the ``.npy`` data at the stream's position.

    The header's shape times the item size must be at most ``max_bytes`` (None: no limit), else
    :class:`DecompressionBombError`, and at most ``available`` (the bytes the data can hold, when
    known), else a truncated-data ``ValueError``; both before the array is allocated. Object
    arrays are unpickled only with ``allow_pickle`` (their size is not known before).
    """
    import numpy as np

    shape, fortran, dtype = _npy_header(stream)
    if dtype.hasobject:
        if not allow_pickle:
            raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
        return pickle.load(stream)
    if any(n < 0 for n in shape):
        raise ValueError(f"the .npy header declares a negative dimension: shape {shape}")
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    declared = f"{what} declares shape {shape} of {dtype} = {nbytes:,} bytes"
    if max_bytes is not None and nbytes > max_bytes:
        raise _over_byte_limit(what, max_bytes, declared + " (refused before allocating it)")
    if available is not None and nbytes > available - stream.tell():
        raise ValueError(f"{declared}, but only {max(available - stream.tell(), 0):,} bytes follow the header (truncated data)")
    flat = np.empty(count, dtype)
    buffer = memoryview(flat.view(np.uint8)) if nbytes else memoryview(b"")
    filled = 0
    while filled < nbytes:
        read = stream.readinto(buffer[filled : filled + _GUNZIP_STEP])
        if not read:
            raise EOFError(f"{declared}, but the data ends after {filled:,} of them (truncated)")
        filled += read
    return flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)


#: Zip compression methods read in bounded steps (what numpy and torch write).
_ZIP_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})


def _zip_members(data: bytes, budget: _ByteBudget, what: str) -> tuple[zipfile.ZipFile, list[zipfile.ZipInfo]]:
    """The archive and its members, once their declared sizes fit ``budget`` and each member's
    compression is one read in bounded steps (bzip2/lzma members are inflated in one call by
    :mod:`zipfile`, which no limit could stop)."""
    archive = zipfile.ZipFile(io.BytesIO(data))
    members = archive.infolist()
    for info in members:
        if info.compress_type not in _ZIP_METHODS:
            raise ValueError(f"member {info.filename!r} of {what} uses zip compression method {info.compress_type}; only stored and deflated members are read")
    budget.take(sum(info.file_size for info in members), f"{what} (the declared sizes of its {len(members)} member{'s' if len(members) != 1 else ''})")
    return archive, members


def decode_npz(data: bytes, decoder: SampleDecoder) -> dict[str, Any]:
    """All arrays of an ``.npz`` archive, by name (as ``numpy.load``: ``.npy`` members without
    the suffix as arrays, other members as bytes); object arrays only when :func:`pickle_allowed`.

    Bounded by ``max_decompressed_bytes`` for the whole archive: the declared member sizes, each
    array's header and the bytes actually inflated, before they are allocated."""
    import numpy as np

    if not data.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        raise ValueError("expected an npz (zip) archive, found data without a zip signature")
    declared, inflated = _ByteBudget(decoder.max_decompressed_bytes), _ByteBudget(decoder.max_decompressed_bytes)
    archive, members = _zip_members(data, declared, "the npz archive")
    result: dict[str, Any] = {}
    with archive:
        for info in members:
            what = f"member {info.filename!r} of the npz archive"
            with archive.open(info) as member:
                stream = _CappedReader(member, inflated, what)
                name = info.filename.removesuffix(".npy")
                if stream.peek(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX:
                    # The declared sizes fit the limit: an array within its member's fits too.
                    result[name] = _read_npy(stream, inflated.max_bytes, allow_pickle=pickle_allowed(decoder), available=info.file_size, what=what)
                    while stream.read(_ZIP_READ):  # to the member's end, where zipfile checks its CRC
                        pass
                else:
                    result[name] = stream.read()
    return result


def decode_pth(data: bytes, decoder: SampleDecoder) -> Any:
    """``torch.load`` on CPU; ``weights_only`` unless :func:`pickle_allowed`. A zip container
    (what ``torch.save`` writes) is refused if its members' declared sizes, which torch allocates
    before inflating them, add up to more than ``max_decompressed_bytes``."""
    import torch

    if data.startswith(b"PK\x03\x04"):  # torch's own test for its zip format
        with _zip_members(data, _ByteBudget(decoder.max_decompressed_bytes), "the torch zip archive")[0]:
            pass
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=not pickle_allowed(decoder))


def decode_pickle(data: bytes, decoder: SampleDecoder) -> Any:
    """``pickle.loads``; :class:`~megatron_energon_lite.decode.SampleDecoder` calls it only
    once :func:`pickle_allowed` (or refuses the part with :class:`UntrustedDataError`)."""
    if not pickle_allowed(decoder):  # called directly: refuse here too
        raise UntrustedDataError(f"unpickling is not allowed: pass SampleDecoder(allow_pickle=True) or set {TRUST_PICKLE_ENV}=1")
    return pickle.loads(data)


def decode_msgpack(data: bytes, decoder: SampleDecoder) -> Any:
    """msgpack (``mp msg msgpack``) if the ``msgpack`` package is installed, else the bytes."""
    try:
        import msgpack
    except ImportError:
        _warn_once("msgpack", "msgpack parts are left as bytes: the msgpack package is not installed (pip install msgpack)")
        return data
    return msgpack.unpackb(data)


def decode_cbor(data: bytes, decoder: SampleDecoder) -> Any:
    """CBOR if ``cbor2`` (or the older ``cbor``) is installed, else the bytes."""
    try:
        import cbor2 as cbor
    except ImportError:
        try:
            import cbor  # type: ignore[import-not-found, no-redef]
        except ImportError:
            _warn_once("cbor", "cbor parts are left as bytes: neither cbor2 nor cbor is installed (pip install cbor2)")
            return data
    return cbor.loads(data)
