"""The one exception tree of megatron_energon_lite.

::

    EnergonLiteError
    ├── ConfigError          bad YAML/JSON/arguments: names the file and the key path
    ├── DatasetError         bad or missing data on disk: names the dataset, shard and sample key
    │   ├── EmptyDatasetError
    │   └── StorageError     object storage failed for good: names the URL, byte range, attempts
    ├── StateError           a checkpoint that cannot be restored into this loader
    ├── DecodeError          a part that cannot be decoded: names the sample key and the part
    ├── MissingDependencyError  an optional extra is not installed: names the extra
    └── FatalSampleError     too many consecutive bad samples: the run stops

    SkipSample               raised by user hooks to drop a sample on purpose (not an error)

Messages follow one shape: what happened, where, what was expected and what was found, and
how to fix it. Use :func:`format_message` to build them so they read the same everywhere.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DatasetError",
    "DecodeError",
    "EmptyDatasetError",
    "EnergonLiteError",
    "FatalSampleError",
    "MissingDependencyError",
    "SkipSample",
    "StateError",
    "StorageError",
    "format_message",
]


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


class MissingDependencyError(EnergonLiteError, ImportError):
    """An optional dependency is needed; the message names the extra to install."""


class FatalSampleError(EnergonLiteError):
    """Too many consecutive samples failed; the run stops instead of skipping forever."""


class SkipSample(Exception):
    """Raised inside a user hook to drop the current sample on purpose.

    Not an :class:`EnergonLiteError`: skipping is a decision, not a failure, and it is not
    counted towards the failure tolerance.
    """
