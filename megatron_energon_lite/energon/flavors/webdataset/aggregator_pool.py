"""Many producer processes, one consumer: Energon's ``flavors.webdataset.aggregator_pool``.

Tasks are handed to ``num_workers`` forked processes; each runs ``user_produce_data(task)`` and
streams what it yields back in batches of at most ``batch_size`` (a batch never spans two tasks).
The aggregator consumes the batches in the calling process, so it may hold an open database or
file that the workers never see. ``num_workers=0`` runs the tasks in the calling process.

Unlike a plain queue loop, a worker that raises or dies does not leave the aggregator waiting
forever: its error is raised in the caller, and the other workers are stopped.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import queue
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ....errors import ConfigError, DatasetError, format_message

__all__ = ["AggregatorPool", "BaseAggregator"]

logger = logging.getLogger(__name__)

T_result = TypeVar("T_result")
T_aggregation_data = TypeVar("T_aggregation_data")
T_input_data = TypeVar("T_input_data")

# How long the aggregator waits for a batch before it checks whether the workers are alive.
_POLL_SECONDS = 1.0


class BaseAggregator(ABC, Generic[T_aggregation_data, T_result]):
    """The consumer side of an :class:`AggregatorPool`; runs in the calling process.

    ``on_start`` runs once before the first batch, ``on_item`` once per batch (a list of what
    the workers yielded), ``on_finish`` once after the last, then ``get_final_result_data``
    gives what :meth:`AggregatorPool.process` returns.
    """

    def on_start(self, aggregator_pool: AggregatorPool) -> None:
        """Called once before any batch arrives."""

    @abstractmethod
    def on_item(self, items: list[T_aggregation_data], aggregator_pool: AggregatorPool) -> None:
        """Called for every batch the workers produce."""

    def on_finish(self, aggregator_pool: AggregatorPool) -> None:
        """Called once after every worker has finished all its tasks."""

    def get_final_result_data(self) -> T_result:
        """The result of the whole run (None unless overridden)."""
        return None  # type: ignore[return-value]


@dataclass(frozen=True)
class _Done:
    """A worker finished all its tasks."""

    worker_id: int


@dataclass(frozen=True)
class _Failed:
    """A worker's task raised: the exception (when it pickles) and its formatted traceback."""

    worker_id: int
    error: BaseException | None
    trace: str


class _WorkerTraceback(Exception):
    """Carries a worker's traceback text as the cause of the re-raised exception."""


class AggregatorPool(Generic[T_input_data, T_aggregation_data, T_result]):
    """Runs ``user_produce_data`` over submitted tasks in forked workers and aggregates the output.

    Usage: construct, :meth:`submit_task` every task, then :meth:`process` once. Workers are
    forked (they inherit ``user_produce_data`` and everything it references without pickling).
    """

    def __init__(
        self,
        num_workers: int,
        user_produce_data: Callable[[T_input_data], Iterable[Any]],
        aggregator: BaseAggregator[T_aggregation_data, T_result],
        *,
        batch_size: int = 1,
    ) -> None:
        if batch_size <= 0:
            raise ConfigError(
                format_message(
                    "AggregatorPool batch_size must be positive",
                    expected="an integer >= 1",
                    found=repr(batch_size),
                )
            )
        if num_workers < 0:
            raise ConfigError(
                format_message(
                    "AggregatorPool num_workers must not be negative",
                    expected="0 (run in this process) or more worker processes",
                    found=repr(num_workers),
                )
            )
        self.num_workers = num_workers
        self.user_produce_data = user_produce_data
        self.aggregator = aggregator
        self.batch_size = batch_size
        self._context = multiprocessing.get_context("fork")
        self.task_queue = self._context.Queue()
        self.result_queue = self._context.Queue()
        self._inline_tasks: list[T_input_data] = []

    def submit_task(self, task: T_input_data) -> None:
        """Queues one task for the workers (call before :meth:`process`)."""
        if self.num_workers == 0:
            self._inline_tasks.append(task)
        else:
            self.task_queue.put(task)

    # --- producer side -----------------------------------------------------------------------
    def _batches(self, task: T_input_data) -> Iterable[list[Any]]:
        batch: list[Any] = []
        for item in self.user_produce_data(task):
            batch.append(item)
            if len(batch) >= self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def _worker(self, worker_id: int) -> None:
        """The loop of one worker process: tasks until the ``None`` sentinel, then ``_Done``."""
        try:
            while (task := self.task_queue.get()) is not None:
                for batch in self._batches(task):
                    self.result_queue.put(batch)
        except BaseException as exc:  # noqa: BLE001 - reported to the aggregator, which raises it
            try:
                pickle.dumps(exc)
                error: BaseException | None = exc
            except Exception:  # noqa: BLE001 - any pickling failure: send the traceback text only
                error = None
            self.result_queue.put(_Failed(worker_id, error, traceback.format_exc()))
        else:
            self.result_queue.put(_Done(worker_id))

    # --- consumer side -----------------------------------------------------------------------
    def process(self) -> T_result:
        """Runs the workers and the aggregator to the end; returns the aggregator's result."""
        if self.num_workers == 0:
            self.aggregator.on_start(self)
            for task in self._inline_tasks:
                for batch in self._batches(task):
                    self.aggregator.on_item(batch, self)
            self.aggregator.on_finish(self)
            return self.aggregator.get_final_result_data()

        workers = [
            self._context.Process(target=self._worker, args=(worker_id,), daemon=True)
            for worker_id in range(self.num_workers)
        ]
        for worker in workers:
            worker.start()
        for _ in workers:
            self.task_queue.put(None)
        try:
            result = self._aggregate(workers)
        except BaseException:
            for worker in workers:
                if worker.is_alive():
                    worker.terminate()
            for worker in workers:
                worker.join()
            raise
        for worker in workers:
            worker.join()
        return result

    def _aggregate(self, workers: list[Any]) -> T_result:
        self.aggregator.on_start(self)
        running = set(range(len(workers)))
        suspects: set[int] = set()  # exited without a _Done seen; confirmed dead on the next poll
        while running:
            try:
                message = self.result_queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                dead = {w for w in running if workers[w].exitcode is not None}
                lost = dead & suspects
                if lost:
                    worker_id = min(lost)
                    raise DatasetError(
                        format_message(
                            f"aggregator pool worker {worker_id} exited without finishing its tasks",
                            found=f"exit code {workers[worker_id].exitcode}",
                            fix="check the log for a crash (out of memory, a signal) in the worker",
                        )
                    )
                suspects = dead
                continue
            if isinstance(message, _Done):
                running.discard(message.worker_id)
            elif isinstance(message, _Failed):
                self._raise_failure(message)
            else:
                self.aggregator.on_item(message, self)
        self.aggregator.on_finish(self)
        return self.aggregator.get_final_result_data()

    @staticmethod
    def _raise_failure(failure: _Failed) -> None:
        cause = _WorkerTraceback(f"in aggregator pool worker {failure.worker_id}:\n{failure.trace}")
        if failure.error is not None:
            raise failure.error from cause
        raise DatasetError(
            format_message(
                f"aggregator pool worker {failure.worker_id} failed with an exception that cannot be "
                "sent between processes",
                found=failure.trace.rstrip(),
            )
        ) from cause
