"""BlendDataset: draws each sample from one of several datasets, by weight."""

from __future__ import annotations

from abc import ABCMeta
from typing import Any

from ...errors import ConfigError, format_message
from ...pipeline.recipe import Blend
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["BlendDataset"]


def split_weights(owner: str, dataset_weights: tuple[Any, ...]) -> tuple[list[SavableDataset[Any]], list[float]]:
    """``((dataset, weight), ...)`` -> (datasets, weights), checked."""
    datasets, weights = [], []
    for i, entry in enumerate(dataset_weights):
        if not (isinstance(entry, tuple) and len(entry) == 2) or isinstance(entry[1], bool) or not isinstance(entry[1], (int, float)) or entry[1] < 0:
            raise ConfigError(
                format_message(
                    f"{owner} takes (dataset, weight) pairs",
                    where=f"argument {i}",
                    expected="a tuple (dataset, weight >= 0)",
                    found=repr(entry)[:200],
                    fix=f"write {owner}((ds_a, 2), (ds_b, 8), worker_config=...)",
                )
            )
        datasets.append(entry[0])
        weights.append(float(entry[1]))
    if not datasets or sum(weights) <= 0:
        raise ConfigError(format_message(f"{owner} needs at least one dataset with a positive weight", found=repr(weights)))
    return datasets, weights


class _AnyBlend(ABCMeta):
    """``isinstance(stage, BlendDataset)`` holds for every blend stage of ours: the pipelines that
    ``get_train_dataset`` builds blend with the core's recipe, which is this class's base."""

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, Blend) if cls is BlendDataset else super().__instancecheck__(instance)


class BlendDataset(BaseWrapperDataset[Any], Blend[Any], metaclass=_AnyBlend):
    """Energon's ``BlendDataset((dataset, weight), ..., worker_config=...)``.

    Each sample comes from dataset ``i`` with probability ``weight_i / sum(weights)``, drawn from
    (worker seed, draw number), so a restored loader draws the same. A dataset that ends leaves
    the blend; the blend ends when all have ended (wrap them in ``RepeatDataset`` for an endless
    blend). ``len()`` is the sum of the datasets' lengths, as in Energon.
    """

    def __init__(self, *dataset_weights: tuple[SavableDataset[Any], float], worker_config: WorkerConfig) -> None:
        datasets, weights = split_weights("BlendDataset", dataset_weights)
        super().__init__(*datasets, worker_config=worker_config)
        self.weights = tuple(weights)
        self.names = tuple(f"BlendDataset dataset {i}" for i in range(len(datasets)))
