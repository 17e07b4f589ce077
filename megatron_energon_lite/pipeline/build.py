"""The ONLY place that assembles stages into a pipeline.

A :class:`PipelineSpec` holds every setting (plain values plus the user's task encoder); from it,
:func:`default_recipe` composes the stage recipes (``recipe.py``) and :func:`build_worker_pipeline`
builds one dataloader worker's stages. Energon's ``build_*`` methods call the same steps
(:func:`datasets_recipe`, :func:`encode_sample_recipe`, :func:`batch_recipe`). Order, innermost
first (as in Energon, research/energon.md 5.4):

train: per dataset: source (this worker's slices, shuffled per epoch) -> [cook] -> repeat
       (forever; ``repetitions`` times in an epochized blend) -> [blend, if several]
       -> [repeat, epochized blend] -> [shuffle buffer] -> encode_sample -> [batch]
       -> [encode_batch] -> [virtual epochs]
val:   per dataset: source (sequential) -> [cook] -> [concat, if several] -> encode_sample
       -> [batch] -> [encode_batch] -> [limit]

The datasets come from the spec's :class:`BlendPlan` (one for a plain dataset path).
"""

from __future__ import annotations

import dataclasses
from functools import cached_property, partial
from typing import Any

from ..decode import SampleDecoder
from ..errors import ConfigError, format_message
from ..format.metadataset import (
    BLEND_MODES,
    BlendPlan,
    LeafDataset,
    combine_shuffle_over_epochs,
    repeated_length,
)
from ..format.resolved import ResolvedDataset, data_record, resolve_datasets
from ..policy import PLAIN, Policy
from ..rng import dataset_seed
from ..storage import configure_storage
from ..samples import CrudeSample
from ..worker import WorkerConfig
from .aux_sources import aux_stores
from .cooking import select_cooker
from .guard import SampleGuard
from .hooks import HookSpec, hook_spec, stage_hook
from .load import JoinLoader, SampleLoader
from .map import MapNode
from .node import Node
from .recipe import Batch, Blend, Concat, GroupBatch, Map, Pack, Pass, Recipe, Repeat, Shuffle
from .runtime import Runtime
from .sharding import Slices, check_shuffle_over_epochs, epoch_slice_order, rotation_offset_for, worker_sample_range, worker_slices
from .source import SliceSource
from .task_hooks import Hooks, fingerprint_name


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """Everything that decides what a worker yields."""

    path: str
    split_part: str
    training: bool
    worker_config: WorkerConfig
    batch_size: int | None
    batch_drop_last: bool = False
    shuffle_buffer_size: int | None = None
    max_samples_per_sequence: int | None = None
    parallel_shard_iters: int | None = None
    virtual_epoch_length: int = 0
    limit: int | None = None
    repeat: bool = True
    shuffle_over_epochs_multiplier: int | None = 1
    dataset_config: str | None = None
    split_config: str | None = None
    trust_dataset_code: bool = False
    task_encoder: Hooks = dataclasses.field(default=None, compare=False)
    plan: BlendPlan = dataclasses.field(default=None, compare=False)
    blend_mode: str = "random"
    packing_buffer_size: int | None = None
    #: Most items the length-grouping buckets hold together (None: unbounded, as Energon).
    group_buffer_size: int | None = None
    #: Storage options per protocol (``configure_storage``), re-applied in each worker; holds
    #: credentials, so it is never part of the fingerprint or the state.
    storage: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    #: Ours, or Energon's where they differ on principle (``policy.py``): decided when the spec
    #: is planned (``loader/api.py``, from ``as_energon``); not part of the fingerprint.
    policy: Policy = dataclasses.field(default=PLAIN, compare=False)

    def fingerprint(self) -> dict[str, Any]:
        """Plain JSON describing the config, saved with every state and checked on restore."""
        decoder = self.task_encoder.decoder
        return {
            "path": self.path,
            "split_part": self.split_part,
            "training": self.training,
            "batch_size": self.batch_size,
            "batch_drop_last": self.batch_drop_last,
            "shuffle_buffer_size": self.shuffle_buffer_size,
            "max_samples_per_sequence": self.max_samples_per_sequence,
            "parallel_shard_iters": self.parallel_slices,
            "virtual_epoch_length": self.virtual_epoch_length,
            **({"packing_buffer_size": self.packing_buffer_size} if self.packing_buffer_size is not None else {}),
            **({"group_buffer_size": self.group_buffer_size} if self.group_buffer_size is not None else {}),
            "limit": self.limit,
            "repeat": self.repeat,
            "shuffle_over_epochs_multiplier": self.shuffle_over_epochs_multiplier,
            "task_encoder": fingerprint_name(self.task_encoder),
            "decoder": None if decoder is None else decoder.config(),
            # Blends only, so that a plain dataset's fingerprint stays as it was.
            **(self._blend_fingerprint() if self.plan.kind != "single" else {}),
            # A .bin/.idx dataset's window length (a blend's leaves carry their own).
            **({"sequence_length": self.plan.leaves[0].sequence_length} if self.plan.kind == "single" and self.plan.leaves[0].sequence_length is not None else {}),
            **{f"worker_config.{k}": v for k, v in self.worker_config.fingerprint().items()},
        }

    def data_record(self) -> list[dict[str, Any]]:
        """Per dataset of the plan, the data the loader was made for (:func:`data_record`)."""
        return [data_record(leaf.path, leaf.split_part, resolved) for leaf, resolved in zip(self.plan.leaves, self.datasets)]

    @cached_property
    def hooks(self) -> HookSpec:
        """What the task encoder overrides and how (:func:`hook_spec`), read once per plan."""
        return hook_spec(self.task_encoder)

    def with_topology(self, worker_config: WorkerConfig) -> PipelineSpec:
        """The same plan for another rank or topology (elastic resume), sharing the datasets
        this spec read: nothing is read again. Asked again for the same worker config, the same
        spec (so every source of a composed pipeline shares one)."""
        made = self.__dict__.setdefault("_topologies", {})
        if id(worker_config) not in made:
            other = dataclasses.replace(self, worker_config=worker_config)
            other.__dict__["datasets"] = self.datasets  # the cached_properties' values
            other.__dict__["hooks"] = self.hooks
            made[id(worker_config)] = (worker_config, other)  # the config is kept: its id stays unique
        return made[id(worker_config)][1]

    def _blend_fingerprint(self) -> dict[str, Any]:
        """The datasets of a blend (or val concatenation) and each one's target share of samples."""
        leaves = [leaf.describe() for leaf in self.plan.leaves]
        if self.plan.kind == "blend":
            # A scheduled weight: its share at the start (clock 0); the schedule is in the leaf.
            targets = [float(leaf.weight) * (1.0 if leaf.weight_schedule is None else leaf.weight_schedule.factor(0)) for leaf in self.plan.leaves]
        else:
            repetitions = [leaf.repetitions if self.plan.kind == "blend_epochized" else 1.0 for leaf in self.plan.leaves]
            sizes = [size * r for size, r in zip(dataset_sizes(self), repetitions)]
            targets = [size / (sum(sizes) or 1) for size in sizes]
        for leaf, target in zip(leaves, targets):
            leaf["target_share"] = target
        return {"datasets": leaves, "blend_kind": self.plan.kind, "blend_mode": self.blend_mode}

    @cached_property
    def datasets(self) -> tuple[ResolvedDataset, ...]:
        """Each dataset of the plan as its metadata describes it, read once: in the process that
        made the spec (the loader builds it up front); forked workers inherit it."""
        return resolve_datasets(self.plan.leaves, dataset_config=self.dataset_config, split_config=self.split_config, trust_dataset_code=self.trust_dataset_code, policy=self.policy)

    @cached_property
    def slices(self) -> list[list[Slices]]:
        """``[dataset][local worker]`` -> that worker's slices of that dataset (subset applied),
        computed once like :attr:`datasets`."""
        return _dataset_slices(self)

    @property
    def parallel_slices(self) -> int:
        if self.parallel_shard_iters is not None:
            return self.parallel_shard_iters
        return 16 if self.training else 1


def validate(spec: PipelineSpec) -> None:
    """Argument checks with messages that name the argument and the fix."""
    for name, value in (("batch_size", spec.batch_size), ("max_samples_per_sequence", spec.max_samples_per_sequence), ("shuffle_buffer_size", spec.shuffle_buffer_size), ("limit", spec.limit), ("packing_buffer_size", spec.packing_buffer_size), ("group_buffer_size", spec.group_buffer_size)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ConfigError(format_message(f"invalid {name}", expected="a positive integer or None", found=repr(value)))
    if spec.virtual_epoch_length < 0:
        raise ConfigError(format_message("invalid virtual_epoch_length", expected="0 (off) or a positive number of batches", found=repr(spec.virtual_epoch_length)))
    # Energon's values: k >= 1 (epochs shuffled together), -1 (slices drawn with replacement,
    # without end) or None (no shuffling); see sharding.epoch_slice_order.
    check_shuffle_over_epochs(spec.shuffle_over_epochs_multiplier, where="get_train_dataset(shuffle_over_epochs_multiplier=...)")
    # Up front also for a task encoder whose build_* never reach batch_recipe.
    check_packing(spec.hooks, spec.packing_buffer_size)
    if spec.blend_mode not in BLEND_MODES:
        raise ConfigError(format_message("invalid blend_mode", expected=" or ".join(BLEND_MODES), found=repr(spec.blend_mode)))
    scheduled = [leaf for leaf in spec.plan.leaves if leaf.weight_schedule is not None]
    if spec.training and scheduled and spec.blend_mode == "cost":
        raise ConfigError(
            format_message(
                "weight schedules are not supported with blend_mode cost",
                where=scheduled[0].where,
                expected="blend_mode random or exact with a weight schedule",
                found=f"blend_mode {spec.blend_mode!r}",
                fix="a cost blend shares tokens per worker and has no global sample clock to read a schedule at; use blend_mode random or exact, or constant weights",
            )
        )
    if spec.blend_mode == "cost" and spec.training and spec.plan.kind != "single":
        if spec.plan.kind != "blend":
            raise ConfigError(format_message("blend_mode cost needs weights", where=spec.path, found=spec.plan.kind, expected="a blend with weights", fix="use blend (weights), not blend_epochized"))
        if not callable(getattr(spec.task_encoder, "sample_cost", None)):
            raise ConfigError(
                format_message(
                    "blend_mode cost needs the task encoder to report a cost per sample",
                    where=type(spec.task_encoder).__name__,
                    expected="a method sample_cost(sample) -> int (e.g. its token count), called on each sample before encode_sample",
                    fix="add sample_cost, or use TextPackingTaskEncoder which has one",
                )
            )
    if spec.training and spec.plan.kind == "blend" and not spec.repeat:
        raise ConfigError(
            format_message(
                "a weighted blend cannot stop after one pass (repeat=False)",
                where=spec.path,
                expected="repeat=True with blend, or blend_epochized for a pass that ends",
                fix="use blend_epochized with repetitions, or drop repeat=False",
            )
        )


def check_packing(hooks: HookSpec, packing_buffer_size: int | None) -> None:
    """A packing buffer needs a task encoder that packs."""
    if packing_buffer_size is not None and not hooks.packing:
        raise ConfigError(
            format_message(
                "packing_buffer_size needs a task encoder that packs",
                where=hooks.task_encoder,
                expected="select_samples_to_pack and pack_selected_samples overridden",
                fix="override both hooks, or leave packing_buffer_size None",
            )
        )


def dataset_sizes(spec: PipelineSpec) -> list[int]:
    """Samples each dataset of the plan reads per pass over all ranks (its subset applied)."""
    sizes = []
    for leaf, dataset in zip(spec.plan.leaves, spec.datasets):
        start, end = leaf.sample_range(dataset.total)
        sizes.append(end - start)
    return sizes


def dataset_slices(spec: PipelineSpec) -> list[list[Slices]]:
    """``[dataset][local worker]`` -> that worker's slices of that dataset (subset applied)."""
    return spec.slices


def _dataset_rotation(spec: PipelineSpec, k: int) -> int:
    """Energon's rotation of dataset ``k``: the remainders of later datasets continue where the
    earlier ones' ended."""
    wc = spec.worker_config
    return rotation_offset_for(k, [dataset.total for dataset in spec.datasets], wc.world_size * wc.workers_per_rank)


def _dataset_slices(spec: PipelineSpec) -> list[list[Slices]]:
    wc = spec.worker_config
    result = []
    for k, (leaf, dataset) in enumerate(zip(spec.plan.leaves, spec.datasets)):
        total = dataset.total
        result.append(
            worker_slices(
                total_samples=total,
                shard_starts=dataset.shard_starts,
                rank=wc.rank,
                world_size=wc.world_size,
                num_workers=wc.num_workers,
                max_samples_per_sequence=spec.max_samples_per_sequence,
                rotation_offset=_dataset_rotation(spec, k),
                sample_range=leaf.sample_range(total),
            )
        )
    return result


@dataclasses.dataclass(frozen=True, eq=False)
class SourceSlices:
    """How dataset ``index`` of a spec is spread over this rank's workers, under the names of
    Energon's inner sample loader dataset (``Source.dataset``), for code that inspects it."""

    spec: PipelineSpec
    index: int

    @property
    def workers_slice_offsets(self) -> list[list[int]]:
        """Per local worker, the bounds of its slices in split order (``[start, ..., end]``); a
        worker without samples gets ``[start]``, where its empty range sits."""
        return [slices.bounds or [self._empty_start(w)] for w, slices in enumerate(self.spec.slices[self.index])]

    def _empty_start(self, local_worker_id: int) -> int:
        wc = self.spec.worker_config
        first, last = self.spec.plan.leaves[self.index].sample_range(self.spec.datasets[self.index].total)
        global_id = wc.rank * wc.workers_per_rank + local_worker_id
        start, _ = worker_sample_range(global_id, last - first, wc.world_size * wc.workers_per_rank, rotation_offset=_dataset_rotation(self.spec, self.index))
        return first + start

    def __len__(self) -> int:
        """Samples of the dataset on this rank (all its workers)."""
        return sum(slices.samples for slices in self.spec.slices[self.index])


def worker_samples(spec: PipelineSpec) -> list[int]:
    """Samples each worker of this rank reads per pass."""
    per_dataset = dataset_slices(spec)
    epochized = spec.training and spec.plan.kind == "blend_epochized"
    return [
        sum(repeated_length(slices[w].samples, leaf.repetitions) if epochized else slices[w].samples for leaf, slices in zip(spec.plan.leaves, per_dataset))
        for w in range(spec.worker_config.workers_per_rank)
    ]


def worker_lengths(spec: PipelineSpec) -> list[int]:
    """Items (batches, or samples without batching) each worker of this rank yields per pass."""
    grouping = spec.hooks.grouping
    lengths = []
    for samples in worker_samples(spec):
        if spec.batch_size is None or grouping:
            # Grouped batches: Energon reports the number of samples, an upper bound.
            lengths.append(samples)
        elif spec.batch_drop_last:
            lengths.append(samples // spec.batch_size)
        else:
            lengths.append(-(-samples // spec.batch_size))
    return lengths


def rank_length(spec: PipelineSpec, lengths: list[int] | None = None) -> int:
    """``len(dataset)``: items per pass for this rank, as Energon computes it (``lengths``: the
    :func:`worker_lengths` of ``spec`` when the caller has them)."""
    if spec.training and spec.virtual_epoch_length > 0:
        return spec.virtual_epoch_length
    total = sum(worker_lengths(spec) if lengths is None else lengths)
    if not spec.training and spec.limit is not None:
        return min(total, spec.limit)
    return total


def _slice_order(multiplier: int, num_slices: int, epoch: int, seed: int) -> list[int]:
    return epoch_slice_order(num_slices, seed=seed, epoch=epoch, shuffle_over_epochs=multiplier)


def _dataset_pipeline(spec: PipelineSpec, k: int, slices, *, seed: int, guard, hook, cook: bool = True, runtime: Runtime | None = None) -> Node:
    """Dataset ``k``'s stages: source -> [cook] (crude datasets and JSONL; ``cook=False``: raw)."""
    leaf = spec.plan.leaves[k]
    te = spec.task_encoder
    hooks = spec.hooks
    loader = leaf_loader(spec, k, runtime)
    multiplier = combine_shuffle_over_epochs(spec.shuffle_over_epochs_multiplier, leaf.shuffle_over_epochs_multiplier)
    order = partial(_slice_order, multiplier) if spec.training else None
    node: Node = SliceSource(
        loader,
        slices,
        seed=seed,
        # In-order slices (multiplier None) are read one at a time, as Energon needs them.
        parallel_slices=1 if spec.training and multiplier is None else spec.parallel_slices,
        guard=guard(stage="load", tolerance=hooks.default_failure_tolerance, dataset=k),
        **({"slice_order": order} if order is not None else {}),
    )
    cooking = leaf_cooking(spec, k, loader) if cook else None
    if cooking is not None:
        node = MapNode(node, hook(te.cook_crude_sample, *cooking), guard=guard(stage="cook_crude_sample", tolerance=hooks.tolerance("cook_crude_sample"), dataset=k), tag="Cook")
    return node


def factory_arguments(spec: PipelineSpec, leaf: LeafDataset) -> dict[str, Any]:
    """The loader's arguments to a user's dataset factory class named in ``dataset.yaml`` (those
    Energon passes it, besides the path, split and decoder)."""
    return {
        "training": spec.training,
        "worker_config": spec.worker_config,
        "shuffle_over_epochs": leaf.shuffle_over_epochs_multiplier,
        "max_samples_per_sequence": spec.max_samples_per_sequence,
        "parallel_shard_iters": spec.parallel_shard_iters,
    }


def is_crude(loader) -> bool:
    """Whether a loader yields crude dicts that a cooker must turn into samples (JSONL always does)."""
    return loader.crude


class Source(Recipe):
    """Dataset ``index`` of a spec's plan on each worker: its slices (shuffled per epoch for
    training), then, with ``cook`` and a crude dataset, the task encoder's cooker. Energon's
    ``dataset.build()`` gives it uncooked."""

    def __init__(self, spec: PipelineSpec, index: int, *, cook: bool) -> None:
        super().__init__()
        self.spec = spec
        self.index = index
        self.cook = cook
        self.worker_config = spec.worker_config

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Source) and other.spec is self.spec and (other.index, other.cook) == (self.index, self.cook)

    __hash__ = Recipe.__hash__

    @property
    def leaf(self) -> LeafDataset:
        return self.spec.plan.leaves[self.index]

    @property
    def dataset(self) -> SourceSlices:
        """The dataset's slices on this rank's workers (Energon's wrappers end in a sample loader
        dataset here, which code walking ``.dataset`` reads ``workers_slice_offsets`` of)."""
        return SourceSlices(self.spec, self.index)

    def data_record(self) -> list[dict[str, Any]]:
        return [self.spec.data_record()[self.index]]

    @property
    def subflavors(self) -> dict[str, Any]:
        """Its samples' subflavors: its ``dataset.yaml``'s, overridden by the metadataset's."""
        config = self.spec.datasets[self.index].config
        return {**(config.subflavors if config is not None else {}), **self.leaf.subflavors}

    @property
    def crude(self) -> bool:
        """Whether its samples are crude dicts that a cooker must turn into samples."""
        return self.spec.plan.leaves[self.index].join is None and self.spec.datasets[self.index].yields is CrudeSample

    def cooked(self) -> Source:
        return Source(self.spec, self.index, cook=True)

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        spec, wc = self.spec, self.worker_config
        seed = wc.worker_seed(local_worker_id)
        guard = partial(SampleGuard, wc.global_error_handler, runtime=runtime)
        hook = partial(stage_hook, worker_seed=seed, local_worker_id=local_worker_id, workers=wc.workers_per_rank, runtime=runtime)
        slices = spec.slices[self.index][local_worker_id]
        return _dataset_pipeline(spec, self.index, slices, seed=dataset_seed(seed, self.index), guard=guard, hook=hook, cook=self.cook, runtime=runtime)

    def worker_length(self, local_worker_id: int) -> int:
        return self.spec.slices[self.index][local_worker_id].samples

    def config(self) -> dict[str, Any]:
        spec = self.spec
        return {"type": "DatasetSource", "dataset": spec.plan.leaves[self.index].describe(), "training": spec.training, "split_part": spec.split_part, "cook": self.cook}

    def with_topology(self, worker_config: WorkerConfig) -> Source:
        return Source(self.spec.with_topology(worker_config), self.index, cook=self.cook)

    def __repr__(self) -> str:
        return f"Source({self.spec.plan.leaves[self.index].where!r}{', cooked' if self.cook else ''})"


def plan_sources(recipe: Recipe) -> list[Source]:
    """The plan sources ``recipe`` reads from, in order."""
    if isinstance(recipe, Source):
        return [recipe]
    inputs = recipe.input_recipes() if isinstance(recipe, Recipe) else ()  # a task encoder may compose anything
    return [source for inner in inputs for source in plan_sources(inner)]


def sources(spec: PipelineSpec) -> list[Source]:
    """Each dataset of the plan, cooked where it is crude."""
    result = []
    for k in range(len(spec.plan.leaves)):
        source = Source(spec, k, cook=False)
        result.append(source.cooked() if source.crude else source)
    return result


def datasets_recipe(spec: PipelineSpec, datasets: list[Recipe] | None = None) -> Recipe:
    """The datasets of the plan (``datasets``: their recipes, default :func:`sources`), repeated
    and blended (training) or concatenated (val), in the spec's blend mode."""
    plan, wc = spec.plan, spec.worker_config
    nodes = sources(spec) if datasets is None else list(datasets)
    if not spec.training:
        return nodes[0] if len(nodes) == 1 else Concat(tuple(nodes), wc)
    if plan.kind == "single":
        return Repeat(nodes[0], wc, count_samples=False) if spec.repeat else nodes[0]
    names = tuple(leaf.where for leaf in plan.leaves)
    if plan.kind == "blend":
        scheduled = any(leaf.weight_schedule is not None for leaf in plan.leaves)
        return Blend(
            tuple(Repeat(node, wc, count_samples=False) for node in nodes),
            wc,
            tuple(leaf.weight for leaf in plan.leaves),
            mode=spec.blend_mode,
            names=names,
            infinite=True,
            cost=spec.task_encoder.sample_cost if spec.blend_mode == "cost" else None,
            # Exact schedules and scheduled weights follow the global stream position.
            global_batch=(spec.batch_size or 1) if spec.blend_mode == "exact" or scheduled else None,
            schedules=tuple(leaf.weight_schedule for leaf in plan.leaves) if scheduled else None,
        )
    # blend_epochized: every dataset `repetitions` times per pass. Exact: per worker, the schedule's
    # weights are the items each dataset yields on it; random: Energon's weights, each dataset's
    # length (after its subset) times its repetitions.
    nodes = [Repeat(node, wc, leaf.repetitions) for node, leaf in zip(nodes, plan.leaves)]
    weights = tuple(size * leaf.repetitions for size, leaf in zip(dataset_sizes(spec), plan.leaves))
    blend = Blend(tuple(nodes), wc, weights, mode=spec.blend_mode, names=names, worker_weights=spec.blend_mode == "exact")
    return Repeat(blend, wc, count_samples=False) if spec.repeat else blend


def encode_sample_recipe(hooks: Hooks, dataset: Recipe, worker_config: WorkerConfig) -> Recipe:
    """``encode_sample`` (or ``preencode_sample``) on every sample, when it does something."""
    spec = hook_spec(hooks)
    if spec.sample_encoder is None:
        return dataset
    name = spec.sample_encoder
    return Map(dataset, worker_config, getattr(hooks, name), stage=name, tolerance=spec.tolerance(name))


def batch_recipe(hooks: Hooks, dataset: Recipe, worker_config: WorkerConfig, *, batch_size: int | None, batch_drop_last: bool = False, packing_buffer_size: int | None = None, group_buffer_size: int | None = None) -> Recipe:
    """Packing or post-encoding, then batching (grouped when ``batch_group_criterion`` is
    overridden), then ``encode_batch`` when it does something."""
    spec = hook_spec(hooks)
    postencode = hooks.postencode_sample if spec.postencoder else None
    if packing_buffer_size is not None:
        check_packing(spec, packing_buffer_size)
        # Members are post-encoded once they are chosen for a pack (Energon's order).
        dataset = Pack(
            dataset,
            worker_config,
            packing_buffer_size,
            hooks.select_samples_to_pack,
            hooks.pack_selected_samples,
            postencode=postencode,
            allow_drop=bool(getattr(hooks, "packing_may_drop_samples", False)),
            tolerance=spec.tolerance("pack_selected_samples"),
            select_tolerance=spec.tolerance("select_samples_to_pack"),
        )
    elif postencode is not None:
        dataset = Map(dataset, worker_config, postencode, stage="postencode_sample", tolerance=spec.tolerance("postencode_sample"), tag="Postencode")
    if spec.grouping:
        dataset = GroupBatch(dataset, worker_config, batch_size, hooks.batch_group_criterion, hooks.batch, drop_last=batch_drop_last, tolerance=spec.tolerance("batch"), max_buffered=group_buffer_size)
    elif batch_size is not None:
        dataset = Batch(dataset, worker_config, batch_size, hooks.batch, drop_last=batch_drop_last, tolerance=spec.tolerance("batch"))
    else:
        return dataset
    if spec.batch_encoder:
        dataset = Map(dataset, worker_config, hooks.encode_batch, stage="encode_batch", tolerance=spec.tolerance("encode_batch"), tag="EncodeBatch", batch=True)
    return dataset


def passes_recipe(spec: PipelineSpec, dataset: Recipe) -> Recipe:
    """Virtual epochs (training) or the val limit: where a pass ends."""
    if spec.training and spec.virtual_epoch_length > 0:
        return Pass(dataset, spec.worker_config, spec.virtual_epoch_length, what="items per virtual epoch")
    if not spec.training and spec.limit is not None:
        return Pass(dataset, spec.worker_config, spec.limit, restart=True, capped=True, what="the limit of items per pass")
    return dataset


def default_recipe(spec: PipelineSpec) -> Recipe:
    """The pipeline of ``spec``, composed as Energon composes it (module docstring)."""
    te, wc = spec.task_encoder, spec.worker_config
    recipe = datasets_recipe(spec)
    if spec.training and spec.shuffle_buffer_size is not None and spec.shuffle_buffer_size > 1:
        recipe = Shuffle(recipe, wc, spec.shuffle_buffer_size)
    recipe = encode_sample_recipe(te, recipe, wc)
    recipe = batch_recipe(te, recipe, wc, batch_size=spec.batch_size, batch_drop_last=spec.batch_drop_last, packing_buffer_size=spec.packing_buffer_size, group_buffer_size=spec.group_buffer_size)
    return passes_recipe(spec, recipe)


def build_worker_pipeline(spec: PipelineSpec, recipe: Recipe, local_worker_id: int, runtime: Runtime | None = None) -> Node:
    """The stages of worker ``local_worker_id`` of this rank (0 when there are no workers) that
    ``recipe`` (:func:`default_recipe`, or a task encoder's composition) makes of ``spec``'s
    datasets, with the spec's storage settings applied in this process; ``runtime``: the one the
    loader lends this worker's pipeline."""
    for protocol, (options, settings) in spec.storage.items():  # a spawned worker starts empty
        configure_storage(protocol, storage_options=options, settings=settings)
    return recipe.build_worker(local_worker_id, runtime)


def spec_decoder(spec: PipelineSpec) -> Any:
    """The task encoder's decoder under the spec's policy (whether pickles may be unpickled
    without the decoder's ``allow_pickle``, as Energon does)."""
    decoder = spec.task_encoder.decoder
    return decoder.under(spec.policy) if isinstance(decoder, SampleDecoder) else decoder


def leaf_loader(spec: PipelineSpec, k: int, runtime: Runtime | None = None) -> SampleLoader | JoinLoader:
    """The loader of dataset ``k`` of the plan, by split index (its pipeline's, with the worker
    pipeline's ``runtime``, and the map view's)."""
    leaf = spec.plan.leaves[k]
    decoder = spec_decoder(spec)
    if leaf.join is not None:
        return JoinLoader(leaf.join, where=leaf.where, decoder=decoder, subflavors=leaf.subflavors, trust_dataset_code=spec.trust_dataset_code, policy=spec.policy)
    return SampleLoader(
        leaf.path,
        leaf.split_part,
        dataset_config=leaf.dataset_config or spec.dataset_config,  # a user's factory is told it
        decoder=decoder,
        subflavors=leaf.subflavors,
        trust_dataset_code=spec.trust_dataset_code,
        policy=spec.policy,
        sample_factory=leaf.sample_factory,
        factory_arguments=factory_arguments(spec, leaf),
        resolved=spec.datasets[k],
        sequence_length=leaf.sequence_length,
        runtime=runtime,
    )


def leaf_cooking(spec: PipelineSpec, k: int, loader: SampleLoader | JoinLoader) -> tuple[Any, dict[str, Any]] | None:
    """``(cooker, aux stores)``, the arguments ``cook_crude_sample`` gets after the crude sample
    of dataset ``k`` (cooker None: the task encoder overrides the hook), or None when ``loader``
    yields typed samples. Opens the aux stores: call it in the process that reads."""
    if not is_crude(loader):
        return None
    leaf = spec.plan.leaves[k]
    te = spec.task_encoder
    subflavors = {**(loader.config.subflavors if loader.config is not None else {}), **leaf.subflavors}
    cooker = None if spec.hooks.overridden("cook_crude_sample") else select_cooker(te.cookers, subflavors, where=leaf.where)
    stores = aux_stores(leaf, spec_decoder(spec), primary=cooker is not None and cooker.need_primary, policy=spec.policy)
    return cooker, stores
