"""RepeatDataset: repeats a dataset a number of times, or forever."""

from __future__ import annotations

import math
from typing import Any

from ..pipeline.node import Node
from ..pipeline.repeat import RepeatNode
from ..worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["RepeatDataset"]


class RepeatDataset(BaseWrapperDataset[Any]):
    """Energon's ``RepeatDataset(dataset, *, repeats=None, restart=True, worker_config)``.

    ``repeats`` None repeats forever; a fraction ends with part of a pass. Dataset sources start
    each repetition with a new slice order; other datasets (batched pipelines, wrappers) start over
    in the same order. ``restart`` is accepted for Energon's signature (a pass here always ends
    after ``repeats`` repetitions and the next pass starts them again).
    """

    def __init__(self, dataset: SavableDataset[Any], *, repeats: float | None = None, restart: bool = True, worker_config: WorkerConfig) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.repeats = repeats
        self.restart = restart
        RepeatNode.check_repeats(repeats)

    def build_worker(self, local_worker_id: int) -> Node:
        return RepeatNode(self.dataset.build_worker(local_worker_id), self.repeats, worker_samples=self.dataset.worker_length(local_worker_id))

    def worker_length(self, local_worker_id: int) -> int:
        inner = self.dataset.worker_length(local_worker_id)
        return inner if self.repeats is None else int(inner * self.repeats)

    @property
    def passes_continue(self) -> bool:
        return self.repeats is None or self.dataset.passes_continue

    def _own_config(self) -> dict[str, Any]:
        return {"repeats": None if self.repeats is None else (self.repeats if math.isfinite(self.repeats) else str(self.repeats))}
