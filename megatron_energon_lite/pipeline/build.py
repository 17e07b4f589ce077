"""The ONLY place that assembles stages into a pipeline.

A :class:`PipelineSpec` holds every setting (plain values plus the user's task encoder); from it,
:func:`build_worker_pipeline` builds the stages of one dataloader worker.  Order, innermost first
(as in Energon, research/energon.md 5.4):

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
from typing import Any, Callable

from ..errors import ConfigError, format_message
from ..format.metadataset import (
    BLEND_MODES,
    BlendPlan,
    LeafDataset,
    combine_shuffle_over_epochs,
)
from ..format.resolved import ResolvedDataset, resolve_datasets
from ..rng import dataset_seed
from ..storage import configure_storage
from ..task_encoder.base import TaskEncoder
from ..task_encoder.cooking import select_cooker
from ..worker import WorkerConfig
from .aux_sources import aux_stores
from .batch import BatchNode
from .blend import BlendNode
from .concat import ConcatNode
from .group import GroupBatchNode
from .guard import SampleGuard
from .hooks import batch_member_context, hook_spec, stage_hook
from .load import JoinLoader, SampleLoader
from .map import MapNode
from .node import Node
from .pack import PackNode
from .passes import PassNode
from .repeat import RepeatNode
from .sharding import Slices, epoch_slice_order, rotation_offset_for, worker_slices
from .shuffle import ShuffleBufferNode
from .source import SliceSource


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
    task_encoder: TaskEncoder = dataclasses.field(default=None, compare=False)
    plan: BlendPlan = dataclasses.field(default=None, compare=False)
    blend_mode: str = "random"
    packing_buffer_size: int | None = None
    #: Most items the length-grouping buckets hold together (None: unbounded, as Energon).
    group_buffer_size: int | None = None
    #: Storage options per protocol (``configure_storage``), re-applied in each worker; holds
    #: credentials, so it is never part of the fingerprint or the state.
    storage: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

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
            "task_encoder": type(self.task_encoder).__qualname__,
            "decoder": None if decoder is None else decoder.config(),
            # Blends only, so that a plain dataset's fingerprint stays as it was.
            **(self._blend_fingerprint() if self.plan.kind != "single" else {}),
            # A .bin/.idx dataset's window length (a blend's leaves carry their own).
            **({"sequence_length": self.plan.leaves[0].sequence_length} if self.plan.kind == "single" and self.plan.leaves[0].sequence_length is not None else {}),
            **{f"worker_config.{k}": v for k, v in self.worker_config.fingerprint().items()},
        }

    def with_topology(self, worker_config: WorkerConfig) -> PipelineSpec:
        """The same plan for another rank or topology (elastic resume), sharing the datasets
        this spec read: nothing is read again."""
        other = dataclasses.replace(self, worker_config=worker_config)
        other.__dict__["datasets"] = self.datasets  # the cached_property's value
        return other

    def _blend_fingerprint(self) -> dict[str, Any]:
        """The datasets of a blend (or val concatenation) and each one's target share of samples."""
        leaves = [leaf.describe() for leaf in self.plan.leaves]
        if self.plan.kind == "blend":
            targets = [float(leaf.weight) for leaf in self.plan.leaves]
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
        return resolve_datasets(self.plan.leaves, dataset_config=self.dataset_config, split_config=self.split_config, trust_dataset_code=self.trust_dataset_code)

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
    from .sharding import check_shuffle_over_epochs

    check_shuffle_over_epochs(spec.shuffle_over_epochs_multiplier, where="get_train_dataset(shuffle_over_epochs_multiplier=...)")
    hooks = hook_spec(spec.task_encoder)
    if spec.packing_buffer_size is not None and not hooks.packing:
        raise ConfigError(
            format_message(
                "packing_buffer_size needs a task encoder that packs",
                where=type(spec.task_encoder).__name__,
                expected="select_samples_to_pack and pack_selected_samples overridden",
                fix="override both hooks, or leave packing_buffer_size None",
            )
        )
    if spec.blend_mode not in BLEND_MODES:
        raise ConfigError(format_message("invalid blend_mode", expected=" or ".join(BLEND_MODES), found=repr(spec.blend_mode)))
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


def _dataset_slices(spec: PipelineSpec) -> list[list[Slices]]:
    wc = spec.worker_config
    totals = [dataset.total for dataset in spec.datasets]
    workers = wc.world_size * wc.workers_per_rank
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
                # Energon: remainders of later datasets continue where earlier ones ended.
                rotation_offset=rotation_offset_for(k, totals, workers),
                sample_range=leaf.sample_range(total),
            )
        )
    return result


def _repeated(samples: int, repetitions: float) -> int:
    return int(samples * repetitions)  # Energon's RepeatDataset.len_worker


def worker_lengths(spec: PipelineSpec) -> list[int]:
    """Items (batches, or samples without batching) each worker of this rank yields per pass."""
    per_dataset = dataset_slices(spec)
    epochized = spec.training and spec.plan.kind == "blend_epochized"
    grouping = hook_spec(spec.task_encoder).grouping
    lengths = []
    for w in range(spec.worker_config.workers_per_rank):
        samples = sum(
            _repeated(slices[w].samples, leaf.repetitions) if epochized else slices[w].samples
            for leaf, slices in zip(spec.plan.leaves, per_dataset)
        )
        if spec.batch_size is None or grouping:
            # Grouped batches: Energon reports the number of samples, an upper bound.
            lengths.append(samples)
        elif spec.batch_drop_last:
            lengths.append(samples // spec.batch_size)
        else:
            lengths.append(-(-samples // spec.batch_size))
    return lengths


def share(length: int, num_workers: int, local_worker_id: int) -> int:
    """Energon's per-worker share of a per-rank length (virtual epochs, limit)."""
    return length // num_workers + (1 if local_worker_id < length % num_workers else 0)


def rank_length(spec: PipelineSpec, lengths: list[int] | None = None) -> int:
    """``len(dataset)``: items per pass for this rank, as Energon computes it (``lengths``: the
    :func:`worker_lengths` of ``spec`` when the caller has them)."""
    if spec.training and spec.virtual_epoch_length > 0:
        return spec.virtual_epoch_length
    total = sum(worker_lengths(spec) if lengths is None else lengths)
    if not spec.training and spec.limit is not None:
        return min(total, spec.limit)
    return total


def _slice_order(seed: int, multiplier: int, num_slices: int, epoch: int) -> list[int]:
    return epoch_slice_order(num_slices, seed=seed, epoch=epoch, shuffle_over_epochs=multiplier)


def _global_position(spec: PipelineSpec, local_worker_id: int) -> Callable[[int], int]:
    """Where this worker's ``n``-th blended sample sits in the global training stream.

    The stream is ordered by training step, then rank, then position in the batch: the loader
    takes one batch from each local worker in turn, so this worker's ``k``-th batch is rank step
    ``k * workers + local_worker_id``, taken by all ranks at once.
    """
    wc = spec.worker_config
    batch = spec.batch_size or 1
    workers, ranks, rank = wc.workers_per_rank, wc.world_size, wc.rank

    def position(n: int) -> int:
        k, j = divmod(n, batch)
        return ((k * workers + local_worker_id) * ranks + rank) * batch + j

    return position


def _dataset_pipeline(spec: PipelineSpec, k: int, slices, *, seed: int, guard, hook, cook: bool = True) -> Node:
    """Dataset ``k``'s stages: source -> [cook] (crude datasets and JSONL; ``cook=False``: raw)."""
    leaf = spec.plan.leaves[k]
    te = spec.task_encoder
    hooks = hook_spec(te)
    loader = leaf_loader(spec, k)
    multiplier = combine_shuffle_over_epochs(spec.shuffle_over_epochs_multiplier, leaf.shuffle_over_epochs_multiplier)
    order = partial(_slice_order, seed, multiplier) if spec.training else None
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


def leaf_source(spec: PipelineSpec, k: int, local_worker_id: int, slices: list[tuple[int, int]]) -> Node:
    """Dataset ``k`` of the plan on one worker (``slices``: its part of ``dataset_slices(spec)[k]``),
    uncooked: what Energon's ``dataset.build()`` gives a task encoder that composes its own pipeline."""
    wc = spec.worker_config
    seed = wc.worker_seed(local_worker_id)
    guard = partial(SampleGuard, wc.global_error_handler)
    return _dataset_pipeline(spec, k, slices, seed=dataset_seed(seed, k), guard=guard, hook=None, cook=False)


def _datasets(spec: PipelineSpec, local_worker_id: int, *, seed: int, guard, hook) -> Node:
    """The datasets of the plan, repeated and blended (training) or concatenated (val)."""
    plan = spec.plan
    per_dataset = [slices[local_worker_id] for slices in dataset_slices(spec)]
    nodes = [
        _dataset_pipeline(spec, k, slices, seed=dataset_seed(seed, k), guard=guard, hook=hook)
        for k, slices in enumerate(per_dataset)
    ]
    if not spec.training:
        return nodes[0] if len(nodes) == 1 else ConcatNode(nodes)
    if plan.kind == "single":
        return RepeatNode(nodes[0]) if spec.repeat else nodes[0]
    names = [leaf.where for leaf in plan.leaves]
    if plan.kind == "blend":
        nodes = [RepeatNode(node) for node in nodes]
        position = _global_position(spec, local_worker_id) if spec.blend_mode == "exact" else None
        cost = spec.task_encoder.sample_cost if spec.blend_mode == "cost" else None
        return BlendNode(
            nodes, [leaf.weight for leaf in plan.leaves], seed=seed, mode=spec.blend_mode, position=position, names=names, infinite=True, cost=cost,
            position_batch=spec.batch_size or 1,
        )
    # blend_epochized: every dataset `repetitions` times per pass.
    counts = [slices.samples for slices in per_dataset]
    nodes = [RepeatNode(node, leaf.repetitions, worker_samples=n) for node, leaf, n in zip(nodes, plan.leaves, counts)]
    if spec.blend_mode == "exact":
        # Exact per worker: the schedule's weights are the items each dataset yields on this worker.
        weights = [_repeated(n, leaf.repetitions) for n, leaf in zip(counts, plan.leaves)]
    else:
        # Energon's weights: dataset length (after its subset) times repetitions.
        weights = [size * leaf.repetitions for size, leaf in zip(dataset_sizes(spec), plan.leaves)]
    if sum(weights) == 0:
        weights = [1] * len(nodes)  # this worker has no samples at all: the blend is empty
    blend = BlendNode(nodes, weights, seed=seed, mode=spec.blend_mode, names=names)
    return RepeatNode(blend) if spec.repeat else blend


def build_worker_pipeline(spec: PipelineSpec, local_worker_id: int) -> Node:
    """The stages of worker ``local_worker_id`` of this rank (0 when there are no workers)."""
    wc = spec.worker_config
    te = spec.task_encoder
    hooks = hook_spec(te)
    for protocol, (options, settings) in spec.storage.items():  # a spawned worker starts empty
        configure_storage(protocol, storage_options=options, settings=settings)
    seed = wc.worker_seed(local_worker_id)
    guard = partial(SampleGuard, wc.global_error_handler)
    hook = partial(stage_hook, worker_seed=seed, local_worker_id=local_worker_id, workers=wc.workers_per_rank)
    node = _datasets(spec, local_worker_id, seed=seed, guard=guard, hook=hook)
    if spec.training and spec.shuffle_buffer_size is not None and spec.shuffle_buffer_size > 1:
        node = ShuffleBufferNode(node, spec.shuffle_buffer_size, seed=seed)
    if hooks.sample_encoder is not None:
        name = hooks.sample_encoder
        node = MapNode(node, hook(getattr(te, name)), guard=guard(stage=name, tolerance=hooks.tolerance(name)))
    postencode = hook(te.postencode_sample) if hooks.postencoder else None
    if spec.packing_buffer_size is not None:
        # Members are post-encoded once they are chosen for a pack (Energon's order).
        node = PackNode(
            node,
            spec.packing_buffer_size,
            hook(te.select_samples_to_pack),
            hook(te.pack_selected_samples),
            postencode=postencode,
            allow_drop=bool(getattr(te, "packing_may_drop_samples", False)),
            guard=guard(stage="pack_selected_samples", tolerance=hooks.tolerance("pack_selected_samples")),
            select_guard=guard(stage="select_samples_to_pack", tolerance=hooks.tolerance("select_samples_to_pack")),
        )
    elif postencode is not None:
        node = MapNode(node, postencode, guard=guard(stage="postencode_sample", tolerance=hooks.tolerance("postencode_sample")), tag="Postencode")
    batcher = hook(te.batch, batch=True)
    if hooks.grouping:
        node = GroupBatchNode(
            node,
            hook(te.batch_group_criterion),
            batcher,
            batch_size=spec.batch_size,
            drop_last=spec.batch_drop_last,
            max_buffered=spec.group_buffer_size,
            guard=guard(stage="batch", tolerance=hooks.tolerance("batch")),
        )
    elif spec.batch_size is not None:
        node = BatchNode(
            node,
            spec.batch_size,
            batcher,
            drop_last=spec.batch_drop_last,
            guard=guard(stage="batch", tolerance=hooks.tolerance("batch")),
            member_context=batch_member_context(local_worker_id=local_worker_id, workers=wc.workers_per_rank),
        )
    if hooks.grouping or spec.batch_size is not None:
        if hooks.batch_encoder:
            node = MapNode(node, hook(te.encode_batch, batch=True), guard=guard(stage="encode_batch", tolerance=hooks.tolerance("encode_batch")), tag="EncodeBatch")
    if spec.training and spec.virtual_epoch_length > 0:
        node = PassNode(node, share(spec.virtual_epoch_length, wc.workers_per_rank, local_worker_id), what="items per virtual epoch")
    if not spec.training and spec.limit is not None:
        node = PassNode(node, share(spec.limit, wc.workers_per_rank, local_worker_id), restart=True, what="the limit of items per pass")
    return node


def leaf_loader(spec: PipelineSpec, k: int) -> SampleLoader | JoinLoader:
    """The loader of dataset ``k`` of the plan, by split index (its pipeline's and the map view's)."""
    leaf = spec.plan.leaves[k]
    te = spec.task_encoder
    if leaf.join is not None:
        return JoinLoader(leaf.join, where=leaf.where, decoder=te.decoder, subflavors=leaf.subflavors, trust_dataset_code=spec.trust_dataset_code)
    return SampleLoader(
        leaf.path,
        leaf.split_part,
        dataset_config=leaf.dataset_config or spec.dataset_config,  # a user's factory is told it
        decoder=te.decoder,
        subflavors=leaf.subflavors,
        trust_dataset_code=spec.trust_dataset_code,
        sample_factory=leaf.sample_factory,
        factory_arguments=factory_arguments(spec, leaf),
        resolved=spec.datasets[k],
        sequence_length=leaf.sequence_length,
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
    cooker = None if hook_spec(te).overridden("cook_crude_sample") else select_cooker(te.cookers, subflavors, where=leaf.where)
    stores = aux_stores(leaf, te.decoder, primary=cooker is not None and cooker.need_primary)
    return cooker, stores
