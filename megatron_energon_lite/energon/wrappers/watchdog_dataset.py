"""WatchdogDataset: Energon's name for the core's watchdog stage (``pipeline/recipe.py``:
``Watchdog``, with Energon's signature ``(dataset, worker_config, timeout_seconds=60,
initial_timeout_seconds=None, fail_on_timeout=False)``). It is the very class the loader puts
around a pipeline for ``get_loader(watchdog_timeout_seconds=...)``, so patching
``WatchdogDataset._watchdog_trigger`` (as Energon's tests do) reaches the loader's watchdog.

``timeout_seconds=None`` disables the watchdog (the wrapped pipeline is used as it is);
``initial_timeout_seconds=None`` uses ``timeout_seconds`` for the first item too.
"""

from __future__ import annotations

from ...errors import WatchdogTimeoutError
from ...pipeline.recipe import Watchdog
from ...pipeline.watchdog import WatchdogNode

__all__ = ["WatchdogDataset", "WatchdogNode", "WatchdogTimeoutError"]

WatchdogDataset = Watchdog
