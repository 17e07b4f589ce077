"""Energon's ``flavors.base_dataset``: the dataset factory base, plus the sample and dataset bases.

A *dataset factory* is one dataset split, configured but not yet read: ``len()`` is its number of
samples over all ranks and ``build()`` gives the dataset that yields them on each worker. It is
what ``get_dataset_from_config`` returns and what a task encoder's ``build_train_datasets`` /
``build_val_datasets`` receive as ``LoadedDataset.dataset``.
"""

from __future__ import annotations

import abc
from typing import Any, Generic, TypeVar

from ...cache.file_store import WebdatasetFileStore
from ...energon_mode import current_policy
from ...errors import NotSupportedError, format_message
from ...format.dataset_config import DatasetFactory
from ...samples import Sample, _pin
from ..wrappers.base import SavableDataset

T_sample = TypeVar("T_sample")

__all__ = ["BaseCoreDatasetFactory", "PinMemoryMixin", "Sample", "SavableDataset"]


class PinMemoryMixin:
    """Energon's mixin for batch types: ``pin_memory()`` pins the tensors of every field.

    Our :class:`Sample` has this already; the mixin is for classes that are not samples.
    """

    def pin_memory(self) -> Any:
        return _pin(self)


class BaseCoreDatasetFactory(Generic[T_sample], DatasetFactory, abc.ABC):
    """One dataset split, configured but not yet read (Energon's ``BaseCoreDatasetFactory``).

    A :class:`~megatron_energon_lite.format.dataset_config.DatasetFactory`: a ``dataset.yaml`` may
    name a subclass with ``__module__``/``__class__``."""

    #: The type of the samples the built dataset yields.
    __sample_type__: type = None  # type: ignore[assignment]
    #: Free-form labels of the dataset (``dataset.yaml`` and the metadataset merged).
    subflavors: dict[str, Any]

    @abc.abstractmethod
    def build(self, worker_rotation_offset: int = 0) -> SavableDataset[T_sample]:
        """The dataset that yields this split's samples on each dataloader worker."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Samples of the split over all ranks (its subset applied)."""

    def as_file_store(self) -> Any:
        """This dataset as a random-access file store (the ``primary`` of a cooker), read by tar
        member name ``"<sample key>.<part>"``."""
        path = getattr(self, "path", None)
        if path is None:
            raise NotSupportedError(
                format_message(f"{type(self).__name__}.as_file_store: this dataset has no prepared folder to read files from")
            )
        return WebdatasetFileStore(path, policy=current_policy())
