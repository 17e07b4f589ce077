"""The loader-level resume check of the tests: the twin of ``tests/pipeline/resume.py``.

:func:`check_loader_resume` runs one loader without interruption and, from the states it saved
along the way (``save_state_rank()``, through JSON as a checkpoint would keep them), restores
fresh loaders and checks that each one continues with exactly the batches of the uninterrupted
run.  A test picks the dataset, the settings and the number of workers in its ``make_loader``::

    def make():
        config = WorkerConfig(rank=0, world_size=1, num_workers=2)
        return get_savable_loader(get_train_dataset(path, batch_size=4, worker_config=config))

    stream = check_loader_resume(make, 12, at=(0, 1, 5, 12))

Only the loader's public methods are used (``save_state_rank``, ``restore_state_rank``,
``restore_sample``), besides torch's ``DataLoader._iterator`` to stop worker processes as soon
as a loader is done with.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["END", "batch_identity", "check_loader_resume"]

#: Recorded in a stream where the loader's pass ended (``StopIteration``); the run goes on with
#: the next pass (``iter(loader)`` again), as a training loop over epochs does.
END = "<END>"

_REPR_LIMIT = 400


def _as_tuple(value: Any) -> Any:
    """Lists to tuples at every depth (a restore key, as the loader gives it or from JSON)."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuple(v) for v in value)
    return value


def _restore_key(batch: Any) -> tuple | None:
    if isinstance(batch, dict) and "__restore_key__" in batch:
        key = batch["__restore_key__"]
    else:
        key = getattr(batch, "__restore_key__", None)  # samples, batches
    return None if key is None else _as_tuple(key)


def _sample_keys(batch: Any) -> Any:
    key = batch.get("__key__") if isinstance(batch, dict) else getattr(batch, "__key__", None)
    return list(key) if isinstance(key, (list, tuple)) else key


def batch_identity(batch: Any) -> tuple[tuple | None, Any]:
    """``(restore key, sample keys)`` of a batch (or an unbatched sample): what the default
    :func:`check_loader_resume` compares.

    The restore key is ``__restore_key__`` (an attribute, or an entry of a dict) with lists made
    tuples; the sample keys are ``__key__`` (a list for a batch, a str for a sample), None where
    absent.  A batch with neither raises ``TypeError``: give ``identity=`` what tells its
    batches apart.
    """
    restore_key, keys = _restore_key(batch), _sample_keys(batch)
    if restore_key is None and keys is None:
        raise TypeError(
            f"batch_identity: a {type(batch).__name__} has neither __restore_key__ nor __key__; "
            "pass identity=<a function of the batch> to check_loader_resume"
        )
    return restore_key, keys


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT] + f"... ({len(text)} chars)"


def _events(loader: Any, identity: Callable[[Any], Any]) -> Iterator[tuple[Any, Any]]:
    """``(identity(batch), batch)`` for every batch, ``(END, None)`` after every pass, forever."""
    while True:
        for batch in loader:
            yield identity(batch), batch
        yield END, None


def _read(events: Iterator[tuple[Any, Any]], count: int, on_event: Callable[[int, Any], None] | None = None) -> list[Any]:
    """The next ``count`` events; fewer when two passes in a row end (an exhausted loader)."""
    out: list[Any] = []
    while len(out) < count and out[-2:] != [END, END]:
        event, batch = next(events)
        out.append(event)
        if on_event is not None:
            on_event(len(out), batch)
    return out


def _close(loader: Any, events: Iterator | None) -> bool:
    """Stops the loader's worker processes now rather than whenever it is collected; True if it had some."""
    if events is not None:
        events.close()  # type: ignore[attr-defined]
    iterator = getattr(loader, "_iterator", None)  # torch keeps persistent workers' iterator here
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is None:
        return False
    shutdown()
    return True


def _first_difference(expected: list[Any], found: list[Any]) -> int:
    for j, (e, f) in enumerate(zip(expected, found)):
        if e != f:
            return j
    return min(len(expected), len(found))


def _check_points(at: Iterable[int] | None, steps: int) -> list[int] | None:
    if at is None:
        return None
    points = sorted(set(at))
    for k in points:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= steps:
            raise ValueError(f"check_loader_resume: at= holds {k!r}; save points are ints in 0..steps ({steps})")
    return points


def check_loader_resume(
    make_loader: Callable[[], Any],
    steps: int,
    *,
    at: Iterable[int] | None = None,
    identity: Callable[[Any], Any] = batch_identity,
    restore_samples: bool = False,
) -> list[Any]:
    """Checks that a loader resumes exactly from the states it saves; returns the uninterrupted stream.

    ``make_loader()`` returns a fresh loader (``get_savable_loader(...)``) over the same dataset
    and settings every time; the number of workers is its choice.  One loader runs ``steps``
    steps without interruption; a step is one batch, recorded as ``identity(batch)`` (default
    :func:`batch_identity`: restore key and sample keys), or the end of a pass, recorded as
    :data:`END` (the run goes on with the next pass; it stops early after two ENDs in a row).

    The state after ``k`` steps is saved for every ``k`` in ``at`` (default: every ``k`` from 0,
    before the first batch, to the last step); each must survive a JSON round trip unchanged
    and must not change after ``save_state_rank()`` returned it.  Then, for every ``k``, a fresh
    loader restores the JSON copy (``restore_state_rank``) and must give exactly the remaining
    steps of the uninterrupted stream; a failure names ``k``, the first step that differs and
    the expected and found identities.  With ``restore_samples``, ``restore_sample`` must also
    rebuild every batch of the stream (the same identity).

    Worker processes are stopped as soon as a loader is done with, also when a check fails.
    Returns the uninterrupted stream (identities and :data:`END`) for further assertions.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"check_loader_resume: steps must be an int >= 1, not {steps!r}")
    points = _check_points(at, steps)
    wanted = set(range(steps + 1)) if points is None else set(points)
    saved: dict[int, tuple[dict, str]] = {}
    rebuild: list[tuple[int, tuple]] = []

    had_workers = False
    loader = make_loader()
    events: Iterator | None = None
    try:

        def save(k: int) -> None:
            state = loader.save_state_rank()
            try:
                text = json.dumps(state, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise AssertionError(f"the state saved after step {k} is not JSON: {exc}\n{_short(state)}") from exc
            assert json.loads(text) == state, f"the state saved after step {k} does not survive a JSON round trip (tuples, non-str keys, ...):\n{_short(state)}"
            saved[k] = (state, text)

        def after(k: int, batch: Any) -> None:
            if restore_samples and batch is not None:
                key = _restore_key(batch)
                if key is None and getattr(loader, "last_restore_key", None) is not None:
                    key = _as_tuple(loader.last_restore_key)  # a plain dict: the loader keeps its key
                assert key is not None, f"restore_samples: the batch of step {k - 1} has no __restore_key__"
                rebuild.append((k - 1, key))
            if k in wanted:
                save(k)

        if 0 in wanted:
            save(0)
        events = _events(loader, identity)
        stream = _read(events, steps, after)
        n = len(stream)
        late = sorted(k for k in wanted if k > n) if points is not None else []
        assert not late, f"the stream ended after {n} steps (two pass ends in a row), before the save points {late}"
        for k, (state, text) in saved.items():
            assert json.dumps(state, allow_nan=False) == text, f"the state saved after step {k} changed after save_state_rank() returned it (aliasing)"
        for index, key in rebuild:
            rebuilt = loader.restore_sample(key)
            assert identity(rebuilt) == stream[index], (
                f"restore_sample({_short(key)}) rebuilt another batch than step {index}'s:\n"
                f"  expected: {_short(stream[index])}\n  found:    {_short(identity(rebuilt))}"
            )
    finally:
        had_workers = _close(loader, events)
        del loader, events

    try:
        for k in sorted(saved):
            expected = stream[k:]
            fresh = make_loader()
            fresh_events: Iterator | None = None
            try:
                fresh.restore_state_rank(json.loads(saved[k][1]))
                fresh_events = _events(fresh, identity)
                found = _read(fresh_events, n - k)
            except Exception as exc:
                add_note = getattr(exc, "add_note", None)  # Python 3.11+
                if add_note is not None:
                    add_note(f"check_loader_resume: while resuming from the state saved after step {k} of {n}")
                raise
            finally:
                had_workers = _close(fresh, fresh_events) or had_workers
                del fresh, fresh_events
            if found != expected:
                j = _first_difference(expected, found)
                lines = [f"resuming from the state saved after step {k} of {n} diverged at step {k + j} ({j} steps after the restore)"]
                if j < len(expected) and j < len(found):
                    lines += [f"  expected: {_short(expected[j])}", f"  found:    {_short(found[j])}"]
                else:
                    lines.append(f"  the restored loader stopped after {len(found)} steps (two pass ends in a row); expected {len(expected)}")
                if k == 0:
                    lines.append("  (the state before the first batch: is make_loader() deterministic?)")
                raise AssertionError("\n".join(lines))
    finally:
        if had_workers:
            gc.collect()  # what stopped workers' loaders leave (pipes, shared memory); slow, so only then
    return stream
