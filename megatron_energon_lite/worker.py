"""WorkerConfig: who this process is in the data-parallel job (rank, world size, workers).

A frozen dataclass with no class-level mutable state: the current dataloader worker is passed
explicitly to whatever needs it instead of being stored on the class (as Energon does).

Debug logging as Energon's: with ``worker_log_level >= 1``, stages that log call
:meth:`WorkerConfig.worker_log`, which writes one JSON line per call to ``worker_debug_path``
(with ``{worker_id}`` and ``{pid}`` filled in), or to standard output when no path is set.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import multiprocessing
import sys
from pathlib import Path
from typing import Any, Callable, TextIO

from .errors import ConfigError, format_message, log_exception, reraise_exception
from .rng import worker_seed

logger = logging.getLogger(__name__)

ErrorHandler = Callable[[BaseException, Any, Any], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Energon's ``WorkerConfig``; equality compares only the topology, as in Energon.

    ``rank`` and ``world_size`` default to the data-parallel group of torch.distributed when it
    is initialised, else to a single rank (as :meth:`default_worker_config`).
    ``prefetch_factor`` (ours): the loader's prefetch when ``get_loader`` / ``get_savable_loader``
    are not given one (None: 2). ``persistent_workers`` is accepted for scripts that pass it;
    workers always persist here, because each one carries its pipeline's position.
    """

    #: None: from torch.distributed (an int once constructed).
    rank: int | None = None
    world_size: int | None = None
    num_workers: int
    data_parallel_group: Any = dataclasses.field(default=None, compare=False)
    seed_offset: int = dataclasses.field(default=0, compare=False)
    #: Where :meth:`worker_log` writes; ``{worker_id}`` and ``{pid}`` separate the processes.
    worker_debug_path: str | None = dataclasses.field(default=None, compare=False)
    #: 0: no debug log; 1: a line per yielded batch (and loader events); 2: more detail.
    worker_log_level: int = dataclasses.field(default=0, compare=False)
    global_error_handler: ErrorHandler = dataclasses.field(default=log_exception, compare=False)
    restore_error_handler: ErrorHandler = dataclasses.field(default=reraise_exception, compare=False)
    prefetch_factor: int | None = dataclasses.field(default=None, compare=False)
    persistent_workers: bool = dataclasses.field(default=True, compare=False)

    def __post_init__(self) -> None:
        if self.rank is None or self.world_size is None:
            rank, world_size = _distributed_rank(self.data_parallel_group)
            if self.rank is None:
                object.__setattr__(self, "rank", rank)
            if self.world_size is None:
                object.__setattr__(self, "world_size", world_size)
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
        if self.prefetch_factor is not None and (not isinstance(self.prefetch_factor, int) or isinstance(self.prefetch_factor, bool) or self.prefetch_factor < 1):
            raise ConfigError(format_message("invalid WorkerConfig.prefetch_factor", expected="a positive integer or None", found=repr(self.prefetch_factor)))
        if not isinstance(self.persistent_workers, bool):
            raise ConfigError(format_message("invalid WorkerConfig.persistent_workers", expected="True or False", found=repr(self.persistent_workers)))
        if not isinstance(self.worker_log_level, int) or isinstance(self.worker_log_level, bool):
            raise ConfigError(format_message("invalid WorkerConfig.worker_log_level", expected="an integer (0: off, 1, 2)", found=repr(self.worker_log_level)))
        if self.worker_debug_path is not None:
            try:
                str(self.worker_debug_path).format(worker_id=0, pid=0)
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(
                    format_message(
                        "invalid WorkerConfig.worker_debug_path",
                        expected="a path whose only placeholders are {worker_id} and {pid}",
                        found=f"{self.worker_debug_path!r} ({type(exc).__name__}: {exc})",
                        fix='e.g. "/tmp/energon_debug/worker_{worker_id}.jsonl"; write literal braces as {{ and }}',
                    )
                ) from None

    @classmethod
    def default_worker_config(cls, num_workers: int = 4, data_parallel_group: Any = None) -> "WorkerConfig":
        """Rank and world size from torch.distributed when it is initialised, else a single rank."""
        rank, world_size = _distributed_rank(data_parallel_group)
        return cls(rank=rank, world_size=world_size, num_workers=num_workers, data_parallel_group=data_parallel_group)

    @property
    def workers_per_rank(self) -> int:
        """Dataloader workers of one rank, counting the main process when there are none."""
        return max(1, self.num_workers)

    @property
    def num_global_workers(self) -> int:
        return self.workers_per_rank * self.world_size

    def current_worker_id(self, reader: str = "the dataset") -> int:
        """The local worker id of this process, checked against the topology ``reader`` was built
        for: a DataLoader with another number of workers would read some shares twice or never,
        and iterating a plan for several workers in the main process reads worker 0's share only
        (Energon asserts both)."""
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        built_for = f"WorkerConfig(rank={self.rank}, world_size={self.world_size}, num_workers={self.num_workers})"
        if info is None:
            if self.workers_per_rank > 1:
                raise ConfigError(
                    format_message(
                        f"{reader} was built for {self.num_workers} workers per rank but is iterated outside a DataLoader worker",
                        expected=f"iteration inside the {self.num_workers} workers of a DataLoader ({built_for})",
                        found="iteration in the main process: only worker 0's share of the samples would be read",
                        fix="read it through get_loader(dataset) or get_savable_loader(dataset), or build it with num_workers=0",
                    )
                )
            return 0
        if info.num_workers != self.workers_per_rank:
            raise ConfigError(
                format_message(
                    f"{reader} was built for another number of workers than the DataLoader running it",
                    expected=f"a DataLoader with {self.workers_per_rank} worker(s): it was built with {built_for}",
                    found=f"a DataLoader with {info.num_workers} worker(s) (worker {info.id} is reading)",
                    fix="read it through get_loader(dataset), which starts the right number of workers, or rebuild "
                    "the dataset with WorkerConfig(num_workers=...) equal to the DataLoader's",
                )
            )
        return info.id

    def global_worker_id(self, local_worker_id: int = 0) -> int:
        return self.rank * self.workers_per_rank + local_worker_id

    def worker_seed(self, local_worker_id: int = 0) -> int:
        """Energon's seed of a worker (depends on its global id and ``seed_offset``)."""
        return worker_seed(self.global_worker_id(local_worker_id), self.seed_offset)

    def config(self) -> dict[str, Any]:
        """Energon's ``WorkerConfig.config()``: rank, world size, workers and the size of the
        data-parallel group (None without one)."""
        group = self.data_parallel_group
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "data_parallel_group": group.size() if group is not None else None,
        }

    def fingerprint(self) -> dict[str, Any]:
        """What a saved loader state records of this config (its keys must not change: states
        saved by earlier releases are compared with it on restore)."""
        return {"rank": self.rank, "world_size": self.world_size, "num_workers": self.num_workers, "seed_offset": self.seed_offset}

    def should_log(self, level: int) -> bool:
        """Whether debug entries of ``level`` (1 or 2) are written (Energon: ``level <= worker_log_level``)."""
        return level <= self.worker_log_level

    def worker_log(self, data: dict[str, Any], local_worker_id: int | None = None) -> None:
        """Writes ``data`` as one JSON line to this process's debug file, as Energon does.

        The file is ``worker_debug_path`` with ``{worker_id}`` = ``rank * (num_workers + 1)`` plus
        0 for the main process or 1 + the local worker id in a dataloader worker, and ``{pid}`` =
        the process id; it is opened (truncated) on the first line. Without a path, the line goes
        to standard output (Energon prints it): it is the output the user asked for with
        ``worker_log_level``, not a diagnostic message. ``local_worker_id``: the logical worker
        (default: the dataloader worker this runs in).
        """
        line = json.dumps(data, default=str) + "\n"
        if self.worker_debug_path is None:
            sys.stdout.write(line)
            sys.stdout.flush()
            return
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        if local_worker_id is None:
            local_worker_id = info.id if info is not None else 0
        worker_id = self.rank * (self.num_workers + 1) + local_worker_id + (1 if info is not None else 0)
        path = self.worker_debug_path.format(worker_id=worker_id, pid=multiprocessing.current_process().ident)
        file = _DEBUG_FILES.get(path)
        if file is None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            file = _DEBUG_FILES[path] = open(path, "w")  # noqa: SIM115 - kept open for the life of the process
        file.write(line)
        file.flush()


def global_position(worker_config: WorkerConfig, batch: int, local_worker_id: int) -> Callable[[int], int]:
    """Where this worker's ``n``-th sample sits in the global training stream (a blend's clock).

    The stream is ordered by training step, then rank, then position in the batch: the loader
    takes one batch from each local worker in turn, so this worker's ``k``-th batch is rank step
    ``k * workers + local_worker_id``, taken by all ranks at once.
    """
    workers, ranks, rank = worker_config.workers_per_rank, worker_config.world_size, worker_config.rank

    def position(n: int) -> int:
        k, j = divmod(n, batch)
        return ((k * workers + local_worker_id) * ranks + rank) * batch + j

    return position


#: Debug files this process has open, by path: one handle per file even when several equal
#: configs log to it. A forked worker inherits the handles; it writes to its own paths when the
#: path has ``{worker_id}`` or ``{pid}``, and appends through the shared handle otherwise.
_DEBUG_FILES: dict[str, TextIO] = {}


@atexit.register
def _close_debug_files() -> None:
    for file in _DEBUG_FILES.values():
        file.close()
    _DEBUG_FILES.clear()


def _distributed_rank(group: Any = None) -> tuple[int, int]:
    """(rank, world size) in ``group`` when torch.distributed is initialised, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1
