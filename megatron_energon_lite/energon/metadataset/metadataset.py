"""Energon's ``DatasetLoader``, ``Metadataset`` and ``MetadatasetV2``: a dataset or metadataset
path, loaded into the factories of a split's datasets through the loader's own plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..epathlib import EPath
from ...errors import NotSupportedError, format_message
from ...format.join import prepare_metadataset_joins
from ...format.metadataset import Blender, load_blend_plan, single_dataset_plan
from ...loader.api import plan_spec
from ...storage import as_path
from ...worker import WorkerConfig
from ..wrappers.compose import PLAN_BLEND_MODES, DatasetBlendMode, loaded_datasets
from .splits import splits_view
from .loader_interface import (
    DatasetLoaderInterface,
    LoadedDatasetList,
    TraversedDatasetReference,
)

__all__ = ["DatasetLoader", "Metadataset", "MetadatasetV2"]

_BLEND_MODES = {**PLAN_BLEND_MODES, "concat": DatasetBlendMode.NONE}
# Settings of the loader spec rather than dataset keyword arguments.
_SPEC_SETTINGS = ("max_samples_per_sequence", "parallel_shard_iters")


class _PlanLoader(DatasetLoaderInterface):
    """Loads ``path`` through the loader's plan, with the keyword arguments given at load time."""

    def __init__(self, path: Any, **kwargs: Any) -> None:
        #: What the loader reads: a path, or a metadataset dict / Blender.
        self.source = path
        self.path = path if isinstance(path, (Mapping, Blender)) else EPath(path)
        self.kwargs = kwargs

    def _plan(self, split_part: str, *, check_datasets: bool = True) -> Any:
        raise NotImplementedError

    def get_datasets(
        self,
        *,
        training: bool,
        split_part: str,
        worker_config: WorkerConfig,
        subflavors: dict[str, Any] | None = None,
        shuffle_over_epochs_multiplier: int | None = 1,
        **kwargs: Any,
    ) -> LoadedDatasetList:
        # Weights and repetitions as the YAML gives them, also for validation (as Energon).
        plan = self._plan(split_part)
        options = {**self.kwargs, **kwargs, "subflavors": subflavors}
        settings = {key: options.pop(key) for key in _SPEC_SETTINGS if key in options}
        spec = plan_spec(
            self.source,
            training=training,
            worker_config=worker_config,
            packing_buffer_size=None,
            kwargs=options,
            split_part=split_part,
            plan=plan,
            batch_size=None,
            shuffle_over_epochs_multiplier=shuffle_over_epochs_multiplier,
            **settings,
        )
        return LoadedDatasetList(datasets=loaded_datasets(spec), blend_mode=_BLEND_MODES[spec.plan.kind])

    def traverse(self, *, split_part: str) -> list[TraversedDatasetReference]:
        return [
            TraversedDatasetReference(path=EPath(leaf.path), split_part=leaf.split_part, aux={name: EPath(source.path) for name, source in leaf.aux.items()}, subflavors=dict(leaf.subflavors))
            for leaf in self._plan(split_part, check_datasets=False).leaves
        ]


class DatasetLoader(_PlanLoader):
    """A prepared dataset folder (or ``.jsonl`` file) as ``load_dataset`` gives it."""

    def _plan(self, split_part: str, *, check_datasets: bool = True) -> Any:
        return single_dataset_plan(str(self.source), split_part)


class MetadatasetV2(_PlanLoader):
    """A metadataset YAML (``__class__: MetadatasetV2``)."""

    @property
    def splits(self) -> dict[str, Any]:
        """Energon's parsed ``splits``: the YAML's splits as objects, read again on each access
        (see :mod:`megatron_energon_lite.energon.metadataset.splits`)."""
        if isinstance(self.source, Blender):
            raise NotSupportedError(format_message("a Blender has no YAML splits to show", found=f"MetadatasetV2 of a Blender with {len(self.source.entries)} entries", fix="read the Blender's entries instead"))
        return splits_view(self.source)

    def _plan(self, split_part: str, *, check_datasets: bool = True) -> Any:
        return load_blend_plan(self.source if isinstance(self.source, (Mapping, Blender)) else str(self.source), split_part, training=True, check_datasets=check_datasets)

    def prepare(self, split_part: str | None = None) -> list[EPath]:
        prepared, _ = prepare_metadataset_joins(as_path(self.source))
        return [EPath(join.index_file.path) for join in prepared]


class Metadataset(MetadatasetV2):
    """A legacy (V1) metadataset YAML (``__class__: Metadataset``)."""
