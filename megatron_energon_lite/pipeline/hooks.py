"""The hook runtime: how the pipeline calls a task encoder's hooks, and what it reads of them.

:func:`hook_spec` reads once which hooks a task encoder overrides and how they are marked;
:func:`call_hook` calls one hook with its sample index (and, for
``@stateless(restore_seeds=True)`` hooks, with seeded global RNGs).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..decode import SampleDecoder
from ..errors import ConfigError, format_message
from .cooking import Cooker
from .marks import (
    HOOK_STATE,
    HookState,
    check_tolerance,
    hook_context,
    hook_seed,
    invoke,
    stateless_spec,
)
from .guard import describe_item
from .runtime import Runtime
from .task_hooks import DefaultHooks, Hooks

__all__ = ["HOOK_NAMES", "HookInfo", "HookSpec", "call_hook", "hook_seed", "hook_spec", "stage_hook"]  # hook_seed: re-exported for tests

T = TypeVar("T")

#: The hooks a task encoder may override, in pipeline order.
HOOK_NAMES: tuple[str, ...] = (
    "cook_crude_sample",
    "encode_sample",
    "preencode_sample",
    "postencode_sample",
    "select_samples_to_pack",
    "pack_selected_samples",
    "batch_group_criterion",
    "batch",
    "encode_batch",
)


def call_hook(fn: Callable[..., Any], *args: Any, sample_index: int, worker_seed: int, runtime: Runtime | None = None) -> Any:
    """Calls hook ``fn(*args)`` as the loader does.

    Inside, ``current_sample_index`` is ``sample_index`` (``current_batch_index`` is inherited
    from an enclosing :class:`hook_context`). A ``@stateless(restore_seeds=True)`` hook runs with
    torch/numpy/random seeded by :func:`hook_seed` ``(worker_seed, sample_index)`` and the
    caller's RNG states restored afterwards, also when it raises. A hook that returns a generator
    gives a generator (``types.GeneratorType``) of its outputs (zero or more), each step run the
    same way, so it may be consumed lazily, interleaved with other hook calls. Exceptions
    (``SkipSample`` included) propagate.  ``runtime``: the calling pipeline's
    (``pipeline/runtime.py``), which the hook's ``TaskEncoder.cache`` reads.
    """
    outer = HOOK_STATE.get()
    state = HookState(sample_index=sample_index, batch_index=outer.batch_index, worker_seed=worker_seed, fn=fn, runtime=runtime)
    return invoke(fn, args, {}, state)


# --------------------------------------------------------------------------------------------
# The hook spec: what the pipeline builder reads, once.


@dataclasses.dataclass(frozen=True, slots=True)
class HookInfo:
    """One hook of a task encoder, as :func:`hook_spec` found it."""

    name: str
    #: Defined outside :class:`Hooks` (Energon's meaning: DefaultTaskEncoder's hooks count).
    overridden: bool
    #: Marked with ``@stateless``.
    stateless: bool
    #: ``@stateless(restore_seeds=True)``.
    restore_seeds: bool
    #: Consecutive failures tolerated before the run stops; 0: never stop.
    failure_tolerance: int
    #: A generator function (may yield 0..n outputs). Hooks returning generators also count at call time.
    generator: bool


@dataclasses.dataclass(frozen=True, slots=True)
class HookSpec:
    """What a task encoder does, read once by :func:`hook_spec` for ``pipeline/build.py``."""

    #: ``module.QualName`` of the task encoder class, for messages.
    task_encoder: str
    decoder: SampleDecoder | None
    cookers: tuple[Cooker[Any], ...]
    #: Every hook of :data:`HOOK_NAMES`, in that order (``spec["batch"]`` finds one by name).
    hooks: tuple[HookInfo, ...]
    #: The per-sample map after the shuffle buffer: "preencode_sample", "encode_sample" or None (identity).
    sample_encoder: str | None
    #: postencode_sample is overridden: per pack member when packing, else a map after the sample encoder.
    postencoder: bool
    #: Both packing hooks are overridden (packing runs when a packing buffer size is given).
    packing: bool
    #: batch_group_criterion is overridden: bucketed batching instead of plain batching.
    grouping: bool
    #: encode_batch does something (a map after batching); False for the identity.
    batch_encoder: bool
    #: batch is TaskEncoder's, or DefaultTaskEncoder's without a raw batch type: generic_batch,
    #: which writes the tensor fields of our sample types into new (stacked or padded) tensors.
    default_batch: bool
    #: The class's ``__default_failure_tolerance__`` (None read as 0).
    default_failure_tolerance: int

    def __getitem__(self, name: str) -> HookInfo:
        for info in self.hooks:
            if info.name == name:
                return info
        raise KeyError(f"no hook named {name!r}; hooks are {', '.join(HOOK_NAMES)}")

    def overridden(self, name: str) -> bool:
        """``self[name].overridden``."""
        return self[name].overridden

    def tolerance(self, name: str) -> int:
        """``self[name].failure_tolerance`` (0: never stop)."""
        return self[name].failure_tolerance

    @property
    def cooks(self) -> bool:
        """Whether the task encoder has cookers (crude datasets need them)."""
        return bool(self.cookers)


def _hook_function(task_encoder: Any, name: str) -> Any:
    bound = getattr(task_encoder, name)
    return getattr(bound, "__func__", bound)


def _is_defined_by(task_encoder: Any, name: str, *bases: type) -> bool:
    """Whether hook ``name`` of the instance is the very function one of ``bases`` defines."""
    func = _hook_function(task_encoder, name)
    return any(base.__dict__.get(name) is func for base in bases)


def hook_spec(task_encoder: Hooks[Any, Any, Any, Any]) -> HookSpec:
    """Reads which hooks ``task_encoder`` overrides and how they are marked, and checks Energon's rules.

    Raises :class:`ConfigError` for: ``encode_sample`` together with ``preencode_sample``; only
    one of the two packing hooks; ``cookers`` that are not :class:`Cooker` objects; a decoder
    that is not a :class:`~megatron_energon_lite.decode.SampleDecoder`; a hook decorated with
    Energon's own ``stateless``; an invalid failure tolerance.
    """
    cls = type(task_encoder)
    cls_name = f"{cls.__module__}.{cls.__qualname__}"
    if not isinstance(task_encoder, Hooks):
        raise ConfigError(
            format_message(
                "the task encoder must derive from megatron_energon_lite's TaskEncoder",
                found=cls_name + " (bases: " + ", ".join(f"{b.__module__}.{b.__qualname__}" for b in cls.__mro__[1:]) + ")",
                fix="import TaskEncoder / DefaultTaskEncoder from megatron_energon_lite instead of megatron.energon",
            )
        )
    default_tolerance = getattr(cls, "__default_failure_tolerance__", None)
    check_tolerance(default_tolerance, f"{cls_name}.__default_failure_tolerance__")
    default_tolerance = default_tolerance or 0

    hooks: dict[str, HookInfo] = {}
    for name in HOOK_NAMES:
        fn = getattr(task_encoder, name)
        spec = stateless_spec(fn)
        if spec is None and getattr(fn, "__stateless__", False):
            raise ConfigError(
                format_message(
                    f"{cls_name}.{name} is decorated with megatron.energon's stateless",
                    fix="import stateless from megatron_energon_lite instead (same arguments)",
                )
            )
        tolerance = default_tolerance if spec is None or spec.failure_tolerance is None else spec.failure_tolerance
        hooks[name] = HookInfo(
            name=name,
            overridden=not _is_defined_by(task_encoder, name, Hooks),
            stateless=spec is not None,
            restore_seeds=spec is not None and spec.restore_seeds,
            failure_tolerance=tolerance,
            generator=inspect.isgeneratorfunction(fn),
        )

    # Energon's rules.
    if hooks["preencode_sample"].overridden and not _is_defined_by(task_encoder, "encode_sample", Hooks, DefaultHooks):
        raise ConfigError(
            format_message(
                f"{cls_name} overrides both encode_sample and preencode_sample",
                expected="either encode_sample, or preencode_sample (+ postencode_sample)",
                fix="move the work of encode_sample into preencode_sample / postencode_sample, or drop preencode_sample",
            )
        )
    select, pack = hooks["select_samples_to_pack"].overridden, hooks["pack_selected_samples"].overridden
    if select != pack:
        have, lack = ("select_samples_to_pack", "pack_selected_samples") if select else ("pack_selected_samples", "select_samples_to_pack")
        raise ConfigError(
            format_message(
                f"{cls_name} overrides {have} but not {lack}",
                expected="both packing hooks, or neither",
                fix=f"define {lack} too (select groups of samples, then pack one group into one sample)",
            )
        )

    cookers = task_encoder.cookers
    if isinstance(cookers, (str, bytes)) or not isinstance(cookers, Sequence) or not all(isinstance(c, Cooker) for c in cookers):
        raise ConfigError(
            format_message(
                f"{cls_name}.cookers must be a list of Cooker objects",
                found=repr(cookers),
                fix="write cookers = [Cooker(cook_fn), Cooker(other_fn, has_subflavors={...})] with Cooker from megatron_energon_lite",
            )
        )
    decoder = task_encoder.decoder
    if decoder is not None and not isinstance(decoder, SampleDecoder):
        raise ConfigError(
            format_message(
                f"{cls_name}.decoder must be a megatron_energon_lite SampleDecoder or None",
                found=f"{type(decoder).__module__}.{type(decoder).__qualname__}",
                fix="import SampleDecoder from megatron_energon_lite (same arguments), or set decoder = None for raw bytes",
            )
        )

    # What runs: DefaultTaskEncoder's conversions without a target type are identities and skipped.
    if hooks["preencode_sample"].overridden:
        sample_encoder: str | None = "preencode_sample"
    elif hooks["encode_sample"].overridden and not (
        _is_defined_by(task_encoder, "encode_sample", DefaultHooks) and task_encoder._encoded_sample_type is None  # type: ignore[attr-defined]
    ):
        sample_encoder = "encode_sample"
    else:
        sample_encoder = None
    batch_encoder = hooks["encode_batch"].overridden and not (
        _is_defined_by(task_encoder, "encode_batch", DefaultHooks)
        and task_encoder._batch_type in (None, task_encoder._raw_batch_type)  # type: ignore[attr-defined]
    )
    default_batch = not hooks["batch"].overridden or (
        _is_defined_by(task_encoder, "batch", DefaultHooks) and task_encoder._raw_batch_type is None  # type: ignore[attr-defined]
    )
    return HookSpec(
        task_encoder=cls_name,
        decoder=decoder,
        cookers=tuple(cookers),
        hooks=tuple(hooks.values()),
        sample_encoder=sample_encoder,
        postencoder=hooks["postencode_sample"].overridden,
        packing=select and pack,
        grouping=hooks["batch_group_criterion"].overridden,
        batch_encoder=batch_encoder,
        default_batch=default_batch,
        default_failure_tolerance=default_tolerance,
    )


def batch_member_context(*, local_worker_id: int, workers: int):
    """``BatchNode(member_context=...)``: while a batch's members are pulled, hooks below it see
    that batch's index (unique over this rank's workers) as ``current_batch_index``, as in Energon."""

    def context(index: int):
        return hook_context(batch_index=index * workers + local_worker_id)

    return context


def stage_hook(hook, *args, worker_seed: int, local_worker_id: int, workers: int, batch: bool = False, runtime: Runtime | None = None):
    """Adapts a task-encoder hook to a stage's ``fn(item, index)``.

    The index a hook sees is unique over this rank's workers, as in Energon:
    ``stage counter * workers + local worker id``; it also seeds ``@stateless(restore_seeds=True)``.
    ``runtime``: the worker pipeline's, which the hook sees (:func:`call_hook`).
    """

    def run(item, index):
        unique = index * workers + local_worker_id
        if batch:
            with hook_context(batch_index=unique):
                result = call_hook(hook, item, *args, sample_index=unique, worker_seed=worker_seed, runtime=runtime)
        else:
            result = call_hook(hook, item, *args, sample_index=unique, worker_seed=worker_seed, runtime=runtime)
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
