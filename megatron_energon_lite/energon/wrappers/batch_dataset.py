"""BatchDataset: groups consecutive samples into batches with a batcher function."""

from __future__ import annotations

from typing import Any, Callable

from ...errors import ConfigError, format_message
from ...pipeline.recipe import Batch
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["BatchDataset"]


def check_batch_size(owner: str, batch_size: Any, *, optional: bool = False) -> None:
    if batch_size is None and optional:
        return
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ConfigError(format_message(f"invalid {owner}(batch_size=...)", expected="a positive integer" + (" or None" if optional else ""), found=repr(batch_size)))


class BatchDataset(BaseWrapperDataset[Any], Batch[Any]):
    """Energon's ``BatchDataset(dataset, batch_size, batcher, *, worker_config, drop_last=False, ...)``."""

    def __init__(
        self,
        dataset: SavableDataset[Any],
        batch_size: int,
        batcher: Callable[[list[Any]], Any],
        *,
        batcher_stateless: bool = False,
        batcher_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        drop_last: bool = False,
        failure_tolerance: int = 100,
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        check_batch_size("BatchDataset", batch_size)
        self.batch_size = batch_size
        self.batcher = batcher
        self.batcher_stateless = batcher_stateless
        self.batcher_config = batcher_config
        self.drop_last = drop_last
        self.tolerance = self.failure_tolerance = failure_tolerance
