"""The hooks a task encoder implements, owned by the core: :class:`Hooks` (every hook with its
default) and :class:`DefaultHooks` (conversion to given sample and batch types by field name).

A task encoder turns loaded samples into training batches through hooks that the loader calls in
this order (Energon's order; every hook is optional)::

    cook_crude_sample -> encode_sample | preencode_sample -> [select_samples_to_pack ->
    postencode_sample -> pack_selected_samples] | postencode_sample -> batch_group_criterion ->
    batch -> encode_batch

Energon's ``TaskEncoder`` / ``DefaultTaskEncoder`` (``task_encoder/``) are these classes plus
Energon's ``build_*`` methods. What the pipeline reads of a hooks object (which hooks are
overridden, their marks) is :func:`~megatron_energon_lite.pipeline.hooks.hook_spec`; what a hook
sees while it runs is :mod:`.marks`; cookers are :mod:`.cooking`.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Generator, Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy

from ..cache.base import CachePool, PrimaryFileStore
from ..decode import SampleDecoder
from ..errors import ConfigError, format_message
from ..samples import Sample, batch_column, generic_batch
from .aux_sources import PRIMARY
from .cooking import Cooker, select_cooker
from .marks import HOOK_STATE, hook_rng, hook_torch_generator, invoke, stateless

__all__ = ["DefaultHooks", "Hooks", "fingerprint_name"]

T = TypeVar("T")
T_sample = TypeVar("T_sample", bound=Sample)
T_encoded_sample = TypeVar("T_encoded_sample")
T_raw_batch = TypeVar("T_raw_batch")
T_batch = TypeVar("T_batch")


def fingerprint_name(hooks: Hooks) -> str:
    """The task encoder's name in a config fingerprint: its class's ``__qualname__``, or the
    ``fingerprint_name`` that class itself declares (not one it inherits)."""
    cls = type(hooks)
    return vars(cls).get("fingerprint_name", cls.__qualname__)


def _current(name: str) -> int:
    value = getattr(HOOK_STATE.get(), name)
    if value is None:
        raise ConfigError(
            format_message(
                f"TaskEncoder.current_{name} is only known inside a hook called by the loader",
                expected="a read inside encode_sample, batch, encode_batch, ... while the loader runs",
                found="a read outside any hook (or in the map view's collate, which has no index)",
                fix="read it inside the hook; in tests, wrap the call in megatron_energon_lite.energon.task_encoder.hook_context("
                f"{name}=...)",
            )
        )
    return value


# --------------------------------------------------------------------------------------------
# Task encoders.


def _fields_of(value: Any, what: str) -> dict[str, Any]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {name: getattr(value, name) for name in value._fields}
    if isinstance(value, dict):
        return value
    raise ConfigError(
        format_message(
            f"cannot convert {what} by field name",
            expected="a dataclass, a namedtuple or a dict",
            found=type(value).__name__,
            fix=f"return a dataclass or dict from the previous hook, or override the hook that converts the {what}",
        )
    )


def _convert(value: Any, target: type, what: str) -> Any:
    """Energon's conversion by field name: ``target(**fields of value)``; a dict target gets the fields dict."""
    fields = _fields_of(value, what)
    if issubclass(target, dict):
        return fields
    try:
        return target(**fields)
    except TypeError as exc:
        if dataclasses.is_dataclass(target):
            wanted = {f.name for f in dataclasses.fields(target) if f.init}
            required = {
                f.name
                for f in dataclasses.fields(target)
                if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            }
        else:
            wanted = set(target._fields)
            required = wanted - set(getattr(target, "_field_defaults", {}))
        extra, missing = sorted(set(fields) - wanted), sorted(required - set(fields))
        if not extra and not missing:
            raise
        raise ConfigError(
            format_message(
                f"cannot convert the {what} {type(value).__name__} to {target.__name__}: the field names differ",
                expected=f"fields of {target.__name__}: " + ", ".join(sorted(wanted)),
                found=(f"extra: {', '.join(extra)}" if extra else "")
                + ("; " if extra and missing else "")
                + (f"missing: {', '.join(missing)}" if missing else ""),
                fix=f"give {target.__name__} the same field names, or override the hook and convert yourself",
            )
        ) from exc


def _is_structured(value: Any) -> bool:
    return isinstance(value, dict) or (dataclasses.is_dataclass(value) and not isinstance(value, type)) or (
        isinstance(value, tuple) and hasattr(value, "_fields")
    )




class Hooks(Generic[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """The hooks a task encoder implements, with their defaults: what the pipeline calls
    (Energon's names and defaults; Energon's ``TaskEncoder`` adds its ``build_*`` methods on top).

    Every hook may raise :class:`~megatron_energon_lite.errors.SkipSample` to drop its input.
    ``encode_sample``, ``preencode_sample``, ``postencode_sample``, ``pack_selected_samples`` and
    ``encode_batch`` may be generators yielding zero or more outputs per input. Inside a hook,
    :attr:`current_sample_index` and :attr:`current_batch_index` identify the call, and
    :attr:`current_rng` / :attr:`current_torch_generator` give its reproducible randomness.
    """

    #: Consecutive failures of one hook tolerated before the run stops (0: never stop).
    __default_failure_tolerance__: int | None = 100

    #: Cookers for crude datasets, tried in order (see :class:`Cooker`).
    cookers: Sequence[Cooker[Any]] = ()
    #: Samples that select_samples_to_pack leaves out of every pack are dropped (as in Energon),
    #: with a warning that names and counts them; True says it is on purpose and silences it.
    packing_may_drop_samples: bool = False

    #: Decodes the parts of a sample; None hands the hooks raw bytes.
    decoder: SampleDecoder | None = SampleDecoder()

    def compose_pipeline(self, spec: Any) -> Any:
        """The pipeline of ``spec`` (a ``PipelineSpec``) as a recipe this object composes itself,
        or None for the default composition of ``pipeline/build.py``. Energon's ``TaskEncoder``
        composes through its ``build_*`` methods when a subclass overrides one."""
        return None

    @stateless
    def cook_crude_sample(
        self, sample: Mapping[str, Any], cooker: Cooker[Any] | None = None, aux: Mapping[str, Any] | None = None
    ) -> T_sample:
        """Cooks a crude sample with ``cooker`` (default: the first of :attr:`cookers` matching
        the sample's ``__subflavors__``). ``aux`` holds the file stores of the dataset's ``aux:``
        sources (and ``primary``, the dataset itself), passed to the cook function by name; a
        cooker with ``need_primary`` gets ``primary`` for the current sample (``".txt"`` is its
        ``txt`` part), one with ``need_cache`` gets the loader's pool as ``cache``."""
        if cooker is None:
            cooker = select_cooker(self.cookers, sample.get("__subflavors__"), where=f"sample {sample.get('__key__')!r}")
        kwargs = dict(aux or {})
        if cooker.need_primary:
            primary = kwargs.get(PRIMARY)
            if primary is None:
                raise ConfigError(
                    format_message(
                        "the cooker needs the primary dataset, which was not given",
                        where=f"sample {sample.get('__key__')!r}",
                        fix="let the loader call cook_crude_sample (it passes aux with 'primary')",
                    )
                )
            kwargs[PRIMARY] = PrimaryFileStore(primary, current_key=str(sample.get("__key__")))
        if cooker.need_cache:
            kwargs["cache"] = self.cache
        return invoke(cooker.cook, (sample,), kwargs, HOOK_STATE.get())

    @stateless
    def encode_sample(self, sample: T_sample) -> T_encoded_sample | Generator[T_encoded_sample, None, None]:
        """Encodes one sample (default: unchanged). Not together with :meth:`preencode_sample`."""
        return sample  # type: ignore[return-value]

    @stateless
    def preencode_sample(self, sample: T_sample) -> T_sample | Generator[T_sample, None, None]:
        """Encodes one sample before packing (default: unchanged); use with :meth:`postencode_sample`."""
        return sample

    @stateless
    def postencode_sample(self, sample: T_sample) -> T_encoded_sample:
        """Encodes one sample after it was selected for a pack (or after preencode_sample without packing)."""
        return sample  # type: ignore[return-value]

    def select_samples_to_pack(self, samples: list[T_encoded_sample]) -> list[list[T_encoded_sample]]:
        """Splits a full packing buffer into groups of samples to pack together."""
        raise NotImplementedError("packing needs both select_samples_to_pack and pack_selected_samples overridden")

    def pack_selected_samples(self, samples: list[T_encoded_sample]) -> T_encoded_sample:
        """Packs one group chosen by :meth:`select_samples_to_pack` into one sample."""
        raise NotImplementedError("packing needs both select_samples_to_pack and pack_selected_samples overridden")

    def batch_group_criterion(self, sample: T_encoded_sample) -> tuple[Hashable, int | None]:
        """``(bucket key, batch size or None)`` for bucketed batching; the default uses one bucket."""
        return None, None

    @stateless
    def batch(self, samples: list[T_encoded_sample]) -> T_raw_batch:
        """Batches encoded samples with :func:`~megatron_energon_lite.samples.generic_batch`.

        A batch of :class:`Sample` objects is an object of the same class whose fields hold the
        lists / padded and stacked tensors of the samples' fields (as in Energon).
        """
        return generic_batch(samples)

    @stateless
    def encode_batch(self, batch: T_raw_batch) -> T_batch | Generator[T_batch, None, None]:
        """Encodes one batch (default: unchanged)."""
        return batch  # type: ignore[return-value]

    def _batch(
        self,
        samples: list[Any],
        result_type: type,
        actions: Mapping[str, Callable[[list[Any]], Any]] | None = None,
        default_action: Callable[[list[Any]], Any] = generic_batch,
    ) -> Any:
        """Energon's field-wise batcher: each field (key) of the samples batched by ``actions[name]``
        or ``default_action``, then built into ``result_type`` (a dataclass with ``from_samples``
        uses that instead)."""
        if dataclasses.is_dataclass(result_type) and hasattr(result_type, "from_samples"):
            return result_type.from_samples(samples)
        if not samples:
            raise ConfigError(format_message("cannot batch an empty list of samples", fix="batch at least one sample"))
        first = samples[0]
        if isinstance(first, dict):
            names = list(first)
        elif dataclasses.is_dataclass(first) and not isinstance(first, type):
            names = [f.name for f in dataclasses.fields(first)]
        elif isinstance(first, tuple) and hasattr(first, "_fields"):
            names = list(first._fields)
        else:
            raise ConfigError(
                format_message(
                    "cannot batch the samples field by field",
                    expected="dataclasses, namedtuples or dicts",
                    found=type(first).__name__,
                    fix="override batch() in your task encoder",
                )
            )
        actions = actions or {}
        columns: dict[str, Any] = {}
        get = operator.getitem if isinstance(first, dict) else getattr
        for name in names:
            columns[name] = actions.get(name, default_action)(batch_column(samples, name, get))
        if issubclass(result_type, dict):
            return columns
        if dataclasses.is_dataclass(result_type) or issubclass(result_type, tuple):
            return result_type(**columns)
        raise ConfigError(
            format_message(
                "cannot build the batch type",
                expected="a dataclass, a namedtuple or dict",
                found=repr(result_type),
                fix="pass a dataclass, namedtuple class or dict as the batch type",
            )
        )

    @property
    def current_sample_index(self) -> int:
        """The index of the current hook call (set by the loader; unique within a stage across workers)."""
        return _current("sample_index")

    @property
    def current_batch_index(self) -> int:
        """The index of the current batch of this rank (set by the loader)."""
        return _current("batch_index")

    @property
    def current_rng(self) -> numpy.random.Generator:
        """A numpy ``Generator`` for the current hook call, the same for the same sample.

        Seeded from ``(seed, epoch, index)`` in the map view (``get_map_dataset``; an ``int``
        index is epoch 0) and from ``(worker seed, current_sample_index)`` in the streaming
        loader, plus the hook's name; made once per call, so successive draws continue one
        stream. It never reads or seeds a global RNG (Megatron keeps its own CUDA RNG states)::

            class Augment(DefaultTaskEncoder):
                def encode_sample(self, sample):
                    rng = self.current_rng  # differs between epochs of the map view
                    noise = torch.randn(3, generator=self.current_torch_generator)
                    return dataclasses.replace(sample, text=f"{sample.text} {rng.integers(100)}")

        Not available in the map view's ``collate`` (batch hooks get no index there).
        """
        return hook_rng(HOOK_STATE.get())

    @property
    def current_torch_generator(self) -> Any:
        """A ``torch.Generator`` for the current hook call, seeded like :attr:`current_rng` (its
        own stream: drawing from one does not move the other); pass it as ``generator=`` to
        torch's random functions. Made once per call; ``torch.manual_seed`` is never called."""
        return hook_torch_generator(HOOK_STATE.get())

    @property
    def cache(self) -> CachePool:
        """The loader's cache pool (``get_loader(..., cache_pool=...)``), for cookers and hooks
        that read auxiliary files lazily: the one of the loader whose pipeline calls the hook."""
        runtime = HOOK_STATE.get().runtime
        pool = None if runtime is None else runtime.cache_pool
        if pool is None:
            raise ConfigError(
                format_message(
                    "TaskEncoder.cache: the loader has no cache pool",
                    expected="a loader made with a cache pool (the cooker asks for need_cache=True)",
                    fix="get_loader(dataset, cache_pool=FileStoreCachePool(parent_cache_dir=...)) "
                    "(or NoCachePool() to read files directly)",
                )
            )
        return pool


def _check_conversion_type(value: Any, name: str) -> None:
    if value is None:
        return
    if isinstance(value, type) and (issubclass(value, dict) or dataclasses.is_dataclass(value) or issubclass(value, tuple)):
        return
    raise ConfigError(
        format_message(
            f"DefaultTaskEncoder({name}=...) must be a dataclass, a namedtuple class, dict or None",
            found=repr(value),
            fix=f"pass the class itself, e.g. {name}=MyBatch",
        )
    )


class DefaultHooks(Hooks[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """Hooks that convert samples and batches to the given types by field name (the hooks of
    Energon's ``DefaultTaskEncoder``, and the loader's default).

    Args:
        encoded_sample_type: ``encode_sample`` converts each sample to it (unless it already is one).
        raw_batch_type: ``batch`` builds this type (``from_samples`` for a :class:`Batch`);
            default: the class of the samples, with list / stacked fields.
        batch_type: ``encode_batch`` converts each batch to it.

    Types are dataclasses or namedtuples (fields matched by name) or ``dict`` (a plain dict of
    the fields).
    """

    #: The name a config fingerprint records for this class: states saved with the default
    #: hooks name ``DefaultTaskEncoder``, Energon's class made of these hooks (see hook_spec).
    fingerprint_name = "DefaultTaskEncoder"

    # Class-level defaults, so a subclass that skips ``super().__init__()`` still works.
    _encoded_sample_type: type | None = None
    _raw_batch_type: type | None = None
    _batch_type: type | None = None

    def __init__(
        self,
        *,
        encoded_sample_type: type[T_encoded_sample] | None = None,
        raw_batch_type: type[T_raw_batch] | None = None,
        batch_type: type[T_batch] | None = None,
    ) -> None:
        for name, value in (("encoded_sample_type", encoded_sample_type), ("raw_batch_type", raw_batch_type), ("batch_type", batch_type)):
            _check_conversion_type(value, name)
        self._encoded_sample_type = encoded_sample_type
        self._raw_batch_type = raw_batch_type
        self._batch_type = batch_type

    @stateless
    def encode_sample(self, sample: T_sample) -> T_encoded_sample | Generator[T_encoded_sample, None, None]:
        """Converts the sample to ``encoded_sample_type`` by field name (unchanged without one)."""
        target = self._encoded_sample_type
        if target is None or isinstance(sample, target):
            return sample  # type: ignore[return-value]
        return _convert(sample, target, "sample")

    @stateless
    def batch(self, samples: list[T_encoded_sample]) -> T_raw_batch:
        """Batches the samples into ``raw_batch_type`` (default: the samples' class).

        Each field is batched with :func:`generic_batch`, except that the ``__subflavors__`` of
        :class:`Sample` objects stay a list of dicts.
        """
        result_type = self._raw_batch_type
        if result_type is None:
            if samples and not _is_structured(samples[0]):
                return generic_batch(samples)
            result_type = type(samples[0]) if samples else list
        actions = {"__subflavors__": _identity} if samples and isinstance(samples[0], Sample) else None
        return self._batch(samples, result_type, actions=actions)

    @stateless
    def encode_batch(self, batch: T_raw_batch) -> T_batch | Generator[T_batch, None, None]:
        """Converts the batch to ``batch_type`` by field name (unchanged without one, or if it equals ``raw_batch_type``)."""
        target = self._batch_type
        if target is None or target == self._raw_batch_type or isinstance(batch, target):
            return batch  # type: ignore[return-value]
        return _convert(batch, target, "batch")


def _identity(value: Any) -> Any:
    return value
