"""WorkerConfig: who this process is in the data-parallel job (rank, world size, workers).

A frozen dataclass with no class-level mutable state: the current dataloader worker is passed
explicitly to whatever needs it instead of being stored on the class (as Energon does).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from .errors import ConfigError, format_message
from .rng import worker_seed

logger = logging.getLogger(__name__)

ErrorHandler = Callable[[BaseException, Any, Any], None]


def log_exception(exc: BaseException, sample: Any = None, sources: Any = None) -> None:
    """Default handler for a failing sample: log it (the sample is then skipped)."""
    key = getattr(sample, "__key__", None) or (sample.get("__key__") if isinstance(sample, dict) else None)
    logger.warning("skipping sample %s (sources %s): %s: %s", key, sources, type(exc).__name__, exc)


def reraise_exception(exc: BaseException, sample: Any = None, sources: Any = None) -> None:
    """Handler that turns any failure into a stop (used while restoring samples)."""
    raise exc


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Energon's ``WorkerConfig``; equality compares only the topology, as in Energon."""

    rank: int
    world_size: int
    num_workers: int
    data_parallel_group: Any = dataclasses.field(default=None, compare=False)
    seed_offset: int = dataclasses.field(default=0, compare=False)
    worker_debug_path: str | None = dataclasses.field(default=None, compare=False)
    worker_log_level: int = dataclasses.field(default=0, compare=False)
    global_error_handler: ErrorHandler = dataclasses.field(default=log_exception, compare=False)
    restore_error_handler: ErrorHandler = dataclasses.field(default=reraise_exception, compare=False)

    def __post_init__(self) -> None:
        for name, value, low in (("world_size", self.world_size, 1), ("num_workers", self.num_workers, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(format_message(f"invalid WorkerConfig.{name}", expected=f"an integer >= {low}", found=repr(value)))
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                format_message(
                    "invalid WorkerConfig.rank",
                    expected=f"0 <= rank < world_size ({self.world_size})",
                    found=repr(self.rank),
                    fix="pass the data-parallel rank, not the global rank, when using model parallelism",
                )
            )

    @classmethod
    def default_worker_config(cls, num_workers: int = 4, data_parallel_group: Any = None) -> "WorkerConfig":
        """Rank and world size from torch.distributed when it is initialised, else a single rank."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(data_parallel_group), dist.get_world_size(data_parallel_group)
        else:
            rank, world_size = 0, 1
        return cls(rank=rank, world_size=world_size, num_workers=num_workers, data_parallel_group=data_parallel_group)

    @property
    def workers_per_rank(self) -> int:
        """Dataloader workers of one rank, counting the main process when there are none."""
        return max(1, self.num_workers)

    @property
    def num_global_workers(self) -> int:
        return self.workers_per_rank * self.world_size

    def global_worker_id(self, local_worker_id: int = 0) -> int:
        return self.rank * self.workers_per_rank + local_worker_id

    def worker_seed(self, local_worker_id: int = 0) -> int:
        """Energon's seed of a worker (depends on its global id and ``seed_offset``)."""
        return worker_seed(self.global_worker_id(local_worker_id), self.seed_offset)

    def config(self) -> dict[str, Any]:
        """Plain JSON describing the topology, for config fingerprints."""
        return {"rank": self.rank, "world_size": self.world_size, "num_workers": self.num_workers, "seed_offset": self.seed_offset}
