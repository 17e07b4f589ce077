"""Megatron-LM indexed datasets (``X.bin`` + ``X.idx``, version 1): read, write, validate.

``X.idx`` is a 34-byte little-endian header (magic, version, token dtype code, sequence count S,
document-index length D+1), then ``int32[S]`` sequence lengths, ``int64[S]`` byte pointers into
``X.bin``, ``int64[D+1]`` document boundaries (in sequences) and, for multimodal data, ``int8[S]``
sequence modes.  ``X.bin`` holds the token arrays of all sequences back to back, nothing else.

Documents here are Megatron's documents (one JSON line of ``preprocess_data.py``); a document
has one or more sequences (sentences).  Since the pointers are cumulative, the token stream is
one flat array: any token range, across documents too, is one contiguous byte range of ``.bin``.
"""

from __future__ import annotations

import logging
import os
import struct
from array import array
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR
from typing import Callable, Sequence

import numpy as np

from ..errors import ConfigError, DatasetError, format_message
from ..storage import (
    AnyPath,
    LocalFilePool,
    RemoteFilePool,
    RemotePath,
    as_path,
    cached_copy,
    file_pool,
    list_files,
    local_scratch,
    remove_scratch,
    replace_with,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DTYPE_CODES",
    "MAGIC",
    "IndexedIndex",
    "IndexedReader",
    "IndexedWriter",
    "indexed_prefix",
    "read_index",
]

DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
_CODE_OF = {dtype: code for code, dtype in DTYPE_CODES.items()}
MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# magic, version, dtype code, sequence count, document-index length (documents + 1)
HEADER = struct.Struct("<9sQBQQ")
# Index arrays are checked in pieces of this many entries, so a check never doubles the memory
# a large index takes.
_CHUNK = 1 << 22
_INT32_MAX = np.iinfo(np.int32).max
_KNOWN_CODES = ", ".join(f"{code} {dtype.name}" for code, dtype in DTYPE_CODES.items())


def _idx_path(prefix: AnyPath) -> AnyPath:
    # with_name, not with_suffix: Megatron prefixes often hold dots of their own.
    return prefix.with_name(prefix.name + ".idx")


def _bin_path(prefix: AnyPath) -> AnyPath:
    return prefix.with_name(prefix.name + ".bin")


def _little_endian(dtype: np.dtype) -> np.dtype:
    # Megatron writes native order, which is little-endian on every machine it runs on.
    return dtype.newbyteorder("<")


def _is_file(path: AnyPath) -> bool:
    return path.is_file() if isinstance(path, RemotePath) else os.path.isfile(path)


def indexed_prefix(path: str | os.PathLike) -> AnyPath | None:
    """The dataset prefix if ``path`` names a Megatron indexed dataset: ``X.idx``, ``X.bin``, or
    the prefix ``X`` itself (with ``X.idx`` present next to it and ``X`` not a directory); else
    None.  Local paths take one or two stats, remote ones one or two object checks (HEAD).

    ``a.jsonl.idx`` and ``x.tar.idx`` are indices of other formats (their ``X`` is a file and there
    is no ``X.bin``), and so is ``a.jsonl`` next to ``a.jsonl.idx``: those give None.
    """
    path = as_path(path)
    if path.suffix in (".idx", ".bin"):
        prefix = path.with_name(path.name[: -len(path.suffix)])
        if not prefix.name:
            return None
        if _is_file(prefix) and not _is_file(_bin_path(prefix)):
            return None
        return prefix
    if isinstance(path, RemotePath):
        # Checks of single objects, not a listing of the parent: the parent of a dataset at the
        # top of a bucket or an msc:// profile cannot always be listed.
        if not _is_file(_idx_path(path)):
            return None
        if _is_file(path):
            return path if _is_file(_bin_path(path)) else None
        return None if path.is_dir() else path
    text = os.fspath(path)
    if not os.path.isfile(text + ".idx"):
        return None
    try:
        mode = os.stat(text).st_mode
    except FileNotFoundError:
        return path
    if S_ISDIR(mode):
        return None
    return path if os.path.isfile(text + ".bin") else None


@dataclass(frozen=True, eq=False)
class IndexedIndex:
    """The parsed ``.idx``; arrays are read-only views of the (memory-mapped) file."""

    dtype: np.dtype
    sequence_lengths: np.ndarray  # int32 (S,)
    sequence_pointers: np.ndarray  # int64 (S,), byte offsets into .bin
    document_indices: np.ndarray  # int64 (D+1,), [0] == 0, [-1] == S
    sequence_modes: np.ndarray | None  # int8 (S,) when multimodal

    @property
    def num_tokens(self) -> int:
        """Tokens in ``.bin`` (the pointers were checked to be contiguous)."""
        if not len(self.sequence_lengths):
            return 0
        return int(self.sequence_pointers[-1]) // self.dtype.itemsize + int(self.sequence_lengths[-1])


def read_index(path: str | os.PathLike) -> IndexedIndex:
    """Reads and validates ``X.idx`` (``path`` is the ``.idx`` file, or the prefix ``X``).

    Every size is checked against the file before anything is allocated, so a hostile header
    fails at once.  Raises :class:`DatasetError` on any mismatch.
    """
    path = as_path(path)
    if path.suffix != ".idx":
        path = _idx_path(path)
    stat = list_files(path.parent, [path.name]).get(path.name)
    if stat is None:
        raise _missing_error(path, "the index file")
    local = cached_copy(path, stat) if isinstance(path, RemotePath) else path
    return _parse_index(local, str(path))


def _parse_index(local: Path, where: str) -> IndexedIndex:
    size = os.path.getsize(local)
    if size < HEADER.size:
        raise DatasetError(
            format_message(
                "Megatron .idx file is too short to hold its header",
                where=where,
                expected=f"at least {HEADER.size} bytes",
                found=f"{size} bytes",
                fix="the file is truncated or not an .idx; write the dataset again",
            )
        )
    with open(local, "rb") as f:
        magic, version, code, sequences, doc_entries = HEADER.unpack(f.read(HEADER.size))
    if magic != MAGIC:
        raise DatasetError(
            format_message(
                "not a Megatron .idx file (bad magic)",
                where=where,
                expected=repr(MAGIC),
                found=repr(magic),
                fix="point at the .idx of a Megatron IndexedDataset (written by preprocess_data.py "
                "or IndexedWriter)",
            )
        )
    if version != VERSION:
        raise DatasetError(
            format_message(
                f"unsupported Megatron .idx version {version}",
                where=where,
                expected=f"version {VERSION}",
                found=f"version {version}",
                fix="write the dataset again with a writer of version 1 (Megatron-LM's or IndexedWriter)",
            )
        )
    if code not in DTYPE_CODES:
        raise DatasetError(
            format_message(
                f"unknown token dtype code {code} in Megatron .idx",
                where=where,
                expected=f"one of {_KNOWN_CODES}",
                found=f"code {code}",
                fix="the header is corrupt or from another format; write the dataset again",
            )
        )
    dtype = DTYPE_CODES[code]
    # Python ints: a hostile count cannot overflow here, and nothing is allocated before this.
    plain = HEADER.size + 12 * sequences + 8 * doc_entries
    if size == plain:
        multimodal = False
    elif sequences and size == plain + sequences:
        multimodal = True
    else:
        raise DatasetError(
            format_message(
                "Megatron .idx size does not match its header",
                where=where,
                expected=f"{plain} bytes (34 + 12 x {sequences} sequences + 8 x {doc_entries} document "
                f"index entries), or {plain + sequences} with multimodal modes",
                found=f"{size} bytes",
                fix="the file is truncated or its header corrupt; write the dataset again",
            )
        )
    if doc_entries < 1:
        raise DatasetError(
            format_message(
                "Megatron .idx has an empty document index",
                where=where,
                expected="at least one entry (the leading 0)",
                found="0 entries",
                fix="write the dataset again",
            )
        )
    mapped = np.memmap(local, dtype=np.uint8, mode="r")
    offset = HEADER.size

    def take(count: int, kind: str) -> np.ndarray:
        nonlocal offset
        item = np.dtype(kind)
        view = np.frombuffer(mapped, dtype=item, count=count, offset=offset)  # unaligned is fine
        offset += count * item.itemsize
        return view

    lengths = take(sequences, "<i4")
    pointers = take(sequences, "<i8")
    documents = take(doc_entries, "<i8")
    modes = take(sequences, "i1") if multimodal else None
    _check_lengths(lengths, pointers, dtype.itemsize, where)
    _check_documents(documents, sequences, where)
    return IndexedIndex(dtype, lengths, pointers, documents, modes)


def _first(count: int, bad: Callable[[int, int], np.ndarray]) -> int | None:
    """The first position in ``[0, count)`` where the mask ``bad(start, stop)`` is set, in pieces."""
    for start in range(0, count, _CHUNK):
        hits = np.flatnonzero(bad(start, min(count, start + _CHUNK)))
        if hits.size:
            return start + int(hits[0])
    return None


def _check_lengths(lengths: np.ndarray, pointers: np.ndarray, itemsize: int, where: str) -> None:
    negative = _first(len(lengths), lambda a, b: lengths[a:b] < 0)
    if negative is not None:
        raise DatasetError(
            format_message(
                "Megatron .idx has a negative sequence length",
                where=f"{where}, sequence {negative}",
                expected="lengths >= 0",
                found=str(int(lengths[negative])),
                fix="the index is corrupt; write the dataset again",
            )
        )
    # pointer[i] must be sum(lengths[:i]) * itemsize: the whole .bin is one flat token stream.
    total = 0
    for start in range(0, len(lengths), _CHUNK):
        piece = lengths[start : start + _CHUNK].astype(np.int64)
        ends = np.cumsum(piece)
        expected = (ends - piece + total) * itemsize
        wrong = np.flatnonzero(pointers[start : start + _CHUNK] != expected)
        if wrong.size:
            i = int(wrong[0])
            raise DatasetError(
                format_message(
                    "Megatron .idx sequence pointers are not contiguous",
                    where=f"{where}, sequence {start + i}",
                    expected=f"byte offset {int(expected[i])} (the lengths before it x {itemsize} bytes)",
                    found=f"byte offset {int(pointers[start + i])}",
                    fix="this reader needs sequences stored back to back in .bin, as Megatron's "
                    "writer stores them; rewrite the dataset (e.g. with IndexedWriter)",
                )
            )
        total += int(ends[-1]) if len(ends) else 0


def _check_documents(documents: np.ndarray, sequences: int, where: str) -> None:
    def fail(what: str, expected: str, found: str) -> DatasetError:
        return DatasetError(
            format_message(
                f"Megatron .idx document index {what}",
                where=where,
                expected=expected,
                found=found,
                fix="the index is corrupt; write the dataset again",
            )
        )

    if int(documents[0]) != 0:
        raise fail("does not start at 0", "document_indices[0] == 0", f"{int(documents[0])}")
    if int(documents[-1]) != sequences:
        raise fail(
            "does not end at the sequence count",
            f"document_indices[-1] == {sequences} (sequences)",
            f"{int(documents[-1])}",
        )
    drop = _first(len(documents) - 1, lambda a, b: documents[a + 1 : b + 1] < documents[a:b])
    if drop is not None:
        raise fail(
            "decreases",
            "non-decreasing sequence boundaries",
            f"document_indices[{drop}] = {int(documents[drop])} > "
            f"document_indices[{drop + 1}] = {int(documents[drop + 1])}",
        )


def _missing_error(path: AnyPath, what: str) -> DatasetError:
    return DatasetError(
        format_message(
            f"Megatron indexed dataset: {what} is missing",
            where=str(path),
            expected=f"{path.name} next to its {'.bin' if path.name.endswith('.idx') else '.idx'}",
            found="no such file",
            fix="name the prefix of an existing .bin/.idx pair (the path without .bin/.idx), "
            "restore the file, or write the dataset again",
        )
    )


class IndexedReader:
    """Random access to the tokens of a Megatron indexed dataset at ``prefix``.

    Reads ``.bin`` with one positional read per call (``os.pread`` on a pooled descriptor
    locally, one ranged GET remotely); a remote ``.idx`` is read from its local cached copy.
    Returned arrays are read-only views of the bytes read.  Pickles as its prefix alone.
    """

    def __init__(self, prefix: str | os.PathLike, *, pool: LocalFilePool | RemoteFilePool | None = None) -> None:
        self.prefix = as_path(prefix)
        self.idx_path = _idx_path(self.prefix)
        self.bin_path = _bin_path(self.prefix)
        found = list_files(self.prefix.parent, [self.idx_path.name, self.bin_path.name])
        idx_stat, bin_stat = found.get(self.idx_path.name), found.get(self.bin_path.name)
        if idx_stat is None and bin_stat is None:
            raise DatasetError(
                format_message(
                    "no Megatron indexed dataset at this prefix",
                    where=str(self.prefix),
                    expected=f"{self.idx_path.name} and {self.bin_path.name}",
                    found="neither file",
                    fix="name the dataset by its prefix: the path of the .bin/.idx pair without the extension",
                )
            )
        if idx_stat is None:
            raise _missing_error(self.idx_path, "the index file")
        if bin_stat is None:
            raise _missing_error(self.bin_path, "the token file")
        local = cached_copy(self.idx_path, idx_stat) if isinstance(self.idx_path, RemotePath) else self.idx_path
        self.index = _parse_index(local, str(self.idx_path))
        self.dtype = self.index.dtype
        self._file_dtype = _little_endian(self.dtype)
        self._itemsize = self.dtype.itemsize
        self.num_sequences = len(self.index.sequence_lengths)
        self.num_documents = len(self.index.document_indices) - 1
        self.num_tokens = self.index.num_tokens
        self.idx_size, self.bin_size = idx_stat.size, bin_stat.size
        expected = self.num_tokens * self._itemsize
        if bin_stat.size != expected:
            raise DatasetError(
                format_message(
                    f"Megatron .bin is {'shorter' if bin_stat.size < expected else 'longer'} than its .idx says",
                    where=f"{self.bin_path} ({bin_stat.size} bytes) and {self.idx_path} ({idx_stat.size} bytes)",
                    expected=f"{self.bin_path.name}: {expected} bytes ({self.num_tokens} tokens x "
                    f"{self._itemsize} bytes, as {self.idx_path.name} says)",
                    found=f"{self.bin_path.name}: {bin_stat.size} bytes",
                    fix="the two files do not belong together (one was replaced or truncated); "
                    "restore the matching pair or write the dataset again",
                )
            )
        documents = self.index.document_indices
        starts = np.empty(len(documents), dtype=np.int64)
        inside = documents < self.num_sequences
        starts[inside] = self.index.sequence_pointers[documents[inside]] // self._itemsize
        starts[~inside] = self.num_tokens
        starts.flags.writeable = False
        self.document_starts = starts
        self._owns_pool = pool is None
        self._pool = pool or file_pool(self.prefix)
        # LocalFilePool keys descriptors by str: convert once, not per read.
        self._bin_key = self.bin_path if isinstance(self.bin_path, RemotePath) else os.fspath(self.bin_path)

    def __len__(self) -> int:
        return self.num_documents

    def __reduce__(self):
        return (IndexedReader, (self.prefix,))

    def __repr__(self) -> str:
        return f"IndexedReader({str(self.prefix)!r}, {self.num_documents} documents, {self.dtype.name})"

    def read_tokens(self, start: int, stop: int, *, readahead_stop: int | None = None) -> np.ndarray:
        """Tokens ``[start, stop)`` of the flat stream (all sequences back to back): one read.

        ``readahead_stop`` (remote only): the end, in tokens, of the stretch about to be read in
        order; the pool then fetches a block ahead up to there instead of one range per call.
        """
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.num_tokens:
            raise ConfigError(
                format_message(
                    "token range out of bounds",
                    where=str(self.prefix),
                    expected=f"0 <= start <= stop <= {self.num_tokens} (the dataset's tokens)",
                    found=f"start {start}, stop {stop}",
                    fix="ask for a range within the dataset",
                )
            )
        if start == stop:
            return np.empty(0, dtype=self._file_dtype)
        readahead_end = None if readahead_stop is None else int(readahead_stop) * self._itemsize
        data = self._pool.read(self._bin_key, start * self._itemsize, (stop - start) * self._itemsize, readahead_end)
        return np.frombuffer(data, dtype=self._file_dtype)

    def document(self, i: int, *, readahead_stop: int | None = None) -> np.ndarray:
        """The tokens of document ``i`` (all its sequences); ``readahead_stop`` as for
        :meth:`read_tokens` (e.g. ``document_starts[j]`` when documents ``i..j-1`` come next)."""
        i = self._checked(i, self.num_documents, "document")
        start, stop = int(self.document_starts[i]), int(self.document_starts[i + 1])
        return self.read_tokens(start, stop, readahead_stop=readahead_stop)

    def sequence(self, i: int) -> np.ndarray:
        i = self._checked(i, self.num_sequences, "sequence")
        start = int(self.index.sequence_pointers[i]) // self._itemsize
        return self.read_tokens(start, start + int(self.index.sequence_lengths[i]))

    def _checked(self, i: int, count: int, what: str) -> int:
        i = int(i)
        if not 0 <= i < count:
            raise ConfigError(
                format_message(
                    f"{what} index out of range",
                    where=str(self.prefix),
                    expected=f"0 <= index <= {count - 1}" if count else f"no index (the dataset has no {what}s)",
                    found=str(i),
                    fix=f"ask for one of the dataset's {count} {what}s",
                )
            )
        return i

    def close(self) -> None:
        if self._owns_pool:
            self._pool.close()


class IndexedWriter:
    """Writes ``X.bin``/``X.idx`` (version 1) document by document.

    Tokens stream into a temporary ``.bin`` while documents are added; :meth:`finalize` moves it
    into place and then writes ``.idx`` through a temporary file and a rename, so readers never
    see an ``.idx`` before its ``.bin``.  A remote prefix is written locally and uploaded.  As a
    context manager it finalizes on success and leaves nothing behind on an exception.
    """

    def __init__(self, prefix: str | os.PathLike, dtype=np.int32, *, multimodal: bool = False) -> None:
        self.prefix = as_path(prefix)
        self.idx_path = _idx_path(self.prefix)
        self.bin_path = _bin_path(self.prefix)
        try:
            self.dtype = np.dtype(dtype)
        except TypeError:
            self.dtype = None
        if self.dtype not in _CODE_OF:
            raise ConfigError(
                format_message(
                    "unsupported token dtype for a Megatron indexed dataset",
                    where=str(self.prefix),
                    expected=f"one of {', '.join(d.name for d in DTYPE_CODES.values())}",
                    found=repr(dtype),
                    fix="pass one of these dtypes (uint16 for vocabularies below 65,536, else int32)",
                )
            )
        self.multimodal = multimodal
        self._file_dtype = _little_endian(self.dtype)
        self._lengths = array("i")  # per sequence (C int: 4 bytes wherever numpy runs)
        self._modes = array("b")
        self._documents = array("q", [0])
        self._tokens = 0
        self._finalized = False
        if not isinstance(self.prefix, RemotePath):
            self.prefix.parent.mkdir(parents=True, exist_ok=True)
        self._scratch = local_scratch(self.bin_path)  # .bin and .idx are written there, then moved
        self._bin_tmp = self._scratch / self.bin_path.name
        self._bin = open(self._bin_tmp, "wb")

    @property
    def num_documents(self) -> int:
        return len(self._documents) - 1

    @property
    def num_sequences(self) -> int:
        return len(self._lengths)

    @property
    def num_tokens(self) -> int:
        return self._tokens

    def __enter__(self) -> "IndexedWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self._discard()

    def add_document(self, tokens, sequence_lengths: Sequence[int] | None = None, modes=None) -> None:
        """Appends one document; with ``sequence_lengths`` it has several sequences (their sum
        must be ``len(tokens)``).  ``modes`` (multimodal only) gives one int8 per sequence."""
        if self._finalized:
            raise ConfigError(
                format_message("IndexedWriter was already finalized", where=str(self.prefix), fix="make a new writer")
            )
        where = f"{self.prefix}, document {self.num_documents}"
        data = self._tokens_array(tokens, where)
        if sequence_lengths is None:
            lengths = np.array([len(data)], dtype=np.int64)
            if len(data) > _INT32_MAX:
                raise ConfigError(
                    format_message(
                        "document too long for one sequence",
                        where=where,
                        expected=f"at most {_INT32_MAX} tokens per sequence",
                        found=f"{len(data)} tokens",
                        fix="split it into sequences with sequence_lengths",
                    )
                )
        else:
            lengths = np.asarray(sequence_lengths)
            if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
                raise ConfigError(
                    format_message("sequence_lengths must be a list of integers", where=where, found=repr(sequence_lengths)[:80])
                )
            lengths = lengths.astype(np.int64)
            if lengths.size and (lengths.min() < 0 or lengths.max() > _INT32_MAX):
                raise ConfigError(
                    format_message(
                        "sequence length out of range",
                        where=where,
                        expected=f"0 <= length <= {_INT32_MAX}",
                        found=f"min {int(lengths.min())}, max {int(lengths.max())}",
                    )
                )
            if int(lengths.sum()) != len(data):
                raise ConfigError(
                    format_message(
                        "sequence lengths do not add up to the document's tokens",
                        where=where,
                        expected=f"sum(sequence_lengths) == {len(data)} (len(tokens))",
                        found=f"sum {int(lengths.sum())} of {lengths.tolist()[:10]}",
                        fix="give one length per sequence, covering all tokens",
                    )
                )
        mode_values = self._mode_values(modes, len(lengths), where)
        self._bin.write(data.data if data.flags.c_contiguous else data.tobytes())
        self._lengths.frombytes(lengths.astype(np.intc).tobytes())
        if mode_values is not None:
            self._modes.frombytes(mode_values.tobytes())
        self._documents.append(len(self._lengths))
        self._tokens += len(data)

    def _tokens_array(self, tokens, where: str) -> np.ndarray:
        data = np.asarray(tokens)
        if data.ndim != 1:
            raise ConfigError(
                format_message("document tokens must be one-dimensional", where=where, found=f"shape {data.shape}")
            )
        if data.dtype == self._file_dtype or not data.size:
            return data.astype(self._file_dtype, copy=False)
        if self.dtype.kind in "iu" and not np.can_cast(data.dtype, self.dtype, "safe"):
            # A silent wrap-around (70000 into uint16) would corrupt the data: check the values.
            if data.dtype.kind not in "iub":
                raise ConfigError(
                    format_message(
                        "document tokens are not integers",
                        where=where,
                        expected=f"integer token ids for dtype {self.dtype.name}",
                        found=f"dtype {data.dtype}",
                    )
                )
            info = np.iinfo(self.dtype)
            low, high = int(data.min()), int(data.max())
            if low < info.min or high > info.max:
                raise ConfigError(
                    format_message(
                        f"token ids do not fit the dataset's dtype {self.dtype.name}",
                        where=where,
                        expected=f"{info.min} <= token <= {info.max}",
                        found=f"tokens from {low} to {high}",
                        fix="choose a wider dtype (int32 for vocabularies of 65,536 or more)",
                    )
                )
        return data.astype(self._file_dtype)

    def _mode_values(self, modes, count: int, where: str) -> np.ndarray | None:
        if not self.multimodal:
            if modes is not None:
                raise ConfigError(
                    format_message("modes given to a writer that is not multimodal", where=where, fix="pass multimodal=True")
                )
            return None
        if modes is None:
            return np.zeros(count, dtype=np.int8)
        values = np.asarray(modes)
        if values.shape != (count,) or (count and values.dtype.kind not in "iu"):
            raise ConfigError(
                format_message(
                    "modes must give one integer per sequence",
                    where=where,
                    expected=f"{count} integers",
                    found=repr(modes)[:80],
                )
            )
        if count and (values.min() < -128 or values.max() > 127):
            raise ConfigError(
                format_message("mode out of the int8 range", where=where, expected="-128 <= mode <= 127", found=repr(modes)[:80])
            )
        return values.astype(np.int8)

    def finalize(self) -> None:
        """Closes ``.bin``, moves it into place, then writes ``.idx``; a second call does nothing."""
        if self._finalized:
            return
        self._finalized = True
        try:
            self._bin.flush()
            os.fsync(self._bin.fileno())
            self._bin.close()
            idx_tmp = self._scratch / self.idx_path.name
            self._write_index(idx_tmp)
            replace_with(self.bin_path, self._bin_tmp)
            replace_with(self.idx_path, idx_tmp)
        except BaseException:
            self._discard()
            raise
        remove_scratch(self._scratch)
        logger.debug("wrote %s: %d documents, %d tokens", self.prefix, self.num_documents, self._tokens)

    def _write_index(self, path: Path) -> None:
        lengths = np.frombuffer(self._lengths, dtype=np.intc).astype("<i4", copy=False)
        ends = np.cumsum(lengths, dtype=np.int64)
        pointers = ((ends - lengths) * self.dtype.itemsize).astype("<i8", copy=False)
        documents = np.frombuffer(self._documents, dtype=np.int64).astype("<i8", copy=False)
        with open(path, "wb") as f:
            f.write(HEADER.pack(MAGIC, VERSION, _CODE_OF[self.dtype], len(lengths), len(documents)))
            f.write(lengths.tobytes())
            f.write(pointers.tobytes())
            f.write(documents.tobytes())
            if self.multimodal:
                f.write(np.frombuffer(self._modes, dtype=np.int8).tobytes())
            f.flush()
            os.fsync(f.fileno())

    def _discard(self) -> None:
        self._finalized = True
        if not self._bin.closed:
            self._bin.close()
        remove_scratch(self._scratch)
