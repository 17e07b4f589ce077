"""RepeatDataset: repeats a dataset a number of times, or forever."""

from __future__ import annotations

from typing import Any

from ...pipeline.recipe import Repeat
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["RepeatDataset"]


class RepeatDataset(BaseWrapperDataset[Any], Repeat[Any]):
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
        self.__post_init__()  # checks repeats
