"""Energon's ``metadataset.loader_interface``: what loading a dataset or metadataset gives."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

from ..epathlib import EPath
from ...worker import WorkerConfig
from ..wrappers.compose import DatasetBlendMode, LoadedDataset

__all__ = ["DatasetBlendMode", "DatasetLoaderInterface", "LoadedDataset", "LoadedDatasetList", "TraversedDatasetReference"]


@dataclasses.dataclass
class LoadedDatasetList:
    """The datasets of one split and how a training pipeline combines them."""

    datasets: list[LoadedDataset]
    blend_mode: DatasetBlendMode = DatasetBlendMode.NONE


@dataclasses.dataclass
class TraversedDatasetReference:
    """One leaf dataset of a metadataset split, without opening it (``traverse_metadataset``).

    ``subflavors`` are those of the metadataset levels only (not the dataset's ``dataset.yaml``).
    """

    path: EPath
    split_part: str
    aux: dict[str, EPath]
    subflavors: dict[str, Any]


class DatasetLoaderInterface(abc.ABC):
    """A dataset folder or a metadataset, as ``load_dataset`` returns it."""

    @abc.abstractmethod
    def get_datasets(
        self,
        *,
        training: bool,
        split_part: str,
        worker_config: WorkerConfig,
        subflavors: dict[str, Any] | None = None,
        shuffle_over_epochs_multiplier: int | None = 1,
        **kwargs: Any,
    ) -> LoadedDatasetList:
        """The datasets of split ``split_part``, as factories with their blend weights."""

    @abc.abstractmethod
    def traverse(self, *, split_part: str) -> list[TraversedDatasetReference]:
        """The leaf datasets of split ``split_part`` (not opened)."""

    def prepare(self, split_part: str | None = None) -> list[EPath]:
        """Builds what loading needs beyond the prepared datasets (join indices); returns the
        files written."""
        return []

    def post_initialize(self, mds_path: EPath | None = None) -> None:
        """Energon's second construction step; nothing to do here."""
