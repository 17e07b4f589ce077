"""The ``aux:`` sources of a crude dataset as the file stores its cooker reads.

Stores are opened once per worker pipeline (in the worker process) and wrapped in the task
encoder's decoder; ``primary`` (the dataset itself) is added when the cooker asks for it. The
loader's cache pool reaches cookers through the pipeline's runtime (``pipeline/runtime.py``):
``TaskEncoder.cache`` returns it.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..cache.base import FileStore
from ..cache.file_store import DecodeFileStore, SystemFileStore, WebdatasetFileStore
from ..errors import ConfigError, DatasetError, format_message
from ..format.metadataset import AuxSource, LeafDataset
from ..policy import PLAIN, Policy
from ..storage import RemotePath, as_path

__all__ = ["PRIMARY", "aux_stores", "decoded"]

#: The cooker argument naming the sample's own dataset.
PRIMARY = "primary"

def decoded(stores: Mapping[str, FileStore], decoder: Any) -> dict[str, FileStore]:
    """``stores`` wrapped in ``decoder`` (as they are when ``decoder`` is None)."""
    if decoder is None:
        return dict(stores)
    return {name: DecodeFileStore(store, decoder=decoder) for name, store in stores.items()}


def aux_stores(leaf: LeafDataset, decoder: Any, *, primary: bool, policy: Policy = PLAIN) -> dict[str, FileStore]:
    """The stores a cooker of ``leaf`` gets as keyword arguments: one per ``aux:`` name, plus
    ``primary`` when asked for (an ``aux:`` source named ``primary`` wins, as in Energon)."""
    stores = {name: _open(source, policy) for name, source in leaf.aux.items()}
    if primary and PRIMARY not in stores:
        stores[PRIMARY] = _open(AuxSource(kind="dataset", path=leaf.path, where=f"{leaf.where} (the primary dataset)"), policy)
    return decoded(stores, decoder)


def _open(source: AuxSource, policy: Policy) -> FileStore:
    if source.kind == "dataset":
        try:
            return WebdatasetFileStore(source.path, policy=policy)
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
