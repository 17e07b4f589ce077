"""``.nv-meta/index.sqlite`` in Energon's schema: one row per sample and one per part.

Plain train/val loading does not need it (``.tar.idx`` suffices); joins, aux sources and media
metadata do.  ``sample_key`` is unique over the whole dataset, so this is also where duplicate
keys are found at prepare time.

:class:`SqliteIndexWriter` has two faces over one file format:

- the shard-at-a-time calls that :mod:`.prepare` uses (:meth:`~SqliteIndexWriter.add_shard`,
  :meth:`~SqliteIndexWriter.copy_shard`, and :meth:`~SqliteIndexWriter.update_copy` for a
  re-prepare that changes a few shards), which collect every duplicate key so the error can
  list them all;
- Energon's row-batch calls (``append_samples``, ``append_parts``, ``append_media_metadata_batch``,
  ``append_media_filter``, ``close``, a context manager and the ``db`` attribute), which raise
  :class:`DuplicateSampleKeyError` on the first duplicate and leave the failed batch unwritten.
"""

from __future__ import annotations

import functools
import os
import shutil
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from ..edataclass import edataclass
from ..errors import ConfigError, DatasetError, format_message
from ..storage import AnyPath, RemotePath, as_path, local_view
from .media_metadata import MEDIA_SCHEMA
from .metadata import INDEX_SQLITE, meta_dir, read_info
from .tar_reader import SampleEntry

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "DuplicateKey",
    "DuplicateSampleKeyError",
    "IndexAggregatable",
    "IndexMediaMetadata",
    "IndexMismatchError",
    "IndexSample",
    "IndexSamplePart",
    "SqliteIndexWriter",
    "part_counts",
    "shard_row_count",
    "shard_sample_keys",
]

_SCHEMA = (
    (
        "CREATE TABLE samples (tar_file_id INTEGER NOT NULL, sample_key TEXT NOT NULL UNIQUE, "
        "sample_index INTEGER NOT NULL, byte_offset INTEGER, byte_size INTEGER)"
    ),
    (
        "CREATE TABLE sample_parts (tar_file_id INTEGER, sample_index INTEGER, part_name TEXT, "
        "content_byte_offset INTEGER, content_byte_size INTEGER)"
    ),
)
_DROP = (
    "DROP INDEX IF EXISTS idx_samples_sample_key",
    "DROP INDEX IF EXISTS idx_samples_by_tar_and_idx",
    "DROP TABLE IF EXISTS samples",
    "DROP INDEX IF EXISTS idx_sample_parts_seq",
    "DROP INDEX IF EXISTS idx_sample_parts_full",
    "DROP TABLE IF EXISTS sample_parts",
)
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)",
    "CREATE INDEX IF NOT EXISTS idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, content_byte_offset)",
    (
        "CREATE INDEX IF NOT EXISTS idx_sample_parts_full ON sample_parts(tar_file_id, sample_index, "
        "part_name, content_byte_offset, content_byte_size)"
    ),
)
_SAMPLE_TABLES_SCHEMA = (
    "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE tbl_name IN ('samples', 'sample_parts') ORDER BY name"
)
_INSERT_SAMPLE = "INSERT INTO samples VALUES (?, ?, ?, ?, ?)"
_INSERT_PART = "INSERT INTO sample_parts VALUES (?, ?, ?, ?, ?)"
_DUPLICATE_FIX = (
    "rename the samples (e.g. prefix keys with the shard name), exclude one copy with --exclude, "
    "or run prepare with --fix-duplicates"
)


# ---------------------------------------------------------------------------------------------
# Rows (Energon's ``flavors.webdataset.prepare`` row types)
# ---------------------------------------------------------------------------------------------


@edataclass
class IndexAggregatable:
    """Base of the rows an indexing worker hands to the index writer."""


@edataclass
class IndexSample(IndexAggregatable):
    """One ``samples`` row: where a whole sample lies in its tar."""

    tar_file_id: int
    sample_key: str
    sample_index: int
    byte_offset: int
    byte_size: int


@edataclass
class IndexSamplePart(IndexAggregatable):
    """One ``sample_parts`` row: where one part's content lies in its tar."""

    tar_file_id: int
    sample_index: int
    part_name: str
    content_byte_offset: int
    content_byte_size: int


@edataclass
class IndexMediaMetadata(IndexAggregatable):
    """One ``media_metadata`` row: ``entry_key`` is ``<sample_key>.<part_name>``."""

    entry_key: str
    metadata_type: str
    metadata_json: str


# ---------------------------------------------------------------------------------------------
# Duplicate keys
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DuplicateKey:
    """A sample key found twice: where it was first and where it appeared again."""

    key: str
    first: tuple[int, int]  # (tar_file_id, sample_index)
    again: tuple[int, int]


class DuplicateSampleKeyError(DatasetError, RuntimeError):
    """A sample key occurs more than once in a dataset; the index was not written.

    ``sample_key`` is the (first) duplicated key, as in Energon; ``duplicates`` lists every one
    found with both positions when they are known. Also a :class:`RuntimeError`, like Energon's.
    """

    sample_key: str
    duplicates: list[DuplicateKey]

    def __init__(
        self,
        sample_key: str,
        *,
        where: str | None = None,
        found: str | None = None,
        what: str | None = None,
        duplicates: Sequence[DuplicateKey] = (),
    ) -> None:
        super().__init__(
            format_message(
                what or f"duplicate sample key {sample_key!r} while indexing",
                where=where,
                expected="every sample key unique over all shards of the dataset",
                found=found,
                fix=_DUPLICATE_FIX,
            )
        )
        self.sample_key = sample_key
        self.duplicates = list(duplicates)

    @classmethod
    def from_duplicates(
        cls, duplicates: Sequence[DuplicateKey], shard_names: Sequence[str], *, where: str | None = None
    ) -> DuplicateSampleKeyError:
        """One error listing (up to ten of) ``duplicates``; shard ids are resolved to names."""
        if not duplicates:
            raise ValueError("from_duplicates needs at least one duplicate")
        shown = "\n".join(
            f"    {d.key!r}: {shard_names[d.first[0]]} sample {d.first[1]} and "
            f"{shard_names[d.again[0]]} sample {d.again[1]}"
            for d in duplicates[:10]
        )
        more = f"\n    ... and {len(duplicates) - 10} more" if len(duplicates) > 10 else ""
        return cls(
            duplicates[0].key,
            what=f"the data contains {len(duplicates)} duplicate sample key(s); nothing was written",
            where=where,
            found=f"\n{shown}{more}",
            duplicates=duplicates,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the attributes across pickling (errors travel from prepare's worker processes).
        return (_rebuild_duplicate_error, (type(self), str(self), self.sample_key, self.duplicates))


class IndexMismatchError(DatasetError):
    """An existing ``index.sqlite`` does not hold what prepare's record says it holds."""


def _rebuild_duplicate_error(
    cls: type[DuplicateSampleKeyError], message: str, sample_key: str, duplicates: list[DuplicateKey]
) -> DuplicateSampleKeyError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.sample_key = sample_key
    error.duplicates = duplicates
    return error


def _mismatch(where: object, shard_id: int, expected: int, rows: int) -> IndexMismatchError:
    return IndexMismatchError(
        format_message(
            "the previous index does not hold the rows recorded for a shard",
            where=f"{where}, tar_file_id {shard_id}",
            expected=f"{expected} samples",
            found=f"{rows} rows",
            fix="run prepare again; it re-scans the shard",
        )
    )


# ---------------------------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------------------------


@functools.cache
def _sample_tables_schema() -> list[tuple]:
    """The ``sqlite_master`` rows of the sample tables and their indexes as this writer makes
    them (SQLite's own text of each statement)."""
    db = sqlite3.connect(":memory:")
    try:
        for statement in (*_SCHEMA, *_INDEXES):
            db.execute(statement)
        return db.execute(_SAMPLE_TABLES_SCHEMA).fetchall()
    finally:
        db.close()


def _local_file(path: str | os.PathLike) -> Path:
    try:
        return Path(os.fspath(path))
    except TypeError:
        raise ConfigError(
            format_message(
                "index.sqlite can only be written on the local file system",
                where=str(path),
                found="a remote path",
                fix="build the index in a local folder and upload the finished file",
            )
        ) from None


class SqliteIndexWriter:
    """Writes the sample tables (and optionally the media tables) of an ``index.sqlite``.

    Opening drops and recreates the sample tables (``enable_sample_tables``); the media tables
    are created if missing and emptied first when ``reset_tables``. ``scratch=True`` is for a
    fresh temporary file that is renamed into place afterwards: an old file at the path is
    removed, and there is no rollback journal on disk and no fsync. Lookup indexes are built
    once, in :meth:`close`, after all rows are in.  :meth:`update_copy` opens a copy of a
    previous index instead, for prepare's shard-at-a-time calls only.
    """

    def __init__(
        self,
        sqlite_path: str | os.PathLike,
        *,
        enable_sample_tables: bool = True,
        enable_media_metadata: bool = False,
        reset_tables: bool = True,
        scratch: bool = False,
    ) -> None:
        if enable_sample_tables and not reset_tables:
            raise ConfigError(
                format_message(
                    "the sample tables of index.sqlite are always rebuilt from scratch",
                    where=str(sqlite_path),
                    expected="reset_tables=True with enable_sample_tables=True",
                    found="reset_tables=False",
                    fix="pass enable_sample_tables=False to add only media metadata to an index",
                )
            )
        self.sqlite_path = sqlite_path
        self.enable_sample_tables = enable_sample_tables
        self.enable_media_metadata = enable_media_metadata
        self.reset_tables = reset_tables
        self.path = _local_file(sqlite_path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if scratch:
            self.path.unlink(missing_ok=True)
        self.db: sqlite3.Connection | None = self._connect("MEMORY" if scratch else None)  # MEMORY: savepoints still roll back
        self._rolls_back = True  # append_samples undoes a failed batch
        if enable_sample_tables:
            for statement in (*_DROP, *_SCHEMA):
                self.db.execute(statement)
        if enable_media_metadata:
            if reset_tables:
                self.db.execute("DROP TABLE IF EXISTS media_metadata")
                self.db.execute("DROP TABLE IF EXISTS media_filters")
            for statement in MEDIA_SCHEMA:
                self.db.execute(statement)

    def _connect(self, scratch_journal: str | None) -> sqlite3.Connection:
        # A URI connection so that attach_previous can open the old index read-only.
        db = sqlite3.connect(self.path.absolute().as_uri(), uri=True)
        db.execute("PRAGMA busy_timeout = 5000")
        if scratch_journal is not None:  # a temporary file: no fsync, the journal where asked
            db.execute(f"PRAGMA journal_mode={scratch_journal}")
            db.execute("PRAGMA synchronous=OFF")
        return db

    @classmethod
    def update_copy(
        cls,
        sqlite_path: str | os.PathLike,
        previous: str | os.PathLike,
        *,
        keep: Mapping[int, int],
        shard_count: int,
        other_tables: Collection[str] = (),
    ) -> SqliteIndexWriter | None:
        """A writer on a copy of the ``previous`` index (made at ``sqlite_path``, a temporary
        file renamed into place afterwards) for a dataset whose shards keep their ids.

        ``keep`` maps the id of each unchanged shard to its recorded sample count; the rows of
        every other shard (ids up to ``shard_count``, and any other id the file holds) are
        deleted, and :meth:`add_rows` then adds the changed shards' new rows.  The lookup
        indexes are there already and SQLite keeps them up to date, so a few changed shards
        cost a file copy and their own rows, not a rebuild of the whole index.  Rowids differ
        from a full rebuild's (a changed shard's rows come after every kept row); within each
        shard, rows stay in (sample_index, content_byte_offset) order.

        Returns None (and leaves no file) when the previous index is not laid out as this
        writer lays one out: other tables or indexes than the sample tables and
        ``other_tables``; rebuild then.  An unreadable file raises :class:`sqlite3.DatabaseError`;
        one that holds another number of rows for a kept shard, :class:`IndexMismatchError`.
        """
        writer = cls.__new__(cls)
        writer.sqlite_path = sqlite_path
        writer.enable_sample_tables, writer.enable_media_metadata, writer.reset_tables = True, False, True
        writer.path = _local_file(sqlite_path)
        writer.db = None
        # No journal at all: nothing is rolled back (a failed update deletes the file; Energon's
        # append_samples, which undoes a failed batch, is refused), and a journal in memory
        # would grow with the pages an update touches.
        writer._rolls_back = False
        writer.path.unlink(missing_ok=True)
        try:
            shutil.copyfile(previous, writer.path)
            db = writer.db = writer._connect("OFF")
            tables = {row[0] for row in db.execute("SELECT tbl_name FROM sqlite_master")}
            layout = db.execute(_SAMPLE_TABLES_SCHEMA).fetchall()
            if not tables <= {"samples", "sample_parts", *other_tables} or layout != _sample_tables_schema():
                writer.abort()
                return None
            found = dict(db.execute("SELECT tar_file_id, COUNT(*) FROM samples GROUP BY tar_file_id").fetchall())
            for shard_id, expected in keep.items():
                if found.get(shard_id, 0) != expected:
                    raise _mismatch(previous, shard_id, expected, found.get(shard_id, 0))
            drop = [(shard_id,) for shard_id in sorted(set(range(shard_count)).union(found).difference(keep))]
            db.executemany("DELETE FROM samples WHERE tar_file_id = ?", drop)
            db.executemany("DELETE FROM sample_parts WHERE tar_file_id = ?", drop)
        except BaseException:
            writer.abort()
            raise
        return writer

    def _open_db(self) -> sqlite3.Connection:
        if self.db is None:
            raise DatasetError(
                format_message(
                    "the index writer is already closed",
                    where=str(self.path),
                    fix="write all rows before close(), or open a new SqliteIndexWriter",
                )
            )
        return self.db

    # --- Energon's row-batch interface -------------------------------------------------------
    def append_samples(self, rows: Sequence[IndexSample]) -> None:
        """Inserts sample rows; a duplicate key raises and leaves none of ``rows`` written."""
        db = self._open_db()
        if not self._rolls_back:
            raise ConfigError(
                format_message(
                    "append_samples on an index writer made by update_copy (it cannot undo a failed batch)",
                    where=str(self.path),
                    fix="use add_rows, or open a new SqliteIndexWriter",
                )
            )
        if not rows:
            return
        db.execute("SAVEPOINT append_samples")
        try:
            db.executemany(
                _INSERT_SAMPLE,
                ((r.tar_file_id, r.sample_key, r.sample_index, r.byte_offset, r.byte_size) for r in rows),
            )
        except sqlite3.IntegrityError as exc:
            db.execute("ROLLBACK TO SAVEPOINT append_samples")
            db.execute("RELEASE SAVEPOINT append_samples")
            key, found = self._explain_duplicate(rows)
            raise DuplicateSampleKeyError(key, where=str(self.path), found=found) from exc
        db.execute("RELEASE SAVEPOINT append_samples")

    def append_parts(self, rows: Sequence[IndexSamplePart]) -> None:
        """Inserts part rows."""
        self._open_db().executemany(
            _INSERT_PART,
            (
                (r.tar_file_id, r.sample_index, r.part_name, r.content_byte_offset, r.content_byte_size)
                for r in rows
            ),
        )

    def append_media_metadata_batch(self, rows: Sequence[IndexMediaMetadata]) -> None:
        """Inserts (or replaces) media metadata rows; needs ``enable_media_metadata``."""
        self._require_media()
        self._open_db().executemany(
            "INSERT OR REPLACE INTO media_metadata (entry_key, metadata_type, metadata_json) VALUES (?, ?, ?)",
            ((r.entry_key, r.metadata_type, r.metadata_json) for r in rows),
        )

    def append_media_filter(self, *, strategy: str, patterns: str | None) -> None:
        """Records the media filter a run used (Energon keeps one row per distinct filter)."""
        self._require_media()
        self._open_db().execute(
            "INSERT OR IGNORE INTO media_filters (strategy, patterns) VALUES (?, ?)", (strategy, patterns)
        )

    def _require_media(self) -> None:
        if not self.enable_media_metadata:
            raise ConfigError(
                format_message(
                    "media metadata written to an index writer opened without media tables",
                    where=str(self.path),
                    fix="open the SqliteIndexWriter with enable_media_metadata=True",
                )
            )

    def _explain_duplicate(self, rows: Sequence[IndexSample]) -> tuple[str, str]:
        """The key (and its two positions) that made a batch fail; SQLite names neither."""
        db = self._open_db()
        seen: dict[str, IndexSample] = {}
        for row in rows:
            earlier = seen.get(row.sample_key)
            if earlier is not None:
                return row.sample_key, (
                    f"twice in one batch: tar_file_id {earlier.tar_file_id} sample {earlier.sample_index} "
                    f"and tar_file_id {row.tar_file_id} sample {row.sample_index}"
                )
            first = db.execute(
                "SELECT tar_file_id, sample_index FROM samples WHERE sample_key = ?", (row.sample_key,)
            ).fetchone()
            if first is not None:
                return row.sample_key, (
                    f"already indexed at tar_file_id {first[0]} sample {first[1]}, "
                    f"again at tar_file_id {row.tar_file_id} sample {row.sample_index}"
                )
            seen[row.sample_key] = row
        return rows[0].sample_key, "a uniqueness violation SQLite did not attribute to one row"

    # --- shard-at-a-time interface (prepare) -----------------------------------------------
    def add_shard(
        self, tar_file_id: int, samples: Sequence[SampleEntry], offsets: Sequence[int]
    ) -> list[DuplicateKey]:
        """Inserts one shard's rows; returns the keys that were already present."""
        bounds = [int(o) for o in offsets]
        sample_rows = [
            (tar_file_id, s.key, i, bounds[i], bounds[i + 1] - bounds[i]) for i, s in enumerate(samples)
        ]
        part_rows = [
            (tar_file_id, i, part, offset, size) for i, s in enumerate(samples) for part, offset, size in s.parts
        ]
        return self.add_rows(sample_rows, part_rows)

    def add_rows(self, sample_rows: Sequence[tuple], part_rows: Sequence[tuple]) -> list[DuplicateKey]:
        """Inserts ready-made rows of ``samples`` and ``sample_parts`` (in table column order);
        returns the sample keys that were already present (those rows are not inserted)."""
        db = self._open_db()
        before = db.total_changes
        db.executemany("INSERT OR IGNORE INTO samples VALUES (?, ?, ?, ?, ?)", sample_rows)
        duplicates: list[DuplicateKey] = []
        if db.total_changes - before != len(sample_rows):
            duplicates = self._find_duplicates(list(sample_rows))
        db.executemany(_INSERT_PART, part_rows)
        return duplicates

    def _find_duplicates(self, rows: list[tuple]) -> list[DuplicateKey]:
        db = self._open_db()
        found = []
        for tar_file_id, key, index, _, _ in rows:
            first = db.execute(
                "SELECT tar_file_id, sample_index FROM samples WHERE sample_key = ?", (key,)
            ).fetchone()
            if first != (tar_file_id, index):
                found.append(DuplicateKey(key, tuple(first), (tar_file_id, index)))
        return found

    def attach_previous(self, old_index: Path) -> None:
        """Makes a previous index readable as ``prev`` for :meth:`copy_shard`."""
        uri = f"{Path(old_index).absolute().as_uri()}?mode=ro"
        self._open_db().execute("ATTACH DATABASE ? AS prev", (uri,))

    def copy_shard(self, old_id: int, new_id: int, *, expected_rows: int | None = None) -> list[DuplicateKey]:
        """Copies an unchanged shard's rows from the attached previous index, renumbering it.

        With ``expected_rows`` (the sample count recorded for the shard), a previous index that
        holds another number of rows for it raises :class:`IndexMismatchError`.
        """
        return self.copy_shards(old_id, new_id, [expected_rows])

    def copy_shards(self, old_first: int, new_first: int, expected_rows: Sequence[int | None]) -> list[DuplicateKey]:
        """Copies the rows of ``len(expected_rows)`` consecutive unchanged shards (previous ids
        ``old_first...``) from the attached previous index as ids ``new_first...``: one
        statement per table, in the order a fresh scan inserts them (by shard, sample and data
        offset), so the new index holds the same rows in the same order as a full re-prepare.

        ``expected_rows[i]`` is the sample count recorded for shard ``old_first + i`` (None: not
        checked); a previous index that holds another number raises :class:`IndexMismatchError`.
        """
        db = self._open_db()
        count = len(expected_rows)
        if count == 0:
            return []
        old_last, shift = old_first + count - 1, new_first - old_first
        found = dict(
            db.execute(
                "SELECT tar_file_id, COUNT(*) FROM prev.samples WHERE tar_file_id BETWEEN ? AND ? GROUP BY tar_file_id",
                (old_first, old_last),
            ).fetchall()
        )
        for i, expected in enumerate(expected_rows):
            rows = found.get(old_first + i, 0)
            if expected is not None and rows != expected:
                raise _mismatch(f"{self.path} (previous index attached as prev)", old_first + i, expected, rows)
        total = sum(found.values())
        select = (
            "SELECT tar_file_id + ?, sample_key, sample_index, byte_offset, byte_size FROM prev.samples "
            "WHERE tar_file_id BETWEEN ? AND ? ORDER BY tar_file_id, sample_index"
        )
        before = db.total_changes
        db.execute(f"INSERT OR IGNORE INTO samples {select}", (shift, old_first, old_last))
        duplicates: list[DuplicateKey] = []
        if db.total_changes - before != total:
            duplicates = self._find_duplicates(db.execute(select, (shift, old_first, old_last)).fetchall())
        db.execute(
            "INSERT INTO sample_parts SELECT tar_file_id + ?, sample_index, part_name, content_byte_offset, "
            "content_byte_size FROM prev.sample_parts WHERE tar_file_id BETWEEN ? AND ? "
            "ORDER BY tar_file_id, sample_index, content_byte_offset",
            (shift, old_first, old_last),
        )
        return duplicates

    # --- finishing ---------------------------------------------------------------------------
    def close(self) -> None:
        """Builds the lookup indexes, commits and closes (a second call does nothing)."""
        if self.db is None:
            return
        if self.enable_sample_tables:
            for statement in _INDEXES:
                self.db.execute(statement)
        self.db.commit()
        self.db.close()
        self.db = None

    def finish(self) -> None:
        """:meth:`close` under the name prepare uses."""
        self.close()

    def abort(self) -> None:
        """Discards everything: closes without committing and deletes the file."""
        if self.db is not None:
            self.db.close()
            self.db = None
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # As in Energon, rows written before an error are kept (a failed batch never is).
        self.close()


def shard_row_count(index: Path, tar_file_id: int) -> int:
    """How many samples an existing index holds for one shard (0 if the file is unusable)."""
    try:
        db = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
        try:
            return db.execute(
                "SELECT COUNT(*) FROM samples WHERE tar_file_id = ?", (tar_file_id,)
            ).fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def shard_sample_keys(tar_path: str | os.PathLike, first: int, *, limit: int) -> list[str]:
    """Keys of the shard's samples from position ``first`` on, from the index.sqlite of the
    dataset it belongs to (the nearest of its six parent folders that holds one): an empty list
    when there is none to read. For error messages (a truncated shard names its lost samples)."""
    path = as_path(tar_path)
    if isinstance(path, RemotePath):
        return []  # a remote index.sqlite is not fetched for an error message
    for root in list(path.parents)[:6]:
        database = meta_dir(root) / INDEX_SQLITE
        try:
            if not isinstance(database, os.PathLike) or not os.path.isfile(database):
                continue
            names = list(read_info(root).shard_counts)
            name = str(PurePosixPath(*path.parts[len(root.parts):]))
            if name not in names:
                return []
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
                rows = db.execute(
                    "SELECT sample_key FROM samples WHERE tar_file_id = ? AND sample_index >= ? ORDER BY sample_index LIMIT ?",
                    (names.index(name), first, limit),
                ).fetchall()
            return [row[0] for row in rows]
        except (sqlite3.Error, OSError, DatasetError, ValueError):
            return []
    return []


def sample_key_positions(root: str | os.PathLike, key: str) -> list[tuple[str, int]] | None:
    """``(shard name, position in the shard)`` of every sample with ``__key__`` ``key`` in the
    prepared dataset at ``root``, from its index.sqlite; None when it has none to read (a
    dataset prepared without it, a JSONL file, a token dataset)."""
    database = meta_dir(as_path(root)) / INDEX_SQLITE
    try:
        if not isinstance(database, os.PathLike) or not os.path.isfile(database):
            return None
        names = list(read_info(root).shard_counts)
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT tar_file_id, sample_index FROM samples WHERE sample_key = ?", (key,)).fetchall()
    except (sqlite3.Error, OSError, DatasetError, ValueError):
        return None
    return [(names[shard], index) for shard, index in rows if 0 <= shard < len(names)]


def part_counts(root: AnyPath) -> dict[str, int] | None:
    """Samples per part name (extension) in the prepared index of the dataset at ``root``, by
    name; None without a readable index (a remote index is read from its cached copy)."""
    path = local_view(meta_dir(root) / INDEX_SQLITE)
    if path is None:
        return None
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT part_name, COUNT(*) FROM sample_parts GROUP BY part_name ORDER BY part_name").fetchall()
    except sqlite3.Error:
        return None
    finally:
        db.close()
    return dict(rows)
