"""The one exception tree of megatron_energon_lite.

::

    EnergonLiteError
    ├── ConfigError          bad YAML/JSON/arguments: names the file and the key path
    ├── DatasetError         bad or missing data on disk: names the dataset, shard and sample key
    │   ├── EmptyDatasetError
    │   └── StorageError     object storage failed for good: names the URL, byte range, attempts
    ├── StateError           a checkpoint that cannot be restored into this loader
    ├── DecodeError          a part that cannot be decoded: names the sample key and the part
    │   └── DecompressionBombError  a part that would decode past a limit (pixels, bytes, JPEG scans)
    ├── BatchMismatchError   a batch's samples whose data do not batch together (a field's types differ)
    ├── MissingDependencyError  an optional extra is not installed: names the extra
    ├── NotSupportedError    an Energon name that exists here but is not implemented
    └── FatalSampleError     too many consecutive bad samples: the run stops

    SkipSample               raised by user hooks to drop a sample on purpose (not an error)

Messages follow one shape: what happened, where, what was expected and what was found, and
how to fix it. Use :func:`format_message` to build them so they read the same everywhere.

The two error handlers a ``WorkerConfig`` takes by default live here too (Energon's
``megatron.energon.errors.log_exception`` and ``reraise_exception``).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

__all__ = [
    "AuxFileNotFoundError",
    "BatchMismatchError",
    "CachePoolClosedError",
    "ConfigError",
    "DatasetError",
    "DecodeError",
    "DecompressionBombError",
    "DssPathError",
    "EmptyDatasetError",
    "EnergonLiteError",
    "FatalSampleError",
    "IndexTypeError",
    "LazyNotPicklableError",
    "MissingDependencyError",
    "NotSupportedError",
    "SampleIndexError",
    "SkipRecord",
    "SkipSample",
    "SkipSink",
    "StateError",
    "StorageError",
    "WatchdogTimeoutError",
    "WorkerStartTimeoutError",
    "check_choice",
    "format_message",
    "log_exception",
    "report_skip",
    "reraise_exception",
]

logger = logging.getLogger(__name__)


def format_message(
    what: str,
    *,
    where: str | None = None,
    expected: str | None = None,
    found: str | None = None,
    fix: str | None = None,
) -> str:
    """Builds an error message: ``what`` first, then one labelled line per known detail."""
    lines = [what]
    for label, value in (("where", where), ("expected", expected), ("found", found), ("fix", fix)):
        if value is not None:
            lines.append(f"  {label}: {value}")
    return "\n".join(lines)


class EnergonLiteError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(EnergonLiteError, ValueError):
    """A configuration (YAML, JSON, CLI flag or Python argument) is invalid."""


class DssPathError(ConfigError, AssertionError):
    """A ``dss://`` dataset path without its ``@VERSION``.  Also an ``AssertionError``: Energon
    asserts there, and code written for Energon catches that."""


class SampleIndexError(ConfigError, IndexError):
    """An index outside a dataset's range; also an ``IndexError``, as Python's sequence protocol
    (``for sample in dataset``) expects."""


class IndexTypeError(ConfigError, TypeError):
    """An index that is neither an ``int`` nor an ``EpochIndex``."""


class DatasetError(EnergonLiteError):
    """Data on disk is missing, corrupt or inconsistent with its metadata."""


class EmptyDatasetError(DatasetError):
    """A dataset, split or shard holds no samples where some are required."""


class StorageError(DatasetError):
    """Reading or writing object storage failed after retries, or cannot start (credentials, cache)."""


class StateError(EnergonLiteError):
    """A saved loader state does not fit the loader it is restored into."""


class DecodeError(EnergonLiteError):
    """A sample part could not be decoded."""


class DecompressionBombError(DecodeError):
    """A part would decode to more pixels or bytes, or take more decode work (JPEG scans), than
    the configured limit, so it was refused before decoding (a decompression bomb, or an honest
    but huge image). Like any
    :class:`DecodeError` it concerns one sample, which the loader's error policy may skip; the
    message names the limit and the ``SampleDecoder`` argument that raises it."""


class BatchMismatchError(EnergonLiteError, ValueError):
    """The samples of one batch do not batch together because their data differ: a field's
    values differ in type, keys or number of dimensions (a JSON part that is a list in one sample
    and an object in the others). A problem of that batch, which the loader's error policy skips
    (counting its samples) like a sample that does not decode. Samples of different declared
    types (dataclasses, namedtuples) are a :class:`ConfigError` instead: the code made them."""


class AuxFileNotFoundError(EnergonLiteError, FileNotFoundError, KeyError):
    """A cooker asked an ``aux:`` source (or the primary dataset) for a file it does not have.

    A problem of one sample, which the loader's error policy may skip. It is a
    ``FileNotFoundError`` (Energon's folder stores) and a ``KeyError`` (its dataset stores)."""


class CachePoolClosedError(EnergonLiteError, RuntimeError):
    """A cache pool was used after ``close()``."""


class LazyNotPicklableError(EnergonLiteError, TypeError):
    """A cache pool's lazy reference was pickled: it belongs to the process that made it."""


class MissingDependencyError(EnergonLiteError, ImportError):
    """An optional dependency is needed; the message names the extra to install."""


class NotSupportedError(EnergonLiteError, NotImplementedError):
    """An Energon name that this package keeps for imports but does not implement (yet)."""


class FatalSampleError(EnergonLiteError):
    """Too many consecutive samples failed; the run stops instead of skipping forever."""


class WatchdogTimeoutError(FatalSampleError, TimeoutError):
    """Producing one item took longer than the watchdog timeout and ``fail_on_timeout`` is set."""


class WorkerStartTimeoutError(EnergonLiteError, TimeoutError):
    """A dataloader worker process did not start within the allowed time after it was forked
    (``ENERGON_LITE_WORKER_START_S``), so the loader stopped it."""


class SkipSample(Exception):
    """Raised inside a user hook to drop the current sample on purpose.

    Not an :class:`EnergonLiteError`: skipping is a decision, not a failure, and it is not
    counted towards the failure tolerance.
    """


class SkipRecord(NamedTuple):
    """One skip of the default error handler, as the loader's main process logs and lists it."""

    #: The sample's ``__key__`` (of several skipped together: the first).
    key: Any
    #: Samples skipped together (a batch, a packing buffer), else 1.
    samples: int
    #: Where the (first) sample came from, when it says so (its ``__sources__``).
    dataset: str | None
    shard: str | None
    #: The stage or hook that failed (``load``, ``encode_sample``, ...), when known.
    stage: str | None
    #: ``"<exception type>: <message>"``.
    reason: str
    #: The log line.
    message: str
    #: ``(dataset, shard, samples)`` for every place the skipped samples came from (each sample
    #: counted where its first source is; None where it names none); they add up to ``samples``.
    places: tuple[tuple[str | None, str | None, int], ...] = ()


#: Skips a :class:`SkipSink` keeps between two items; more are only counted (bounded memory on
#: a bad stretch).
SKIP_REPORT_LIMIT = 1000


class SkipSink:
    """Where the default error handler's skips go while a loader's worker pipeline runs, for its
    main process to log and list: a worker's own log may not reach the training job's logging.

    One per worker pipeline (its runtime, ``pipeline/runtime.py``); the pipeline's guards add to
    it and the loader's worker stream takes what was added after each item."""

    __slots__ = ("_records", "_overflow")

    def __init__(self) -> None:
        self._records: list[SkipRecord] = []
        self._overflow = 0

    def add(self, record: SkipRecord) -> None:
        if len(self._records) < SKIP_REPORT_LIMIT:
            self._records.append(record)
        else:
            self._overflow += 1

    def take(self) -> tuple[tuple[SkipRecord, ...], int]:
        """The collected skips and how many more were only counted; empties the sink."""
        if not self._records and not self._overflow:
            return (), 0
        taken, overflow = tuple(self._records), self._overflow
        self._records.clear()
        self._overflow = 0
        return taken, overflow


def check_choice(what: str, value: Any, choices: Any, fix: str) -> None:
    """A :class:`ConfigError` unless ``value`` is one of ``choices``: "unknown WHAT 'value'",
    naming the valid values and ``fix``."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(format_message(f"unknown {what} {value!r}", expected=f"one of {' '.join(choices)}", found=repr(value), fix=fix))


def _first_source(sources: Any) -> Any:
    """The first source info (an object with a ``shard_name``) in ``sources``, nested or flat."""
    if hasattr(sources, "shard_name"):
        return sources
    if isinstance(sources, (list, tuple)):
        for entry in sources:
            found = _first_source(entry)
            if found is not None:
                return found
    return None


def _sources_of(sample: Any) -> Any:
    return sample.get("__sources__") if isinstance(sample, dict) else getattr(sample, "__sources__", None)


def _skipped_samples(sample: Any, sources: Any) -> tuple[list[Any], list[Any]] | None:
    """The keys of the samples a failure drops and the first source of each (None if unknown);
    None when ``sample`` is one sample.

    ``sample`` is one sample, a list of samples (a batch's members, a packing buffer) or a batch
    made of them (its ``__key__`` a list, one key per sample; its ``__sources__`` one entry per
    sample, or the samples' sources in a row, one each)."""
    if isinstance(sample, (list, tuple)) and not hasattr(sample, "_fields"):
        return [_sample_key(member) for member in sample], [_first_source(_sources_of(member)) for member in sample]
    key = _sample_key(sample)
    if not isinstance(key, (list, tuple)):
        return None
    keys = list(key)
    own = _sources_of(sample)
    own = sources if own is None else own
    if isinstance(own, (list, tuple)) and len(own) == len(keys):
        return keys, [_first_source(entry) for entry in own]
    return keys, [_first_source(own)] * len(keys)  # not one entry per sample: all where the first is


def _places(firsts: list[Any]) -> tuple[tuple[str | None, str | None, int], ...]:
    counts: dict[tuple[str | None, str | None], int] = {}
    for source in firsts:
        place = (getattr(source, "dataset_path", None), getattr(source, "shard_name", None))
        counts[place] = counts.get(place, 0) + 1
    return tuple((dataset, shard, count) for (dataset, shard), count in counts.items())


def log_exception(exc: BaseException, sample: Any = None, sources: Any = None) -> None:
    """The default error handler: logs the failure with the sample's key (the sample is skipped).
    Inside a loader's pipeline its guards call :func:`report_skip` instead, which also names the
    failing stage and, in a loader's worker stream, lets the main process log it."""
    report_skip(exc, sample, sources)


def report_skip(exc: BaseException, sample: Any = None, sources: Any = None, *, stage: str | None = None, sink: SkipSink | None = None) -> None:
    """What :func:`log_exception` does for a failure at ``stage``: logs the skip, or adds its
    record to ``sink`` (the loader's main process logs it). A failure that drops several samples
    (a batch, a packing buffer) counts each, where it came from."""
    several = _skipped_samples(sample, sources)
    if several is None:
        keys, firsts = [_sample_key(sample)], [_first_source(sources)]
        what = f"sample {keys[0]}"
    else:  # a batch, or a packing buffer: name its members
        keys, firsts = several
        shown = ", ".join(map(str, keys[:8])) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
        what = f"{len(keys)} samples [{shown}]"
    reason = f"{type(exc).__name__}: {exc}"
    message = f"skipping {what}{f' at {stage}' if stage else ''} (sources {sources}): {reason}"
    if sink is None:
        logger.warning("%s", message)
        return
    first = next((source for source in firsts if source is not None), None)
    sink.add(
        SkipRecord(
            key=keys[0] if keys else None,
            samples=len(keys),
            dataset=getattr(first, "dataset_path", None),
            shard=getattr(first, "shard_name", None),
            stage=stage,
            reason=reason,
            message=message,
            places=_places(firsts),
        )
    )


def _sample_key(sample: Any) -> Any:
    return getattr(sample, "__key__", None) or (sample.get("__key__") if isinstance(sample, dict) else None)


def reraise_exception(exc: BaseException, sample: Any = None, sources: Any = None) -> None:
    """The error handler that stops on any failure (used while restoring samples)."""
    raise exc
