"""MapDataset: applies a function to every sample."""

from __future__ import annotations

from typing import Any, Callable

from ...pipeline.recipe import Map
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["MapDataset"]


class MapDataset(BaseWrapperDataset[Any], Map[Any]):
    """Energon's ``MapDataset(dataset, map_fn, *, worker_config, ...)``.

    ``stateless_map_fn`` is accepted for Energon's signature: outputs here are always rebuilt
    from their restore keys by calling ``map_fn`` again (mark it ``@stateless(restore_seeds=True)``
    if it draws random numbers). ``failure_tolerance``: consecutive failures before the run stops.
    """

    def __init__(
        self,
        dataset: SavableDataset[Any],
        map_fn: Callable[[Any], Any],
        *,
        stateless_map_fn: bool = False,
        map_fn_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        failure_tolerance: int = 100,
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.fn = self.map_fn = map_fn
        self.stateless_map_fn = stateless_map_fn
        self.map_fn_config = map_fn_config
        self.tolerance = self.failure_tolerance = failure_tolerance

    def own_config(self) -> dict[str, Any]:
        config = self.map_fn_config() if callable(self.map_fn_config) else self.map_fn_config
        return {**super().own_config(), **({"map_fn_config": config} if config is not None else {})}
