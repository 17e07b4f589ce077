"""MixBatchDataset: blends batches of several datasets, then mixes ``batch_size`` of them into one."""

from __future__ import annotations

from typing import Any, Callable

from ...pipeline.node import Node
from ...pipeline.runtime import Runtime
from ...worker import WorkerConfig
from .base import SavableDataset
from .batch_dataset import BatchDataset
from .blend_dataset import BlendDataset

__all__ = ["MixBatchDataset", "concat_pad", "generic_concat", "homogeneous_concat_mix"]


def concat_pad(batch: list[Any]) -> Any:
    """Concatenates tensors along dimension 0, padding the other dimensions with zeros to the largest."""

    ndim = batch[0].ndim
    shape = [max(t.shape[d] for t in batch) for d in range(1, ndim)]
    out = batch[0].new_zeros((sum(t.shape[0] for t in batch), *shape))
    offset = 0
    for t in batch:
        out[(slice(offset, offset + t.shape[0]), *(slice(0, n) for n in t.shape[1:]))] = t
        offset += t.shape[0]
    return out


def generic_concat(batch: list[Any]) -> Any:
    """Concatenates a list of batches field by field: tensors padded and concatenated, lists joined,
    dataclasses / dicts / tuples recursively."""
    import dataclasses

    import numpy as np
    import torch

    first = batch[0]
    if isinstance(first, torch.Tensor):
        return concat_pad(batch)
    if isinstance(first, np.ndarray):
        return np.concatenate(batch)
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return type(first)(**{f.name: generic_concat([getattr(b, f.name) for b in batch]) for f in dataclasses.fields(first) if f.init})
    if isinstance(first, dict):
        return {key: generic_concat([b[key] for b in batch]) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(generic_concat([b[i] for b in batch]) for i in range(len(first))))
    if isinstance(first, list):
        return [item for b in batch for item in b]
    return batch


def homogeneous_concat_mix(samples: list[Any]) -> Any:
    """Mixes batches of one type into one batch (:func:`generic_concat`)."""
    return generic_concat(samples)


class MixBatchDataset(SavableDataset[Any]):
    """Energon's ``MixBatchDataset((dataset, weight), ..., batch_size, batch_mix_fn, worker_config)``.

    The datasets' batches are blended by weight and every ``batch_size`` of them are mixed by
    ``batch_mix_fn`` (default: the list of batches). The same as
    ``BatchDataset(BlendDataset(...), batch_size, batch_mix_fn)``, which is how it is built.
    """

    def __init__(
        self,
        *dataset_weights: tuple[SavableDataset[Any], float],
        batch_size: int,
        batch_mix_fn: Callable[[list[Any]], Any] = lambda x: x,
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__()
        self.worker_config = worker_config
        self.inner = BatchDataset(BlendDataset(*dataset_weights, worker_config=worker_config), batch_size, batch_mix_fn, worker_config=worker_config)

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        return self.inner.build_worker(local_worker_id, runtime)

    def worker_length(self, local_worker_id: int) -> int:
        return self.inner.dataset.worker_length(local_worker_id)

    def config(self) -> dict[str, Any]:
        return {"type": "MixBatchDataset", "inner": self.inner.config()}
