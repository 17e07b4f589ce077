"""The ONLY place that assembles stages into a pipeline.

A :class:`PipelineSpec` holds every setting (plain values plus the user's task encoder); from it,
:func:`build_worker_pipeline` builds the stages of one dataloader worker.  Order, innermost first
(as in Energon, research/energon.md 5.4):

train: source (this worker's slices, shuffled per epoch) -> [cook] -> repeat -> [shuffle buffer]
       -> encode_sample -> [batch] -> [encode_batch] -> [virtual epochs]
val:   source (sequential) -> [cook] -> encode_sample -> [batch] -> [encode_batch] -> [limit]
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

from ..errors import ConfigError, format_message
from ..format.metadata import read_info, resolve_split
from ..task_encoder import TaskEncoder, call_hook, hook_context, hook_spec, select_cooker
from ..worker import WorkerConfig
from .batch import BatchNode
from .epochize import EpochizeNode
from .guard import SampleGuard, describe_item
from .limit import LimitNode
from .load import SampleLoader
from .map import MapNode
from .node import Node
from .repeat import RepeatNode
from .sharding import epoch_slice_order, worker_slices
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
    shuffle_over_epochs_multiplier: int = 1
    dataset_config: str | None = None
    split_config: str | None = None
    trust_dataset_code: bool = False
    task_encoder: TaskEncoder = dataclasses.field(default=None, compare=False)

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
            "limit": self.limit,
            "repeat": self.repeat,
            "shuffle_over_epochs_multiplier": self.shuffle_over_epochs_multiplier,
            "task_encoder": type(self.task_encoder).__qualname__,
            "decoder": None if decoder is None else decoder.config(),
            **{f"worker_config.{k}": v for k, v in self.worker_config.config().items()},
        }

    @property
    def parallel_slices(self) -> int:
        if self.parallel_shard_iters is not None:
            return self.parallel_shard_iters
        return 16 if self.training else 1


def validate(spec: PipelineSpec) -> None:
    """Argument checks with messages that name the argument and the fix."""
    for name, value in (("batch_size", spec.batch_size), ("max_samples_per_sequence", spec.max_samples_per_sequence), ("shuffle_buffer_size", spec.shuffle_buffer_size), ("limit", spec.limit)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ConfigError(format_message(f"invalid {name}", expected="a positive integer or None", found=repr(value)))
    if spec.virtual_epoch_length < 0:
        raise ConfigError(format_message("invalid virtual_epoch_length", expected="0 (off) or a positive number of batches", found=repr(spec.virtual_epoch_length)))
    if spec.shuffle_over_epochs_multiplier not in (1,) and not (isinstance(spec.shuffle_over_epochs_multiplier, int) and spec.shuffle_over_epochs_multiplier > 1):
        raise ConfigError(format_message("invalid shuffle_over_epochs_multiplier", expected="an integer >= 1 (-1 and None are not supported yet)", found=repr(spec.shuffle_over_epochs_multiplier)))


def split_lengths(spec: PipelineSpec) -> tuple[int, list[int]]:
    """(total samples of the split, cumulative shard starts) without opening any shard."""
    split = resolve_split(spec.path, spec.split_part, split_config=spec.split_config, info=read_info(spec.path))
    starts = [0]
    for shard in split.shards:
        starts.append(starts[-1] + shard.count)
    return starts[-1], starts


def rank_slices(spec: PipelineSpec) -> list[list[tuple[int, int]]]:
    total, starts = split_lengths(spec)
    wc = spec.worker_config
    return worker_slices(
        total_samples=total,
        shard_starts=starts,
        rank=wc.rank,
        world_size=wc.world_size,
        num_workers=wc.num_workers,
        max_samples_per_sequence=spec.max_samples_per_sequence,
    )


def worker_lengths(spec: PipelineSpec) -> list[int]:
    """Items (batches, or samples without batching) each worker of this rank yields per pass."""
    lengths = []
    for slices in rank_slices(spec):
        samples = sum(end - start for start, end in slices)
        if spec.batch_size is None:
            lengths.append(samples)
        elif spec.batch_drop_last:
            lengths.append(samples // spec.batch_size)
        else:
            lengths.append(-(-samples // spec.batch_size))
    return lengths


def share(length: int, num_workers: int, local_worker_id: int) -> int:
    """Energon's per-worker share of a per-rank length (virtual epochs, limit)."""
    return length // num_workers + (1 if local_worker_id < length % num_workers else 0)


def rank_length(spec: PipelineSpec) -> int:
    """``len(dataset)``: items per pass for this rank, as Energon computes it."""
    if spec.training and spec.virtual_epoch_length > 0:
        return spec.virtual_epoch_length
    total = sum(worker_lengths(spec))
    if not spec.training and spec.limit is not None:
        return min(total, spec.limit)
    return total


def _slice_order(seed: int, multiplier: int, num_slices: int, epoch: int) -> list[int]:
    return epoch_slice_order(num_slices, seed=seed, epoch=epoch, shuffle_over_epochs=multiplier)


def _hook_fn(hook, *args, worker_seed: int, local_worker_id: int, workers: int, batch: bool = False):
    """Adapts a task-encoder hook to a stage's ``fn(item, index)``.

    The index a hook sees is unique over this rank's workers, as in Energon:
    ``stage counter * workers + local worker id``; it also seeds ``@stateless(restore_seeds=True)``.
    """

    def run(item, index):
        unique = index * workers + local_worker_id
        if batch:
            with hook_context(batch_index=unique):
                result = call_hook(hook, item, *args, sample_index=unique, worker_seed=worker_seed)
        else:
            result = call_hook(hook, item, *args, sample_index=unique, worker_seed=worker_seed)
        if result is None:
            # A ConfigError stops the run: every later sample would fail the same way.
            raise ConfigError(
                format_message(
                    f"{getattr(hook, '__name__', 'hook')} returned None",
                    where=f"task encoder {type(getattr(hook, '__self__', None)).__name__}, item {describe_item(item)}",
                    expected="a sample (or a batch), or raise SkipSample to drop it",
                    fix="check that the hook ends with `return`",
                )
            )
        return result

    return run


def build_worker_pipeline(spec: PipelineSpec, local_worker_id: int) -> Node:
    """The stages of worker ``local_worker_id`` of this rank (0 when there are no workers)."""
    wc = spec.worker_config
    te = spec.task_encoder
    hooks = hook_spec(te)
    seed = wc.worker_seed(local_worker_id)
    guard = partial(SampleGuard, wc.global_error_handler)
    hook = partial(_hook_fn, worker_seed=seed, local_worker_id=local_worker_id, workers=wc.workers_per_rank)

    loader = SampleLoader(
        spec.path,
        spec.split_part,
        dataset_config=spec.dataset_config,
        split_config=spec.split_config,
        decoder=te.decoder,
        trust_dataset_code=spec.trust_dataset_code,
    )
    slices = rank_slices(spec)[local_worker_id]
    order = partial(_slice_order, seed, spec.shuffle_over_epochs_multiplier) if spec.training else None
    node: Node = SliceSource(
        loader,
        slices,
        seed=seed,
        parallel_slices=spec.parallel_slices,
        guard=guard(stage="load", tolerance=hooks.default_failure_tolerance),
        **({"slice_order": order} if order is not None else {}),
    )
    if loader.config is None or loader.config.kind == "crude":  # JSONL is always crude
        subflavors = loader.config.subflavors if loader.config is not None else {}
        cooker = None if hooks.overridden("cook_crude_sample") else select_cooker(te.cookers, subflavors, where=spec.path)
        node = MapNode(node, hook(te.cook_crude_sample, cooker), guard=guard(stage="cook_crude_sample", tolerance=hooks.tolerance("cook_crude_sample")), tag="Cook")
    if spec.training and spec.repeat:
        node = RepeatNode(node)
    if spec.training and spec.shuffle_buffer_size is not None and spec.shuffle_buffer_size > 1:
        node = ShuffleBufferNode(node, spec.shuffle_buffer_size, seed=seed)
    if hooks.sample_encoder is not None:
        name = hooks.sample_encoder
        node = MapNode(node, hook(getattr(te, name)), guard=guard(stage=name, tolerance=hooks.tolerance(name)))
    if hooks.postencoder:
        node = MapNode(node, hook(te.postencode_sample), guard=guard(stage="postencode_sample", tolerance=hooks.tolerance("postencode_sample")), tag="Postencode")
    if hooks.grouping:
        raise ConfigError(format_message("batch_group_criterion is not supported yet", where=type(te).__name__, fix="remove the override; length grouping comes with a later release"))
    if spec.batch_size is not None:
        node = BatchNode(node, spec.batch_size, hook(te.batch, batch=True), drop_last=spec.batch_drop_last, guard=guard(stage="batch", tolerance=hooks.tolerance("batch")))
        if hooks.batch_encoder:
            node = MapNode(node, hook(te.encode_batch, batch=True), guard=guard(stage="encode_batch", tolerance=hooks.tolerance("encode_batch")), tag="EncodeBatch")
    if spec.training and spec.virtual_epoch_length > 0:
        node = EpochizeNode(node, share(spec.virtual_epoch_length, wc.workers_per_rank, local_worker_id))
    if not spec.training and spec.limit is not None:
        node = LimitNode(node, share(spec.limit, wc.workers_per_rank, local_worker_id))
    return node
