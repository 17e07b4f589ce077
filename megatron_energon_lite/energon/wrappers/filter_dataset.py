"""FilterDataset: keeps the samples for which ``filter_fn(sample)`` is true."""

from __future__ import annotations

from typing import Any, Callable

from ...pipeline.recipe import Filter
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["FilterDataset"]


class FilterDataset(BaseWrapperDataset[Any], Filter[Any]):
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
        self.predicate = self.filter_fn = filter_fn
        self.filter_fn_config = filter_fn_config
