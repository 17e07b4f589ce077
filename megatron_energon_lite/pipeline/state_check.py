"""Checks of the values in a saved state, shared by every stage's ``reset(state)``.

A state comes back from a checkpoint file.  A value in it that was edited or corrupted (a
negative counter, a count past the end of its slice, a slice id of a million, a string where a
number belongs) must not restore silently into a wrong position, nor fail later with a bare
``IndexError`` or ``TypeError``: ``reset`` checks each value's type and range first and raises
:class:`~megatron_energon_lite.errors.StateError` naming the field by its JSON path in the saved
state (``$.worker_states[1].source.open[0][1]``), what was expected and what was found.

The path grows as the restore goes down the pipeline: a stage resets its source inside
``nested("source")`` (or ``nested("sources", i)``), and the loader resets a worker's pipeline
inside ``nested("worker_states", worker)``.  The checks only read a context variable, so they
cost nothing measurable next to a restore.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

from ..errors import StateError, format_message

__all__ = ["check_bool", "check_count", "check_index", "check_list", "check_stage", "invalid", "nested", "state_path"]

_PATH: contextvars.ContextVar[tuple[str | int, ...]] = contextvars.ContextVar("energon_lite_state_path", default=())

_FIX = (
    "restore a state exactly as save_state_rank() returned it, into a loader built with the same "
    "settings; this value was edited or corrupted (an older checkpoint of the same run may be intact)"
)


@contextlib.contextmanager
def nested(*parts: str | int) -> Iterator[None]:
    """Values checked inside this block are reported under ``parts`` (keys and list indexes)."""
    token = _PATH.set(_PATH.get() + parts)
    try:
        yield
    finally:
        _PATH.reset(token)


def state_path(*parts: str | int) -> str:
    """The JSON path of ``parts`` below the current position, e.g. ``$.worker_states[0].source.open[2]``."""
    text = "$"
    for part in _PATH.get() + parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def invalid(parts: tuple[str | int, ...], expected: str, found: Any, *, stage: str | None = None) -> StateError:
    """The error for the value ``found`` at ``parts`` (below the current position)."""
    path = state_path(*parts)
    return StateError(
        format_message(
            f"cannot restore the saved state: {path} holds an impossible value",
            where=path if stage is None else f"{path} (state of the {stage} stage)",
            expected=expected,
            found=f"{_show(found)}",
            fix=_FIX,
        )
    )


def check_stage(state: Any, tag: str, *keys: str) -> dict[str, Any]:
    """``state`` as the state of a stage tagged ``tag`` with ``keys`` (a dict with ``stage=tag``),
    else :class:`StateError`; the values are checked by the stage's ``reset`` with the checks below."""
    if not isinstance(state, dict) or state.get("stage") != tag or any(k not in state for k in keys):
        missing = [k for k in keys if k not in state] if isinstance(state, dict) else []
        raise StateError(
            format_message(
                f"state does not belong to a {tag} stage",
                where=state_path(),
                expected=f"a dict with stage={tag!r} and keys {', '.join(keys)}",
                found=repr(state)[:200] + (f" (missing: {', '.join(missing)})" if missing else ""),
                fix="restore a state saved by a loader built with the same pipeline settings",
            )
        )
    return state


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    kind = type(value).__name__
    if isinstance(value, (list, tuple, dict)):
        kind = f"{kind} of {len(value)}"
    return f"{text} ({kind})"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_count(value: Any, *parts: str | int, stage: str | None = None, high: int | None = None, high_reason: str = "") -> int:
    """``value`` as an int >= 0 (and <= ``high``), else :func:`invalid`."""
    if not _is_int(value) or value < 0 or (high is not None and value > high):
        bound = "an integer >= 0" if high is None else f"an integer from 0 to {high}{f' ({high_reason})' if high_reason else ''}"
        raise invalid(parts, bound, value, stage=stage)
    return value


def check_index(value: Any, size: int, *parts: str | int, stage: str | None = None, of: str = "items") -> int:
    """``value`` as an int in ``[0, size)``, else :func:`invalid`."""
    if not _is_int(value) or not 0 <= value < size:
        expected = f"an index from 0 to {size - 1} ({size} {of})" if size > 0 else f"nothing: there are no {of}"
        raise invalid(parts, expected, value, stage=stage)
    return value


def check_bool(value: Any, *parts: str | int, stage: str | None = None) -> bool:
    """``value`` as a bool (true or false in JSON), else :func:`invalid`."""
    if not isinstance(value, bool):
        raise invalid(parts, "true or false", value, stage=stage)
    return value


def check_list(value: Any, *parts: str | int, stage: str | None = None, length: int | None = None, of: str = "entries") -> list:
    """``value`` as a list (of ``length`` entries; a tuple of an in-memory state passes too), else :func:`invalid`."""
    if not isinstance(value, (list, tuple)) or (length is not None and len(value) != length):
        expected = "a list" if length is None else f"a list of {length} {of}"
        raise invalid(parts, expected, value, stage=stage)
    return value
