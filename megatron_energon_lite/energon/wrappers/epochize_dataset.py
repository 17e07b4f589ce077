"""EpochizeDataset: cuts an endless stream into passes ("virtual epochs") of ``length`` items."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError, format_message
from ...pipeline.recipe import Pass
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["EpochizeDataset"]


class EpochizeDataset(BaseWrapperDataset[Any], Pass[Any]):
    """Energon's ``EpochizeDataset(dataset, length, worker_config)``: each pass of the rank yields
    ``length`` items (each worker its share) and the next pass continues the stream."""

    def __init__(self, dataset: SavableDataset[Any], length: int, worker_config: WorkerConfig) -> None:
        super().__init__(dataset, worker_config=worker_config)
        if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
            raise ConfigError(format_message("invalid EpochizeDataset(length=...)", expected="a positive integer (items per pass of this rank)", found=repr(length)))
        self.length = length
        self.what = "items per virtual epoch"
