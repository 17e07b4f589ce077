"""A deterministic map-style view of a dataset split or blend, for Megatron-LM and BioNeMo.

``get_map_dataset(path)[i]`` loads sample ``i`` through the machinery the streaming loader uses
(the resolved metadata, ``SampleLoader``, the crude cooker and ``aux:`` stores of
``pipeline/build.py``, the task encoder's hooks through ``task_encoder/marks.py``) and returns
the encoded sample, the same bytes for the same index in any process. Megatron's samplers (which
keep only a consumed-sample count) and torch's ``DistributedSampler`` drive it;
:class:`~megatron_energon_lite.epochs.MultiEpochResampler` gives it epochs.

A blend is laid out once, as Megatron's ``BlendedDataset`` does, but with exact counts: see
:func:`blend_counts` and :func:`blend_order`.

Resuming (for the README): the view has no state. With Megatron's samplers, save
``consumed_samples`` as Megatron does, rebuild the dataset with the same arguments and pass the
saved count to the sampler (``MegatronPretrainingSampler(total, consumed_samples, ...)``); the
samples that follow are the ones the interrupted run would have read. With torch's
``DistributedSampler``, call ``set_epoch(epoch)`` and skip the batches of that epoch already
consumed (or wrap the view in a ``MultiEpochResampler`` and let a sampler start at the consumed
index). Only the training loader resumes; validation and test views start at 0 every time.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Generator, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import torch.utils.data

from .epochs import EpochIndex, check_flat_index
from .errors import (
    ConfigError,
    DatasetError,
    EmptyDatasetError,
    IndexTypeError,
    NotSupportedError,
    SkipSample,
    format_message,
)
from .loader.api import plan_spec  # the argument handling of get_train_dataset
from .manifest import ManifestWriter, dataset_tables
from .pipeline.build import default_recipe, leaf_cooking, leaf_loader, validate
from .pipeline.load import BLEND_TAG, RESTORE_TAG
from .pipeline.hooks import hook_spec
from .rng import stage_id
from .pipeline.marks import HookState, invoke
from .pipeline.task_hooks import DefaultHooks, Hooks
from .worker import WorkerConfig

__all__ = ["MapManifest", "MapStyleDataset", "blend_counts", "blend_order", "get_map_dataset"]

logger = logging.getLogger(__name__)

#: ``get_train_dataset`` keyword arguments that mean something for a map view.
_VIEW_KWARGS = frozenset({
    "dataset_config", "split_config", "subflavors", "subset", "sample_type",
    "auto_decode", "image_decode", "av_decode", "video_decode_audio", "storage_options",
})
_INF = float("inf")


def blend_counts(weights: Sequence[Fraction | float | int], total: int) -> list[int]:
    """Samples each dataset gets out of ``total``: the largest-remainder rounding of
    ``weight_j / sum(weights) * total`` (exact fractions; ties to the lowest index), so the counts
    add up to ``total`` and each is within one of its exact share."""
    exact = [w if isinstance(w, Fraction) else Fraction(w) for w in weights]
    norm = sum(exact)
    quotas = [w / norm * total for w in exact]
    counts = [int(q) for q in quotas]  # floor: quotas are >= 0
    by_remainder = sorted(range(len(quotas)), key=lambda j: (-(quotas[j] - counts[j]), j))
    for j in by_remainder[: total - sum(counts)]:
        counts[j] += 1
    return counts


def blend_order(weights: Sequence[float], counts: Sequence[int]) -> np.ndarray:
    """The dataset of each position ``n`` of a blend of ``sum(counts)`` positions.

    Megatron-LM's greedy rule (research/megatron_data.md 2.10): the dataset with the largest
    ``w_j * max(n, 1) - taken_j`` (ties to the lowest index), among those that have not yet
    reached their count, so the final counts are ``counts`` exactly and every prefix stays within
    about one sample (< 2) of the weights. ``weights`` are normalised shares. About 0.5 s per
    million positions for 4 datasets (a Python loop).
    """
    if len(counts) > 32767:
        raise ConfigError(format_message("too many datasets in one blend", expected="at most 32,767 (Megatron's limit too)", found=str(len(counts))))
    w = [float(x) if c > 0 else -_INF for x, c in zip(weights, counts)]
    taken = [0] * len(counts)
    order = array("h")  # Megatron's int16: fewer than 32,768 datasets
    append = order.append
    datasets = range(len(counts))
    for n in range(sum(counts)):
        x = n if n > 1 else 1
        best, best_value = 0, -_INF
        for j in datasets:
            value = w[j] * x - taken[j]
            if value > best_value:
                best, best_value = j, value
        append(best)
        taken[best] += 1
        if taken[best] == counts[best]:
            w[best] = -_INF  # full: out of the running
    return np.frombuffer(order, dtype=np.int16) if order else np.zeros(0, dtype=np.int16)


def _draw_numbers(order: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
    """Per position, the sample of its dataset it reads: the dataset's k-th draw reads ``k % length``."""
    draws = np.empty(len(order), dtype=np.int64)
    for j, length in enumerate(lengths):
        positions = np.flatnonzero(order == j)
        if len(positions):
            draws[positions] = np.arange(len(positions), dtype=np.int64) % length
    return draws


class _Leaf:
    """One dataset of the view: the split indices it reads, in order."""

    __slots__ = ("kept", "length", "start", "where")

    def __init__(self, where: str, start: int, end: int, kept: np.ndarray | None) -> None:
        self.where = where
        self.start = start
        #: The split indices left after ``split.yaml``'s key excludes; None: all of start..end.
        self.kept = kept
        self.length = end - start if kept is None else len(kept)

    def split_index(self, draw: int) -> int:
        return self.start + draw if self.kept is None else int(self.kept[draw])


class MapStyleDataset(torch.utils.data.Dataset):
    """A dataset split or blend by index (``torch.utils.data.Dataset``); made by :func:`get_map_dataset`.

    ``dataset[i]`` (``i`` an ``int``: epoch 0) or ``dataset[EpochIndex(epoch, i)]`` is the encoded
    sample ``i``; the epoch changes only what the hooks draw from ``current_rng``.
    :meth:`collate` batches like the streaming loader (``DataLoader(dataset, batch_size=32,
    collate_fn=dataset.collate)``). Pickling sends the arguments only; the other process
    rebuilds the view (metadata and blend index) and opens files when it first reads.
    """

    def __init__(self, path: Any, *, split_part: str = "train", task_encoder: Hooks | None = None, seed: int = 42,
                 num_samples: int | None = None, worker_config: WorkerConfig | None = None, trust_dataset_code: bool = False,
                 **kwargs: Any) -> None:
        self._arguments = dict(path=path, split_part=split_part, task_encoder=task_encoder, seed=seed, num_samples=num_samples,
                               worker_config=worker_config, trust_dataset_code=trust_dataset_code, **kwargs)
        unknown = sorted(set(kwargs) - _VIEW_KWARGS)
        if unknown:
            raise ConfigError(format_message(f"unknown keyword argument {unknown[0]!r} for get_map_dataset", expected=f"one of {', '.join(sorted(_VIEW_KWARGS))}", found=", ".join(unknown)))
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(format_message("invalid seed for get_map_dataset", expected="an int", found=repr(seed)))
        if num_samples is not None and (not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1):
            raise ConfigError(format_message("invalid num_samples for get_map_dataset", expected="an integer >= 1, or None (the sum of the datasets' lengths)", found=repr(num_samples)))
        spec = plan_spec(
            path,
            training=True,  # a blend keeps its weights in every split, as Megatron's blends do
            worker_config=worker_config or WorkerConfig(rank=0, world_size=1, num_workers=0),
            task_encoder=DefaultHooks() if task_encoder is None else task_encoder,
            packing_buffer_size=None,
            kwargs={**kwargs, "trust_dataset_code": trust_dataset_code},
            split_part=split_part,
            batch_size=None,
        )
        validate(spec)
        self.spec = spec
        self.seed = seed
        self.task_encoder = spec.task_encoder
        self._hooks = hook_spec(self.task_encoder)
        self._check_task_encoder()
        self._check_plan()
        self._leaves = [self._leaf(k) for k in range(len(spec.plan.leaves))]
        self.counts, self._order, self._draws = self._layout(num_samples)
        self._length = sum(self.counts)
        self._pid: int | None = None
        self._readers: list[Any] = []

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._arguments,))

    # --- construction ---------------------------------------------------------------------

    def _composes_its_own(self) -> bool:
        """Whether the task encoder composes a pipeline other than the default one (``build_*``)."""
        recipe = self.task_encoder.compose_pipeline(self.spec)
        return recipe is not None and recipe != default_recipe(self.spec)

    def _check_task_encoder(self) -> None:
        name = type(self.task_encoder).__name__
        what = "packs samples (select_samples_to_pack)" if self._hooks.packing else "groups batches (batch_group_criterion)" if self._hooks.grouping else None
        if what is None and self._composes_its_own():
            what = "builds its own pipeline (build_train_datasets, ...)"
        if what is not None:
            raise ConfigError(
                format_message(
                    f"the map view cannot use a task encoder that {what}: those hooks work on a stream of samples, not on one index",
                    where=name,
                    fix="use the streaming loader (get_train_dataset + get_savable_loader, which resumes exactly), "
                    "or a task encoder without those hooks",
                )
            )

    def _check_plan(self) -> None:
        plan = self.spec.plan
        if plan.mock:
            raise NotSupportedError(format_message("mock data is not supported by the map view", where=f"{plan.source}: mock", fix="remove mock: from the YAML, or use get_train_dataset(..., mock=True)"))
        if self.spec.blend_mode == "cost":
            raise NotSupportedError(
                format_message("blend_mode cost is not supported by the map view", where=plan.source, found="weights that share a cost per sample", fix="use blend_mode random or exact (the view always lays out samples by weight)")
            )
        if plan.kind not in ("single", "blend", "blend_epochized"):
            raise NotSupportedError(format_message(f"a {plan.kind} plan is not supported by the map view", where=plan.source, expected="a dataset, a blend or a blend_epochized"))

    def _leaf(self, k: int) -> _Leaf:
        """Dataset ``k``'s subset, without the samples ``split.yaml`` excludes by key.

        The streaming loader skips those when it reads them (its lengths count them, as
        Energon's do); a sampler cannot skip, so the view leaves them out of its index, found
        once by reading the keys of the shards that list excludes.
        """
        leaf, resolved = self.spec.plan.leaves[k], self.spec.datasets[k]
        start, end = leaf.sample_range(resolved.total)
        split = resolved.split
        if split is None or not split.excluded_keys or leaf.join is not None:
            return _Leaf(leaf.where, start, end, None)
        starts = split.shard_starts
        scan = [
            range(max(start, starts[s]), min(end, starts[s + 1]))
            for s, name in enumerate(split.names)
            if name in split.excluded_keys and starts[s] < end and starts[s + 1] > start
        ]
        if not scan:
            return _Leaf(leaf.where, start, end, None)
        loader = leaf_loader(self.spec, k)
        try:
            excluded = [i for indices in scan for i in indices if loader.reader.read(i, wanted=frozenset()) is None]
        finally:
            loader.close()
        logger.info("%s: %d samples excluded by key in split.yaml are left out of the map view", leaf.where, len(excluded))
        kept = np.setdiff1d(np.arange(start, end, dtype=np.int64), np.asarray(excluded, dtype=np.int64)) if excluded else None
        return _Leaf(leaf.where, start, end, kept)

    def _layout(self, num_samples: int | None) -> tuple[tuple[int, ...], np.ndarray | None, np.ndarray | None]:
        """``(counts per dataset, dataset per position, draw per position)``; one dataset: no arrays."""
        plan, lengths = self.spec.plan, [leaf.length for leaf in self._leaves]
        if plan.kind == "single":
            counts = [num_samples if num_samples is not None else lengths[0]]
        elif plan.kind == "blend":
            scheduled = [leaf for leaf in plan.leaves if leaf.weight_schedule is not None]
            if scheduled:
                raise ConfigError(format_message("a map view cannot follow a weight schedule", where=scheduled[0].where, found="a weight: schedule", fix="its order is fixed up front from constant weights; use the streaming loader (get_train_dataset), or constant weights"))
            counts = blend_counts([leaf.weight for leaf in plan.leaves], num_samples if num_samples is not None else sum(lengths))
        else:
            if num_samples is not None:
                raise ConfigError(
                    format_message(
                        "num_samples does not apply to a blend_epochized",
                        where=plan.source,
                        found=f"num_samples={num_samples}",
                        fix="its repetitions set the length; for more, wrap the view in MultiEpochResampler, or use a blend with weights",
                    )
                )
            counts = [int(length * leaf.repetitions) for length, leaf in zip(lengths, plan.leaves)]  # Energon's RepeatDataset length
        for leaf, count, length in zip(self._leaves, counts, lengths):
            if count > 0 and length == 0:
                raise EmptyDatasetError(format_message("a dataset of the map view has no samples", where=leaf.where, expected=f"samples to read ({count} asked for)", found="0 after its subset and split.yaml's excludes", fix="widen the subset, or give the dataset weight 0"))
        if sum(counts) == 0:
            raise EmptyDatasetError(format_message("the map view has no samples", where=plan.source or self.spec.path, found=f"datasets of lengths {lengths}"))
        if plan.kind == "single":
            return tuple(counts), None, None
        if plan.kind == "blend":
            weight_sum = sum(leaf.weight for leaf in plan.leaves)
            shares = [float(leaf.weight / weight_sum) for leaf in plan.leaves]
        else:
            shares = [count / sum(counts) for count in counts]
        order = blend_order(shares, counts)
        return tuple(counts), order, _draw_numbers(order, lengths)

    # --- lookup -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._length

    def _epoch_index(self, index: Any) -> EpochIndex:
        where = f"map view of {self.spec.path} (split {self.spec.split_part!r}, length {self._length})"
        if isinstance(index, EpochIndex):
            epoch, idx = index
            if not isinstance(epoch, (int, np.integer)) or isinstance(epoch, bool):
                raise IndexTypeError(format_message("invalid epoch", where=where, expected="an integer >= 0", found=f"{type(epoch).__name__} {epoch!r}"))
            if epoch < 0:
                raise ConfigError(format_message("negative epoch", where=where, expected="an integer >= 0", found=str(epoch)))
            return EpochIndex(int(epoch), check_flat_index(idx, self._length, where))
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            return EpochIndex(0, check_flat_index(index, self._length, where))
        raise IndexTypeError(format_message("invalid index", where=where, expected="an int or an EpochIndex(epoch, idx)", found=f"{type(index).__name__} {index!r}"[:120]))

    def locate(self, index: int | EpochIndex) -> tuple[int, int]:
        """``(dataset position in the plan, split index)`` that ``index`` reads."""
        return self._locate(self._epoch_index(index).idx)

    def _locate(self, i: int) -> tuple[int, int]:
        if self._order is None:
            return 0, self._leaves[0].split_index(i % self._leaves[0].length)
        k = int(self._order[i])
        return k, self._leaves[k].split_index(int(self._draws[i]))

    def manifest(self, folder: str | os.PathLike[str], *, rank: int = 0, world_size: int = 1) -> MapManifest:
        """A per-step manifest of a loop over this view (``manifest.py``): ``add(step, indices)``
        records the samples each step read, ``read_manifest(folder)`` reads them back."""
        return MapManifest(self, folder, rank=rank, world_size=world_size)

    def _reader(self, k: int) -> tuple[Any, Any]:
        """Dataset ``k``'s loader and cooking arguments in this process (made on first use; a forked
        worker makes its own)."""
        if self._pid != os.getpid():
            self._pid, self._readers = os.getpid(), [None] * len(self._leaves)
        reader = self._readers[k]
        if reader is None:
            loader = leaf_loader(self.spec, k)
            reader = self._readers[k] = (loader, leaf_cooking(self.spec, k, loader))
        return reader

    def __getitem__(self, index: int | EpochIndex) -> Any:
        epoch, i = self._epoch_index(index)
        k, split_index = self._locate(i)
        loader, cooking = self._reader(k)
        te, hooks = self.task_encoder, self._hooks
        try:
            sample = loader.load(split_index, check_key=True)
            if sample is None:
                raise DatasetError(
                    format_message(
                        "a sample the map view indexes is excluded by split.yaml",
                        where=f"{self._leaves[k].where}, split index {split_index}",
                        fix="split.yaml changed after the view was made: make the view again",
                    )
                )
            if cooking is not None:
                sample = self._call(te.cook_crude_sample, (sample, *cooking), epoch, i)
            if hooks.sample_encoder is not None:
                sample = self._call(getattr(te, hooks.sample_encoder), (sample,), epoch, i)
            if hooks.postencoder:
                sample = self._call(te.postencode_sample, (sample,), epoch, i)
        except Exception as exc:
            exc.add_note(f"map view index {EpochIndex(epoch, i)}: {self._leaves[k].where}, split index {split_index}")
            raise
        return sample

    def _call(self, fn: Any, args: tuple, epoch: int | None, i: int | None) -> Any:
        """One hook call: exactly one output, seeded from ``(seed, epoch, i)`` (None: no index)."""
        if i is None:
            state = HookState(fn=fn)
        else:
            # restore_seeds hooks seed from (worker seed, sample index): an epoch seed varies them per epoch.
            state = HookState(sample_index=i, worker_seed=stage_id(f"map_view|{self.seed}|{epoch}"), rng_key=(self.seed, epoch, i), fn=fn)
        name = getattr(fn, "__name__", "hook")
        try:
            result = invoke(fn, args, {}, state)
            if isinstance(result, Generator):
                outputs = list(result)
                if len(outputs) != 1:
                    raise ConfigError(
                        format_message(
                            f"{name} yielded {len(outputs)} outputs for one input",
                            where=f"task encoder {type(self.task_encoder).__name__}",
                            expected="exactly one: a map view returns one sample per index and one batch per collate",
                            fix="yield one output, or use the streaming loader",
                        )
                    )
                result = outputs[0]
        except SkipSample as exc:
            raise DatasetError(
                format_message(
                    f"{name} raised SkipSample, but a map view cannot skip an index",
                    where=f"task encoder {type(self.task_encoder).__name__}",
                    fix="exclude such samples in split.yaml (exclude: [shard/key]), which the view leaves out of its index, or do not skip in this hook",
                )
            ) from exc
        if result is None:
            raise ConfigError(
                format_message(
                    f"{name} returned None",
                    where=f"task encoder {type(self.task_encoder).__name__}",
                    expected="a sample (or a batch)",
                    fix="check that the hook ends with `return`",
                )
            )
        return result

    def collate(self, samples: list[Any]) -> Any:
        """The task encoder's ``batch`` then ``encode_batch`` (when it has one) on ``samples``: a
        ``collate_fn`` for ``DataLoader``. The batch hooks get no index here (``current_rng`` and
        ``current_batch_index`` are not available)."""
        batch = self._call(self.task_encoder.batch, (list(samples),), None, None)
        if self._hooks.batch_encoder:
            batch = self._call(self.task_encoder.encode_batch, (batch,), None, None)
        return batch


class MapManifest:
    """The manifest of a loop over a :class:`MapStyleDataset`: the loop (whose sampler picks the
    indices) tells each step's indices; each is recorded as its dataset and split index, the
    same entries the streaming loader writes (``("Blend", k, "Webdataset", i)``; a batch key
    ``("Worker", 0, "Batch", step, ...)``), so ``read_manifest``, ``energon-lite manifest`` and
    skip lists by manifest entry read them alike.  The folder's run is the view's configuration
    and data (with its seed and length: another layout is another run)."""

    def __init__(self, view: MapStyleDataset, folder: str | os.PathLike[str], *, rank: int, world_size: int) -> None:
        spec = view.spec
        self._view = view
        self._blend = len(spec.plan.leaves) > 1
        config = {**spec.fingerprint(), "map_view": True, "seed": view.seed, "length": len(view)}
        self._writer = ManifestWriter(folder, rank=rank, world_size=world_size, num_workers=0, config=config, data=spec.data_record(), datasets=dataset_tables(spec))

    def add(self, step: int, indices: Sequence[int | EpochIndex]) -> None:
        """Records that ``step`` read the view's ``indices`` (in batch order)."""
        keys = []
        for index in indices:
            k, split_index = self._view.locate(index)
            keys.append((BLEND_TAG, k, RESTORE_TAG, split_index) if self._blend else (RESTORE_TAG, split_index))
        self._writer.add(step, ("Worker", 0, "Batch", step, *keys))

    def flush(self) -> None:
        """Returns when every step added so far is on disk (call it with each checkpoint)."""
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _rebuild(arguments: Mapping[str, Any]) -> MapStyleDataset:
    arguments = dict(arguments)
    return MapStyleDataset(arguments.pop("path"), **arguments)


def get_map_dataset(
    path: Any,
    *,
    split_part: str = "train",
    task_encoder: Hooks | None = None,
    seed: int = 42,
    num_samples: int | None = None,
    worker_config: WorkerConfig | None = None,
    trust_dataset_code: bool = False,
    **kwargs: Any,
) -> MapStyleDataset:
    """A map-style view of split ``split_part``: ``view[i]`` is the encoded sample ``i``, the same
    every time, in any process (a ``torch.utils.data.Dataset`` for Megatron's samplers and
    ``DistributedSampler``).

    ``path``: a prepared dataset, a ``.jsonl`` file, a metadataset YAML (or dict) or a
    ``Blender``; subsets and subflavors apply as in the streaming loader, and so do the keyword
    arguments ``dataset_config``, ``split_config``, ``subflavors``, ``subset``, ``sample_type``,
    ``storage_options`` and the deprecated decoder arguments. ``task_encoder`` (default
    ``DefaultTaskEncoder()``): its cookers, ``encode_sample`` (or ``preencode_sample`` /
    ``postencode_sample``) run per index, ``batch`` / ``encode_batch`` in :meth:`collate`; one that
    packs or groups batches is refused. ``worker_config`` is handed to a dataset factory named in
    ``dataset.yaml`` (default: one process).

    Length: one dataset: its split (after its subset), or ``num_samples`` (reading it round and
    round). A ``blend``: ``num_samples``, by default the sum of the datasets' lengths; each dataset
    gets its exact share by largest remainder and the positions follow Megatron's greedy rule (see
    :func:`blend_order`); a dataset asked for more samples than it has wraps around (its ``k``-th
    draw reads its sample ``k % length``), in its own order ``0, 1, 2, ...``. A
    ``blend_epochized``: ``floor(repetitions * length)`` samples of each dataset. The YAML's
    ``blend_mode`` is not used (``cost`` is refused). Samples ``split.yaml`` excludes by key are
    left out of the index (found once, by reading the keys of the shards that list excludes), so
    ``len`` can be smaller than the streaming loader's, which counts them.

    Randomness: hooks draw from ``self.current_rng`` / ``self.current_torch_generator``, seeded
    from ``(seed, epoch, index)``; ``view[EpochIndex(e, i)]`` differs between epochs only there.
    ``@stateless(restore_seeds=True)`` hooks work as in the loader (torch, numpy and ``random``
    seeded per ``(seed, epoch, index)`` around the call, then restored), but ``torch.manual_seed``
    also reseeds CUDA, which Megatron's RNG tracker owns: prefer ``current_rng``.
    Errors are raised, never skipped (a sampler cannot skip an index); an out-of-range index is
    a :class:`~megatron_energon_lite.errors.SampleIndexError`, also an ``IndexError``.

    Resuming: the view has no state. With Megatron's samplers, rebuild the view with the same
    arguments and pass the saved ``consumed_samples``; with ``DistributedSampler``, ``set_epoch``
    and skip the batches already consumed (or a ``MultiEpochResampler`` and a sampler starting at
    the consumed index). Only the training loader resumes; validation and test start at 0.
    """
    return MapStyleDataset(path, split_part=split_part, task_encoder=task_encoder, seed=seed, num_samples=num_samples,
                           worker_config=worker_config, trust_dataset_code=trust_dataset_code, **kwargs)
