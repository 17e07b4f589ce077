"""Energon's ``task_encoder.loader``: the dataset constructors, with ``get_val_datasets`` giving
each validation dataset's factory as Energon does."""

from __future__ import annotations

from typing import Any

from ...loader import api
from ...loader.api import get_train_dataset, get_val_dataset
from ...pipeline.recipe import Recipe
from ..flavors.base_dataset import BaseCoreDatasetFactory
from ..wrappers.compose import loaded_datasets

__all__ = ["get_train_dataset", "get_val_dataset", "get_val_datasets"]


def get_val_datasets(path, *, split_part: str = "val", **kwargs: Any) -> list[tuple[Recipe, BaseCoreDatasetFactory]]:
    """Energon's ``get_val_datasets``: one validation dataset per leaf dataset, not concatenated,
    each with the factory of its dataset (``factory.path``, ``factory.subflavors``, ...), the one
    a task encoder's ``build_val_datasets`` receives.  Takes :func:`get_val_dataset`'s arguments."""
    entries = api.get_val_datasets(path, split_part=split_part, **kwargs)
    return [(dataset, loaded_datasets(dataset.spec)[0].dataset) for dataset, _ in entries]
