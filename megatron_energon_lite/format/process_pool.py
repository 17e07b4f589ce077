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

__all__ = ["scan_pool"]

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


def _exit_with_parent(parent: int) -> None:
    threading.Thread(target=_watch_parent, args=(parent,), name="energon-lite-parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    # Orphans are re-parented (to init or a subreaper): a changed parent id means ours is gone.
    while os.getppid() == parent:
        time.sleep(_PARENT_CHECK_SECONDS)
    os._exit(1)
