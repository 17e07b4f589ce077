"""GroupBatchDataset: batches samples that share a group key (e.g. an aspect ratio bucket)."""

from __future__ import annotations

from typing import Any, Callable, Hashable

from ...pipeline.recipe import GroupBatch
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset
from .batch_dataset import check_batch_size

__all__ = ["GroupBatchDataset"]


class GroupBatchDataset(BaseWrapperDataset[Any], GroupBatch[Any]):
    """Energon's ``GroupBatchDataset(dataset, fixed_batch_size, sample_group_key, batcher, *, drop_last, worker_config, ...)``.

    ``sample_group_key(sample) -> (group key, batch size or None)``. ``len()`` is the wrapped
    dataset's (an upper bound), as in Energon. ``max_buffered`` (ours) bounds the samples the
    buckets hold together.
    """

    def __init__(
        self,
        dataset: SavableDataset[Any],
        fixed_batch_size: int | None,
        sample_group_key: Callable[[Any], tuple[Hashable, int | None]],
        batcher: Callable[[list[Any]], Any],
        *,
        batcher_stateless: bool = False,
        batcher_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        drop_last: bool = False,
        failure_tolerance: int = 100,
        max_buffered: int | None = None,
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        check_batch_size("GroupBatchDataset", fixed_batch_size, optional=True)
        self.batch_size = self.fixed_batch_size = fixed_batch_size
        self.criterion = self.sample_group_key = sample_group_key
        self.batcher = batcher
        self.drop_last = drop_last
        self.tolerance = self.failure_tolerance = failure_tolerance
        self.max_buffered = max_buffered
