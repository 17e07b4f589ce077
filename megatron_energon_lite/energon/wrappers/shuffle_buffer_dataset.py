"""ShuffleBufferDataset: shuffles through a buffer of ``size`` samples (keys saved, not samples)."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError, format_message
from ...pipeline.recipe import Shuffle
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["ShuffleBufferDataset"]


class ShuffleBufferDataset(BaseWrapperDataset[Any], Shuffle[Any]):
    """Energon's ``ShuffleBufferDataset(dataset, size, *, worker_config)``."""

    def __init__(self, dataset: SavableDataset[Any], size: int, *, worker_config: WorkerConfig) -> None:
        super().__init__(dataset, worker_config=worker_config)
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ConfigError(format_message("invalid ShuffleBufferDataset(size=...)", expected="a positive integer", found=repr(size)))
        self.size = size
