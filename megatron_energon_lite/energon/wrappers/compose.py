"""Energon's ``build_*`` methods: the steps of the loader's own composition, under Energon's names.

``TaskEncoder.build_train_datasets`` / ``build_val_datasets`` / ``build_batch`` /
``build_encode_sample`` / ``build_cook_crude_sample`` call these functions when a task encoder
overrides one of those methods (its override may call ``super()``). Each step makes the same
stage recipes as ``pipeline/build.py`` does for the default pipeline (it calls build.py's
functions), so a pass-through override composes the very same pipeline: the spec's blend mode
(exact, cost), elastic resume and fingerprint hold. The inputs are :class:`LoadedDataset` entries
whose ``dataset`` is a dataset factory (``flavors/``): ``.build()`` gives the dataset's uncooked
samples on each worker.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError, format_message
from ..flavors.base_dataset import BaseCoreDatasetFactory
from ..flavors.factories import plan_factory
from ...pipeline import build
from ...pipeline.aux_sources import PRIMARY, aux_stores, decoded
from ...pipeline.build import PipelineSpec, Source, dataset_sizes, dataset_slices, validate
from ...pipeline.cooking import select_cooker
from ...pipeline.hooks import hook_spec
from ...pipeline.recipe import Blend, Concat, Map, Pass, Recipe, Repeat, Shuffle
from ...samples import CrudeSample
from ...worker import WorkerConfig

if TYPE_CHECKING:
    from ..task_encoder.base import TaskEncoder

__all__ = [
    "DatasetBlendMode",
    "LoadedDataset",
    "PLAN_BLEND_MODES",
    "build_batch",
    "build_cook_crude_sample",
    "build_encode_sample",
    "build_datasets",
    "build_train_datasets",
    "build_val_datasets",
    "load_dataset",
]


class DatasetBlendMode(enum.Enum):
    """How ``build_train_datasets`` combines several datasets (Energon's names)."""

    NONE = "none"
    DATASET_WEIGHT = "dataset_weight"
    SAMPLE_REPETITIONS = "sample_repetitions"


#: The blend mode ``build_train_datasets`` gets for each kind of plan.
PLAN_BLEND_MODES = {"single": DatasetBlendMode.NONE, "blend": DatasetBlendMode.DATASET_WEIGHT, "blend_epochized": DatasetBlendMode.SAMPLE_REPETITIONS}


@dataclasses.dataclass
class LoadedDataset:
    """One dataset of a plan with its blend settings (Energon's ``LoadedDataset``)."""

    dataset: BaseCoreDatasetFactory
    weight: float | None = None
    repetitions: float | None = None
    aux: dict[str, Any] | None = None


def loaded_datasets(spec: PipelineSpec) -> list[LoadedDataset]:
    """The plan's datasets as ``build_train_datasets`` / ``build_val_datasets`` receive them."""
    scheduled = [leaf for leaf in spec.plan.leaves if leaf.weight_schedule is not None] if spec.training else []
    if scheduled:
        raise ConfigError(
            format_message(
                "a weight schedule cannot be handed to Energon's dataset list",
                where=scheduled[0].where,
                expected="constant weights (LoadedDataset.weight is one number)",
                found="a weight: schedule",
                fix="load it with get_train_dataset and a task encoder that does not override build_train_datasets, or use constant weights",
            )
        )
    slices, sizes = dataset_slices(spec), dataset_sizes(spec)  # once for every dataset of the plan
    return [
        LoadedDataset(plan_factory(spec, k, slices[k], sizes[k]), weight=float(leaf.weight), repetitions=leaf.repetitions, aux=aux_stores(leaf, None, primary=False) or None)
        for k, leaf in enumerate(spec.plan.leaves)
    ]


def build_datasets(te: TaskEncoder, spec: PipelineSpec) -> Recipe:
    """The pipeline of ``spec`` as the task encoder's ``build_train_datasets`` /
    ``build_val_datasets`` compose it (what the loader asks an overriding task encoder for)."""
    validate(spec)
    wc = spec.worker_config
    datasets = loaded_datasets(spec)
    if spec.training:
        mode = PLAN_BLEND_MODES[spec.plan.kind]
        dataset = te.build_train_datasets(
            datasets=datasets, worker_config=wc, batch_size=spec.batch_size, batch_drop_last=spec.batch_drop_last,
            packing_buffer_size=spec.packing_buffer_size, virtual_epoch_length=spec.virtual_epoch_length,
            shuffle_buffer_size=spec.shuffle_buffer_size, blend_mode=mode, repeat=spec.repeat,
        )
    else:
        dataset = te.build_val_datasets(
            datasets=datasets, worker_config=wc, batch_size=spec.batch_size, batch_drop_last=spec.batch_drop_last,
            packing_buffer_size=spec.packing_buffer_size, limit=spec.limit,
        )
    if not isinstance(dataset, Recipe):
        raise ConfigError(
            format_message(
                f"{type(te).__name__}.build_{'train' if spec.training else 'val'}_datasets returned {type(dataset).__name__}",
                expected="a dataset built from the datasets it was given and the wrappers of megatron_energon_lite (MapDataset, BatchDataset, ...)",
                fix="return the composed dataset",
            )
        )
    return dataset


def _plan_sources(datasets: list[LoadedDataset]) -> PipelineSpec | None:
    """The spec whose plan ``datasets`` are, all of them in order with the plan's weights and
    repetitions (what the loader passes), else None (datasets a task encoder assembled itself)."""
    bindings = [getattr(d.dataset, "_bound", None) for d in datasets]
    if not bindings or any(b is None for b in bindings):
        return None
    spec = bindings[0][0]
    leaves = spec.plan.leaves
    if len(leaves) != len(datasets) or any(b[0] is not spec or b[1] != k for k, b in enumerate(bindings)):
        return None
    if any(float(leaf.weight) != (1.0 if d.weight is None else float(d.weight)) or leaf.repetitions != d.repetitions for leaf, d in zip(leaves, datasets)):
        return None
    return spec


def _plan_spec(dataset: Recipe) -> PipelineSpec | None:
    """The spec of the plan sources ``dataset`` reads from, if they share one."""
    specs = {id(s.spec): s.spec for s in build.plan_sources(dataset)}
    return next(iter(specs.values())) if len(specs) == 1 else None


def build_cook_crude_sample(te: TaskEncoder, dataset: Recipe, *, worker_config: WorkerConfig, subflavors: dict[str, Any], get_primary_aux: Any = None, aux: dict[str, Any] | None = None) -> Recipe:
    if isinstance(dataset, Source) and not dataset.cook and subflavors == dataset.subflavors and set(aux or {}) == set(dataset.leaf.aux or {}):
        return dataset.cooked()  # the plan's own cooking, as the default pipeline does it
    spec = hook_spec(te)
    cooker = None if spec.overridden("cook_crude_sample") else select_cooker(te.cookers, subflavors)
    stores = dict(aux or {})
    if cooker is not None and cooker.need_primary and PRIMARY not in stores:
        if get_primary_aux is None:
            raise ConfigError(format_message("the cooker needs the primary dataset (need_primary=True)", fix="pass get_primary_aux=<dataset factory>.as_file_store"))
        stores[PRIMARY] = get_primary_aux()
    cook = functools.partial(te.cook_crude_sample, cooker=cooker, aux=decoded(stores, te.decoder))
    return Map(dataset, worker_config, cook, stage="cook_crude_sample", tolerance=spec.tolerance("cook_crude_sample"), tag="Cook")


def load_dataset(te: TaskEncoder, loaded: LoadedDataset, worker_config: WorkerConfig) -> Recipe:
    """A dataset's samples, cooked when it is crude (Energon's ``TaskEncoder._load_dataset``)."""
    factory = loaded.dataset
    built = factory.build()
    if factory.__sample_type__ is CrudeSample:
        return te.build_cook_crude_sample(built, worker_config=worker_config, subflavors=factory.subflavors, get_primary_aux=factory.as_file_store, aux=loaded.aux)
    return built


def build_encode_sample(te: TaskEncoder, dataset: Recipe, *, worker_config: WorkerConfig) -> Recipe:
    return build.encode_sample_recipe(te, dataset, worker_config)


def build_batch(te: TaskEncoder, dataset: Recipe, *, batch_size: int | None, batch_drop_last: bool = False, packing_buffer_size: int | None = None, worker_config: WorkerConfig) -> Recipe:
    spec = _plan_spec(dataset)
    group_buffer_size = None if spec is None else spec.group_buffer_size  # ours: not in Energon's signature
    return build.batch_recipe(te, dataset, worker_config, batch_size=batch_size, batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, group_buffer_size=group_buffer_size)


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
) -> Recipe:
    """Energon's default training composition: repeat, blend, shuffle, encode, batch, virtual
    epochs. The plan's datasets as the loader passes them are blended as the default pipeline
    blends them (the spec's blend mode, exact and cost included)."""
    if not datasets:
        raise ConfigError(format_message("build_train_datasets got no datasets", fix="check the metadataset's train split"))
    mode = _blend_mode(blend_mode)
    loaded = [load_dataset(te, d, worker_config) for d in datasets]
    spec = _plan_sources(datasets)
    if spec is not None and spec.training and PLAN_BLEND_MODES[spec.plan.kind] is mode and spec.repeat == repeat and spec.worker_config is worker_config:
        dataset = build.datasets_recipe(spec, loaded)
    else:
        dataset = _blended(loaded, datasets, mode, repeat, worker_config)
    if shuffle_buffer_size is not None and shuffle_buffer_size > 1:
        dataset = Shuffle(dataset, worker_config, shuffle_buffer_size)
    dataset = te.build_encode_sample(dataset, worker_config=worker_config)
    dataset = te.build_batch(dataset, batch_size=batch_size, batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, worker_config=worker_config)
    if virtual_epoch_length > 0:
        dataset = Pass(dataset, worker_config, virtual_epoch_length, what="items per virtual epoch")
    return dataset


def _blended(loaded: list[Recipe], datasets: list[LoadedDataset], mode: DatasetBlendMode, repeat: bool, worker_config: WorkerConfig) -> Recipe:
    """Energon's own repeat and random blend, for datasets that are not a plan's."""
    if mode is DatasetBlendMode.DATASET_WEIGHT or (mode is DatasetBlendMode.NONE and repeat):
        inner = [(Repeat(ds, worker_config), 1.0 if d.weight is None else float(d.weight)) for ds, d in zip(loaded, datasets)]
        repeat = False  # the datasets repeat already
    else:
        inner = [
            (ds if d.repetitions in (None, 1) else Repeat(ds, worker_config, d.repetitions), len(d.dataset) * (1 if d.repetitions is None else d.repetitions))
            for ds, d in zip(loaded, datasets)
        ]
    dataset = inner[0][0] if len(inner) == 1 else Blend(tuple(ds for ds, _ in inner), worker_config, tuple(w for _, w in inner), names=tuple(f"BlendDataset dataset {i}" for i in range(len(inner))))
    return Repeat(dataset, worker_config) if repeat else dataset


def build_val_datasets(
    te: TaskEncoder,
    *,
    datasets: list[LoadedDataset],
    worker_config: WorkerConfig,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    limit: int | None = None,
) -> Recipe:
    """Energon's default validation composition: concatenate, encode, batch, limit."""
    if not datasets:
        raise ConfigError(format_message("build_val_datasets got no datasets", fix="check the metadataset's val split"))
    loaded = [load_dataset(te, d, worker_config) for d in datasets]
    dataset = loaded[0] if len(loaded) == 1 else Concat(tuple(loaded), worker_config)
    dataset = te.build_encode_sample(dataset, worker_config=worker_config)
    dataset = te.build_batch(dataset, batch_size=batch_size, batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, worker_config=worker_config)
    if limit is not None and limit > 0:
        dataset = Pass(dataset, worker_config, limit, restart=True, capped=True, what="the limit of items per pass")
    return dataset
