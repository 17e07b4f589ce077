"""PackingDataset: fills a buffer, selects groups of samples, and packs each group into one sample."""

from __future__ import annotations

from typing import Any, Callable

from ...errors import ConfigError, format_message
from ...pipeline.recipe import Pack
from ...worker import WorkerConfig
from .base import BaseWrapperDataset, SavableDataset

__all__ = ["PackingDataset"]


class PackingDataset(BaseWrapperDataset[Any], Pack[Any]):
    """Energon's ``PackingDataset(dataset, buffer_size, pre_packer, final_packer, *, sample_encoder=None, worker_config, ...)``.

    ``pre_packer(buffer) -> [[samples of pack 1], ...]`` chooses the packs, ``sample_encoder``
    (optional) encodes each chosen member, ``final_packer(members) -> sample`` builds a pack.
    ``len()`` is the wrapped dataset's (an upper bound), as in Energon.
    """

    def __init__(
        self,
        dataset: SavableDataset[Any],
        buffer_size: int,
        pre_packer: Callable[[list[Any]], list[list[Any]]],
        final_packer: Callable[[list[Any]], Any],
        *,
        final_packer_stateless: bool = False,
        sample_encoder: Callable[[Any], Any] | None = None,
        sample_encoder_stateless: bool = False,
        packer_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        pre_packer_failure_tolerance: int = 100,
        final_packer_failure_tolerance: int = 100,
        sample_encoder_failure_tolerance: int = 100,
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        if not isinstance(buffer_size, int) or isinstance(buffer_size, bool) or buffer_size <= 0:
            raise ConfigError(format_message("invalid PackingDataset(buffer_size=...)", expected="a positive integer", found=repr(buffer_size)))
        self.buffer_size = buffer_size
        self.select = self.pre_packer = pre_packer
        self.pack = self.final_packer = final_packer
        self.postencode = self.sample_encoder = sample_encoder
        self.select_tolerance = self.pre_packer_failure_tolerance = pre_packer_failure_tolerance
        self.tolerance = self.final_packer_failure_tolerance = final_packer_failure_tolerance
