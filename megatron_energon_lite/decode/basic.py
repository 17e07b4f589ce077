"""Decoders for non-media parts: text, ints, JSON, numpy, torch, pickle, msgpack, CBOR.

Each decoder is ``fn(data: bytes, decoder: SampleDecoder) -> value`` and is registered by
extension in :mod:`megatron_energon_lite.decode`. Unpickling runs code stored in the data, so
nothing here unpickles unless :func:`pickle_allowed` says so: the decoder was built with
``allow_pickle=True``, the environment sets ``ENERGON_LITE_TRUST_PICKLE=1`` (for programs you
cannot edit), or the process runs as Energon (``import megatron_energon_lite.as_energon``),
which unpickles like Energon does. Otherwise:

* a ``pkl pickle pyd`` part is refused with :class:`UntrustedDataError` naming the opt-ins
  (``SampleDecoder`` checks this before calling :func:`decode_pickle`);
* ``npy``/``npz`` object arrays fail to decode;
* ``pth`` is read with ``torch.load(weights_only=True)``, which loads tensors and plain containers.

``mp msg msgpack`` and ``cbor`` are decoded when ``msgpack`` (resp. ``cbor2`` or ``cbor``) can be
imported; otherwise they stay bytes (a warning is logged once).

``.gz`` parts are decompressed by :func:`gunzip`, incrementally and up to a byte limit
(``SampleDecoder(max_decompressed_bytes=...)``, :data:`DEFAULT_MAX_DECOMPRESSED_BYTES` = 1 GiB by
default): a small gzip stream can expand a thousandfold (2 MB of zeros -> 2 GiB), so a part that
would grow past the limit is refused with :class:`~megatron_energon_lite.errors.DecompressionBombError`
after at most the limit has been produced, instead of exhausting memory.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import zlib
from typing import TYPE_CHECKING, Any

from .. import energon_mode
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


def bomb_error(what: str, *, expected: str, found: str, fix: str, where: str | None = None) -> DecompressionBombError:
    """A :class:`DecompressionBombError`; ``details`` keeps the pieces so that
    :meth:`SampleDecoder.decode_part` can add where (sample, part, dataset) it happened."""
    error = DecompressionBombError(format_message(what, where=where, expected=expected, found=found, fix=fix))
    error.details = {"what": what, "expected": expected, "found": found, "fix": fix}  # type: ignore[attr-defined]
    return error


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
            raise bomb_error(
                f"gzip data expands past the limit of {max_bytes:,} bytes; refused (a decompression bomb guard)",
                expected=f"at most {max_bytes:,} decompressed bytes (SampleDecoder max_decompressed_bytes)",
                found=f"{len(data):,} compressed bytes that expand to more than {max_bytes:,} bytes",
                fix="if the part is genuine, raise the limit: SampleDecoder(max_decompressed_bytes=<bytes>) as "
                "the task encoder's decoder (None for no limit); otherwise the sample is skipped by the "
                "loader's error policy",
            )
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
    Energon mode (read on every call, so setting the variable after import works)."""
    return decoder.allow_pickle or energon_mode.opted_in(TRUST_PICKLE_ENV)


def decode_npy(data: bytes, decoder: SampleDecoder) -> Any:
    """A numpy array from ``.npy`` bytes; object arrays only when :func:`pickle_allowed`."""
    import numpy as np

    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=pickle_allowed(decoder))


def decode_npz(data: bytes, decoder: SampleDecoder) -> dict[str, Any]:
    """All arrays of an ``.npz`` archive, by name; object arrays only when :func:`pickle_allowed`."""
    import numpy as np

    loaded = np.load(io.BytesIO(data), allow_pickle=pickle_allowed(decoder))
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"expected an npz (zip) archive, found {type(loaded).__name__} data")
    with loaded:
        return {name: loaded[name] for name in loaded.files}


def decode_pth(data: bytes, decoder: SampleDecoder) -> Any:
    """``torch.load`` on CPU; ``weights_only`` unless :func:`pickle_allowed`."""
    import torch

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
