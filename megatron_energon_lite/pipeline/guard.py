"""The one bad-sample policy, shared by every stage that runs a user hook.

A stage runs its hook through :meth:`SampleGuard.call`:

* :class:`~megatron_energon_lite.errors.SkipSample` drops the item on purpose.  It is not a failure:
  the consecutive-failure counter neither grows nor resets;
* system exceptions (:data:`SYSTEM_EXCEPTIONS`: a broken program or interpreter, not a broken sample)
  propagate unchanged, as do our own ``FatalSampleError``, ``StateError`` and ``ConfigError``, and
  ``DatasetError`` (a stale or damaged shard or index, an unusable cache or storage: a problem of
  the dataset or the machine, which would fail every sample it touches, so it stops the run);
* ``StopIteration`` leaking out of a hook would silently end the stream, so it stops the run with a
  ``FatalSampleError``;
* any other exception is passed to ``handler(exc, item, sources)`` (Energon's
  ``global_error_handler`` signature; it logs by default: the default handler's skips go to the
  pipeline's runtime, see ``errors.report_skip``) and the item is dropped.  After
  ``tolerance`` consecutive failures (0 = unlimited) the guard raises ``FatalSampleError`` naming the
  stage, the last failing samples and the last exception.  A handler that raises (Energon's
  ``reraise_exception``) stops the run with that exception, which keeps its type (as in Energon)
  and gets a note naming the stage and the sample(s) (Python 3.11+: shown in its traceback).

``item`` is what failed: one sample, or a list of samples when the hook works on several (a batch,
a pack, a packing buffer); the handler gets it as is, as Energon's handlers do.

The guard only counts; it never decides on success by itself.  The stage calls :meth:`passed` when a
hook produced an output, so that a generator hook resets the counter per yielded output (creating a
generator is not a success).  ``failures`` is part of the owning stage's state, so a restored stage
keeps counting exactly; use one guard per stage.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

from ..errors import (
    ConfigError,
    DatasetError,
    FatalSampleError,
    SkipSample,
    StateError,
    format_message,
    report_skip,
)
from ..worker import ErrorHandler, log_exception
from .node import get_restore_key
from .runtime import Runtime

__all__ = ["DROPPED", "SYSTEM_EXCEPTIONS", "SampleGuard", "describe_item"]

#: Exceptions that mean the program is broken, not the sample: they are never handled.
SYSTEM_EXCEPTIONS: tuple[type[BaseException], ...] = (
    SystemError,
    SyntaxError,
    ImportError,
    MemoryError,
    RecursionError,
    NameError,
    KeyboardInterrupt,
    FatalSampleError,
    StateError,
    ConfigError,
    DatasetError,
)

#: How many failing samples a ``FatalSampleError`` names.
_REMEMBERED_FAILURES = 5


class _Dropped:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DROPPED"


#: Returned by :meth:`SampleGuard.call` when the item was dropped (skipped or failed).
DROPPED: Any = _Dropped()


def _sample_key(item: Any) -> str | None:
    key = item.get("__key__") if isinstance(item, dict) else getattr(item, "__key__", None)
    return None if key is None else str(key)


def describe_item(item: Any) -> str:
    """A short description of a sample (or a list of samples): its ``__key__`` and restore key."""
    if isinstance(item, (list, tuple)) and not hasattr(item, "__restore_key__"):
        parts = [describe_item(member) for member in item[:4]]
        more = f", ... ({len(item)} samples)" if len(item) > 4 else ""
        return "[" + ", ".join(parts) + more + "]"
    key, restore_key = _sample_key(item), get_restore_key(item)
    if key is None and not restore_key:
        return f"<{type(item).__name__} without __key__>"
    return f"{key!r} (restore key {restore_key!r})" if restore_key else repr(key)


def _sources(item: Any) -> Any:
    """Energon's ``get_source_info``: the ``__sources__`` of a sample, or of every sample of a list."""
    if isinstance(item, list):
        found = [source for member in item for source in (_sources(member) or ())]
        return found or None
    return item.get("__sources__") if isinstance(item, dict) else getattr(item, "__sources__", None)


class SampleGuard:
    """Runs hooks under the bad-sample policy and counts consecutive failures.

    Args:
        handler: called as ``handler(exc, item, sources)`` for each handled failure.
        tolerance: consecutive failures that stop the run with ``FatalSampleError``; 0 = unlimited.
        stage: the stage or hook name used in messages.
        runtime: the worker pipeline's runtime: its clock times the hook, its skip sink gets
            the default handler's skips (none: an empty one).
    """

    __slots__ = ("handler", "tolerance", "stage", "dataset", "runtime", "failures", "_last")

    def __init__(
        self,
        handler: ErrorHandler = log_exception,
        *,
        tolerance: int = 100,
        stage: str = "hook",
        dataset: int | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        if not isinstance(tolerance, int) or isinstance(tolerance, bool) or tolerance < 0:
            raise ConfigError(
                format_message(
                    f"invalid failure tolerance for {stage}",
                    expected="an integer >= 0 (0 = unlimited)",
                    found=repr(tolerance),
                )
            )
        self.handler = handler
        self.tolerance = tolerance
        self.stage = stage
        #: The plan's dataset whose stage this is (before the blend; None after it): for the stall report.
        self.dataset = dataset
        self.runtime = Runtime() if runtime is None else runtime
        #: Consecutive failures so far; stages save and restore it with their state.
        self.failures = 0
        self._last: collections.deque[str] = collections.deque(maxlen=_REMEMBERED_FAILURES)

    def call(self, item: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """Returns ``fn(*args)``, or :data:`DROPPED` when the policy dropped ``item``."""
        clock = self.runtime.clock  # the loader's stall report times this item: time the hook as its stage
        try:
            return fn(*args) if clock is None else clock.run(self.stage, self.dataset, fn, *args)
        except SkipSample:
            return DROPPED
        except SYSTEM_EXCEPTIONS:
            raise
        except StopIteration as exc:
            raise FatalSampleError(
                format_message(
                    f"{self.stage} raised StopIteration, which would silently end the data stream",
                    where=f"sample {describe_item(item)}",
                    fix="return a value, raise SkipSample to drop the sample, or let a generator end by returning",
                )
            ) from exc
        except Exception as exc:  # noqa: BLE001 - the policy: log, drop, count
            self._failed(exc, item)
            return DROPPED

    def sibling(self, stage: str, tolerance: int | None = None) -> "SampleGuard":
        """A new guard with this one's handler (and tolerance, unless given) for another hook of the
        same stage; it counts its own consecutive failures, as Energon's separate ``ErrorContext``s do."""
        return SampleGuard(self.handler, tolerance=self.tolerance if tolerance is None else tolerance, stage=stage, runtime=self.runtime)

    def passed(self) -> None:
        """Records a successful output: the run of consecutive failures is over."""
        self.failures = 0

    def reset(self, failures: int = 0) -> None:
        """Sets the counter (from a saved state) and forgets the remembered failures."""
        self.failures = failures
        self._last.clear()

    def _failed(self, exc: Exception, item: Any) -> None:
        try:
            if self.handler is log_exception:  # the default: to the runtime's skip sink, naming the stage
                report_skip(exc, item, _sources(item), stage=self.stage, sink=self.runtime.skips)
            else:
                self.handler(exc, item, _sources(item))
        except Exception as raised:  # the policy is to stop: name where, keep the exception's type
            add_note = getattr(raised, "add_note", None)  # Python 3.11+
            if add_note is not None:
                add_note(f"raised by {self.stage} on {describe_item(item)}; the error handler re-raised it")
            raise
        self.failures += 1
        self._last.append(describe_item(item))
        if self.tolerance and self.failures >= self.tolerance:
            raise FatalSampleError(
                format_message(
                    f"{self.stage} failed on {self.failures} samples in a row; stopping instead of skipping more",
                    where="last failing samples: " + ", ".join(self._last),
                    found=f"last exception: {type(exc).__name__}: {exc}",
                    fix=(
                        "fix the hook or the data; to allow more consecutive failures decorate the hook with "
                        "@stateless(failure_tolerance=N) (0 = unlimited) or set __default_failure_tolerance__ "
                        "on the task encoder"
                    ),
                )
            ) from exc

    def __repr__(self) -> str:
        return f"SampleGuard(stage={self.stage!r}, tolerance={self.tolerance}, failures={self.failures})"
