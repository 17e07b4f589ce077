"""The ``aux:`` sources of a crude dataset as the file stores its cooker reads, and the cache
pool that the loader lends to cookers.

Stores are opened once per worker pipeline (in the worker process) and wrapped in the task
encoder's decoder; ``primary`` (the dataset itself) is added when the cooker asks for it. The
loader's pool is *active* in the process that runs the pipeline, the main process included (so
``restore_sample`` works with cookers that need it), and is what ``TaskEncoder.cache`` returns.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..cache.base import CachePool, FileStore
from ..cache.file_store import DecodeFileStore, SystemFileStore, WebdatasetFileStore
from ..errors import ConfigError, DatasetError, format_message
from ..format.metadataset import AuxSource, LeafDataset
from ..storage import RemotePath, as_path

__all__ = ["PRIMARY", "active_cache_pool", "activate_cache_pool", "aux_stores", "decoded"]

#: The cooker argument naming the sample's own dataset.
PRIMARY = "primary"

_active_pool: CachePool | None = None


def activate_cache_pool(pool: CachePool | None) -> None:
    """Makes ``pool`` the one cookers of this process get (``TaskEncoder.cache``)."""
    global _active_pool
    _active_pool = pool


def active_cache_pool() -> CachePool | None:
    return _active_pool


def decoded(stores: Mapping[str, FileStore], decoder: Any) -> dict[str, FileStore]:
    """``stores`` wrapped in ``decoder`` (as they are when ``decoder`` is None)."""
    if decoder is None:
        return dict(stores)
    return {name: DecodeFileStore(store, decoder=decoder) for name, store in stores.items()}


def aux_stores(leaf: LeafDataset, decoder: Any, *, primary: bool) -> dict[str, FileStore]:
    """The stores a cooker of ``leaf`` gets as keyword arguments: one per ``aux:`` name, plus
    ``primary`` when asked for (an ``aux:`` source named ``primary`` wins, as in Energon)."""
    stores = {name: _open(source) for name, source in leaf.aux.items()}
    if primary and PRIMARY not in stores:
        stores[PRIMARY] = _open(AuxSource(kind="dataset", path=leaf.path, where=f"{leaf.where} (the primary dataset)"))
    return decoded(stores, decoder)


def _open(source: AuxSource) -> FileStore:
    if source.kind == "dataset":
        try:
            return WebdatasetFileStore(source.path)
        except DatasetError as exc:
            raise DatasetError(f"{exc}\n  in: {source.where}") from None
    path = as_path(source.path)
    if not isinstance(path, RemotePath) and not path.is_dir():
        raise ConfigError(
            format_message(
                "an aux folder does not exist",
                where=source.where,
                expected="a folder (filesystem://<folder>, relative to the YAML file)",
                found=str(path),
            )
        )
    return SystemFileStore(path)
