"""GroupBatchDataset: batches samples that share a group key (e.g. an aspect ratio bucket)."""

from __future__ import annotations

from typing import Any, Callable, Hashable

from ..pipeline.group import GroupBatchNode
from ..pipeline.node import Node
from ..worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset, function_config
from .batch_dataset import check_batch_size

__all__ = ["GroupBatchDataset"]


class GroupBatchDataset(BaseWrapperDataset[Any]):
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
        self.fixed_batch_size = fixed_batch_size
        self.sample_group_key = sample_group_key
        self.batcher = batcher
        self.drop_last = drop_last
        self.failure_tolerance = failure_tolerance
        self.max_buffered = max_buffered

    def build_worker(self, local_worker_id: int) -> Node:
        return GroupBatchNode(
            self.dataset.build_worker(local_worker_id),
            self._stage_fn(self.sample_group_key, local_worker_id),
            self._stage_fn(self.batcher, local_worker_id, batch=True),
            batch_size=self.fixed_batch_size,
            drop_last=self.drop_last,
            max_buffered=self.max_buffered,
            guard=self._guard("batch", self.failure_tolerance),
        )

    def _own_config(self) -> dict[str, Any]:
        return {
            "fixed_batch_size": self.fixed_batch_size,
            "sample_group_key": function_config(self.sample_group_key),
            "batcher": function_config(self.batcher),
            "drop_last": self.drop_last,
        }
