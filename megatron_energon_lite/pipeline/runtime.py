"""The runtime of one worker's pipeline: what its stages use of the loader that runs them.

The loader makes one :class:`Runtime` per worker pipeline (``loader/streams.py``), fills it and
hands it to the recipe's ``build_worker``; the nodes that need a part keep the object (not the
part: the loader changes ``clock`` from item to item).  A pipeline built without one (iterating
a dataset directly, the map view) gets an empty runtime: skips are logged where they happen,
nothing is timed, no cache pool, no report channel.  Two pipelines in one process (two loaders
without worker processes) thus never see each other's clock, skips or cache pool.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:
    from ..cache.base import CachePool
    from ..errors import SkipSink
    from .stage_clock import StageClock

__all__ = ["Runtime"]


@dataclasses.dataclass(eq=False)
class Runtime:
    #: The clock of this process's stall report while the current item is timed (one item in
    #: ``stage_clock.TIME_EVERY``); None: not timed.  The guards and the decoder run under it.
    clock: StageClock | None = None
    #: Where the default error handler's skips go for the main process to log (None: logged here).
    skips: SkipSink | None = None
    #: The loader's cache pool (``get_loader(..., cache_pool=...)``): ``TaskEncoder.cache``.
    cache_pool: CachePool | None = None
    #: Where a stuck-item report of the watchdog goes (a dataloader worker's channel to the main
    #: process); None: logged here.
    report_sink: Callable[[str], None] | None = None
    #: The samples a replay skips (``pipeline/skip.py``): ``(dataset, split index)`` -> how the
    #: report names it; None: none (the pipeline has no skip stage).
    sample_skips: Mapping[tuple[int, int], str] | None = None
