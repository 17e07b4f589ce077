"""Energon's JSONL dataset factories: a prepared ``.jsonl`` file, one crude sample per line."""

from __future__ import annotations

from typing import Any

from ...format.jsonl import write_jsonl_index
from ...samples import CrudeSample
from .webdataset.default_generic_webdataset import DefaultGenericWebdatasetFactory

__all__ = ["CrudeJsonlDatasetFactory", "DefaultCrudeJsonlDatasetFactory"]


class CrudeJsonlDatasetFactory(DefaultGenericWebdatasetFactory[CrudeSample]):
    """A ``.jsonl`` file (prepared: its ``.idx`` next to it): each line is a :class:`CrudeSample`
    with the parsed object under ``"json"``. The file is one shard; ``split_part`` is ignored
    (Energon's ``split_part`` for JSONL is always the whole file)."""

    __sample_type__ = CrudeSample

    def __init__(self, path: Any, *, split_part: str = "train", **kwargs: Any) -> None:
        super().__init__(path, split_part=split_part, **kwargs)

    @staticmethod
    def prepare_dataset(path: Any) -> int:  # type: ignore[override]
        """Writes the ``.idx`` of the JSONL file at ``path``; returns its number of samples."""
        return write_jsonl_index(str(path))


class DefaultCrudeJsonlDatasetFactory(CrudeJsonlDatasetFactory):
    """Energon's name for the factory that ``get_train_dataset("file.jsonl", ...)`` uses."""
