"""Energon's ``BaseWebdatasetFactory``: one split of a prepared dataset, and the dataset it builds.

A factory is made in one of two ways:

* by the loader, for each dataset of a plan (``get_train_dataset`` on a metadataset, ``load_dataset
  (...).get_datasets(...)``, the ``LoadedDataset`` entries a task encoder's ``build_*`` receive):
  it shares the plan's :class:`PipelineSpec`, so its slices follow the blend's worker rotation;
* directly with Energon's arguments (``get_dataset_from_config`` does this), which builds a
  single-dataset spec from them when first needed (so that subclasses may set attributes after
  ``super().__init__`` as Energon's do).

``build()`` gives a :class:`DatasetSource`: the dataset's samples on each worker, decoded with the
factory's decoder, not cooked, not repeated (Energon's ``WebdatasetSampleLoaderDataset``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence, TypeVar

from ....decode import SampleDecoder
from ....energon_mode import current_policy
from ...epathlib import EPath
from ....errors import ConfigError, NotSupportedError, format_message
from ....format.dataset_config import DatasetConfig, load_dataset_config
from ....format.metadataset import single_dataset_plan, with_subset
from ....format.prepare import braceexpand, prepare_dataset
from ....format.sqlite_index import part_counts
from ....pipeline.build import (
    PipelineSpec,
    dataset_sizes,
    dataset_slices,
    Source,
)
from ....pipeline.task_hooks import DefaultHooks
from ....policy import Policy
from ....worker import WorkerConfig
from ...wrappers.base import SavableDataset
from ..base_dataset import BaseCoreDatasetFactory

logger = logging.getLogger(__name__)

T_sample = TypeVar("T_sample")

__all__ = ["BaseWebdatasetFactory", "DatasetSource"]

class _DefaultDecoder:
    """The decoder argument was not given: the factory class's default (a new ``SampleDecoder()``,
    as in Energon) applies. Shown as that in ``help()``."""

    def __repr__(self) -> str:
        return "SampleDecoder()"


DEFAULT_DECODER: Any = _DefaultDecoder()


class DatasetSource(SavableDataset[Any], Source):
    """Dataset ``index`` of a spec's plan on each worker, uncooked (shuffled slices for training):
    the core's plan source under Energon's dataset methods."""

    def __init__(self, spec: PipelineSpec, index: int) -> None:
        Source.__init__(self, spec, index, cook=False)


class BaseWebdatasetFactory(BaseCoreDatasetFactory[T_sample]):
    """One split of a prepared dataset (Energon's ``BaseWebdatasetFactory``).

    Energon's arguments: ``split_part``, ``training`` (shuffled slices), ``worker_config``,
    ``shuffle_over_epochs`` (1: every sample once per epoch; k: slices drawn without replacement
    over k epochs; -1: with replacement; None: in order), ``parallel_shard_iters``,
    ``max_samples_per_sequence``, ``subset`` (``DatasetSubset`` or a dict with ``range`` /
    ``absolute_range``) and ``split_config``. The samples are built as the dataset's
    ``.nv-meta/dataset.yaml`` (or ``dataset_config``) says.
    """

    def __init__(
        self,
        path: Any,
        *,
        split_part: str,
        training: bool,
        worker_config: WorkerConfig,
        shuffle_over_epochs: int | None = 1,
        parallel_shard_iters: int | None = None,
        max_samples_per_sequence: int | None = None,
        subset: Any = None,
        split_config: str | None = None,
        part_filter: Any = None,
        dataset_config: str | None = None,
        trust_dataset_code: bool = False,
    ) -> None:
        if not isinstance(worker_config, WorkerConfig):
            raise ConfigError(format_message(f"{type(self).__name__}(worker_config=...) must be a WorkerConfig", found=type(worker_config).__name__, fix="pass WorkerConfig.default_worker_config(num_workers)"))
        self.path = EPath(path)
        self.paths = [self.path]
        self.split_part = split_part
        self.training = training
        self.worker_config = worker_config
        self.shuffle_over_epochs = shuffle_over_epochs
        self.parallel_shard_iters = parallel_shard_iters
        self.max_samples_per_sequence = max_samples_per_sequence
        self.subset = subset
        self.split_config = split_config
        self.dataset_config = dataset_config
        self.trust_dataset_code = trust_dataset_code
        self.part_filter = part_filter
        if not hasattr(self, "subflavors"):
            self.subflavors = {}
        self._bound: tuple[PipelineSpec, int, list[list[tuple[int, int]]], int] | None = None

    @classmethod
    def of_plan(cls, spec: PipelineSpec, index: int, slices: list[list[tuple[int, int]]], size: int, *, yaml_subflavors: dict[str, Any] | None = None) -> BaseWebdatasetFactory:
        """The factory of dataset ``index`` of ``spec``'s plan (``slices``, ``size``: its
        ``dataset_slices`` and ``dataset_sizes`` entries, computed once for the whole plan;
        ``yaml_subflavors``: those of the dataset's ``dataset.yaml``, which the leaf's override)."""
        leaf = spec.plan.leaves[index]
        factory = cls.__new__(cls)
        factory.path = EPath(leaf.path)
        factory.paths = [factory.path]
        factory.split_part = leaf.split_part
        factory.training = spec.training
        factory.worker_config = spec.worker_config
        factory.shuffle_over_epochs = leaf.shuffle_over_epochs_multiplier
        factory.parallel_shard_iters = spec.parallel_shard_iters
        factory.max_samples_per_sequence = spec.max_samples_per_sequence
        factory.subset = None
        factory.split_config = leaf.split_config or spec.split_config
        factory.dataset_config = leaf.dataset_config or spec.dataset_config
        factory.trust_dataset_code = spec.trust_dataset_code
        factory.part_filter = None
        factory.subflavors = {**(yaml_subflavors or {}), **leaf.subflavors}
        factory._bound = (spec, index, slices, size)
        return factory

    def bind(self, spec: PipelineSpec, index: int, slices: list[list[tuple[int, int]]], size: int) -> None:
        """Makes this factory (constructed by its own ``__init__``) dataset ``index`` of ``spec``'s plan."""
        self._bound = (spec, index, slices, size)

    # --- the spec -------------------------------------------------------------------------------
    def sample_config(self) -> DatasetConfig:
        """How samples are built: which parts to read and how to fill the sample (the dataset's
        ``dataset.yaml``, or ``dataset_config``)."""
        return load_dataset_config(self.path, self.dataset_config, trust_dataset_code=self.trust_dataset_code, policy=self._policy())

    def _policy(self) -> Policy:
        """The policy of the spec this factory is part of; made on its own, the switch's now."""
        return self._bound[0].policy if self._bound is not None else current_policy()

    def builds_own_samples(self) -> bool:
        """Whether the loader must call this factory's ``load_sample`` for every sample: true for
        a user's subclass, whose ``load_sample`` (or decoder) may differ from ours. Our own classes
        read with the dataset's settings are read by the loader directly: the same samples."""
        return not type(self).__module__.startswith("megatron_energon_lite.")

    def _spec_decoder(self) -> SampleDecoder | None:
        """The decoder the loader applies itself (when it does not call ``load_sample``)."""
        return None

    def _own_spec(self) -> PipelineSpec:
        task_encoder = DefaultHooks()
        own = self.builds_own_samples()
        task_encoder.decoder = None if own else self._spec_decoder()
        plan = single_dataset_plan(
            self.path,
            self.split_part,
            subflavors=dict(self.subflavors),
            dataset_config=self.dataset_config,
            split_config=self.split_config,
            shuffle_over_epochs_multiplier=self.shuffle_over_epochs,
            sample_factory=self if own else None,
        )
        return PipelineSpec(
            path=str(self.path),
            split_part=self.split_part,
            training=self.training,
            worker_config=self.worker_config,
            batch_size=None,
            max_samples_per_sequence=self.max_samples_per_sequence,
            parallel_shard_iters=self.parallel_shard_iters,
            shuffle_over_epochs_multiplier=1,
            dataset_config=self.dataset_config,
            split_config=self.split_config,
            trust_dataset_code=self.trust_dataset_code,
            task_encoder=task_encoder,
            plan=with_subset(plan, self.subset),
            policy=current_policy(),
        )

    def _binding(self) -> tuple[PipelineSpec, int, list[list[tuple[int, int]]], int]:
        if self._bound is None:
            spec = self._own_spec()
            self._bound = (spec, 0, dataset_slices(spec)[0], dataset_sizes(spec)[0])
        return self._bound

    # --- Energon's factory interface ------------------------------------------------------------
    def build(self, worker_rotation_offset: int = 0) -> DatasetSource:
        """The split's samples on each worker. Energon's ``worker_rotation_offset`` is computed
        from the plan here (a blend's later datasets continue where earlier ones left off)."""
        spec, index, slices, _ = self._binding()
        return DatasetSource(spec, index)

    def __len__(self) -> int:
        return self._binding()[3]

    def load_sample(self, raw_data: dict[str, Any]) -> T_sample:
        """Energon's hook: the sample built from a raw sample dict (``__key__``, ``__shard__``,
        ``__restore_key__``, ``__sources__`` and the parts as bytes). A subclass of this base
        must implement it; the ``Default*`` factories fill ``__sample_type__`` by field_map."""
        raise NotSupportedError(
            format_message(
                f"{type(self).__name__} does not implement load_sample",
                fix="implement load_sample(raw) in your factory, or derive it from DefaultDecoderWebdatasetFactory (field_map in dataset.yaml)",
            )
        )

    @staticmethod
    def prepare_dataset(
        parent_path: Any,
        paths: Sequence[str],
        *,
        split_parts_ratio: Sequence[tuple[str, float]] | None = None,
        split_parts_patterns: Sequence[tuple[str, str]] | None = None,
        split_config: str = "split.yaml",
        shuffle_seed: int | None = 42,
        progress_fn: Callable[..., Any] | None = None,
        workers: int = 32,
        tar_index_only: bool = False,
        media_filter: Any = None,
        fix_duplicates: bool = False,
        index_sqlite_tmp_path: Any = None,
    ) -> tuple[set[str], list[tuple[str, int]]]:
        """Indexes the tars ``paths`` (relative to ``parent_path``) and writes ``.nv-meta/``, as
        Energon's ``prepare_dataset``. Returns (the part names found, at most 50; (shard, samples)
        per shard). ``progress_fn`` is not called: progress shows as a bar on the terminal."""
        if split_config != "split.yaml":
            raise NotSupportedError(format_message("prepare_dataset(split_config=...) other than split.yaml is not supported", found=repr(split_config), fix="prepare with split.yaml (the loader's split_config argument can name another file you write)"))
        if fix_duplicates:
            raise NotSupportedError(format_message("prepare_dataset(fix_duplicates=True) is not supported here", fix="run `energon-lite prepare --fix-duplicates` on the dataset"))
        if shuffle_seed not in (None, 42):
            raise NotSupportedError(format_message("prepare_dataset(shuffle_seed=...) other than 42 or None is not supported", found=repr(shuffle_seed), fix="pass 42 (Energon's default) or None"))
        result = prepare_dataset(
            parent_path,
            split_ratio=list(split_parts_ratio) if split_parts_ratio is not None else None,
            split_parts=list(split_parts_patterns) if split_parts_patterns is not None else None,
            num_workers=workers,
            progress=False,
            tar_index_only=tar_index_only,
            shuffle_tars=shuffle_seed is not None and split_parts_ratio is not None,
            force_overwrite=True,
            media_filter=media_filter,
            shards=[shard for pattern in paths for shard in braceexpand(pattern)],  # Energon expands {0..9}
        )
        parts = set(list(part_counts(result.root) or {})[:50])  # Energon returns at most 50 part names
        return parts, list(result.shard_counts.items())

