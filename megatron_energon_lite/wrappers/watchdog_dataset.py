"""WatchdogDataset: reports (or stops on) a pipeline that is stuck inside one ``next()``.

Energon's loaders wrap every dataset in a watchdog (``watchdog_timeout_seconds=60`` by default):
when producing one item takes longer than the timeout, the stack of the stuck thread is logged
and ``WatchdogDataset._watchdog_trigger`` runs; with ``fail_on_timeout=True`` it raises and the
process ends (exit status 1), so a hung dataloader worker surfaces as a failed worker instead of
a silent stall. Only the time inside the pipeline is watched, not the time the consumer spends
between items. The first item after a (re)start may get a longer ``initial_timeout_seconds``
(shuffle buffers and packers fill up then).

The watchdog is transparent: items, their order, lengths, ``config()`` and saved states are
exactly those of the wrapped dataset, so a state saved with a watchdog restores without one.

Cost per item: a few attribute writes. Each worker that iterates gets one daemon thread that
wakes a few times per timeout period; it holds the stage weakly and ends when the stage is gone.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ..errors import WatchdogTimeoutError
from ..pipeline.recipe import Watchdog
from ..pipeline.watchdog import WatchdogNode
from ..worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["WatchdogDataset", "WatchdogNode", "WatchdogTimeoutError"]

T = TypeVar("T")

class WatchdogDataset(BaseWrapperDataset[T], Watchdog[T]):
    """Energon's ``WatchdogDataset(dataset, worker_config, timeout_seconds=60,
    initial_timeout_seconds=None, fail_on_timeout=False)``.

    ``timeout_seconds=None`` disables the watchdog (the wrapped pipeline is used as it is);
    ``initial_timeout_seconds=None`` uses ``timeout_seconds`` for the first item too.
    """

    def __init__(
        self,
        dataset: SavableDataset[T],
        worker_config: WorkerConfig,
        timeout_seconds: float | None = 60,
        initial_timeout_seconds: float | None = None,
        fail_on_timeout: bool = False,
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.timeout_seconds = timeout_seconds
        self.initial_timeout_seconds = initial_timeout_seconds
        self.fail_on_timeout = fail_on_timeout
        self.__post_init__()  # checks the timeouts

    def reset_state_own(self) -> None:
        """Energon's hook; the watchdog has no state of its own."""

    def __str__(self) -> str:
        return f"WatchdogDataset(dataset={self.dataset})"
