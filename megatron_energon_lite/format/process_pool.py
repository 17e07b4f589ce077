"""The process pool of the scanning commands (``prepare``, ``prepare-media``).

Its workers end with the process that started them: a pool worker waits on a queue whose write end
it holds itself, so it would wait forever after a ``kill -9`` of the command (or an OOM kill),
holding memory and open shards.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterator, Sequence, TypeVar

from tqdm import tqdm

__all__ = ["scan_in_order", "scan_pool"]

R = TypeVar("R")

#: How often a pool worker checks that the process that started it is still there.
_PARENT_CHECK_SECONDS = 0.5


def scan_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` forked processes that exit when this process is gone."""
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_exit_with_parent,
        initargs=(os.getpid(),),
    )


def scan_in_order(
    task: Callable[[tuple], R],
    jobs: Sequence[tuple],
    *,
    num_workers: int | None,
    progress: bool,
    desc: str,
    unit: str,
    max_chunk: int = 16,
    in_process: bool = True,
) -> Iterator[R]:
    """``task(job)`` for each of ``jobs``, in parallel processes (``num_workers``; None: one per
    core) with a progress bar, yielded in the order of ``jobs``; in this process for one worker
    unless not ``in_process`` (this process has other work meanwhile).
    ``task`` must be a module-level function (it is pickled to the workers)."""
    workers = min(num_workers or os.cpu_count() or 1, max(1, len(jobs)))
    bar = tqdm(total=len(jobs), desc=desc, unit=unit, disable=not progress)
    try:
        if workers <= 1 and in_process:
            for job in jobs:
                result = task(job)
                bar.update()  # before the yield: a consumer that stops after the last result (zip) never resumes us
                yield result
            return
        pool = scan_pool(workers)
        try:
            chunk = max(1, min(max_chunk, len(jobs) // (workers * 4)))
            for result in pool.map(task, jobs, chunksize=chunk):
                bar.update()
                yield result
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    finally:
        bar.close()


def _exit_with_parent(parent: int) -> None:
    threading.Thread(target=_watch_parent, args=(parent,), name="energon-lite-parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    # Orphans are re-parented (to init or a subreaper): a changed parent id means ours is gone.
    while os.getppid() == parent:
        time.sleep(_PARENT_CHECK_SECONDS)
    os._exit(1)
