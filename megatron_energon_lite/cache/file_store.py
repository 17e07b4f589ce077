"""The file stores behind ``aux:`` sources: a prepared dataset, a plain folder, a decoding wrapper.

* :class:`WebdatasetFileStore`: a prepared dataset; a file is a tar member ``"<key>.<part>"``,
  found through ``index.sqlite`` (its ``sample_parts`` table) and read as one byte range.
* :class:`SystemFileStore`: a folder (local or object storage); a file is a relative path.
* :class:`DecodeFileStore`: decodes what another store returns with the task encoder's decoder.

Reads go through the storage layer (pooled descriptors locally; ranged reads with retries and
the index cache remotely). Names come from sample data, so they are checked: a folder store never
reads outside its folder. A name a source does not have raises
:class:`~megatron_energon_lite.errors.AuxFileNotFoundError` (one sample's problem); a source that
is not usable (not prepared, a damaged index) raises ``DatasetError`` (stops the run).

Stores hold per-process resources (open descriptors, SQLite connections per thread); pickling
drops them, and a forked worker opens its own.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import PurePosixPath
from typing import Any

from ..decode import SampleDecoder
from ..errors import AuxFileNotFoundError, DatasetError, format_message
from ..format.media_metadata import open_index
from ..format.metadata import INDEX_SQLITE, meta_dir, read_info
from ..format.recorded_keys import check_read_key
from ..format.tar_reader import BLOCK, TarFormatError, header_name, iter_members, split_name
from ..policy import PLAIN, Policy
from ..format.media_types import MediaMetadataBase, deserialize_media_metadata
from ..source_info import SourceInfo
from ..storage import AnyPath, RemotePath, as_path, file_pool, file_stat
from ..storage.remote import fetch_object
from .base import FileStore, FileStoreDecoder, FileStoreWrapper

__all__ = ["DecodeFileStore", "SystemFileStore", "WebdatasetFileStore", "check_relative_name"]

_PREPARE_MEDIA = "energon-lite prepare-media {path} --media-metadata-by-extension"
_PREPARE_DATASET_MEDIA = "energon-lite prepare {path} --media-metadata-by-extension --force-overwrite"


def check_relative_name(name: Any, *, store: FileStore) -> str:
    """``name`` if it is a relative path inside the store (no ``..``, not absolute, not a URL)."""
    if (
        not isinstance(name, str)
        or not name
        or "\0" in name
        or name.startswith("/")
        or "://" in name
        or ".." in PurePosixPath(name).parts
    ):
        raise AuxFileNotFoundError(
            format_message(
                "a file name for an aux source must be a path inside it",
                where=str(store),
                expected="a relative path without '..', e.g. images/0001.jpg",
                found=repr(name)[:200],
                fix="build the name from the sample's data relative to the aux folder",
            )
        )
    return name


class _IndexReader:
    """Thread-local read-only SQLite connections to one ``index.sqlite`` (opened lazily)."""

    def __init__(self, path: AnyPath, *, what: str) -> None:
        self.path = path
        self.what = what
        self._local = threading.local()

    def connection(self) -> sqlite3.Connection | None:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = open_index(self.path)
        return db

    def query(self, sql: str, args: tuple) -> list[tuple] | None:
        """Rows of ``sql``; None if the index or the table does not exist."""
        db = self.connection()
        if db is None:
            return None
        try:
            return db.execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise self.damaged(exc) from None
        except sqlite3.DatabaseError as exc:
            raise self.damaged(exc) from None

    def damaged(self, exc: Exception) -> DatasetError:
        return DatasetError(
            format_message(
                f"the index of {self.what} cannot be read",
                where=str(self.path),
                found=f"{type(exc).__name__}: {exc}",
                fix="run energon-lite prepare (or prepare-media for a folder) on it again",
            )
        )

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "what": self.what}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], what=state["what"])


def _media_metadata(index: _IndexReader, key: str, store: FileStore, fix: str) -> MediaMetadataBase:
    rows = index.query("SELECT metadata_type, metadata_json FROM media_metadata WHERE entry_key = ?", (key,))
    if rows is None:
        raise DatasetError(
            format_message(
                "no media metadata was stored for this source",
                where=str(store),
                expected=f"a media_metadata table in {index.path}",
                fix=f"run `{fix}`",
            )
        )
    if not rows:
        raise AuxFileNotFoundError(
            format_message(
                "no media metadata for this file",
                where=f"{store}: {key!r}",
                fix=f"check the name; if the file was added after the metadata, run `{fix}` again",
            )
        )
    metadata_type, metadata_json = rows[0]
    return deserialize_media_metadata(metadata_type, metadata_json)


class _PooledReads:
    """Byte ranges read through the storage layer's per-process file pool (opened on first use,
    not pickled: each process opens its own)."""

    _pool = None

    def _read(self, root: AnyPath, path: AnyPath, offset: int, size: int) -> bytes:
        if self._pool is None:
            self._pool = file_pool(root)
        return self._pool.read(path, offset, size)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}


class SystemFileStore(_PooledReads, FileStore[bytes]):
    """The files of a folder, by their path relative to it (``filesystem://`` aux sources).

    Media metadata comes from the folder's ``.nv-meta/index.sqlite`` (``energon-lite
    prepare-media``).
    """

    def __init__(self, base_dir: Any = None) -> None:
        if base_dir is None:
            raise DatasetError(
                format_message("SystemFileStore needs the folder it reads from", expected="SystemFileStore(base_dir)")
            )
        self.base_dir = as_path(base_dir)
        self._index = _IndexReader(meta_dir(self.base_dir) / INDEX_SQLITE, what=f"folder {self.base_dir}")

    def get_path(self) -> str:
        return str(self.base_dir)

    def __getitem__(self, key: str) -> tuple[bytes, SourceInfo]:
        name = check_relative_name(key, store=self)
        path = self.base_dir / name
        data = self._read_whole(path)
        if data is None:
            raise AuxFileNotFoundError(
                format_message("file not found in an aux folder", where=str(path), fix="check the name the cooker builds, or add the file")
            )
        base = self.get_path()
        return data, SourceInfo(dataset_path=base, index=name, shard_name=base, file_names=(name,))

    def _read_whole(self, path: AnyPath) -> bytes | None:
        """The file's bytes, or None if it does not exist: one GET remotely (a listing of the
        folder first would cost a round trip and grow with the folder)."""
        if isinstance(path, RemotePath):
            try:
                return fetch_object(path)
            except FileNotFoundError:
                return None
        stat = file_stat(path)
        return None if stat is None else self._read(self.base_dir, path, 0, stat.size)

    def get_media_metadata(self, key: str) -> MediaMetadataBase:
        name = check_relative_name(key, store=self)
        return _media_metadata(self._index, name, self, _PREPARE_MEDIA.format(path=self.base_dir))

    def __str__(self) -> str:
        return f"SystemFileStore(base_dir={self.get_path()!r})"


class WebdatasetFileStore(_PooledReads, FileStore[bytes]):
    """The tar members of a prepared dataset, by member name ``"<sample key>.<part>"``.

    Each read is one lookup in ``index.sqlite`` and one byte range of the shard.
    """

    def __init__(self, dataset_path: Any, *, policy: Policy = PLAIN) -> None:
        """``policy``: the loader's (shards outside the dataset folder, see ``check_shard_name``)."""
        self.base_path = as_path(dataset_path)
        index = meta_dir(self.base_path) / INDEX_SQLITE
        if file_stat(index) is None:
            raise DatasetError(
                format_message(
                    "an aux dataset must be a prepared dataset",
                    where=str(self.base_path),
                    expected=f"{index} (written by energon-lite prepare)",
                    fix=f"run `energon-lite prepare {self.base_path}`; for a plain folder of files write "
                    "filesystem://<folder> in the aux: entry instead",
                )
            )
        self._shards = list(read_info(self.base_path, policy=policy).shard_counts)
        self._index = _IndexReader(index, what=f"dataset {self.base_path}")

    def get_path(self) -> str:
        return str(self.base_path)

    def _locate(self, key: str) -> tuple[str, int, int, int]:
        parts = split_name(key) if isinstance(key, str) else None
        if parts is None:
            raise AuxFileNotFoundError(
                format_message(
                    "an aux dataset is read by tar member name",
                    where=str(self),
                    expected="'<sample key>.<part>', e.g. '000123.jpg'",
                    found=repr(key)[:200],
                )
            )
        sample_key, part = parts
        rows = self._index.query(
            "SELECT p.tar_file_id, p.content_byte_offset, p.content_byte_size, s.byte_offset FROM sample_parts p "
            "JOIN samples s ON p.tar_file_id = s.tar_file_id AND p.sample_index = s.sample_index "
            "WHERE s.sample_key = ? AND p.part_name = ?",
            (sample_key, part),
        )
        if rows is None:
            raise self._index.damaged(sqlite3.OperationalError("no sample_parts table"))
        if not rows:
            raise AuxFileNotFoundError(
                format_message(
                    "no such sample part in the aux dataset",
                    where=f"{self}: {key!r}",
                    expected=f"a sample {sample_key!r} with a part {part!r}",
                    fix="check the key the cooker builds (energon-lite info lists the dataset's parts)",
                )
            )
        tar_id, offset, size, sample_offset = rows[0]
        if not (type(tar_id) is int and 0 <= tar_id < len(self._shards)):
            raise self._index.damaged(ValueError(f"tar_file_id {tar_id!r} is not one of the {len(self._shards)} shards of .info.json"))
        if not all(type(v) is int for v in (offset, size, sample_offset)) or not BLOCK <= offset or size < 0 or not 0 <= sample_offset <= offset - BLOCK:
            raise self._index.damaged(ValueError(f"impossible byte range for {key!r}: member data at {offset!r} ({size!r} bytes), sample at {sample_offset!r}"))
        return self._shards[tar_id], offset, size, sample_offset

    def __getitem__(self, key: str) -> tuple[bytes, SourceInfo]:
        shard, offset, size, sample_offset = self._locate(key)
        path = self.base_path / shard
        # The member's header with its data, in one read: its name must be the one asked for
        # (an index whose shard was rewritten after prepare points at another member).
        block = self._read(self.base_path, path, offset - BLOCK, BLOCK + size)
        if header_name(block) != key:
            self._check_member_name(key, path, sample_offset, offset, size)
        return block[BLOCK:], SourceInfo(dataset_path=self.get_path(), index=key, shard_name=shard, file_names=(key,))

    def _check_member_name(self, key: str, path: AnyPath, sample_offset: int, offset: int, size: int) -> None:
        """The member name by a full parse from the sample's first header (long names and PAX
        headers sit in blocks of their own before the member's header)."""
        where = f"{path} member data at byte {offset}"
        data = self._read(self.base_path, path, sample_offset, offset + size - sample_offset)
        try:
            found = next((m.name for m in iter_members(data, base_offset=sample_offset, where=str(path)) if m.data_offset == offset), None)
        except TarFormatError as exc:
            found = f"no readable tar member ({str(exc).splitlines()[0]})"
        check_read_key(str(found), key, self.base_path, where=where, kind="tar member")

    def get_media_metadata(self, key: str) -> MediaMetadataBase:
        return _media_metadata(self._index, key, self, _PREPARE_DATASET_MEDIA.format(path=self.base_path))

    def __str__(self) -> str:
        return f"WebdatasetFileStore(path={self.get_path()!r})"


class DecodeFileStore(FileStoreWrapper[Any]):
    """Decodes what ``inner`` returns with ``decoder`` (by the file name's extension)."""

    def __init__(self, inner: FileStore, *, decoder: FileStoreDecoder | Any) -> None:
        super().__init__(inner)
        self.decoder = decoder

    def _decode(self, fname: str, data: bytes) -> Any:
        # Our SampleDecoder decodes one file with decode_file (its decode takes a whole sample);
        # a subclass that overrides decode(fname, data), as Energon's decoders do, is called so.
        decoder = self.decoder
        if isinstance(decoder, SampleDecoder) and type(decoder).decode is SampleDecoder.decode:
            return decoder.decode_file(fname, data)
        return decoder.decode(fname, data)

    def __getitem__(self, key: str) -> tuple[Any, SourceInfo]:
        data, source_info = self._inner[key]
        return self._decode(key, data), source_info

    def _decode_raw(self, data: bytes, **kwargs: Any) -> Any:
        return self._decode(kwargs["fname"], self._inner._decode_raw(data, **kwargs))

    def __str__(self) -> str:
        return f"DecodeFileStore(inner={self._inner}, decoder={self.decoder!r})"

