"""Energon's ``megatron.energon.cache.base`` names: auxiliary data (``aux:`` sources, file stores,
cache pools, lazy references) is not supported yet.

The names exist so that code importing them loads; using one raises :class:`NotSupportedError`
saying so. Auxiliary data is the next planned feature.
"""

from __future__ import annotations

from typing import Any

from ..errors import NotSupportedError, format_message

__all__ = [
    "CachePool",
    "DecodeFileStore",
    "DirectLazy",
    "FileCacheLazy",
    "FileStore",
    "FileStoreCachePool",
    "FileStoreDecoder",
    "Lazy",
    "MockLazy",
    "NoCachePool",
    "PrimaryFileStore",
    "SystemFileStore",
]


class _NotYetSupported:
    """Refuses construction with a message naming the class."""

    def __class_getitem__(cls, item: Any) -> type:  # Energon's classes are generic: Lazy[str]
        return cls

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotSupportedError(
            format_message(
                f"{type(self).__name__}: auxiliary data (aux: sources, file stores, cache pools, lazy references) is not supported yet",
                fix="read the data from the sample itself (a cooker can build it from the sample's parts); pass cache_pool=None to the loader",
            )
        )


class FileStore(_NotYetSupported):
    """Energon: random access to files of a dataset or folder by name."""


class FileStoreDecoder(_NotYetSupported):
    """Energon: decodes what a file store returns."""


class DecodeFileStore(FileStore):
    """Energon: a file store that decodes what it reads."""


class SystemFileStore(FileStore):
    """Energon: a file store over a plain folder (``filesystem://``)."""


class PrimaryFileStore(FileStore):
    """Energon: the sample's own dataset as a file store."""


class Lazy(_NotYetSupported):
    """Energon: a reference to a file that is read when needed."""


class DirectLazy(Lazy):
    """Energon: a lazy reference read directly from its store."""


class FileCacheLazy(Lazy):
    """Energon: a lazy reference read through a cache pool."""


class MockLazy(Lazy):
    """Energon: a lazy reference with a fixed value, for tests."""


class CachePool(_NotYetSupported):
    """Energon: fetches auxiliary files in the background into a bounded local cache."""


class FileStoreCachePool(CachePool):
    """Energon: a cache pool over file stores."""


class NoCachePool(CachePool):
    """Energon: reads auxiliary files directly, without caching."""
