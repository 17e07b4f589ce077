"""Energon's debug log records, written when ``WorkerConfig.worker_log_level >= 1``.

Each record is one JSON object per line, written through :meth:`WorkerConfig.worker_log` (one
file per process: ``worker_debug_path`` with ``{worker_id}`` = ``rank * (num_workers + 1)``, plus
0 for the main process, 1 + the worker id in a dataloader worker).  The records have Energon's
names and fields, so that ``energon analyze-debug`` reads our logs and ``energon-lite
analyze-debug`` reads Energon's:

Main process, level 1, from the loader (:class:`LoaderLog`)::

    {"t": "SavableLoader.__init__", "r": rank, "w": null, "id": loader id, "config": {...}}
    {"t": "SavableDataLoader.iter", "r": rank, "w": null, "id": loader id, "iter_id": pass id}
    {"t": "SavableDataLoader.yield", "r": rank, "w": null, "id": ..., "iter_id": ...,
     "worker_id": logical worker, "worker_idx": items of that worker so far,
     "idx": index in this pass, "iter_idx": the same, "global_idx": index over all passes,
     "keys": [sample keys of the batch]}
    {"t": "SavableDataLoader.StopIteration", "r": rank, "w": null, "id": ..., "iter_id": ...}

``config`` holds ``map_fn_config: {"training": bool, "_path": dataset path}`` (where Energon's
analyzer looks for the dataset's mode and path) next to the dataset's own config.

Dataloader worker (:class:`WorkerLog`), level 1 for a training dataset, 2 for validation (as
Energon's ``LogSampleDataset``)::

    {"t": "yield_batch", "r": rank, "w": global worker id, "m": "train" | "val",
     "idx": items of this worker so far, "keys": [sample keys]}

A batch without string sample keys gets no ``keys`` field.
"""

from __future__ import annotations

from typing import Any

from ..sample_utils import default_get_batch_keys
from ..worker import WorkerConfig


def dataset_mode_and_path(dataset: Any) -> tuple[bool | None, str | None]:
    """(training, path) of a dataset from ``get_train_dataset``/``get_val_dataset`` or a wrapper.

    The pipeline's spec when it has one, else the first ``training`` and ``path`` (or Energon's
    ``_path``) found in its ``config()``; None for what cannot be found.
    """
    spec = getattr(dataset, "spec", None)
    if spec is not None and hasattr(spec, "training"):
        return bool(spec.training), str(spec.path)
    try:
        config = dataset.config()
    except Exception:  # noqa: BLE001 - a dataset without a usable config() still loads; the log says unknown
        return None, None
    training = find_config_value(config, ("training",))
    path = find_config_value(config, ("_path", "path"))
    return (bool(training) if isinstance(training, bool) else None), (None if path is None else str(path))


def find_config_value(config: Any, names: tuple[str, ...]) -> Any:
    """The first value of a key in ``names`` in a nested config (dicts and lists), depth first."""
    if isinstance(config, dict):
        for name in names:
            if name in config and not isinstance(config[name], (dict, list)):
                return config[name]
        children = list(config.values())
    elif isinstance(config, (list, tuple)):
        children = list(config)
    else:
        return None
    for child in children:
        found = find_config_value(child, names)
        if found is not None:
            return found
    return None


class LoaderLog:
    """The main process's records of one loader: creation, passes, and every item it yields.

    Create it with :meth:`create`, which returns None when the level is below 1 (the loader then
    pays nothing per item).
    """

    def __init__(self, worker_config: WorkerConfig, loader_id: int, dataset: Any) -> None:
        self.worker_config = worker_config
        self.loader_id = loader_id
        self.iter_id: int | None = None
        self.pass_index = 0  # items yielded in the current pass
        self.global_index = 0  # items yielded over all passes
        self.worker_counts: dict[int, int] = {}
        training, path = dataset_mode_and_path(dataset)
        try:
            own_config = dataset.config()
        except Exception:  # noqa: BLE001 - see dataset_mode_and_path
            own_config = {}
        config = {"map_fn_config": {"training": training, "_path": path}}
        config.update(own_config if isinstance(own_config, dict) else {"config": own_config})
        self._write("SavableLoader.__init__", config=config)

    @classmethod
    def create(cls, worker_config: WorkerConfig, loader_id: int, dataset: Any) -> LoaderLog | None:
        if not worker_config.should_log(level=1):
            return None
        return cls(worker_config, loader_id, dataset)

    def _write(self, kind: str, **fields: Any) -> None:
        self.worker_config.worker_log({"t": kind, "r": self.worker_config.rank, "w": None, "id": self.loader_id, **fields})

    def start_pass(self, iter_id: int) -> None:
        """A new pass over the dataset (an epoch of the loader) begins."""
        self.iter_id = iter_id
        self.pass_index = 0
        self._write("SavableDataLoader.iter", iter_id=iter_id)

    def yielded(self, item: Any, worker_id: int) -> None:
        """The loader hands ``item``, made by logical worker ``worker_id``, to the caller."""
        worker_index = self.worker_counts.get(worker_id, 0)
        self.worker_counts[worker_id] = worker_index + 1
        keys = default_get_batch_keys(item)
        self._write(
            "SavableDataLoader.yield",
            iter_id=self.iter_id,
            worker_id=worker_id,
            worker_idx=worker_index,
            idx=self.pass_index,
            iter_idx=self.pass_index,
            global_idx=self.global_index,
            **({} if keys is None else {"keys": keys}),
        )
        self.pass_index += 1
        self.global_index += 1

    def end_pass(self) -> None:
        """The current pass has ended (every worker is exhausted)."""
        self._write("SavableDataLoader.StopIteration", iter_id=self.iter_id)


class WorkerLog:
    """A dataloader worker's record of every item it yields (Energon's ``yield_batch``)."""

    def __init__(self, worker_config: WorkerConfig, training: bool) -> None:
        self.worker_config = worker_config
        self.mode = "train" if training else "val"
        self.counts: dict[int, int] = {}

    @classmethod
    def create(cls, dataset: Any) -> WorkerLog | None:
        """None unless the level asks for it: 1 for a training dataset, 2 for validation."""
        worker_config = dataset.worker_config
        if not worker_config.should_log(level=1):
            return None
        training, _ = dataset_mode_and_path(dataset)
        if not training and not worker_config.should_log(level=2):
            return None
        return cls(worker_config, bool(training))

    def yielded(self, item: Any, worker_id: int) -> None:
        """Logical worker ``worker_id`` (of this rank) yields ``item``."""
        index = self.counts.get(worker_id, 0)
        self.counts[worker_id] = index + 1
        config = self.worker_config
        record = {"t": "yield_batch", "r": config.rank, "w": config.global_worker_id(worker_id), "m": self.mode, "idx": index}
        keys = default_get_batch_keys(item)
        if keys is not None:
            record["keys"] = keys
        config.worker_log(record, local_worker_id=worker_id)
