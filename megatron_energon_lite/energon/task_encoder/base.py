"""Energon's task encoders: the core's hooks (:mod:`megatron_energon_lite.pipeline.task_hooks`)
plus Energon's ``build_*`` methods, which compose the pipeline from dataset wrappers.

A task encoder that overrides none of the ``build_*`` methods gets the loader's default pipeline;
one that overrides any of them composes its own (:meth:`TaskEncoder.compose_pipeline`), from the
same stage recipes, so an override that only calls ``super()`` yields the very same pipeline,
blend mode, elastic resume and checkpoint fingerprint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from ...decode import SampleDecoder
from ...errors import ConfigError, format_message
from ...pipeline.build import PipelineSpec
from ...pipeline.cooking import Cooker
from ...pipeline.marks import hook_context, stateless, stateless_spec
from ...pipeline.marks import StatelessSpec
from ...pipeline.task_hooks import DefaultHooks, Hooks
from ...samples import Sample
from ..wrappers import compose

__all__ = [
    "AugmentTaskEncoder",
    "DefaultTaskEncoder",
    "StatelessSpec",
    "TaskEncoder",
    "hook_context",
    "stateless",
    "stateless_spec",
]

#: Energon's pipeline-building methods of a task encoder.
BUILD_METHODS = ("build_train_datasets", "build_val_datasets", "build_batch", "build_encode_sample", "build_cook_crude_sample")

T_sample = TypeVar("T_sample", bound=Sample)
T_encoded_sample = TypeVar("T_encoded_sample")
T_raw_batch = TypeVar("T_raw_batch")
T_batch = TypeVar("T_batch")


class TaskEncoder(Hooks[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """Base class of task encoders: override the hooks you need (Energon's names and defaults).

    Every hook may raise :class:`~megatron_energon_lite.errors.SkipSample` to drop its input.
    ``encode_sample``, ``preencode_sample``, ``postencode_sample``, ``pack_selected_samples`` and
    ``encode_batch`` may be generators yielding zero or more outputs per input. Inside a hook,
    :attr:`current_sample_index` and :attr:`current_batch_index` identify the call, and
    :attr:`current_rng` / :attr:`current_torch_generator` give its reproducible randomness.
    """

    def compose_pipeline(self, spec: PipelineSpec) -> Any:
        """The pipeline the ``build_*`` methods compose, when this class overrides one of them
        (else None: the loader's default, which the default methods compose as well)."""
        cls = type(self)
        if all(getattr(cls, name) is getattr(TaskEncoder, name) for name in BUILD_METHODS):
            return None
        return compose.build_datasets(self, spec)

    # --- Energon's pipeline-building methods ----------------------------------------------------
    # Override these to compose the pipeline yourself from the dataset wrappers
    # (megatron_energon_lite.energon.wrappers); the defaults take the steps of the loader's own
    # composition (pipeline/build.py), so an override that calls super() changes nothing else.

    def build_train_datasets(self, *, datasets: list[Any], worker_config: Any, batch_size: int | None, batch_drop_last: bool = False, packing_buffer_size: int | None = None, virtual_epoch_length: int = 0, shuffle_buffer_size: int | None = None, blend_mode: Any = "none", repeat: bool = True) -> Any:
        """Combines the training datasets (``LoadedDataset`` entries) into one dataset."""
        return compose.build_train_datasets(self, datasets=datasets, worker_config=worker_config, batch_size=batch_size, batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, virtual_epoch_length=virtual_epoch_length, shuffle_buffer_size=shuffle_buffer_size, blend_mode=blend_mode, repeat=repeat)

    def build_val_datasets(self, *, datasets: list[Any], worker_config: Any, batch_size: int | None, batch_drop_last: bool = False, packing_buffer_size: int | None = None, limit: int | None = None) -> Any:
        """Combines the validation datasets (``LoadedDataset`` entries) into one dataset."""
        return compose.build_val_datasets(self, datasets=datasets, worker_config=worker_config, batch_size=batch_size, batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, limit=limit)

    def build_batch(self, dataset: Any, *, batch_size: int | None, batch_drop_last: bool = False, packing_buffer_size: int | None = None, worker_config: Any) -> Any:
        """Packing or post-encoding, then batching (grouped when batch_group_criterion is overridden), then encode_batch."""
        return compose.build_batch(self, dataset, batch_size=batch_size, batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, worker_config=worker_config)

    def build_encode_sample(self, dataset: Any, *, worker_config: Any) -> Any:
        """Maps encode_sample (or preencode_sample) over the dataset."""
        return compose.build_encode_sample(self, dataset, worker_config=worker_config)

    def build_cook_crude_sample(self, dataset: Any, *, worker_config: Any, subflavors: dict[str, Any], get_primary_aux: Any = None, aux: dict[str, Any] | None = None) -> Any:
        """Maps the matching cooker over a crude dataset."""
        return compose.build_cook_crude_sample(self, dataset, worker_config=worker_config, subflavors=subflavors, get_primary_aux=get_primary_aux, aux=aux)

    def _load_dataset(self, dataset: Any, worker_rotation_offset: int, worker_config: Any) -> Any:
        """A ``LoadedDataset``'s samples, cooked when crude (Energon's private helper, used by overrides)."""
        return compose.load_dataset(self, dataset, worker_config)


class DefaultTaskEncoder(DefaultHooks[T_sample, T_encoded_sample, T_raw_batch, T_batch], TaskEncoder[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """A task encoder that converts samples and batches to the given types by field name: the
    core's :class:`~megatron_energon_lite.pipeline.task_hooks.DefaultHooks` (which documents the
    arguments) with Energon's ``build_*`` methods."""


class AugmentTaskEncoder(TaskEncoder[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """Wraps another task encoder: its hooks run unless this class overrides them (Energon's
    ``AugmentTaskEncoder``); override e.g. ``encode_sample`` and call ``super().encode_sample``."""

    def __init__(self, task_encoder: TaskEncoder[T_sample, T_encoded_sample, T_raw_batch, T_batch]) -> None:
        if not isinstance(task_encoder, TaskEncoder):
            raise ConfigError(format_message("AugmentTaskEncoder wraps a TaskEncoder", found=type(task_encoder).__name__))
        self._task_encoder = task_encoder

    @property
    def decoder(self) -> SampleDecoder | None:  # type: ignore[override]
        return self._task_encoder.decoder

    @property
    def cookers(self) -> Sequence[Cooker[Any]]:  # type: ignore[override]
        return self._task_encoder.cookers

    def encode_sample(self, sample: T_sample) -> T_encoded_sample:
        return self._task_encoder.encode_sample(sample)

    def batch(self, samples: list[T_encoded_sample]) -> T_raw_batch:
        return self._task_encoder.batch(samples)

    def encode_batch(self, batch: T_raw_batch) -> T_batch:
        return self._task_encoder.encode_batch(batch)
