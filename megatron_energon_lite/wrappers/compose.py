"""Energon's pipeline composition through wrappers, for task encoders that override ``build_*``.

``TaskEncoder.build_train_datasets`` / ``build_val_datasets`` / ``build_batch`` /
``build_encode_sample`` / ``build_cook_crude_sample`` call these functions. They are used only
when a task encoder overrides one of those methods (its override may call ``super()``); otherwise
the loader builds the same stages directly from ``pipeline/build.py``. The inputs are
:class:`LoadedDataset` entries whose ``dataset`` is a dataset factory (``flavors/``): ``.build()``
gives the dataset's uncooked samples on each worker.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, format_message
from ..flavors.base_dataset import BaseCoreDatasetFactory
from ..flavors.factories import plan_factory
from ..pipeline.aux_sources import PRIMARY, aux_stores, decoded
from ..pipeline.build import PipelineSpec, dataset_sizes, dataset_slices
from ..pipeline.hooks import hook_spec
from ..samples import CrudeSample
from ..task_encoder.cooking import select_cooker
from ..worker import WorkerConfig
from .base import SavableDataset
from .batch_dataset import BatchDataset
from .blend_dataset import BlendDataset
from .concat_dataset import ConcatDataset
from .epochize_dataset import EpochizeDataset
from .group_batch_dataset import GroupBatchDataset
from .limit_dataset import LimitDataset
from .map_dataset import MapDataset
from .packing_dataset import PackingDataset
from .repeat_dataset import RepeatDataset
from .shuffle_buffer_dataset import ShuffleBufferDataset

if TYPE_CHECKING:
    from ..task_encoder.base import TaskEncoder

__all__ = [
    "BUILD_METHODS",
    "DatasetBlendMode",
    "LoadedDataset",
    "build_batch",
    "build_cook_crude_sample",
    "build_encode_sample",
    "build_train_datasets",
    "build_val_datasets",
    "load_dataset",
    "overrides_build",
]

#: Energon's pipeline-building methods of a task encoder.
BUILD_METHODS = ("build_train_datasets", "build_val_datasets", "build_batch", "build_encode_sample", "build_cook_crude_sample")


class DatasetBlendMode(enum.Enum):
    """How ``build_train_datasets`` combines several datasets (Energon's names)."""

    NONE = "none"
    DATASET_WEIGHT = "dataset_weight"
    SAMPLE_REPETITIONS = "sample_repetitions"


@dataclasses.dataclass
class LoadedDataset:
    """One dataset of a plan with its blend settings (Energon's ``LoadedDataset``)."""

    dataset: BaseCoreDatasetFactory
    weight: float | None = None
    repetitions: float | None = None
    aux: dict[str, Any] | None = None


def overrides_build(task_encoder: Any) -> bool:
    """Whether the task encoder overrides one of Energon's ``build_*`` methods."""
    from ..task_encoder.base import DefaultTaskEncoder, TaskEncoder

    cls = type(task_encoder)
    return any(getattr(cls, name) not in (getattr(TaskEncoder, name), getattr(DefaultTaskEncoder, name)) for name in BUILD_METHODS)


def loaded_datasets(spec: PipelineSpec) -> list[LoadedDataset]:
    """The plan's datasets as ``build_train_datasets`` / ``build_val_datasets`` receive them."""
    slices, sizes = dataset_slices(spec), dataset_sizes(spec)  # once for every dataset of the plan
    return [
        LoadedDataset(plan_factory(spec, k, slices[k], sizes[k]), weight=float(leaf.weight), repetitions=leaf.repetitions, aux=aux_stores(leaf, None, primary=False) or None)
        for k, leaf in enumerate(spec.plan.leaves)
    ]


def build_cook_crude_sample(te: TaskEncoder, dataset: SavableDataset[Any], *, worker_config: WorkerConfig, subflavors: dict[str, Any], get_primary_aux: Any = None, aux: dict[str, Any] | None = None) -> SavableDataset[Any]:
    spec = hook_spec(te)
    cooker = None if spec.overridden("cook_crude_sample") else select_cooker(te.cookers, subflavors)
    stores = dict(aux or {})
    if cooker is not None and cooker.need_primary and PRIMARY not in stores:
        if get_primary_aux is None:
            raise ConfigError(format_message("the cooker needs the primary dataset (need_primary=True)", fix="pass get_primary_aux=<dataset factory>.as_file_store"))
        stores[PRIMARY] = get_primary_aux()
    cook = functools.partial(te.cook_crude_sample, cooker=cooker, aux=decoded(stores, te.decoder))
    return MapDataset(dataset, cook, worker_config=worker_config, failure_tolerance=spec.tolerance("cook_crude_sample"))


def load_dataset(te: TaskEncoder, loaded: LoadedDataset, worker_config: WorkerConfig) -> SavableDataset[Any]:
    """A dataset's samples, cooked when it is crude (Energon's ``TaskEncoder._load_dataset``)."""
    factory = loaded.dataset
    built = factory.build()
    if factory.__sample_type__ is CrudeSample:
        return te.build_cook_crude_sample(built, worker_config=worker_config, subflavors=factory.subflavors, get_primary_aux=factory.as_file_store, aux=loaded.aux)
    return built


def build_encode_sample(te: TaskEncoder, dataset: SavableDataset[Any], *, worker_config: WorkerConfig) -> SavableDataset[Any]:
    spec = hook_spec(te)
    if spec.sample_encoder is None:
        return dataset
    return MapDataset(dataset, getattr(te, spec.sample_encoder), worker_config=worker_config, failure_tolerance=spec.tolerance(spec.sample_encoder))


def build_batch(te: TaskEncoder, dataset: SavableDataset[Any], *, batch_size: int | None, batch_drop_last: bool = False, packing_buffer_size: int | None = None, worker_config: WorkerConfig) -> SavableDataset[Any]:
    spec = hook_spec(te)
    if packing_buffer_size is not None:
        if not spec.packing:
            raise ConfigError(format_message("packing_buffer_size needs a task encoder that packs", where=spec.task_encoder, expected="select_samples_to_pack and pack_selected_samples overridden", fix="override both hooks, or leave packing_buffer_size None"))
        dataset = PackingDataset(
            dataset,
            packing_buffer_size,
            te.select_samples_to_pack,
            te.pack_selected_samples,
            sample_encoder=te.postencode_sample if spec.postencoder else None,
            final_packer_failure_tolerance=spec.tolerance("pack_selected_samples"),
            worker_config=worker_config,
        )
    elif spec.postencoder:
        dataset = MapDataset(dataset, te.postencode_sample, worker_config=worker_config, failure_tolerance=spec.tolerance("postencode_sample"))
    if spec.grouping:
        dataset = GroupBatchDataset(dataset, batch_size, te.batch_group_criterion, te.batch, drop_last=batch_drop_last, failure_tolerance=spec.tolerance("batch"), worker_config=worker_config)
    elif batch_size is not None:
        dataset = BatchDataset(dataset, batch_size, te.batch, drop_last=batch_drop_last, failure_tolerance=spec.tolerance("batch"), worker_config=worker_config)
    else:
        return dataset
    if spec.batch_encoder:
        dataset = MapDataset(dataset, te.encode_batch, worker_config=worker_config, failure_tolerance=spec.tolerance("encode_batch"))
    return dataset


def _blend_mode(value: Any) -> DatasetBlendMode:
    return value if isinstance(value, DatasetBlendMode) else DatasetBlendMode(value)


def build_train_datasets(
    te: TaskEncoder,
    *,
    datasets: list[LoadedDataset],
    worker_config: WorkerConfig,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    virtual_epoch_length: int = 0,
    shuffle_buffer_size: int | None = None,
    blend_mode: Any = DatasetBlendMode.NONE,
    repeat: bool = True,
) -> SavableDataset[Any]:
    """Energon's default training composition: repeat, blend, shuffle, encode, batch, virtual epochs."""
    if not datasets:
        raise ConfigError(format_message("build_train_datasets got no datasets", fix="check the metadataset's train split"))
    mode = _blend_mode(blend_mode)
    loaded = [load_dataset(te, d, worker_config) for d in datasets]
    if mode is DatasetBlendMode.DATASET_WEIGHT or (mode is DatasetBlendMode.NONE and repeat):
        inner = [(RepeatDataset(ds, worker_config=worker_config), 1.0 if d.weight is None else float(d.weight)) for ds, d in zip(loaded, datasets)]
        repeat = False  # the datasets repeat already
    else:
        inner = [
            (ds if d.repetitions in (None, 1) else RepeatDataset(ds, repeats=d.repetitions, worker_config=worker_config), len(d.dataset) * (1 if d.repetitions is None else d.repetitions))
            for ds, d in zip(loaded, datasets)
        ]
    dataset: SavableDataset[Any] = inner[0][0] if len(inner) == 1 else BlendDataset(*inner, worker_config=worker_config)
    if repeat:
        dataset = RepeatDataset(dataset, worker_config=worker_config)
    if shuffle_buffer_size is not None and shuffle_buffer_size > 1:
        dataset = ShuffleBufferDataset(dataset, shuffle_buffer_size, worker_config=worker_config)
    dataset = te.build_encode_sample(dataset, worker_config=worker_config)
    dataset = te.build_batch(dataset, batch_size=batch_size, batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, worker_config=worker_config)
    if virtual_epoch_length > 0:
        dataset = EpochizeDataset(dataset, virtual_epoch_length, worker_config=worker_config)
    return dataset


def build_val_datasets(
    te: TaskEncoder,
    *,
    datasets: list[LoadedDataset],
    worker_config: WorkerConfig,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    limit: int | None = None,
) -> SavableDataset[Any]:
    """Energon's default validation composition: concatenate, encode, batch, limit."""
    if not datasets:
        raise ConfigError(format_message("build_val_datasets got no datasets", fix="check the metadataset's val split"))
    loaded = [load_dataset(te, d, worker_config) for d in datasets]
    dataset = loaded[0] if len(loaded) == 1 else ConcatDataset(*loaded, worker_config=worker_config)
    dataset = te.build_encode_sample(dataset, worker_config=worker_config)
    dataset = te.build_batch(dataset, batch_size=batch_size, batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, worker_config=worker_config)
    if limit is not None and limit > 0:
        dataset = LimitDataset(dataset, limit, reset_after_epoch=True, worker_config=worker_config)
    return dataset
