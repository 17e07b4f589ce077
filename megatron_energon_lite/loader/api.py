"""Energon's entry points and their arguments: ``get_train_dataset``, ``get_val_dataset``,
``get_val_datasets``, ``get_loader`` and ``get_savable_loader``.  :func:`plan_spec` checks the
arguments shared by both dataset constructors and builds the spec; ``map_view.py`` and Energon's
``metadataset/`` build theirs with it too."""

from __future__ import annotations

import dataclasses
import os
import logging
import warnings
from typing import Any, Mapping

from ..cache.base import CachePool
from ..decode import SampleDecoder
from ..energon_mode import current_policy
from ..errors import ConfigError, format_message
from ..format.dataset_config import require_sample_type
from ..format.metadataset import (
    Blender,
    BlendPlan,
    is_metadataset_path,
    load_blend_plan,
    single_dataset_plan,
    with_subflavors,
    with_subset,
)
from ..pipeline.blend import TABLE_LIMIT, integer_weights
from ..pipeline.build import PipelineSpec
from ..pipeline.recipe import ENDLESS, Recipe, Watchdog, pass_end
from ..pipeline.task_hooks import DefaultHooks, Hooks
from ..policy import Policy
from ..samples import CrudeSample
from ..storage import configure_storage, configured_storage, is_remote
from ..worker import WorkerConfig
from .dataloader import SavableDataLoader
from .dataset import PipelineDataset
from .mock import MockDataset, mock_mode

__all__ = ["get_loader", "get_savable_loader", "get_train_dataset", "get_val_dataset", "get_val_datasets", "plan_spec"]

logger = logging.getLogger("megatron_energon_lite.loader")  # loader.py's, unchanged by the split: the name users configure

@dataclasses.dataclass(frozen=True)
class _PlannedPath:
    """A path whose plan the caller already has (``get_val_datasets``' leaves): passed as the
    path, so that no private parameter shows in the public signatures."""

    path: Any
    plan: BlendPlan


def _plan(path, split_part: str, *, training: bool) -> tuple[str, BlendPlan]:
    """(a display name for ``path``, what it reads): a dataset folder, a .jsonl file, a metadataset
    YAML, a metadataset dict or a :class:`Blender`."""
    if is_metadataset_path(path):
        name = "<metadataset dict>" if isinstance(path, Mapping) else "Blender" if isinstance(path, Blender) else str(path)
        plan = load_blend_plan(path, split_part, training=training)
    else:
        name = str(path)
        plan = single_dataset_plan(path, split_part)
    zero = [leaf for leaf in plan.leaves if leaf.weight == 0]
    if zero:
        for leaf in zero:
            logger.warning("%s has weight 0: it is left out of the blend", leaf.where)
        plan = dataclasses.replace(plan, leaves=tuple(leaf for leaf in plan.leaves if leaf.weight != 0))
    return name, plan


def _warn_slow_exact_schedule(plan: BlendPlan, worker_config: WorkerConfig) -> None:
    workers = worker_config.world_size * worker_config.workers_per_rank
    if workers <= 1:
        return
    if any(leaf.weight_schedule is not None for leaf in plan.leaves):
        logger.warning(
            "exact blend with weight schedules (%s): each worker walks every position of the global stream, "
            "about %d positions per sample (~2.5 us each with 16 datasets); on large jobs use blend_mode random, "
            "where a schedule costs nothing measurable (docs/guide/blending.md, 'Weights that change during a run')",
            plan.source or "the blend", workers,
        )
        return
    period = sum(integer_weights([leaf.weight for leaf in plan.leaves]))
    if period > TABLE_LIMIT:
        logger.warning(
            "exact blend: the weights of %s normalise to a schedule period of %d positions (more than %d), "
            "so each worker steps through about %d schedule positions per sample (~0.6 us each); "
            "round the weights (e.g. to 4 significant digits) to make every step a table lookup",
            plan.source or "the blend", period, TABLE_LIMIT, workers,
        )


def _configure_storage(path, storage_options: dict | None) -> None:
    """``storage_options`` apply to the protocol of ``path`` when it is a URL, else to every remote
    URL the call reads (datasets named in a local metadataset YAML)."""
    if storage_options is None:
        return
    if not isinstance(storage_options, Mapping):
        raise ConfigError(format_message("storage_options must be a dict", found=type(storage_options).__name__, fix="pass e.g. {'key': ..., 'secret': ..., 'endpoint_url': ...}"))
    protocol = str(path).partition("://")[0] if is_remote(path) else "*"
    configure_storage(protocol, storage_options=storage_options)


# Keyword arguments of get_train_dataset / get_val_dataset beyond the named ones. Energon's:
# dataset_config and split_config; what its dataset factories take (parallel_shard_iters,
# subflavors, subset, sample_type; for validation also max_samples_per_sequence and
# shuffle_over_epochs_multiplier, named arguments of get_train_dataset); its deprecated decoder
# arguments and handler. Ours: trust_dataset_code, group_buffer_size, storage_options.
_DATASET_KWARGS = frozenset({
    "dataset_config", "split_config", "parallel_shard_iters", "subflavors", "subset", "sample_type",
    "auto_decode", "image_decode", "av_decode", "video_decode_audio", "handler",
    "trust_dataset_code", "group_buffer_size", "storage_options",
})
_VAL_KWARGS = frozenset({"max_samples_per_sequence", "shuffle_over_epochs_multiplier"})
_DEPRECATED_DECODER_KWARGS = ("image_decode", "av_decode", "video_decode_audio")


def _apply_deprecated_decoder_kwargs(kwargs: dict, task_encoder: Hooks) -> None:
    """Energon's deprecated ``auto_decode``, ``image_decode``, ``av_decode``, ``video_decode_audio``
    and ``handler`` (popped from ``kwargs``), with Energon's precedence: ``auto_decode=False``
    sets the task encoder's decoder to None; the decoder arguments replace the default decoder
    (a FutureWarning says to set the decoder instead) and must agree with a decoder the task
    encoder sets itself; ``handler`` is ignored for ``worker_config.global_error_handler``."""
    auto_decode = kwargs.pop("auto_decode", True)
    decoder_args = {key: kwargs.pop(key) for key in _DEPRECATED_DECODER_KWARGS if key in kwargs}
    if "handler" in kwargs:
        kwargs.pop("handler")
        warnings.warn(
            "the handler argument is deprecated and ignored (as in Energon): failing samples go to "
            "WorkerConfig.global_error_handler; pass WorkerConfig(..., global_error_handler=...) instead",
            FutureWarning,
            stacklevel=4,
        )
    if not isinstance(auto_decode, bool):
        raise ConfigError(format_message("auto_decode must be True or False", found=repr(auto_decode)))
    if not auto_decode:
        task_encoder.decoder = None  # as Energon: on the task encoder, for every later call too
        return
    if not decoder_args:
        return
    warnings.warn(
        f"the decoder arguments {', '.join(decoder_args)} are deprecated (as in Energon): set the task "
        f"encoder's decoder instead, e.g. decoder = SampleDecoder({', '.join(f'{k}={v!r}' for k, v in decoder_args.items())})",
        FutureWarning,
        stacklevel=4,
    )
    current = task_encoder.decoder
    if current is Hooks.decoder:  # the default decoder: the arguments replace it
        task_encoder.decoder = SampleDecoder(**decoder_args)
        return
    differing = (
        sorted(decoder_args) if current is None else [key for key, value in decoder_args.items() if getattr(current, key) != value]
    )
    if differing:
        raise ConfigError(
            format_message(
                f"the decoder arguments {', '.join(differing)} conflict with the decoder {type(task_encoder).__name__} sets",
                expected=f"{', '.join(f'{k}={getattr(current, k)!r}' for k in differing)} (the task encoder's decoder)" if current is not None else "no decoder arguments: the task encoder's decoder is None",
                found=", ".join(f"{k}={decoder_args[k]!r}" for k in differing),
                fix="drop the arguments and configure the task encoder's decoder (decoder = SampleDecoder(...))",
            )
        )


def _check_sample_type(spec: PipelineSpec, sample_type: Any) -> None:
    """Energon's ``sample_type`` argument: every dataset must yield that type (or a subclass)."""
    if not isinstance(sample_type, type):
        raise ConfigError(format_message("sample_type must be a class", found=repr(sample_type)[:80], fix="pass e.g. sample_type=CaptioningSample"))
    for leaf, dataset in zip(spec.plan.leaves, spec.datasets):
        if leaf.join is None:  # a join's sample type is its joiner's
            require_sample_type(dataset.yields, sample_type, where=leaf.where)


def _check_aux(spec: PipelineSpec) -> None:
    """``aux:`` sources are read by cookers: a dataset that is not crude would never read them."""
    for leaf, dataset in zip(spec.plan.leaves, spec.datasets):
        if leaf.aux and dataset.yields is not CrudeSample:
            raise ConfigError(
                format_message(
                    "aux sources are read by cookers, but this dataset is not crude",
                    where=f"{leaf.where}.aux",
                    found=f"aux {', '.join(leaf.aux)} on a dataset of typed samples ({leaf.path})",
                    fix="make the dataset crude (dataset.yaml: __class__: CrudeWebdataset) and cook it with a cooker "
                    "that takes the aux names as arguments, or remove aux",
                )
            )


def plan_spec(path, *, training: bool, worker_config, task_encoder: Hooks | None = None, packing_buffer_size, kwargs: dict, split_part: str, plan: BlendPlan | None = None, blend_mode: str | None = None, **settings) -> PipelineSpec:
    """Checks the arguments shared by both dataset constructors and builds the spec (``task_encoder``
    None: a ``DefaultHooks()``; ``plan``: what ``path`` reads, when the caller planned it)."""
    if isinstance(path, _PlannedPath):
        path, plan = path.path, path.plan
    if worker_config is None:  # Energon requires one; ours defaults as Energon's default_worker_config
        worker_config = WorkerConfig.default_worker_config()
    if not isinstance(worker_config, WorkerConfig):
        raise ConfigError(format_message("worker_config must be a WorkerConfig", found=type(worker_config).__name__, fix="pass WorkerConfig.default_worker_config(num_workers)"))
    task_encoder = DefaultHooks() if task_encoder is None else task_encoder
    if not isinstance(task_encoder, Hooks):
        raise ConfigError(format_message("task_encoder must be a TaskEncoder", found=type(task_encoder).__name__))
    known = _DATASET_KWARGS if training else _DATASET_KWARGS | _VAL_KWARGS
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ConfigError(format_message(f"unknown keyword argument {unknown[0]!r}", expected=f"one of {', '.join(sorted(known))}", found=", ".join(unknown)))
    kwargs = dict(kwargs)
    _apply_deprecated_decoder_kwargs(kwargs, task_encoder)
    sample_type, subflavors, subset = (kwargs.pop(key, None) for key in ("sample_type", "subflavors", "subset"))
    _configure_storage(path, kwargs.pop("storage_options", None))
    if plan is None:
        name, plan = _plan(path, split_part, training=training)
    else:
        name = str(path)
    plan = with_subset(with_subflavors(plan, subflavors), subset)
    if blend_mode is not None and plan.blend_mode is not None and blend_mode != plan.blend_mode:
        raise ConfigError(
            format_message(
                "blend_mode differs between the argument and the metadataset",
                where=f"{plan.source}: blend_mode",
                found=f"argument {blend_mode!r}, YAML {plan.blend_mode!r}",
                fix="drop one of them",
            )
        )
    mode = blend_mode or plan.blend_mode or "random"
    if mode == "exact" and plan.kind == "blend" and training:
        _warn_slow_exact_schedule(plan, worker_config)
    spec = PipelineSpec(
        path=name, split_part=split_part, training=training, worker_config=worker_config, task_encoder=task_encoder, plan=plan,
        blend_mode=mode, packing_buffer_size=packing_buffer_size, storage=configured_storage(), policy=current_policy(), **settings, **kwargs,
    )
    # Checked against the datasets as the spec resolved them (their metadata is read once).
    if sample_type is not None:
        _check_sample_type(spec, sample_type)
    _check_aux(spec)
    return spec


def _dataset(spec: PipelineSpec, mock: Any = None) -> Recipe:
    """The dataset of a spec: the default pipeline, or what the task encoder's ``build_*`` overrides
    compose; with ``mock`` (the argument, else the YAML's ``mock:``) its first item per worker, again
    and again (``mock.py``)."""
    from_yaml = mock is None
    mode = mock_mode(getattr(spec.plan, "mock", False) if from_yaml else mock, where=f"{spec.plan.source}: mock" if from_yaml else "mock=...")
    dataset = _real_dataset(spec)
    if mode is None:
        return dataset
    endless = pass_end(dataset) == ENDLESS
    return MockDataset(dataset, mode=mode, endless=endless, name=f"{spec.path} (split {spec.split_part})")


def _real_dataset(spec: PipelineSpec) -> PipelineDataset:
    return PipelineDataset(spec, spec.task_encoder.compose_pipeline(spec))


def get_train_dataset(
    path,
    *,
    split_part: str = "train",
    worker_config: WorkerConfig | None = None,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    shuffle_buffer_size: int | None = None,
    max_samples_per_sequence: int | None = None,
    virtual_epoch_length: int = 0,
    shuffle_over_epochs_multiplier: int | None = 1,
    task_encoder: Hooks | None = None,
    repeat: bool = True,
    blend_mode: str | None = None,
    mock: bool | str | None = None,
    **kwargs,
) -> Recipe:
    """Energon's ``get_train_dataset``: shuffled slices, optional shuffle buffer, infinite by default.

    ``path`` is a prepared dataset, a ``.jsonl`` file, a metadataset YAML (or dict) or a
    :class:`Blender`.  ``blend_mode`` (ours): ``"random"`` draws each sample's dataset by weight
    as Energon does; ``"exact"`` follows a deterministic schedule that keeps the realized counts
    within one sample of the weights at every step of the global stream.  Default: the YAML's
    ``blend_mode``, else ``"random"``.

    Energon requires ``worker_config``, ``shuffle_buffer_size`` and ``max_samples_per_sequence``;
    here they default to ``WorkerConfig.default_worker_config()`` (rank and world size from
    torch.distributed, 4 workers) and None (no sample shuffle buffer; each slice is a whole
    shard). Other keyword arguments: Energon's ``dataset_config``, ``split_config``,
    ``parallel_shard_iters``, ``subflavors``, ``subset``, ``sample_type`` and its deprecated
    ``auto_decode``, ``image_decode``, ``av_decode``, ``video_decode_audio`` and ``handler``
    (a ``FutureWarning``; they set the task encoder's decoder, as in Energon); ours: ``trust_dataset_code`` (run the
    dataset's ``sample_loader.py``), ``group_buffer_size`` and ``storage_options``.

    ``mock`` (ours; default: the YAML's ``mock:``, else off): ``True`` yields each worker's first
    real batch again and again, the same object, without reading or decoding after it (the
    training loop's ceiling); ``"copy"``: a fresh copy of it each time.

    ``task_encoder``: None (the default) means the default hooks, which behave as Energon's
    ``DefaultTaskEncoder()``.
    """
    spec = plan_spec(
        path,
        training=True,
        worker_config=worker_config,
        task_encoder=task_encoder,
        packing_buffer_size=packing_buffer_size,
        kwargs=kwargs,
        split_part=split_part,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        shuffle_buffer_size=shuffle_buffer_size,
        max_samples_per_sequence=max_samples_per_sequence,
        virtual_epoch_length=virtual_epoch_length,
        shuffle_over_epochs_multiplier=shuffle_over_epochs_multiplier,
        repeat=repeat,
        blend_mode=blend_mode,
    )
    return _dataset(spec, mock)


def get_val_dataset(
    path,
    *,
    split_part: str = "val",
    worker_config: WorkerConfig | None = None,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    limit: int | None = None,
    task_encoder: Hooks | None = None,
    mock: bool | str | None = None,
    **kwargs,
) -> Recipe:
    """Energon's ``get_val_dataset``: sequential, one pass, ``limit`` batches per pass.

    Takes the keyword arguments of :func:`get_train_dataset` (``worker_config`` defaults the same
    way), plus Energon's ``max_samples_per_sequence`` and ``shuffle_over_epochs_multiplier``
    (accepted; validation reads in order, so the latter changes nothing), and ``mock``.
    """
    spec = plan_spec(
        path,
        training=False,
        worker_config=worker_config,
        task_encoder=task_encoder,
        packing_buffer_size=packing_buffer_size,
        kwargs=kwargs,
        split_part=split_part,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        limit=limit,
        repeat=False,
    )
    return _dataset(spec, mock)


# Energon's loader arguments. Those that tune its snapshot/replay machinery or features we do
# not have (cache pools) are accepted so scripts run unchanged, and logged once; the watchdog
# ones (watchdog_timeout_seconds=60 by default, as in Energon) wrap the dataset in a
# WatchdogDataset, which changes neither items nor states.
_ENERGON_LOADER_ARGS = frozenset({
    "worker_config", "checkpoint_every_sec", "checkpoint_every_min_n_samples", "n_checkpoints",
    "gc_collect_every_n_steps", "cache_pool", "watchdog_timeout_seconds",
    "watchdog_initial_timeout_seconds", "fail_on_timeout",
})


def _make_loader(dataset: Recipe, prefetch_factor: int | None, energon_args: dict, ours: dict[str, Any]) -> SavableDataLoader:
    """``prefetch_factor`` None: the dataset's ``WorkerConfig.prefetch_factor``, else 2."""
    unknown = sorted(set(energon_args) - _ENERGON_LOADER_ARGS)
    if unknown:
        raise ConfigError(format_message(f"unknown loader argument {unknown[0]!r}", expected=f"prefetch_factor or one of Energon's: {', '.join(sorted(_ENERGON_LOADER_ARGS))}", found=", ".join(unknown)))
    cache_pool = energon_args.pop("cache_pool", None)
    if cache_pool is not None and not isinstance(cache_pool, CachePool):
        raise ConfigError(format_message("cache_pool must be a CachePool", expected="FileStoreCachePool(...), NoCachePool() or None", found=type(cache_pool).__name__))
    worker_config = getattr(dataset, "worker_config", None)
    given = energon_args.pop("worker_config", None)
    if given is not None:  # as Energon: deprecated, and it must be the dataset's
        if given != worker_config:
            raise ConfigError(
                format_message(
                    "the worker_config passed to the loader differs from the dataset's",
                    expected=repr(worker_config),
                    found=repr(given),
                    fix="drop worker_config here (deprecated in Energon too): the dataset's is used",
                )
            )
        warnings.warn("passing worker_config to get_loader / get_savable_loader is deprecated (as in Energon) and has no effect", FutureWarning, stacklevel=3)
    watchdog_timeout = energon_args.pop("watchdog_timeout_seconds", 60)
    watchdog_initial_timeout = energon_args.pop("watchdog_initial_timeout_seconds", None)
    fail_on_timeout = energon_args.pop("fail_on_timeout", False)
    if watchdog_timeout is not None and isinstance(dataset, Recipe):
        dataset = Watchdog(dataset, worker_config, timeout_seconds=watchdog_timeout, initial_timeout_seconds=watchdog_initial_timeout, fail_on_timeout=fail_on_timeout)
    ignored = sorted(k for k, v in energon_args.items() if v is not None)
    if ignored:
        logger.info("ignoring Energon loader arguments %s: states travel with every batch here", ", ".join(ignored))
    if prefetch_factor is None:
        prefetch_factor = getattr(worker_config, "prefetch_factor", None) or 2
    if worker_config is not None and not getattr(worker_config, "persistent_workers", True):
        logger.info("WorkerConfig(persistent_workers=False) is ignored: each worker keeps its pipeline's position, so workers persist")
    return SavableDataLoader(dataset, prefetch_factor=prefetch_factor, cache_pool=cache_pool, policy=_policy_of(dataset), **ours)


def _policy_of(dataset: Recipe) -> Policy:
    """The policy a loader restores states under: its dataset's spec's (through the watchdog and
    a mock), else (a dataset of the user's own) the switch's now."""
    while not isinstance(dataset, PipelineDataset) and isinstance(getattr(dataset, "dataset", None), Recipe):
        dataset = dataset.dataset
    return dataset.spec.policy if isinstance(dataset, PipelineDataset) else current_policy()


def _stall_args(stall_report: bool, stall_report_every_s: float | None) -> dict[str, Any]:
    if not isinstance(stall_report, bool):
        raise ConfigError(format_message("stall_report must be True or False", found=repr(stall_report)[:80]))
    if stall_report_every_s is not None and (isinstance(stall_report_every_s, bool) or not isinstance(stall_report_every_s, (int, float)) or not stall_report_every_s > 0):
        raise ConfigError(format_message("stall_report_every_s must be a number of seconds > 0, or None", found=repr(stall_report_every_s)[:80]))
    return {"stall_report": stall_report, "stall_report_every_s": stall_report_every_s}


def get_loader(dataset: Recipe, *, prefetch_factor: int | None = None, stall_report: bool = False, stall_report_every_s: float | None = None, **energon_args) -> SavableDataLoader:
    """A loader over ``dataset`` (the same class as the savable one: saving costs nothing here).
    ``prefetch_factor`` defaults to the dataset's ``WorkerConfig.prefetch_factor``, else 2.
    As in Energon, ``watchdog_timeout_seconds`` (default 60, None: off),
    ``watchdog_initial_timeout_seconds`` (first item; default the same) and ``fail_on_timeout``
    watch each item's production: the stuck stack is logged, and with ``fail_on_timeout`` the
    process (the dataloader worker) exits.  Ours: ``stall_report=True`` times the loader's stages
    for :meth:`SavableDataLoader.stall_report`; ``stall_report_every_s=N`` also logs a one-line
    summary of the last N seconds (logger ``megatron_energon_lite.stall``, level INFO)."""
    return _make_loader(dataset, prefetch_factor, energon_args, _stall_args(stall_report, stall_report_every_s))


def get_savable_loader(dataset: Recipe, *, prefetch_factor: int | None = None, stall_report: bool = False, stall_report_every_s: float | None = None, manifest: str | os.PathLike[str] | None = None, **energon_args) -> SavableDataLoader:
    """Energon's savable loader.  Energon's checkpoint tuning arguments (``checkpoint_every_sec``,
    ``n_checkpoints``, ...) are accepted and ignored: states travel with every batch here.
    ``prefetch_factor`` defaults to the dataset's ``WorkerConfig.prefetch_factor``, else 2.
    The watchdog and stall report arguments work as in :func:`get_loader`.  ``manifest=DIR``
    (default: ``ENERGON_LITE_MANIFEST``, also read by :func:`get_loader`) records which samples
    made each step on each rank (``megatron_energon_lite.manifest``)."""
    return _make_loader(dataset, prefetch_factor, energon_args, {**_stall_args(stall_report, stall_report_every_s), "manifest": manifest})


def get_val_datasets(path, *, split_part: str = "val", **kwargs) -> list[tuple[Recipe, dict[str, Any]]]:
    """Energon's ``get_val_datasets``: one validation dataset per leaf dataset, not concatenated.

    Each entry is ``(dataset, description)``, a plain dict (``path``, ``split_part``,
    ``subflavors``, ...); the package's public ``get_val_datasets`` (the Energon layer's) gives
    the dataset's factory instead, as Energon does.
    """
    _, plan = _plan(path, split_part, training=False)
    entries = []
    for leaf in plan.leaves:
        dataset = get_val_dataset(_PlannedPath(leaf.path, dataclasses.replace(plan, kind="single", leaves=(leaf,))), split_part=split_part, **kwargs)
        entries.append((dataset, {k: v for k, v in leaf.describe().items() if k not in ("weight", "repetitions")}))
    return entries
