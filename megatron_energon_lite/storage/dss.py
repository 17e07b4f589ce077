"""``dss://NAME@VERSION/path``: Energon's dataset-cache URLs.

Not an fsspec protocol but a folder in the local dataset cache: ``NAME/VERSION/path`` under the
cache folder, local or remote as that folder is.  Energon names the folder with the module global
``megatron.energon.epathlib.epath.NVDATASET_CACHE_DIR`` (seeded from the environment variable of
that name at import, reassigned by users and by Energon's tests), so the folder is looked up at
call time through :func:`dataset_cache_dir`: :mod:`megatron_energon_lite.energon.epathlib` points the
lookup at its global when it is imported; without it the environment variable is read.

This module only parses names; :func:`megatron_energon_lite.storage.paths.dss_path` joins one
onto the cache folder.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any, Callable

from ..errors import ConfigError, DssPathError, format_message

DSS_PREFIX = "dss://"
CACHE_VARIABLE = "NVDATASET_CACHE_DIR"


def resolve_dots(path: PurePosixPath, original: object) -> PurePosixPath:
    """``path`` (absolute) with ``.`` and ``..`` resolved by name (symlinks are not followed)."""
    parts: list[str] = []
    for part in path.parts[1:]:
        if part == "..":
            if not parts:
                raise ConfigError(
                    format_message("path goes above the root", found=repr(str(original)), fix="remove a '..' from the path")
                )
            parts.pop()
        elif part != ".":
            parts.append(part)
    return PurePosixPath("/", *parts)


def dss_name_version(first: str, original: object) -> tuple[str, str]:
    """``"NAME@VERSION"`` -> ``("NAME", "VERSION")``; a :class:`DssPathError` without a version."""
    name, sep, version = first.rpartition("@")
    if not sep or not name or not version:
        raise DssPathError(
            format_message(
                "DSS paths must include a dataset version separated by '@'",
                expected="dss://NAME@VERSION/path",
                found=repr(str(original)),
            )
        )
    return name, version


def parse_dss(first: str, inner: str, original: object) -> PurePosixPath:
    """The path inside the dataset cache named by ``dss://FIRST/INNER``: ``/NAME@VERSION/INNER``
    with ``.`` and ``..`` resolved (checked: ``FIRST`` must carry a version)."""
    dss_name_version(first, original)
    return resolve_dots(PurePosixPath("/", first, inner), original)


def split_dss_url(url: str) -> PurePosixPath:
    """``dss://NAME@VERSION/a/../b`` -> ``/NAME@VERSION/b`` (see :func:`parse_dss`)."""
    first, _, inner = url[len(DSS_PREFIX) :].partition("/")
    if not first:
        raise ConfigError(format_message("invalid path URL", expected="dss://NAME/path", found=repr(url)))
    return parse_dss(first, inner, url)


def dss_url(internal_path: PurePosixPath) -> str:
    """The URL of a path inside the dataset cache: ``/NAME@VERSION/b`` -> ``dss://NAME@VERSION/b``."""
    return DSS_PREFIX + str(internal_path)[1:]


def cache_parts(internal_path: PurePosixPath) -> list[str]:
    """The folders and file below the cache folder: ``/NAME@VERSION/a/b`` -> ``[NAME, VERSION, a, b]``."""
    parts = internal_path.parts
    name, version = dss_name_version(parts[1], dss_url(internal_path)) if len(parts) > 1 else ("", "")
    return [name, version, *parts[2:]]


def missing_cache_error(url: str) -> ConfigError:
    return ConfigError(
        format_message(
            "dss:// paths need the dataset cache folder",
            where=url,
            fix=f"set the environment variable {CACHE_VARIABLE} before starting Python",
        )
    )


def _from_environment() -> str | None:
    return os.environ.get(CACHE_VARIABLE) or None


_cache_dir_lookup: Callable[[], Any] = _from_environment  # process-wide, not per run: set when epathlib is imported


def set_dataset_cache_lookup(lookup: Callable[[], Any]) -> None:
    """Where :func:`dataset_cache_dir` reads the cache folder from: a function returning anything
    :func:`~megatron_energon_lite.storage.as_path` takes, or None when there is no cache.
    :mod:`megatron_energon_lite.energon.epathlib` sets it at import to read its ``NVDATASET_CACHE_DIR``."""
    global _cache_dir_lookup
    _cache_dir_lookup = lookup


def dataset_cache_dir() -> Any:
    """The dataset cache folder now (None when unset): read at every call, never cached."""
    return _cache_dir_lookup()
