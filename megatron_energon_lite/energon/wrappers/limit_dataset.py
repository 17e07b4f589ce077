"""LimitDataset: at most ``length`` items per pass (over all workers of a rank)."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError, format_message
from ...pipeline.recipe import Pass
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["LimitDataset"]


class LimitDataset(BaseWrapperDataset[Any], Pass[Any]):
    """Energon's ``LimitDataset(dataset, length, *, reset_after_epoch=False, worker_config)``.

    Each worker yields its share of ``length`` per pass. With ``reset_after_epoch`` every pass
    starts the dataset over (the same items each time, as validation wants); without it the next
    pass continues where this one stopped.  A dataset that ends before the limit ends the pass and
    starts over in the next (Energon 7.4 resets it after every pass, whatever reset_after_epoch).
    """

    def __init__(self, dataset: SavableDataset[Any], length: int, *, reset_after_epoch: bool = False, worker_config: WorkerConfig) -> None:
        super().__init__(dataset, worker_config=worker_config)
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise ConfigError(format_message("invalid LimitDataset(length=...)", expected="an integer >= 0 (items per pass of this rank)", found=repr(length)))
        self.length = length
        self.restart = self.reset_after_epoch = reset_after_epoch
        self.capped = True
        self.what = "the limit of items per pass"
