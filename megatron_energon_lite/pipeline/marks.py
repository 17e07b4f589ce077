"""What a hook sees when it is called: ``@stateless`` marks, the sample/batch index context, seeded RNGs.

``@stateless`` stores a plain attribute on the function; :func:`invoke` honours it (seeding
torch/numpy/random for ``restore_seeds`` hooks) and sets the context that
``TaskEncoder.current_sample_index`` / ``current_batch_index`` / ``current_rng`` read. The
pipeline's side of calling hooks (which index a call gets, what a task encoder overrides) is
``pipeline/hooks.py``; the map view's is ``map_view.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
from collections.abc import Callable, Generator, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar, overload

import numpy

from ..errors import ConfigError, format_message
from ..rng import rng_for
from .runtime import Runtime

__all__ = [
    "HOOK_STATE",
    "HookState",
    "StatelessSpec",
    "hook_context",
    "hook_rng",
    "hook_seed",
    "hook_torch_generator",
    "invoke",
    "mark",
    "stateless",
    "stateless_spec",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_STATELESS_ATTR = "__energon_lite_stateless__"


@dataclasses.dataclass(frozen=True, slots=True)
class StatelessSpec:
    """What ``@stateless`` says about a hook."""

    #: Seed torch/numpy/random from (worker seed, sample index) around each call.
    restore_seeds: bool = False
    #: Consecutive failures tolerated before the run stops (0: never stop); None: the class default.
    failure_tolerance: int | None = None


def mark(fn: F, attr: str, value: Any) -> F:
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


def check_tolerance(value: Any, where: str) -> None:
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
    check_tolerance(failure_tolerance, "@stateless(failure_tolerance=...)")
    spec = StatelessSpec(restore_seeds=restore_seeds, failure_tolerance=failure_tolerance)
    if fn is None:
        return lambda f: mark(f, _STATELESS_ATTR, spec)
    return mark(fn, _STATELESS_ATTR, spec)


def stateless_spec(fn: Callable[..., Any]) -> StatelessSpec | None:
    """The :class:`StatelessSpec` of a function, bound method or ``functools.partial``, or None."""
    while True:
        spec = getattr(fn, _STATELESS_ATTR, None)
        if spec is not None or not isinstance(fn, functools.partial):
            return spec
        fn = fn.func


# --------------------------------------------------------------------------------------------
# The sample/batch index a hook sees, and seeded calls.

@dataclasses.dataclass(frozen=True, slots=True)
class HookState:
    """The context of one hook call."""

    sample_index: int | None = None
    batch_index: int | None = None
    worker_seed: int | None = None
    #: What :func:`hook_rng` seeds from: ``(seed, epoch, index)`` in the map view; None:
    #: ``(worker_seed, sample_index)`` (the streaming loader).
    rng_key: tuple[int, ...] | None = None
    #: The hook called (its name keys :func:`hook_rng`, so two hooks of one sample draw
    #: different numbers); None: :func:`invoke` sets it. Callers that make a state per call pass
    #: it, which spares invoke a second state object (a hook call costs ~1 us).
    fn: Any = None
    #: The generators made during this call, so that successive draws continue one stream.
    rngs: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    #: The runtime of the worker pipeline whose stage calls the hook (``pipeline/runtime.py``;
    #: ``TaskEncoder.cache`` reads its cache pool); None outside a pipeline.
    runtime: Runtime | None = dataclasses.field(default=None, compare=False, repr=False)


HOOK_STATE: ContextVar[HookState] = ContextVar("megatron_energon_lite_hook_state", default=HookState())


class hook_context:  # noqa: N801 - used like a function: `with hook_context(batch_index=3): ...`
    """Sets what ``TaskEncoder.current_sample_index`` / ``current_batch_index`` /
    ``current_rng`` return inside.

    Values left None keep those of the enclosing context. :func:`call_hook` sets the sample index
    and worker seed itself; a batch stage wraps its hook calls in
    ``hook_context(batch_index=...)``; ``rng_key`` replaces ``(worker_seed, sample_index)`` as
    what ``current_rng`` is seeded from; ``runtime``: the pipeline runtime whose cache pool
    ``TaskEncoder.cache`` returns (``pipeline/runtime.py``). Enter and exit in the same thread.
    """

    __slots__ = ("_state", "_token")

    def __init__(
        self,
        *,
        sample_index: int | None = None,
        batch_index: int | None = None,
        worker_seed: int | None = None,
        rng_key: tuple[int, ...] | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        outer = HOOK_STATE.get()
        self._state = HookState(
            sample_index=outer.sample_index if sample_index is None else sample_index,
            batch_index=outer.batch_index if batch_index is None else batch_index,
            worker_seed=outer.worker_seed if worker_seed is None else worker_seed,
            rng_key=outer.rng_key if rng_key is None else tuple(rng_key),
            runtime=outer.runtime if runtime is None else runtime,
        )
        self._token: Any = None

    def __enter__(self) -> hook_context:
        self._token = HOOK_STATE.set(self._state)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        HOOK_STATE.reset(self._token)


def hook_seed(worker_seed: int, sample_index: int) -> int:
    """The seed of a ``restore_seeds`` hook call: Energon's, so augmentations draw the same numbers.

    The first 4 bytes (big-endian) of ``sha1(f"{worker_seed}|{sample_index}")``.
    """
    return int.from_bytes(hashlib.sha1(f"{worker_seed}|{sample_index}".encode()).digest()[:4], "big")


def hook_rng(state: HookState) -> numpy.random.Generator:
    """The numpy generator of the hook call ``state`` describes, made on first use and kept for
    the call: ``rng_for(key[0], "hook:<name>", *key[1:])`` with ``key = state.rng_key`` (the map
    view's ``(seed, epoch, index)``), else ``(worker_seed, sample_index)``. No global RNG is read
    or seeded."""
    rng = state.rngs.get("numpy")
    if rng is None:
        rng = state.rngs["numpy"] = rng_for(*_rng_seed(state, "hook"))
    return rng


def hook_torch_generator(state: HookState) -> Any:
    """A ``torch.Generator`` for the hook call ``state`` describes, made on first use and kept for
    the call; seeded from the same key as :func:`hook_rng` but its own stream (using one does not
    move the other). Seeds the generator object only, never ``torch.manual_seed``."""
    generator = state.rngs.get("torch")
    if generator is None:
        import torch  # not at the top: `energon-lite info` of a metadataset imports this module

        seed = int(rng_for(*_rng_seed(state, "hook-torch")).integers(0, 2**63 - 1))
        generator = state.rngs["torch"] = torch.Generator().manual_seed(seed)
    return generator


def _rng_seed(state: HookState, stage: str) -> tuple:
    key = state.rng_key
    if key is None:
        if state.worker_seed is None or state.sample_index is None:
            raise ConfigError(
                format_message(
                    "TaskEncoder.current_rng is only known inside a hook called with a sample index",
                    expected="a read inside encode_sample, cook_crude_sample, ... while the loader or the map view runs",
                    found="a read outside any hook, or in a hook called without an index (the map view's collate)",
                    fix="draw the randomness in encode_sample; in tests, wrap the call in "
                    "megatron_energon_lite.energon.task_encoder.hook_context(sample_index=..., worker_seed=...)",
                )
            )
        key = (state.worker_seed, state.sample_index)
    return (key[0], f"{stage}:{_hook_name(state.fn) if state.fn is not None else ''}", *key[1:])


class _GlobalRng:
    """The states of torch's, numpy's and Python's global generators (captured in-process only)."""

    __slots__ = ("np_state", "py_state", "torch_state")

    def __init__(self) -> None:
        import torch  # not at the top: `energon-lite info` of a metadataset imports this module

        self.torch_state = torch.get_rng_state()
        self.np_state = numpy.random.get_state()
        self.py_state = random.getstate()

    def restore(self) -> None:
        import torch

        torch.set_rng_state(self.torch_state)
        numpy.random.set_state(self.np_state)
        random.setstate(self.py_state)

    @staticmethod
    def seed(seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        numpy.random.seed(seed)
        random.seed(seed)


class _HookRun:
    """Runs the steps of one generator hook call inside its context and its own RNG states."""

    __slots__ = ("rng", "state")

    def __init__(self, state: HookState, rng: _GlobalRng | None) -> None:
        self.state = state
        #: The hook's own RNG states between steps (None: the hook does not restore seeds).
        self.rng = rng

    def run(self, fn: Callable[[], T]) -> T:
        # The batch a step's output joins is the caller's at that step (Energon: a generator's
        # later outputs may land in the next batch); the sample index stays the call's.
        caller = HOOK_STATE.get().batch_index
        state = self.state if caller is None or caller == self.state.batch_index else dataclasses.replace(self.state, batch_index=caller)
        token = HOOK_STATE.set(state)
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
            HOOK_STATE.reset(token)


def _stepped(it: Generator[Any, Any, Any], run: _HookRun) -> Generator[Any, None, Any]:
    """Yields the outputs of a generator hook, each step (and the final close) inside ``run``.

    Every step sees ``current_sample_index`` as at the call, ``current_batch_index`` as the caller
    sets it for that step (the batch being formed), and, for ``restore_seeds`` hooks, the
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


def invoke(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], state: HookState) -> Any:
    if state.fn is None:  # a new call; a cooker called inside cook_crude_sample shares that call's
        state = HookState(state.sample_index, state.batch_index, state.worker_seed, state.rng_key, fn, runtime=state.runtime)
    spec = stateless_spec(fn)
    seeded = spec is not None and spec.restore_seeds and state.worker_seed is not None and state.sample_index is not None
    token = HOOK_STATE.set(state)
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
        HOOK_STATE.reset(token)
    if isinstance(result, Generator):
        return _stepped(result, _HookRun(state, inner))
    return result


def _hook_name(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)
