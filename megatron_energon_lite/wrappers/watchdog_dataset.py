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

import logging
from typing import Any, TypeVar

from ..errors import ConfigError, WatchdogTimeoutError, format_message
from ..pipeline.node import Node
from ..pipeline.watchdog import WatchdogNode
from ..worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["WatchdogDataset", "WatchdogNode", "WatchdogTimeoutError"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

def _check_timeout(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(
            format_message(
                f"WatchdogDataset {name} (watchdog_{name} of get_loader) must be a positive "
                "number of seconds or None",
                expected="e.g. 60 (None disables the watchdog)",
                found=repr(value),
            )
        )
    return float(value)


class WatchdogDataset(BaseWrapperDataset[T]):
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
        self.timeout_seconds = _check_timeout("timeout_seconds", timeout_seconds)
        self.initial_timeout_seconds = _check_timeout("initial_timeout_seconds", initial_timeout_seconds)
        self.fail_on_timeout = bool(fail_on_timeout)

    def build_worker(self, local_worker_id: int) -> Node:
        inner = self.dataset.build_worker(local_worker_id)
        if self.timeout_seconds is None:
            return inner
        wc = self.worker_config
        return WatchdogNode(
            inner,
            owner=self,
            timeout=self.timeout_seconds,
            initial_timeout=self.initial_timeout_seconds,
            where=f"rank {wc.rank}, worker {local_worker_id}",
        )

    # Transparent: the same length and config as the wrapped dataset, so states do not change.
    def __len__(self) -> int:
        return len(self.dataset)

    def config(self) -> dict[str, Any]:
        return self.dataset.config()

    def with_topology(self, worker_config: WorkerConfig) -> WatchdogDataset[T]:
        return WatchdogDataset(self.dataset.with_topology(worker_config), worker_config, timeout_seconds=self.timeout_seconds, initial_timeout_seconds=self.initial_timeout_seconds, fail_on_timeout=self.fail_on_timeout)

    def reset_state_own(self) -> None:
        """Energon's hook; the watchdog has no state of its own."""

    def _watchdog_trigger(self) -> None:
        """Runs in the watchdog thread once per stuck item, after the stack dump was logged.

        Raises :class:`WatchdogTimeoutError` if ``fail_on_timeout`` (the process then exits),
        else logs a warning and lets the pipeline go on waiting.
        """
        if self.fail_on_timeout:
            raise WatchdogTimeoutError(
                format_message(
                    f"watchdog: producing one item took longer than {self.timeout_seconds} s",
                    expected="each item within watchdog_timeout_seconds",
                    fix="find the stuck call in the logged stack; raise watchdog_timeout_seconds "
                    "(or watchdog_initial_timeout_seconds for the first item) if the work is just slow",
                )
            )
        logger.warning(
            "watchdog: producing one item took longer than %s s; still waiting "
            "(fail_on_timeout=True would stop the process instead)",
            self.timeout_seconds,
        )

    def __str__(self) -> str:
        return f"WatchdogDataset(dataset={self.dataset})"
