"""Task encoders: the user's hooks, with Energon's names and defaults, and nothing else.

A task encoder turns loaded samples into training batches through hooks that the loader calls in
this order (Energon's order; every hook is optional)::

    cook_crude_sample -> encode_sample | preencode_sample -> [select_samples_to_pack ->
    postencode_sample -> pack_selected_samples] | postencode_sample -> batch_group_criterion ->
    batch -> encode_batch

This module holds the hooks, the decorators that describe them (:func:`stateless`,
:func:`cooker`) and two small functions for the pipeline: :func:`hook_spec` reads once what a
task encoder overrides, and :func:`call_hook` calls one hook with its sample index (and, for
``@stateless(restore_seeds=True)`` hooks, with seeded global RNGs). Pipelines are assembled in
``pipeline/build.py``, never here.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
from collections.abc import Callable, Generator, Hashable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Generic, TypeVar, overload

from .decode import SampleDecoder
from .errors import ConfigError, format_message
from .samples import Sample, SourceInfo, generic_batch

__all__ = [
    "Cooker",
    "DefaultTaskEncoder",
    "HOOK_NAMES",
    "HookInfo",
    "HookSpec",
    "StatelessSpec",
    "TaskEncoder",
    "basic_sample_keys",
    "call_hook",
    "cooker",
    "hook_context",
    "hook_seed",
    "hook_spec",
    "select_cooker",
    "stateless",
    "stateless_spec",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
T_sample = TypeVar("T_sample", bound=Sample)
T_encoded_sample = TypeVar("T_encoded_sample")
T_raw_batch = TypeVar("T_raw_batch")
T_batch = TypeVar("T_batch")

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

_STATELESS_ATTR = "__energon_lite_stateless__"
_COOKER_ATTR = "__energon_lite_cooker__"


# --------------------------------------------------------------------------------------------
# Decorators: plain attributes on the function, read by hook_spec and call_hook.


@dataclasses.dataclass(frozen=True, slots=True)
class StatelessSpec:
    """What ``@stateless`` says about a hook."""

    #: Seed torch/numpy/random from (worker seed, sample index) around each call.
    restore_seeds: bool = False
    #: Consecutive failures tolerated before the run stops (0: never stop); None: the class default.
    failure_tolerance: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _CookerFlags:
    need_cache: bool = False
    need_primary: bool = False


def _mark(fn: F, attr: str, value: Any) -> F:
    """Stores ``value`` as attribute ``attr`` on ``fn`` (on a wrapper if ``fn`` takes no attributes)."""
    target = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
    if not callable(target):
        raise ConfigError(
            format_message(
                "only functions can be decorated as task encoder hooks or cookers",
                found=repr(fn),
                fix="decorate the def of the function or method",
            )
        )
    try:
        setattr(target, attr, value)
    except (AttributeError, TypeError):
        # Bound methods and builtins take no attributes: wrap them.
        inner = target

        @functools.wraps(inner)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return inner(*args, **kwargs)

        setattr(wrapper, attr, value)
        return wrapper  # type: ignore[return-value]
    return fn


def _check_tolerance(value: Any, where: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(
            format_message(
                f"invalid failure tolerance for {where}",
                expected="None or an integer >= 0 (0 never stops the run)",
                found=repr(value),
            )
        )


@overload
def stateless(fn: F) -> F: ...


@overload
def stateless(*, restore_seeds: bool = False, failure_tolerance: int | None = None) -> Callable[[F], F]: ...


def stateless(
    fn: F | None = None, *, restore_seeds: bool = False, failure_tolerance: int | None = None
) -> F | Callable[[F], F]:
    """Marks a hook as stateless: its output depends only on its input (and its sample index).

    Use as ``@stateless`` or ``@stateless(restore_seeds=True, failure_tolerance=10)``. The
    function is returned unchanged apart from an attribute; :func:`call_hook` does the work:

    * ``restore_seeds=True``: torch, numpy and ``random`` are seeded from (worker seed, sample
      index) before the call, and their previous states are restored afterwards, so random
      augmentations are reproducible when a sample is rebuilt. For generator hooks this holds for
      every step: the hook's own RNG stream continues between its outputs, and the caller's
      stream is untouched.
    * ``failure_tolerance``: consecutive failures of this hook tolerated before the run stops
      with :class:`~megatron_energon_lite.errors.FatalSampleError` (0: never stop); None uses the
      task encoder's ``__default_failure_tolerance__``. Unlike Energon, this also works together
      with ``restore_seeds=True``.
    """
    if not isinstance(restore_seeds, bool):
        raise ConfigError(format_message("stateless(restore_seeds=...) must be True or False", found=repr(restore_seeds)))
    _check_tolerance(failure_tolerance, "@stateless(failure_tolerance=...)")
    spec = StatelessSpec(restore_seeds=restore_seeds, failure_tolerance=failure_tolerance)
    if fn is None:
        return lambda f: _mark(f, _STATELESS_ATTR, spec)
    return _mark(fn, _STATELESS_ATTR, spec)


def stateless_spec(fn: Callable[..., Any]) -> StatelessSpec | None:
    """The :class:`StatelessSpec` of a function, bound method or ``functools.partial``, or None."""
    while True:
        spec = getattr(fn, _STATELESS_ATTR, None)
        if spec is not None or not isinstance(fn, functools.partial):
            return spec
        fn = fn.func


@overload
def cooker(fn: F) -> F: ...


@overload
def cooker(*, need_cache: bool = False, need_primary: bool = False) -> Callable[[F], F]: ...


def cooker(fn: F | None = None, *, need_cache: bool = False, need_primary: bool = False) -> F | Callable[[F], F]:
    """Marks a cook function as needing a cache pool (``cache=``) or the primary dataset (``primary=``).

    Not supported yet: cache pools and primary file stores come in a later release, so a cooker
    that sets either flag raises :class:`ConfigError` when the loader chooses it. Plain cook
    functions need no ``@cooker`` at all.
    """
    for name, value in (("need_cache", need_cache), ("need_primary", need_primary)):
        if not isinstance(value, bool):
            raise ConfigError(format_message(f"cooker({name}=...) must be True or False", found=repr(value)))
    flags = _CookerFlags(need_cache=need_cache, need_primary=need_primary)
    if fn is None:
        return lambda f: _mark(f, _COOKER_ATTR, flags)
    return _mark(fn, _COOKER_ATTR, flags)


def _function_name(fn: Any) -> str:
    fn = getattr(fn, "func", fn)  # functools.partial
    return getattr(fn, "__qualname__", None) or repr(fn)


@dataclasses.dataclass
class Cooker(Generic[T_sample]):
    """Turns crude samples (dicts of decoded parts) into :class:`Sample` objects.

    A crude dataset is cooked by the first cooker of ``TaskEncoder.cookers`` whose
    ``has_subflavors`` items are all in the dataset's subflavors (None matches every dataset).
    ``cook(crude_sample, **aux)`` must be decorated with :func:`stateless`.
    """

    #: ``cook(crude_sample) -> Sample``.
    cook: Callable[..., T_sample]
    #: Subflavors a dataset must have (all keys with equal values) to be cooked by this cooker.
    has_subflavors: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not callable(self.cook):
            raise ConfigError(
                format_message("Cooker(cook=...) must be callable", found=repr(self.cook), fix="pass the cook function itself")
            )
        if self.has_subflavors is not None and not isinstance(self.has_subflavors, Mapping):
            raise ConfigError(
                format_message(
                    f"Cooker(has_subflavors=...) of {_function_name(self.cook)} must be a dict or None",
                    found=repr(self.has_subflavors),
                    fix="pass e.g. has_subflavors={'source': 'laion'}",
                )
            )

    @property
    def need_cache(self) -> bool:
        return getattr(self.cook, _COOKER_ATTR, _CookerFlags()).need_cache

    @property
    def need_primary(self) -> bool:
        return getattr(self.cook, _COOKER_ATTR, _CookerFlags()).need_primary

    def is_match(self, subflavors: Mapping[str, Any] | None) -> bool:
        """Whether every item of ``has_subflavors`` is in ``subflavors``."""
        if self.has_subflavors is None:
            return True
        subflavors = subflavors or {}
        return all(key in subflavors and subflavors[key] == value for key, value in self.has_subflavors.items())

    def describe(self) -> str:
        """``cook_fn(has_subflavors={...})``, for messages."""
        return f"{_function_name(self.cook)}(has_subflavors={self.has_subflavors!r})"


def select_cooker(cookers: Sequence[Cooker[Any]], subflavors: Mapping[str, Any] | None, *, where: str | None = None) -> Cooker[Any]:
    """The first cooker matching ``subflavors``, checked for use.

    Raises :class:`ConfigError` when there are no cookers, none matches, the chosen cook is not
    ``@stateless``, or it asks for a cache or the primary dataset (not supported yet). ``where``
    (e.g. the dataset path) goes into the messages.
    """
    if not cookers:
        raise ConfigError(
            format_message(
                "got a crude dataset (sample_type CrudeSample), but the task encoder has no cookers",
                where=where,
                expected="at least one Cooker in the task encoder's `cookers`",
                found="cookers = ()",
                fix="add e.g. `cookers = [Cooker(cook_my_data)]` to your TaskEncoder class, where "
                "cook_my_data is a @stateless function that turns the crude dict into a Sample, "
                "typically MySample(**basic_sample_keys(crude), ...)",
            )
        )
    for candidate in cookers:
        if candidate.is_match(subflavors):
            break
    else:
        raise ConfigError(
            format_message(
                f"no cooker matches the subflavors {dict(subflavors or {})!r}",
                where=where,
                expected="a cooker whose has_subflavors items are all in the dataset's subflavors",
                found="cookers " + "; ".join(c.describe() for c in cookers),
                fix="add a cooker with matching has_subflavors (or has_subflavors=None to match every "
                "dataset), or set the subflavors in the metadataset",
            )
        )
    if stateless_spec(candidate.cook) is None:
        raise ConfigError(
            format_message(
                f"cook function {_function_name(candidate.cook)} is not marked @stateless",
                where=where,
                fix="decorate it with @stateless (from megatron_energon_lite); cooking must only depend on the crude sample",
            )
        )
    if candidate.need_cache or candidate.need_primary:
        wanted = [name for name, flag in (("cache", candidate.need_cache), ("primary", candidate.need_primary)) if flag]
        raise ConfigError(
            format_message(
                f"cook function {_function_name(candidate.cook)} asks for " + " and ".join(wanted) + ", which is not supported yet",
                where=where,
                expected="@cooker() without need_cache / need_primary",
                found=", ".join(f"need_{name}=True" for name in wanted),
                fix="read the data in the cook function from the crude sample itself for now; cache pools and "
                "primary file stores come in a later release",
            )
        )
    return candidate


def basic_sample_keys(crude_sample: Mapping[str, Any], additional_source_info: tuple[SourceInfo, ...] = ()) -> dict[str, Any]:
    """``__key__``, ``__restore_key__``, ``__subflavors__`` and ``__sources__`` of a crude sample,
    to pass on to the cooked sample; ``additional_source_info`` is appended to the sources."""
    keys = {name: crude_sample[name] for name in ("__key__", "__restore_key__", "__subflavors__", "__sources__") if name in crude_sample}
    if additional_source_info:
        keys["__sources__"] = (*(crude_sample.get("__sources__") or ()), *additional_source_info)
    return keys


# --------------------------------------------------------------------------------------------
# Calling hooks: the sample/batch index context and seeded global RNGs.


@dataclasses.dataclass(frozen=True, slots=True)
class _HookState:
    sample_index: int | None = None
    batch_index: int | None = None
    worker_seed: int | None = None


_HOOK_STATE: ContextVar[_HookState] = ContextVar("megatron_energon_lite_hook_state", default=_HookState())


class hook_context:  # noqa: N801 - used like a function: `with hook_context(batch_index=3): ...`
    """Sets what ``TaskEncoder.current_sample_index`` / ``current_batch_index`` return inside.

    Values left None keep those of the enclosing context. :func:`call_hook` sets the sample index
    and worker seed itself; a batch stage wraps its hook calls in
    ``hook_context(batch_index=...)``. Enter and exit in the same thread.
    """

    __slots__ = ("_state", "_token")

    def __init__(self, *, sample_index: int | None = None, batch_index: int | None = None, worker_seed: int | None = None) -> None:
        outer = _HOOK_STATE.get()
        self._state = _HookState(
            sample_index=outer.sample_index if sample_index is None else sample_index,
            batch_index=outer.batch_index if batch_index is None else batch_index,
            worker_seed=outer.worker_seed if worker_seed is None else worker_seed,
        )
        self._token: Any = None

    def __enter__(self) -> hook_context:
        self._token = _HOOK_STATE.set(self._state)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        _HOOK_STATE.reset(self._token)


def hook_seed(worker_seed: int, sample_index: int) -> int:
    """The seed of a ``restore_seeds`` hook call: Energon's, so augmentations draw the same numbers.

    The first 4 bytes (big-endian) of ``sha1(f"{worker_seed}|{sample_index}")``.
    """
    return int.from_bytes(hashlib.sha1(f"{worker_seed}|{sample_index}".encode()).digest()[:4], "big")


class _GlobalRng:
    """The states of torch's, numpy's and Python's global generators (captured in-process only)."""

    __slots__ = ("np_state", "py_state", "torch_state")

    def __init__(self) -> None:
        import random

        import numpy
        import torch

        self.torch_state = torch.get_rng_state()
        self.np_state = numpy.random.get_state()
        self.py_state = random.getstate()

    def restore(self) -> None:
        import random

        import numpy
        import torch

        torch.set_rng_state(self.torch_state)
        numpy.random.set_state(self.np_state)
        random.setstate(self.py_state)

    @staticmethod
    def seed(seed: int) -> None:
        import random

        import numpy
        import torch

        torch.manual_seed(seed)
        numpy.random.seed(seed)
        random.seed(seed)


class _HookRun:
    """Runs the steps of one generator hook call inside its context and its own RNG states."""

    __slots__ = ("rng", "state")

    def __init__(self, state: _HookState, rng: _GlobalRng | None) -> None:
        self.state = state
        #: The hook's own RNG states between steps (None: the hook does not restore seeds).
        self.rng = rng

    def run(self, fn: Callable[[], T]) -> T:
        token = _HOOK_STATE.set(self.state)
        outer = None
        if self.rng is not None:
            outer = _GlobalRng()
            self.rng.restore()
        try:
            return fn()
        finally:
            if outer is not None:
                self.rng = _GlobalRng()
                outer.restore()
            _HOOK_STATE.reset(token)


def _stepped(it: Generator[Any, Any, Any], run: _HookRun) -> Generator[Any, None, Any]:
    """Yields the outputs of a generator hook, each step (and the final close) inside ``run``.

    Every step sees ``current_sample_index`` as at the call and, for ``restore_seeds`` hooks, the
    hook's RNG states continued from its previous step; the caller's are restored after each step.
    """
    try:
        while True:
            try:
                item = run.run(it.__next__)
            except StopIteration as stop:
                return stop.value
            yield item
    finally:
        run.run(it.close)  # a no-op once the hook's generator has finished


def _invoke(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], state: _HookState) -> Any:
    spec = stateless_spec(fn)
    seeded = spec is not None and spec.restore_seeds and state.worker_seed is not None and state.sample_index is not None
    token = _HOOK_STATE.set(state)
    outer = inner = None
    if seeded:
        outer = _GlobalRng()
        _GlobalRng.seed(hook_seed(state.worker_seed, state.sample_index))  # type: ignore[arg-type]
    try:
        result = fn(*args, **kwargs)
        if seeded and isinstance(result, Generator):
            inner = _GlobalRng()
    finally:
        if outer is not None:
            outer.restore()
        _HOOK_STATE.reset(token)
    if isinstance(result, Generator):
        return _stepped(result, _HookRun(state, inner))
    return result


def call_hook(fn: Callable[..., Any], *args: Any, sample_index: int, worker_seed: int) -> Any:
    """Calls hook ``fn(*args)`` as the loader does.

    Inside, ``current_sample_index`` is ``sample_index`` (``current_batch_index`` is inherited
    from an enclosing :class:`hook_context`). A ``@stateless(restore_seeds=True)`` hook runs with
    torch/numpy/random seeded by :func:`hook_seed` ``(worker_seed, sample_index)`` and the
    caller's RNG states restored afterwards, also when it raises. A hook that returns a generator
    gives a generator (``types.GeneratorType``) of its outputs (zero or more), each step run the
    same way, so it may be consumed lazily, interleaved with other hook calls. Exceptions
    (``SkipSample`` included) propagate.
    """
    outer = _HOOK_STATE.get()
    state = _HookState(sample_index=sample_index, batch_index=outer.batch_index, worker_seed=worker_seed)
    return _invoke(fn, args, {}, state)


def _current(name: str) -> int:
    value = getattr(_HOOK_STATE.get(), name)
    if value is None:
        raise ConfigError(
            format_message(
                f"TaskEncoder.current_{name} is only known inside a hook called by the loader",
                expected="a read inside encode_sample, batch, encode_batch, ... while the loader runs",
                found="a read outside any hook",
                fix="read it inside the hook; in tests, wrap the call in megatron_energon_lite.task_encoder.hook_context("
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


class TaskEncoder(Generic[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """Base class of task encoders: override the hooks you need (Energon's names and defaults).

    Every hook may raise :class:`~megatron_energon_lite.errors.SkipSample` to drop its input.
    ``encode_sample``, ``preencode_sample``, ``postencode_sample``, ``pack_selected_samples`` and
    ``encode_batch`` may be generators yielding zero or more outputs per input. Inside a hook,
    :attr:`current_sample_index` and :attr:`current_batch_index` identify the call.
    """

    #: Consecutive failures of one hook tolerated before the run stops (0: never stop).
    __default_failure_tolerance__: int | None = 100

    #: Cookers for crude datasets, tried in order (see :class:`Cooker`).
    cookers: Sequence[Cooker[Any]] = ()
    #: True when select_samples_to_pack may leave samples of the buffer out on purpose; otherwise
    #: a left-out sample is an error naming it (ours; Energon drops such samples silently).
    packing_may_drop_samples: bool = False

    #: Decodes the parts of a sample; None hands the hooks raw bytes.
    decoder: SampleDecoder | None = SampleDecoder()

    @stateless
    def cook_crude_sample(
        self, sample: Mapping[str, Any], cooker: Cooker[Any] | None = None, aux: Mapping[str, Any] | None = None
    ) -> T_sample:
        """Cooks a crude sample with ``cooker`` (default: the first of :attr:`cookers` matching
        the sample's ``__subflavors__``); ``aux`` holds keyword arguments for the cook function."""
        if cooker is None:
            cooker = select_cooker(self.cookers, sample.get("__subflavors__"), where=f"sample {sample.get('__key__')!r}")
        state = _HOOK_STATE.get()
        return _invoke(cooker.cook, (sample,), aux or {}, state)

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
        for name in names:
            try:
                column = [s[name] for s in samples] if isinstance(first, dict) else [getattr(s, name) for s in samples]
            except (KeyError, AttributeError, TypeError) as exc:
                raise ConfigError(
                    format_message(
                        f"cannot batch field {name!r}: not every sample has it",
                        found="sample types " + ", ".join(sorted({type(s).__name__ for s in samples})),
                        fix="give every sample of a batch the same type, or override batch()",
                    )
                ) from exc
            columns[name] = actions.get(name, default_action)(column)
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
    def cache(self) -> Any:
        """Energon's cache pool for cookers: not supported yet."""
        raise ConfigError(
            format_message(
                "TaskEncoder.cache (cache pools) is not supported yet",
                fix="read the data in the cook function from the crude sample itself for now",
            )
        )


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


class DefaultTaskEncoder(TaskEncoder[T_sample, T_encoded_sample, T_raw_batch, T_batch]):
    """A task encoder that converts samples and batches to the given types by field name.

    Args:
        encoded_sample_type: ``encode_sample`` converts each sample to it (unless it already is one).
        raw_batch_type: ``batch`` builds this type (``from_samples`` for a :class:`Batch`);
            default: the class of the samples, with list / stacked fields.
        batch_type: ``encode_batch`` converts each batch to it.

    Types are dataclasses or namedtuples (fields matched by name) or ``dict`` (a plain dict of
    the fields).
    """

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


# --------------------------------------------------------------------------------------------
# The hook spec: what the pipeline builder reads, once.


@dataclasses.dataclass(frozen=True, slots=True)
class HookInfo:
    """One hook of a task encoder, as :func:`hook_spec` found it."""

    name: str
    #: Defined outside :class:`TaskEncoder` (Energon's meaning: DefaultTaskEncoder's hooks count).
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


def hook_spec(task_encoder: TaskEncoder[Any, Any, Any, Any]) -> HookSpec:
    """Reads which hooks ``task_encoder`` overrides and how they are marked, and checks Energon's rules.

    Raises :class:`ConfigError` for: ``encode_sample`` together with ``preencode_sample``; only
    one of the two packing hooks; ``cookers`` that are not :class:`Cooker` objects; a decoder
    that is not a :class:`~megatron_energon_lite.decode.SampleDecoder`; a hook decorated with
    Energon's own ``stateless``; an invalid failure tolerance.
    """
    cls = type(task_encoder)
    cls_name = f"{cls.__module__}.{cls.__qualname__}"
    if not isinstance(task_encoder, TaskEncoder):
        raise ConfigError(
            format_message(
                "the task encoder must derive from megatron_energon_lite's TaskEncoder",
                found=cls_name + " (bases: " + ", ".join(f"{b.__module__}.{b.__qualname__}" for b in cls.__mro__[1:]) + ")",
                fix="import TaskEncoder / DefaultTaskEncoder from megatron_energon_lite instead of megatron.energon",
            )
        )
    default_tolerance = getattr(cls, "__default_failure_tolerance__", None)
    _check_tolerance(default_tolerance, f"{cls_name}.__default_failure_tolerance__")
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
            overridden=not _is_defined_by(task_encoder, name, TaskEncoder),
            stateless=spec is not None,
            restore_seeds=spec is not None and spec.restore_seeds,
            failure_tolerance=tolerance,
            generator=inspect.isgeneratorfunction(fn),
        )

    # Energon's rules.
    if hooks["preencode_sample"].overridden and not _is_defined_by(task_encoder, "encode_sample", TaskEncoder, DefaultTaskEncoder):
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
        _is_defined_by(task_encoder, "encode_sample", DefaultTaskEncoder) and task_encoder._encoded_sample_type is None  # type: ignore[attr-defined]
    ):
        sample_encoder = "encode_sample"
    else:
        sample_encoder = None
    batch_encoder = hooks["encode_batch"].overridden and not (
        _is_defined_by(task_encoder, "encode_batch", DefaultTaskEncoder)
        and task_encoder._batch_type in (None, task_encoder._raw_batch_type)  # type: ignore[attr-defined]
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
        default_failure_tolerance=default_tolerance,
    )

