"""The dataset of a spec: what ``get_train_dataset`` / ``get_val_dataset`` return (``api.py``)
and the loader iterates (``dataloader.py``)."""

from __future__ import annotations

import logging
from typing import Any, Sequence

from ..errors import EmptyDatasetError, format_message
from ..pipeline.build import (
    PipelineSpec,
    build_worker_pipeline,
    default_recipe,
    rank_length,
    validate,
    worker_lengths,
    worker_samples,
)
from ..pipeline.node import Node
from ..pipeline.recipe import Recipe, check_takes_runtime, passes_continue, share
from ..pipeline.runtime import Runtime
from ..worker import WorkerConfig

__all__ = ["PipelineDataset"]

logger = logging.getLogger("megatron_energon_lite.loader")  # loader.py's, unchanged by the split: the name users configure


class PipelineDataset(Recipe):
    """What ``get_train_dataset`` / ``get_val_dataset`` return: the pipeline of a spec, as
    ``pipeline/build.py`` composes it, or as the task encoder composes it
    (``Hooks.compose_pipeline``: Energon's ``build_*`` overrides) from the same stage recipes.

    A composition equal to the default one is the default one: the same stages, lengths,
    fingerprint and elastic resume. Any other composition's fingerprint adds its recipes
    (``"composition"``), and it is moved to another topology stage by stage."""

    def __init__(self, spec: PipelineSpec, recipe: Recipe | None = None) -> None:
        super().__init__()
        validate(spec)
        self.spec = spec
        default = default_recipe(spec)
        self.recipe = default if recipe is None or recipe == default else recipe
        self.composed = self.recipe is not default
        self.worker_config = spec.worker_config
        # Also validates the dataset and split up front.
        self._worker_lengths = worker_lengths(spec) if not self.composed else [self.recipe.worker_length(w) for w in range(spec.worker_config.workers_per_rank)]
        self._length = rank_length(spec, self._worker_lengths)
        if spec.training and spec.repeat and not any(self._worker_lengths):
            # An endless stream of nothing: the first batch would be a bare StopIteration.
            wc = spec.worker_config
            raise EmptyDatasetError(
                format_message(
                    f"rank {wc.rank} of {wc.world_size} gets nothing to train on",
                    where=f"{spec.path} (split {spec.split_part})",
                    expected="at least one item for this rank per epoch (a training stream repeats forever)",
                    found=f"{sum(dataset.total for dataset in spec.datasets)} samples shared by {wc.world_size} rank(s) x {wc.workers_per_rank} worker(s)"
                    + (f", batch_size {spec.batch_size} with batch_drop_last" if spec.batch_drop_last else ""),
                    fix="use fewer ranks or workers, a larger dataset or subset, or batch_drop_last=False",
                )
            )
        if spec.training and spec.repeat and spec.batch_size and not self.composed and not (spec.hooks.grouping or spec.hooks.packing):
            _warn_batches_that_repeat(spec)
        # Saved with every state: computed once.
        self._config = spec.fingerprint() if not self.composed else {**spec.fingerprint(), "composition": self.recipe.config()}
        self._data_record = spec.data_record()
        if self.composed:
            check_takes_runtime(self.recipe)
            _warn_unmovable(self.recipe)

    @property
    def dataset(self) -> Recipe:
        """Its pipeline's last stage (Energon's wrappers name their input ``dataset``; the stages
        go on through theirs, down to each dataset's slices)."""
        return self.recipe

    def build_worker(self, local_worker_id: int, runtime: Runtime | None = None) -> Node:
        return build_worker_pipeline(self.spec, self.recipe, local_worker_id, runtime)

    def worker_length(self, local_worker_id: int) -> int:
        if passes_continue(self.recipe) and not self.composed:  # virtual epochs and val limits give each worker its share
            return share(self._length, self.worker_config.workers_per_rank, local_worker_id)
        return self._worker_lengths[local_worker_id]

    def __len__(self) -> int:
        return self._length

    def config(self) -> dict[str, Any]:
        return self._config

    def data_record(self) -> list[dict[str, Any]]:
        return self._data_record

    def with_topology(self, worker_config: WorkerConfig) -> PipelineDataset:
        spec = self.spec.with_topology(worker_config)
        return PipelineDataset(spec, self.recipe.with_topology(worker_config) if self.composed else None)

    def input_recipes(self) -> Sequence[Recipe]:
        return (self.recipe,)


def _warn_unmovable(recipe: Recipe) -> None:
    """Says at build time which stages of a composed pipeline are not the core's stage recipes:
    such a pipeline saves and restores exactly, but cannot be resumed on another topology."""
    found = []
    pending = [recipe]
    while pending:
        current = pending.pop()
        if type(current).with_topology is Recipe.with_topology:
            found.append(type(current).__qualname__)
        pending.extend(current.input_recipes())
    if found:
        logger.warning(
            "the task encoder's pipeline has stages that are not the loader's stage recipes (%s): it saves and "
            "restores exactly, but restore_state_global cannot move it to another number of ranks or workers",
            ", ".join(sorted(set(found))),
        )


def _warn_batches_that_repeat(spec: PipelineSpec) -> None:
    """A worker with fewer samples than a batch fills its batches by repeating them (a training
    stream goes round and round): legal, as in Energon, but rarely meant, so said once."""
    short = {w: n for w, n in enumerate(worker_samples(spec)) if 0 < n < spec.batch_size}
    if short:
        wc = spec.worker_config
        logger.warning(
            "%s (split %s): on rank %d, %s sample(s) per epoch, fewer than batch_size %d, so each of their batches "
            "holds some samples more than once; use fewer workers (num_workers=%d now), a larger dataset or a smaller batch",
            spec.path, spec.split_part, wc.rank, ", ".join(f"worker {w} reads {n}" for w, n in short.items()), spec.batch_size, wc.num_workers,
        )
