"""Decoders for non-media parts: text, ints, JSON, numpy, torch, pickle, msgpack, CBOR.

Each decoder is ``fn(data: bytes, decoder: SampleDecoder) -> value`` and is registered by
extension in :mod:`megatron_energon_lite.decode`. Nothing here unpickles unless the decoder was
built with ``allow_pickle=True``:

* ``pkl pickle pyd`` parts are returned as the raw bytes (a warning is logged once);
* ``npy``/``npz`` object arrays fail to decode;
* ``pth`` is read with ``torch.load(weights_only=True)``, which loads tensors and plain containers.

``mp msg msgpack`` and ``cbor`` are decoded when ``msgpack`` (resp. ``cbor2`` or ``cbor``) can be
imported; otherwise they stay bytes (a warning is logged once).
"""

from __future__ import annotations

import io
import json
import logging
import pickle
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import SampleDecoder

__all__ = [
    "decode_cbor",
    "decode_int",
    "decode_json",
    "decode_msgpack",
    "decode_npy",
    "decode_npz",
    "decode_pickle",
    "decode_pth",
    "decode_text",
]

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


def decode_npy(data: bytes, decoder: SampleDecoder) -> Any:
    """A numpy array from ``.npy`` bytes; object arrays only with ``allow_pickle=True``."""
    import numpy as np

    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=decoder.allow_pickle)


def decode_npz(data: bytes, decoder: SampleDecoder) -> dict[str, Any]:
    """All arrays of an ``.npz`` archive, by name; object arrays only with ``allow_pickle=True``."""
    import numpy as np

    loaded = np.load(io.BytesIO(data), allow_pickle=decoder.allow_pickle)
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"expected an npz (zip) archive, found {type(loaded).__name__} data")
    with loaded:
        return {name: loaded[name] for name in loaded.files}


def decode_pth(data: bytes, decoder: SampleDecoder) -> Any:
    """``torch.load`` on CPU; ``weights_only`` unless ``allow_pickle=True``."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=not decoder.allow_pickle)


def decode_pickle(data: bytes, decoder: SampleDecoder) -> Any:
    """Unpickled only with ``allow_pickle=True``; otherwise the bytes, unchanged."""
    if not decoder.allow_pickle:
        _warn_once(
            "pickle",
            "pickle parts (pkl/pickle/pyd) are left as bytes: unpickling runs code from the dataset. "
            "Pass SampleDecoder(allow_pickle=True) if you trust the data.",
        )
        return data
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
