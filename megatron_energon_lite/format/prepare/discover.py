"""Finding the shards: the tar files under a dataset folder, in Energon's order."""

from __future__ import annotations

import operator
import os
import re
from pathlib import PurePosixPath

from ...errors import ConfigError, format_message
from ...storage import AnyPath, RemotePath
from ..metadata import META_DIR


def discover_shards(root: AnyPath, exclude: str | None = None) -> list[str]:
    """Tar paths under ``root``, relative and posix, in Energon's order."""
    return _discover(root, exclude)


def _discover(root: AnyPath, exclude: str | None, dotted: set[str] | None = None) -> list[str]:
    """:func:`discover_shards`; locally, ``dotted`` (if given) gets the folders (relative, ""
    for the root) that hold a name starting with "." (a temporary file is ``.NAME.tmp-PID``)."""
    if isinstance(root, RemotePath):  # one recursive listing
        found = [name for name in root.list_files() if name.endswith((".tar", ".tgz"))]
        # Energon sorts Path objects, i.e. component by component: "d/a/b.tar" < "d/a-c.tar".
        names = sorted(found, key=lambda n: PurePosixPath(n).parts)
    else:
        names = []
        _walk_tars(os.fspath(root), "", names, dotted)  # in that order already
    names = [n for n in names if not n.startswith(META_DIR + "/")]
    if exclude:
        pattern = _compile(exclude, "--exclude")
        names = [n for n in names if not pattern.search(n)]
    return names


def _walk_tars(folder: str, prefix: str, found: list[str], dotted: set[str] | None = None) -> None:
    """Appends the ``*.tar`` / ``*.tgz`` files under ``folder`` (names relative, ``prefix`` +
    name) to ``found``: what ``root.glob("**/*.tar")`` plus ``is_file()`` gives, from one
    ``scandir`` per folder and no ``stat`` for plain files.  As ``glob("**")``, it does not descend
    into symlinked folders and skips folders it cannot list; a symlink to a tar file counts.

    Each folder's entries are taken in name order, so the names come out in Energon's order
    (component by component) without sorting them all.  ``dotted``: see :func:`_discover`."""
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=_entry_name)
    except OSError:
        return
    for entry in entries:
        name = entry.name
        try:
            if name.endswith((".tar", ".tgz")) and entry.is_file():
                found.append(prefix + name)
            elif entry.is_dir() and not entry.is_symlink():
                _walk_tars(entry.path, f"{prefix}{name}/", found, dotted)
        except OSError:
            pass
        if dotted is not None and name.startswith("."):
            dotted.add(prefix[:-1])


_entry_name = operator.attrgetter("name")


def _compile(regex: str, option: str) -> re.Pattern:
    try:
        return re.compile(regex)
    except re.error as exc:
        raise ConfigError(
            format_message(
                f"invalid regular expression for {option}",
                found=f"{regex!r} ({exc})",
                fix="pass a Python regular expression, e.g. 'shards/train/.*'",
            )
        ) from None
