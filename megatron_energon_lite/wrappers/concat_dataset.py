"""ConcatDataset: one dataset after the other."""

from __future__ import annotations

from typing import Any

from ..pipeline.concat import ConcatNode
from ..pipeline.node import Node
from ..worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["ConcatDataset"]


class ConcatDataset(BaseWrapperDataset[Any]):
    """Energon's ``ConcatDataset(*datasets, worker_config)``."""

    def __init__(self, *datasets: SavableDataset[Any], worker_config: WorkerConfig) -> None:
        super().__init__(*datasets, worker_config=worker_config)

    def build_worker(self, local_worker_id: int) -> Node:
        return ConcatNode([d.build_worker(local_worker_id) for d in self.datasets])

    def worker_length(self, local_worker_id: int) -> int:
        return sum(d.worker_length(local_worker_id) for d in self.datasets)
