"""Energon's ``SavableDataset`` and ``BaseWrapperDataset``, on the core's recipes.

``SavableDataset`` is the core's :class:`~megatron_energon_lite.pipeline.recipe.Recipe` (what the
loader needs of a dataset) with Energon's methods; every core recipe counts as one, so what
``get_train_dataset`` returns is a ``SavableDataset`` too. Energon's wrappers (``MapDataset``,
``BatchDataset``, ``BlendDataset``, ...) are the core's stage recipes with Energon's signatures:
a task encoder's ``build_train_datasets`` may compose them exactly as in Energon and gets the
stages the default pipeline is made of, which save and restore exactly.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from ...errors import ConfigError, format_message
from ...pipeline.recipe import Recipe
from ...worker import WorkerConfig

__all__ = ["BaseWrapperDataset", "SavableDataset"]

T = TypeVar("T")


class SavableDataset(Recipe[T], Generic[T]):
    """A dataset for :func:`~megatron_energon_lite.get_loader` under Energon's name: the core's
    :class:`~megatron_energon_lite.pipeline.recipe.Recipe` plus Energon's methods.

    Subclasses implement :meth:`build_worker` (``(local_worker_id, runtime=None)``, handing
    ``runtime`` to the ``build_worker`` of their inputs), :meth:`worker_length` and :meth:`config`.
    """

    def len_worker(self, worker_idx: int | None = None) -> int:
        """Energon's name for :meth:`worker_length` (worker 0 of this rank when None)."""
        return self.worker_length(worker_idx or 0)

    def len_rank(self) -> int:
        return len(self)

    def worker_has_samples(self, local_worker_id: int = 0) -> bool:
        return self.worker_length(local_worker_id) > 0

    def can_restore_sample(self) -> bool:
        return True

    @classmethod
    def __subclasshook__(cls, subclass: type) -> bool:
        # Every recipe of the core is a savable dataset in Energon's sense (what get_train_dataset
        # returns, the loader's watchdog, ...): isinstance(x, SavableDataset) holds for them too.
        if cls is SavableDataset and Recipe in getattr(subclass, "__mro__", ()):
            return True
        return NotImplemented


class BaseWrapperDataset(SavableDataset[T]):
    """A dataset that wraps one or more others (Energon's ``BaseWrapperDataset``). Energon's
    wrappers are the core's stage recipes (``pipeline/recipe.py``) with Energon's signatures:
    this class checks their inputs and sets ``datasets`` / ``dataset``."""

    def __init__(self, *datasets: SavableDataset[Any], worker_config: WorkerConfig) -> None:
        if not isinstance(worker_config, WorkerConfig):
            raise ConfigError(
                format_message(
                    f"{type(self).__name__}(worker_config=...) must be a WorkerConfig",
                    found=type(worker_config).__name__,
                    fix="pass the worker_config the inner datasets were built with",
                )
            )
        for dataset in datasets:
            if not isinstance(dataset, Recipe):
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
        self.datasets = tuple(datasets)
        self.dataset = datasets[0] if datasets else None
        self.worker_config = worker_config
