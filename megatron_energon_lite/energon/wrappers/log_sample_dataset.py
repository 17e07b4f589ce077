"""LogSampleDataset and GcDataset: pass-through stages kept for Energon's pipelines."""

from __future__ import annotations

import gc
from typing import Any, Callable

from ...pipeline.map import MapNode
from ...pipeline.node import Node
from ...pipeline.runtime import Runtime
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["GcDataset", "LogSampleDataset"]


def _batch_keys(batch: Any) -> list[str] | None:
    keys = getattr(batch, "__key__", None)
    if keys is None and isinstance(batch, dict):
        keys = batch.get("__key__")
    return keys if isinstance(keys, list) else None if keys is None else [keys]


class LogSampleDataset(BaseWrapperDataset[Any]):
    """Energon's ``LogSampleDataset(dataset, mode, worker_config, get_keys_fn=...)``: items pass
    through unchanged; when the worker config asks for it (``worker_log_level``), each item's keys
    are written to the worker's debug log (``WorkerConfig.worker_log``)."""

    def __init__(self, dataset: SavableDataset[Any], mode: str, worker_config: WorkerConfig, get_keys_fn: Callable[[Any], list[str] | None] = _batch_keys) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.mode = mode
        self.get_keys_fn = get_keys_fn

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        wc = self.worker_config
        should_log = getattr(wc, "should_log", None)
        worker_log = getattr(wc, "worker_log", None)
        inner = self.dataset.build_worker(local_worker_id, runtime)
        if should_log is None or worker_log is None or not should_log(level=1):
            return inner

        def log(item: Any, index: int) -> Any:
            worker_log({"t": "yield_batch", "r": wc.rank, "w": local_worker_id, "m": self.mode, "idx": index, "keys": self.get_keys_fn(item)})
            return item

        return MapNode(inner, log, tag="Log")


class GcDataset(BaseWrapperDataset[Any]):
    """Energon's ``GcDataset(dataset, *, worker_config, every_n_iter=10, freeze=True)``: runs
    ``gc.collect()`` every ``every_n_iter`` items in the worker; items pass through unchanged."""

    def __init__(self, dataset: SavableDataset[Any], *, worker_config: WorkerConfig, every_n_iter: int = 10, freeze: bool = True) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.every_n_iter = every_n_iter
        self.freeze = freeze

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        every = self.every_n_iter

        def collect(item: Any, index: int) -> Any:
            if every > 0 and index % every == every - 1:
                gc.collect()
            return item

        return MapNode(self.dataset.build_worker(local_worker_id, runtime), collect, tag="Gc")
