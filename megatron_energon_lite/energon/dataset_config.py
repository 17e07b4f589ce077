"""Energon's ``dataset_config.get_dataset_from_config``: the factory of one prepared dataset split."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .epathlib import EPath
from .flavors.base_dataset import BaseCoreDatasetFactory
from .flavors.crude import CrudeWebdataset
from .flavors.jsonl import DefaultCrudeJsonlDatasetFactory
from .flavors.webdataset.standard_webdataset import StandardWebdatasetFactory
from ..energon_mode import current_policy
from ..format.dataset_config import load_dataset_config, require_sample_type
from ..samples import CrudeSample
from ..worker import WorkerConfig

__all__ = ["get_dataset_from_config"]


def get_dataset_from_config(
    path: Any,
    *,
    dataset_config: str | None = None,
    split_config: str | None = None,
    split_part: str | None = None,
    training: bool = True,
    subflavors: Mapping[str, Any] | None = None,
    worker_config: WorkerConfig,
    sample_type: type | None = None,
    **kwargs: Any,
) -> BaseCoreDatasetFactory:
    """The factory of split ``split_part`` of the prepared dataset (or ``.jsonl`` file) at ``path``.

    Its class is the one ``dataset.yaml`` (or ``dataset_config``) implies: the user's class it
    names (``__module__``/``__class__``, made with the file's other keys), ``CrudeWebdataset`` for
    a crude dataset, else ``StandardWebdatasetFactory`` of the named sample type; ``sample_type``,
    when given, must be that type or a base of it. ``len()`` is the split's sample count and
    ``.build()`` gives the dataset to wrap (``MapDataset``, ``BatchDataset`` ...) or to pass to
    ``get_loader``. Other keyword arguments go to the factory: ``decoder``, ``shuffle_over_epochs``,
    ``parallel_shard_iters``, ``max_samples_per_sequence``, ``subset``, ``trust_dataset_code``.
    """
    common = dict(split_part=split_part or "train", training=training, worker_config=worker_config, split_config=split_config, **kwargs)
    jsonl = str(path).endswith(".jsonl")
    config = None if jsonl else load_dataset_config(path, dataset_config, trust_dataset_code=bool(kwargs.get("trust_dataset_code")), policy=current_policy())
    found = CrudeSample if config is None else config.yields
    if sample_type is not None:
        require_sample_type(found, sample_type, where=str(path))
    if config is not None and config.factory_class is not None:  # the user's class, made with the file's keys
        return config.make_factory(EPath(path), subflavors=subflavors, dataset_config=dataset_config, **common)
    common["subflavors"] = dict(subflavors or {})
    if jsonl:
        return DefaultCrudeJsonlDatasetFactory(path, **common)
    if found is CrudeSample:
        return CrudeWebdataset(path, dataset_config=dataset_config, **common)
    return StandardWebdatasetFactory(path, sample_type=found, dataset_config=dataset_config, **common)
