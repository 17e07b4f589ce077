"""ShuffleBufferDataset: shuffles through a buffer of ``size`` samples (keys saved, not samples)."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, format_message
from ..pipeline.node import Node
from ..pipeline.shuffle import ShuffleBufferNode
from ..worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["ShuffleBufferDataset"]


class ShuffleBufferDataset(BaseWrapperDataset[Any]):
    """Energon's ``ShuffleBufferDataset(dataset, size, *, worker_config)``."""

    def __init__(self, dataset: SavableDataset[Any], size: int, *, worker_config: WorkerConfig) -> None:
        super().__init__(dataset, worker_config=worker_config)
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ConfigError(format_message("invalid ShuffleBufferDataset(size=...)", expected="a positive integer", found=repr(size)))
        self.size = size

    def build_worker(self, local_worker_id: int) -> Node:
        return ShuffleBufferNode(self.dataset.build_worker(local_worker_id), self.size, seed=self.worker_config.worker_seed(local_worker_id))

    def _own_config(self) -> dict[str, Any]:
        return {"size": self.size}
