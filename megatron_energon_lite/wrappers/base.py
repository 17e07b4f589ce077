"""The base of every dataset object: a recipe for each dataloader worker's pipeline.

``get_train_dataset`` / ``get_val_dataset`` and Energon's dataset wrappers (``MapDataset``,
``BatchDataset``, ``BlendDataset``, ...) all return a :class:`SavableDataset`: an object built
once in the main process that knows its length and configuration and builds, in each worker, the
chain of pipeline stages (:mod:`megatron_energon_lite.pipeline`) that does the work. Wrapping a
dataset wraps its recipe, so a task encoder's ``build_train_datasets`` may compose wrappers
exactly as in Energon and still save and restore exactly: the stages keep their own small states.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, TypeVar

import torch.utils.data

from ..errors import ConfigError, NotSupportedError, format_message
from ..pipeline.build import share
from ..pipeline.guard import SampleGuard
from ..pipeline.hooks import stage_hook
from ..pipeline.node import Node
from ..task_encoder.marks import stateless_spec
from ..worker import WorkerConfig

__all__ = ["BaseWrapperDataset", "SavableDataset", "function_config", "share", "tolerance_of"]  # share: re-exported for the wrappers

T = TypeVar("T")


def function_config(fn: Any) -> str:
    """``module.qualname`` of a function (partials and bound methods too), for config fingerprints."""
    fn = getattr(fn, "func", fn)
    fn = getattr(fn, "__func__", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


class SavableDataset(torch.utils.data.IterableDataset, Generic[T]):
    """A dataset for :func:`~megatron_energon_lite.get_loader`: builds each worker's pipeline.

    Subclasses implement :meth:`build_worker`, :meth:`worker_length` and :meth:`config`.
    Iterate through ``get_loader`` / ``get_savable_loader`` (they run the workers and keep the
    state); iterating the object itself yields the items of worker 0 without state.
    """

    worker_config: WorkerConfig

    def build_worker(self, local_worker_id: int) -> Node:
        """The stages of dataloader worker ``local_worker_id`` of this rank (0 without workers)."""
        raise NotImplementedError

    def worker_length(self, local_worker_id: int) -> int:
        """Items worker ``local_worker_id`` yields per pass (Energon's ``len_worker``)."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """Plain JSON describing what this dataset yields, saved with states and checked on restore."""
        raise NotImplementedError

    def with_topology(self, worker_config: WorkerConfig) -> SavableDataset[T]:
        """The same dataset for another rank or topology (elastic resume, ``elastic.py``)."""
        raise NotSupportedError(
            format_message(
                f"restoring a {type(self).__name__} on another topology is not supported yet: only the datasets "
                "get_train_dataset / get_val_dataset build (not composed wrappers)",
                fix="restore on the topology the state was saved with",
            )
        )

    @property
    def passes_continue(self) -> bool:
        """True when a pass ends inside an endless stream (virtual epochs, limits), which then goes on."""
        return False

    def __len__(self) -> int:
        return sum(self.worker_length(w) for w in range(self.worker_config.workers_per_rank))

    def len_worker(self, worker_idx: int | None = None) -> int:
        """Energon's name for :meth:`worker_length` (worker 0 of this rank when None)."""
        return self.worker_length(worker_idx or 0)

    def len_rank(self) -> int:
        return len(self)

    def worker_has_samples(self, local_worker_id: int = 0) -> bool:
        return self.worker_length(local_worker_id) > 0

    def can_restore_sample(self) -> bool:
        return True

    def __iter__(self) -> Iterator[T]:
        return iter(self.build_worker(self.worker_config.current_worker_id(type(self).__name__)))

    # --- for wrappers -------------------------------------------------------------------------
    def _stage_fn(self, fn: Callable[..., Any], local_worker_id: int, *, batch: bool = False) -> Callable[[Any, int], Any]:
        """``fn`` as a stage calls it: with a sample index unique over this rank's workers, seeded
        for ``@stateless(restore_seeds=True)`` functions, None refused with a clear error."""
        wc = self.worker_config
        return stage_hook(fn, worker_seed=wc.worker_seed(local_worker_id), local_worker_id=local_worker_id, workers=wc.workers_per_rank, batch=batch)

    def _guard(self, stage: str, tolerance: int) -> SampleGuard:
        return SampleGuard(self.worker_config.global_error_handler, tolerance=tolerance, stage=stage)


class BaseWrapperDataset(SavableDataset[T]):
    """A dataset that wraps one or more others (Energon's ``BaseWrapperDataset``)."""

    def __init__(self, *datasets: SavableDataset[Any], worker_config: WorkerConfig) -> None:
        super().__init__()
        if not isinstance(worker_config, WorkerConfig):
            raise ConfigError(
                format_message(
                    f"{type(self).__name__}(worker_config=...) must be a WorkerConfig",
                    found=type(worker_config).__name__,
                    fix="pass the worker_config the inner datasets were built with",
                )
            )
        for dataset in datasets:
            if not isinstance(dataset, SavableDataset):
                raise ConfigError(
                    format_message(
                        f"{type(self).__name__} wraps datasets from get_train_dataset / get_val_dataset or other wrappers",
                        found=type(dataset).__name__,
                        fix="pass the result of get_train_dataset, get_val_dataset, get_dataset_from_config(...).build() or a wrapper",
                    )
                )
            if dataset.worker_config != worker_config:
                raise ConfigError(
                    format_message(
                        f"{type(self).__name__} and the dataset it wraps have different worker configs",
                        expected=repr(worker_config),
                        found=repr(dataset.worker_config),
                        fix="build every dataset of one loader with the same WorkerConfig",
                    )
                )
        self.datasets = list(datasets)
        self.worker_config = worker_config

    @property
    def dataset(self) -> SavableDataset[Any]:
        """The wrapped dataset (the first one, for wrappers of several)."""
        return self.datasets[0]

    @property
    def passes_continue(self) -> bool:
        return any(d.passes_continue for d in self.datasets)

    def worker_length(self, local_worker_id: int) -> int:
        return self.dataset.worker_length(local_worker_id)

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__name__, **self._own_config(), "datasets": [d.config() for d in self.datasets]}

    def _own_config(self) -> dict[str, Any]:
        """This wrapper's own settings for :meth:`config` (plain JSON)."""
        return {}


def tolerance_of(fn: Any, default: int) -> int:
    """``@stateless(failure_tolerance=...)`` of ``fn``, else ``default``."""
    spec = stateless_spec(fn)
    return default if spec is None or spec.failure_tolerance is None else spec.failure_tolerance
