"""Energon's ``metadataset.loader``: ``load_dataset``, ``prepare_metadataset``, ``traverse_metadataset``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..epathlib import EPath
from ...errors import ConfigError, format_message
from ...format.metadata import load_structured
from ...format.metadataset import Blender, is_metadataset_path
from ...storage import as_path
from .loader_interface import DatasetLoaderInterface, TraversedDatasetReference
from .metadataset import DatasetLoader, Metadataset, MetadatasetV2

__all__ = ["load_dataset", "prepare_metadataset", "traverse_metadataset"]


def load_dataset(path: Any, **kwargs: Any) -> DatasetLoaderInterface:
    """A prepared dataset folder, a ``.jsonl`` file or a metadataset YAML, ready for
    ``.get_datasets(training=..., split_part=..., worker_config=...)``. ``kwargs`` (e.g.
    ``dataset_config``, ``split_config``, ``subflavors``) apply to every ``get_datasets`` call."""
    if not is_metadataset_path(path):
        return DatasetLoader(path, **kwargs)
    if isinstance(path, Blender):
        return MetadatasetV2(path, **kwargs)
    raw = path if isinstance(path, Mapping) else load_structured(as_path(path))
    cls_name = raw.get("__class__") if isinstance(raw, Mapping) else None
    if cls_name not in (None, "Metadataset", "MetadatasetV2"):
        raise ConfigError(format_message("unknown metadataset __class__", where=f"{path}: __class__", expected="MetadatasetV2 or Metadataset", found=repr(cls_name)))
    return (MetadatasetV2 if cls_name == "MetadatasetV2" else Metadataset)(path, **kwargs)


def prepare_metadataset(path: Any) -> list[EPath]:
    """Builds the join indices of a metadataset (``energon prepare meta.yaml``); returns the files."""
    return load_dataset(path).prepare()


def traverse_metadataset(path: Any, *, split_part: str) -> list[TraversedDatasetReference]:
    """The leaf datasets of split ``split_part`` with their hierarchy's subflavors and ``aux``
    paths, without opening them (missing datasets are listed too)."""
    return load_dataset(path).traverse(split_part=split_part)
