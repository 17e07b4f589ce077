"""Cookers: turn crude samples (dicts of decoded parts) into typed samples.

A crude dataset is cooked by the first :class:`Cooker` of ``TaskEncoder.cookers`` whose
``has_subflavors`` match the dataset's subflavors; :func:`basic_sample_keys` carries the key,
restore key, subflavors and sources over to the cooked sample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar, overload

from ..errors import ConfigError, format_message
from ..samples import Sample, SourceInfo
from .marks import mark, stateless_spec

__all__ = ["Cooker", "basic_sample_keys", "cooker", "select_cooker"]

F = TypeVar("F", bound=Callable[..., Any])
T_sample = TypeVar("T_sample", bound=Sample)

_COOKER_ATTR = "__energon_lite_cooker__"


@dataclasses.dataclass(frozen=True, slots=True)
class _CookerFlags:
    need_cache: bool = False
    need_primary: bool = False


@overload
def cooker(fn: F) -> F: ...


@overload
def cooker(*, need_cache: bool = False, need_primary: bool = False) -> Callable[[F], F]: ...


def cooker(fn: F | None = None, *, need_cache: bool = False, need_primary: bool = False) -> F | Callable[[F], F]:
    """Marks a cook function as needing the loader's cache pool (passed as ``cache=``) or the
    sample's own dataset as a file store (``primary=``, where ``".txt"`` is the current sample's
    ``txt`` part). Plain cook functions need no ``@cooker`` at all.
    """
    for name, value in (("need_cache", need_cache), ("need_primary", need_primary)):
        if not isinstance(value, bool):
            raise ConfigError(format_message(f"cooker({name}=...) must be True or False", found=repr(value)))
    flags = _CookerFlags(need_cache=need_cache, need_primary=need_primary)
    if fn is None:
        return lambda f: mark(f, _COOKER_ATTR, flags)
    return mark(fn, _COOKER_ATTR, flags)


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
