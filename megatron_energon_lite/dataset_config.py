"""Energon's ``dataset_config.get_dataset_from_config``: the factory of one prepared dataset split."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ConfigError, format_message
from .flavors.base_dataset import BaseCoreDatasetFactory
from .flavors.crude import CrudeWebdataset
from .flavors.jsonl import DefaultCrudeJsonlDatasetFactory
from .flavors.webdataset.standard_webdataset import StandardWebdatasetFactory
from .format.dataset_config import load_dataset_config
from .samples import CrudeSample
from .worker import WorkerConfig

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

    Its class is the one ``dataset.yaml`` (or ``dataset_config``) implies: ``CrudeWebdataset`` for
    a crude dataset, else ``StandardWebdatasetFactory`` of the named sample type; ``sample_type``,
    when given, must be that type or a base of it. ``len()`` is the split's sample count and
    ``.build()`` gives the dataset to wrap (``MapDataset``, ``BatchDataset`` ...) or to pass to
    ``get_loader``. Other keyword arguments go to the factory: ``decoder``, ``shuffle_over_epochs``,
    ``parallel_shard_iters``, ``max_samples_per_sequence``, ``subset``, ``trust_dataset_code``.
    """
    common = dict(split_part=split_part or "train", training=training, worker_config=worker_config, subflavors=dict(subflavors or {}), split_config=split_config, **kwargs)
    if str(path).endswith(".jsonl"):
        found: type = CrudeSample
        factory: BaseCoreDatasetFactory = DefaultCrudeJsonlDatasetFactory(path, **common)
    else:
        config = load_dataset_config(path, dataset_config, trust_dataset_code=bool(kwargs.get("trust_dataset_code")))
        if config.kind == "crude":
            found = CrudeSample
            factory = CrudeWebdataset(path, dataset_config=dataset_config, **common)
        else:
            found = config.sample_type
            factory = StandardWebdatasetFactory(path, sample_type=found, dataset_config=dataset_config, **common)
    if sample_type is not None and not (isinstance(sample_type, type) and issubclass(found, sample_type)):
        raise ConfigError(
            format_message(
                f"the dataset yields {found.__name__}, not the sample_type {getattr(sample_type, '__name__', sample_type)}",
                where=str(path),
                expected=f"{getattr(sample_type, '__name__', sample_type)} or a subclass",
                found=f"{found.__module__}.{found.__qualname__}",
                fix="pass the dataset's sample type, or fix sample_type in its .nv-meta/dataset.yaml",
            )
        )
    return factory
