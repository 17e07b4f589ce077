"""AggregatorPool: forked producers, one aggregator in the caller; failures surface, never hang."""

from __future__ import annotations

import os
import threading

import pytest

from megatron_energon_lite.errors import ConfigError, DatasetError
from megatron_energon_lite.energon.flavors.webdataset.aggregator_pool import (
    AggregatorPool,
    BaseAggregator,
)


class Collect(BaseAggregator[tuple, list]):
    def __init__(self) -> None:
        self.events: list[str] = []
        self.batches: list[list[tuple]] = []

    def on_start(self, aggregator_pool: AggregatorPool) -> None:
        self.events.append("start")

    def on_item(self, items: list[tuple], aggregator_pool: AggregatorPool) -> None:
        self.batches.append(items)

    def on_finish(self, aggregator_pool: AggregatorPool) -> None:
        self.events.append("finish")

    def get_final_result_data(self) -> list:
        return self.batches


def produce(task: tuple[int, int]):
    """Task ``(id, n)`` yields ``(id, 0) .. (id, n-1)``."""
    task_id, count = task
    for i in range(count):
        yield (task_id, i)


def run_pool(num_workers: int, tasks, batch_size: int = 3, producer=produce, aggregator=None):
    aggregator = aggregator or Collect()
    pool = AggregatorPool(num_workers, producer, aggregator, batch_size=batch_size)
    for task in tasks:
        pool.submit_task(task)
    return pool.process(), aggregator


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_every_item_arrives_in_batches_that_do_not_span_tasks(num_workers: int) -> None:
    tasks = [(t, n) for t, n in enumerate([5, 0, 3, 7, 1, 6])]
    batches, aggregator = run_pool(num_workers, tasks)
    assert aggregator.events == ["start", "finish"]
    assert all(1 <= len(b) <= 3 and len({task_id for task_id, _ in b}) == 1 for b in batches)
    assert sorted(item for b in batches for item in b) == sorted(item for task in tasks for item in produce(task))
    for task_id, count in tasks:  # one task's items stay in order (one worker runs it)
        assert [i for b in batches for t, i in b if t == task_id] == list(range(count))


def failing(task):
    yield ("ok", 0)
    raise ValueError(f"cannot index task {task}")


def test_a_worker_exception_is_raised_in_the_caller() -> None:
    with pytest.raises(ValueError, match="cannot index task 1") as info:
        run_pool(2, [1], producer=failing)
    assert "in aggregator pool worker" in str(info.value.__cause__)


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("no pickle")
        self.lock = threading.Lock()


def unpicklable(task):
    raise Unpicklable()
    yield  # a generator


def test_an_exception_that_cannot_be_sent_becomes_a_dataset_error() -> None:
    with pytest.raises(DatasetError, match="cannot be sent between processes") as info:
        run_pool(1, [0], producer=unpicklable)
    assert "Unpicklable" in str(info.value)


def dies(task):
    os._exit(3)
    yield


def test_a_worker_that_dies_is_reported_not_waited_for() -> None:
    with pytest.raises(DatasetError, match="exited without finishing") as info:
        run_pool(1, [0], producer=dies)
    assert "exit code 3" in str(info.value)


class Broken(Collect):
    def on_item(self, items, aggregator_pool) -> None:
        raise KeyError("aggregator failed")


def test_an_aggregator_error_stops_the_workers() -> None:
    with pytest.raises(KeyError, match="aggregator failed"):
        run_pool(2, [(t, 50) for t in range(10)], aggregator=Broken())


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        AggregatorPool(1, produce, Collect(), batch_size=0)
    with pytest.raises(ConfigError, match="num_workers"):
        AggregatorPool(-1, produce, Collect())
