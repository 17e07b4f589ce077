"""EpochizeDataset: cuts an endless stream into passes ("virtual epochs") of ``length`` items."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, format_message
from ..pipeline.node import Node
from ..pipeline.passes import PassNode
from ..worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset, share

__all__ = ["EpochizeDataset"]


class EpochizeDataset(BaseWrapperDataset[Any]):
    """Energon's ``EpochizeDataset(dataset, length, worker_config)``: each pass of the rank yields
    ``length`` items (each worker its share) and the next pass continues the stream."""

    def __init__(self, dataset: SavableDataset[Any], length: int, worker_config: WorkerConfig) -> None:
        super().__init__(dataset, worker_config=worker_config)
        if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
            raise ConfigError(format_message("invalid EpochizeDataset(length=...)", expected="a positive integer (items per pass of this rank)", found=repr(length)))
        self.length = length

    def build_worker(self, local_worker_id: int) -> Node:
        return PassNode(self.dataset.build_worker(local_worker_id), share(self.length, self.worker_config.workers_per_rank, local_worker_id), what="items per virtual epoch")

    def worker_length(self, local_worker_id: int) -> int:
        return share(self.length, self.worker_config.workers_per_rank, local_worker_id)

    @property
    def passes_continue(self) -> bool:
        return True

    def _own_config(self) -> dict[str, Any]:
        return {"length": self.length}
