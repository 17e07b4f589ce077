"""Random-access reads check that what they read is what was asked for.

A read by position (a restore key, a map-view index, a shuffle buffer's re-read) or by name (an
``aux:`` member, a join's match) trusts ``.tar.idx`` / ``index.sqlite`` offsets; both go stale
when a shard is rewritten after ``prepare`` (same size, other order: every offset still lands on
a header). The key actually read is compared with the key the index recorded, and a difference
stops the read with :func:`key_mismatch_error`, the one message for every such read.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from ..errors import DatasetError, format_message
from ..storage import local_view
from .metadata import INDEX_SQLITE, meta_dir, read_info

__all__ = ["RecordedKeys", "check_read_key", "key_mismatch_error"]


def key_mismatch_error(dataset: Any, *, where: str, expected: str, found: str, what: str | None = None) -> DatasetError:
    """The error for a read whose member or sample name is not the one its index promised."""
    return DatasetError(
        format_message(
            what or "the data read does not match the dataset's index (a shard was rewritten after prepare)",
            where=where,
            expected=expected,
            found=found,
            fix=f"run `energon-lite prepare {dataset}` again",
        )
    )


def check_read_key(found: str, expected: str, dataset: Any, *, where: str, kind: str = "sample key") -> None:
    """Raises :func:`key_mismatch_error` unless ``found == expected``."""
    if found != expected:
        raise key_mismatch_error(dataset, where=where, expected=f"{kind} {expected!r} (as .nv-meta/{INDEX_SQLITE} records it)", found=f"{kind} {found!r}")


class RecordedKeys:
    """The sample key ``index.sqlite`` records at each (shard, position in the shard): what a
    read by position must find. Without an index (a dataset prepared with ``--tar-index-only``)
    positions are not checked. The connection is opened on first use, per process."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._pid: int | None = None
        self._db: sqlite3.Connection | None = None
        self._shard_ids: dict[str, int] = {}

    def _connection(self) -> sqlite3.Connection | None:
        if self._pid != os.getpid():  # a forked worker opens its own
            self._pid, self._db = os.getpid(), None
            local = local_view(meta_dir(self.root) / INDEX_SQLITE)
            if local is not None:
                self._shard_ids = {name: i for i, name in enumerate(read_info(self.root, allow_outside_root=True).shard_counts)}  # the split reader decided
                self._db = sqlite3.connect(f"file:{local}?mode=ro", uri=True, check_same_thread=False)
        return self._db

    def check(self, shard: str, position: int, found: str, *, where: str) -> None:
        """Raises unless the index records ``found`` as sample ``position`` of ``shard``."""
        db = self._connection()
        if db is None:
            return
        try:
            row = db.execute(
                "SELECT sample_key FROM samples WHERE tar_file_id = ? AND sample_index = ?", (self._shard_ids.get(shard, -1), position)
            ).fetchone()
        except sqlite3.Error as exc:
            raise DatasetError(
                format_message("cannot read the sample index", where=str(meta_dir(self.root) / INDEX_SQLITE), found=f"{type(exc).__name__}: {exc}", fix=f"run `energon-lite prepare {self.root}` again")
            ) from None
        if row is None:
            raise key_mismatch_error(self.root, where=where, expected=f"a row for sample {position} of {shard} in .nv-meta/{INDEX_SQLITE}", found=f"no such row; the tar holds sample key {found!r} there")
        check_read_key(found, row[0], self.root, where=where)

    def close(self) -> None:
        if self._db is not None and self._pid == os.getpid():
            self._db.close()
        self._db, self._pid = None, None

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "_pid": None, "_db": None, "_shard_ids": {}}
