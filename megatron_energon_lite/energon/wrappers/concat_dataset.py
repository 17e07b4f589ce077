"""ConcatDataset: one dataset after the other."""

from __future__ import annotations

from typing import Any

from ...pipeline.recipe import Concat
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["ConcatDataset"]


class ConcatDataset(BaseWrapperDataset[Any], Concat[Any]):
    """Energon's ``ConcatDataset(*datasets, worker_config)``."""

    def __init__(self, *datasets: SavableDataset[Any], worker_config: WorkerConfig) -> None:
        super().__init__(*datasets, worker_config=worker_config)
