"""FilterDataset: keeps the samples for which ``filter_fn(sample)`` is true."""

from __future__ import annotations

from typing import Any, Callable

from ..pipeline.filter import FilterNode
from ..pipeline.node import Node
from ..worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset, function_config

__all__ = ["FilterDataset"]


class FilterDataset(BaseWrapperDataset[Any]):
    """Energon's ``FilterDataset(dataset, *, filter_fn, filter_fn_config=None, worker_config)``.
    ``len()`` is the wrapped dataset's (an upper bound), as in Energon."""

    def __init__(
        self,
        dataset: SavableDataset[Any],
        *,
        filter_fn: Callable[[Any], bool],
        filter_fn_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.filter_fn = filter_fn
        self.filter_fn_config = filter_fn_config

    def build_worker(self, local_worker_id: int) -> Node:
        return FilterNode(self.dataset.build_worker(local_worker_id), self._stage_fn(self.filter_fn, local_worker_id), guard=self._guard("filter", 100))

    def _own_config(self) -> dict[str, Any]:
        return {"filter_fn": function_config(self.filter_fn)}
