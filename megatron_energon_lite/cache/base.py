"""Auxiliary data: file stores, lazy references and the cache pool interface.

A *file store* gives random access to the files of one source by name: another prepared dataset
(``"<sample key>.<part>"``), a plain folder (a relative path), or the sample's own dataset
(:class:`PrimaryFileStore`, where ``".txt"`` means the current sample's ``txt`` part). A cooker
receives one store per ``aux:`` name of its metadataset entry and reads with
``store.get(name, sample)``, which also appends where the bytes came from to the sample's
``__sources__``.

A *lazy* reference (:class:`Lazy`) names a file to be read later, e.g. by ``encode_sample`` after
the cache pool (:class:`CachePool`) fetched it in the background. Lazies live inside a worker
process: they hold open stores and are resolved before an item leaves the worker.

Energon's names and import paths (``megatron.energon.cache``) are kept; the behaviour differs where
Energon's is a bug (see each class).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from ..errors import NotSupportedError, format_message
from ..source_info import SourceInfo, add_source_info

if TYPE_CHECKING:
    from ..format.media_types import MediaMetadataBase

__all__ = [
    "CachePool",
    "FileStore",
    "FileStoreDecoder",
    "FileStoreWrapper",
    "Lazy",
    "MockLazy",
    "PrimaryFileStore",
]

T = TypeVar("T")


class FileStore(Generic[T]):
    """Random access to the files of one source by name.

    Subclasses implement ``__getitem__(name) -> (data, SourceInfo)`` and ``get_path()``.
    ``_get_raw``/``_decode_raw`` split a read into its bytes and their decoding, so that a cache
    pool can store the bytes and decode them when they are used.
    """

    def __getitem__(self, key: str) -> tuple[T, SourceInfo]:
        raise NotImplementedError

    def _get_raw(self, key: str) -> tuple[bytes, SourceInfo]:
        """The undecoded bytes of ``key``; a plain store's items are its bytes."""
        return self[key]  # type: ignore[return-value]

    def _decode_raw(self, data: bytes, **kwargs: Any) -> T:
        """Decodes what :meth:`_get_raw` returned (``fname=`` names the file)."""
        return data  # type: ignore[return-value]

    def get(self, key: str, sample: Any = None) -> T:
        """Reads ``key``; appends its source to ``sample``'s ``__sources__`` when given."""
        data, source_info = self[key]
        add_source_info(sample, source_info)
        return data

    def get_path(self) -> str:
        """The source's path (a folder, a dataset, a URL): identifies the store in caches and configs."""
        raise NotImplementedError

    def get_media_metadata(self, key: str) -> MediaMetadataBase:
        raise NotSupportedError(
            format_message(
                f"{type(self).__name__} has no media metadata",
                where=f"{self.get_path()!s}: {key!r}",
                fix="media metadata comes from a prepared dataset (energon-lite prepare "
                "--media-metadata-by-extension) or a folder (energon-lite prepare-media)",
            )
        )

    def __str__(self) -> str:
        return f"{type(self).__name__}(path={self.get_path()!r})"

    def __repr__(self) -> str:  # so lazies and messages that repr a store name its source
        return str(self)


class FileStoreWrapper(FileStore[T]):
    """A store that adds behaviour to another; raw reads and media metadata go to the inner one."""

    def __init__(self, inner: FileStore) -> None:
        self._inner = inner

    def __getitem__(self, key: str) -> tuple[T, SourceInfo]:
        return self._inner[key]

    def _get_raw(self, key: str) -> tuple[bytes, SourceInfo]:
        return self._inner._get_raw(key)

    def _decode_raw(self, data: bytes, **kwargs: Any) -> T:
        return self._inner._decode_raw(data, **kwargs)

    def get_path(self) -> str:
        return self._inner.get_path()

    def get_media_metadata(self, key: str) -> MediaMetadataBase:
        return self._inner.get_media_metadata(key)

    def __str__(self) -> str:
        return f"{type(self).__name__}(inner={self._inner})"


class FileStoreDecoder(abc.ABC):
    """Decodes one file's bytes, choosing the decoder by the file name's extension."""

    @abc.abstractmethod
    def decode(self, fname: str, data: bytes) -> Any: ...


class PrimaryFileStore(FileStoreWrapper[T]):
    """The sample's own dataset: a name starting with ``.`` is a part of the current sample
    (``".txt"`` -> ``"<key>.txt"``); any other name is read as it is.

    Unlike Energon, raw reads (those of a cache pool) expand the name too.
    """

    def __init__(self, inner: FileStore, current_key: str) -> None:
        super().__init__(inner)
        self._current_key = current_key

    def _full(self, key: str) -> str:
        return f"{self._current_key}{key}" if key.startswith(".") else key

    def __getitem__(self, key: str) -> tuple[T, SourceInfo]:
        return self._inner[self._full(key)]

    def _get_raw(self, key: str) -> tuple[bytes, SourceInfo]:
        return self._inner._get_raw(self._full(key))

    def _decode_raw(self, data: bytes, **kwargs: Any) -> T:
        if "fname" in kwargs:
            kwargs = {**kwargs, "fname": self._full(kwargs["fname"])}
        return self._inner._decode_raw(data, **kwargs)

    def get(self, key: str, sample: Any = None) -> T:
        return self._inner.get(self._full(key), sample)

    def get_media_metadata(self, key: str) -> MediaMetadataBase:
        return self._inner.get_media_metadata(self._full(key))


@dataclass(kw_only=True, eq=False)
class Lazy(Generic[T]):
    """A file of ``ds`` to be read later with :meth:`get`; equal lazies name the same file of
    the same store."""

    ds: FileStore
    fname: str
    pool: CachePool

    def get(self, sample: Any = None) -> T:
        """The data, read now if not yet; appends its source to ``sample``'s ``__sources__``."""
        raise NotImplementedError

    def __hash__(self) -> int:
        return hash((id(self.ds), self.fname))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lazy) and self.ds is other.ds and self.fname == other.fname


class MockLazy(Lazy[T]):
    """A lazy whose data comes from ``get_fn(fname)`` (tests, and :meth:`NoCachePool.to_cache`)."""

    def __init__(self, fname: str, get_fn: Callable[[str], T]) -> None:
        self.ds = None
        self.pool = None
        self.fname = fname
        self.get_fn = get_fn

    def get(self, sample: Any = None) -> T:
        return self.get_fn(self.fname)

    def __hash__(self) -> int:
        return hash((self.fname, self.get_fn))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MockLazy) and self.fname == other.fname and self.get_fn == other.get_fn

    def __repr__(self) -> str:
        return f"MockLazy(fname={self.fname!r}, get_fn={self.get_fn!r})"


class CachePool(abc.ABC):
    """Reads auxiliary files for cookers, now (:meth:`get`) or later (:meth:`get_lazy`)."""

    @abc.abstractmethod
    def get(self, ds: FileStore, fname: str, sample: Any = None) -> Any:
        """Reads ``fname`` of ``ds`` now; appends its source to ``sample``."""

    @abc.abstractmethod
    def get_lazy(self, ds: FileStore, fname: str) -> Lazy:
        """A reference to ``fname`` of ``ds``, possibly fetched in the background."""

    @abc.abstractmethod
    def to_cache(self, data: T, name: str) -> Lazy[T]:
        """Moves ``data`` out of memory until it is needed (``name`` is for messages only)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stops background work; the pool cannot be used afterwards."""
