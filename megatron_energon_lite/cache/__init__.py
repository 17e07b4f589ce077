"""Energon's ``megatron.energon.cache``: auxiliary data (file stores, cache pools, lazy references).

See :mod:`.base` for the model; :mod:`.file_store` for the stores of ``aux:`` sources,
:mod:`.no_cache` and :mod:`.file_cache_pool` for the pools.
"""

from .base import (
    CachePool,
    FileStore,
    FileStoreDecoder,
    FileStoreWrapper,
    Lazy,
    MockLazy,
    PrimaryFileStore,
)
from .file_cache_pool import CacheFileLazy, FileCacheLazy, FileStoreCachePool
from .file_store import DecodeFileStore, SystemFileStore, WebdatasetFileStore
from .no_cache import DirectLazy, NoCachePool

__all__ = [
    "CacheFileLazy",
    "CachePool",
    "DecodeFileStore",
    "DirectLazy",
    "FileCacheLazy",
    "FileStore",
    "FileStoreCachePool",
    "FileStoreDecoder",
    "FileStoreWrapper",
    "Lazy",
    "MockLazy",
    "NoCachePool",
    "PrimaryFileStore",
    "SystemFileStore",
    "WebdatasetFileStore",
]
