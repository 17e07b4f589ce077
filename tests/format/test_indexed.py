"""Megatron ``.bin/.idx`` datasets: the bytes the writer writes (checked against the layout in
research/megatron_data.md 1.1), reading them back, every validation error, and object storage."""

from __future__ import annotations

import os
import pickle
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_energon_lite.errors import ConfigError, DatasetError
from megatron_energon_lite.format.indexed import (
    DTYPE_CODES,
    MAGIC,
    IndexedReader,
    IndexedWriter,
    indexed_prefix,
    read_index,
)

# The format's dtype table (research/megatron_data.md 1.3), written out independently of the module.
FORMAT_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}


def idx_bytes(lengths, pointers, documents, *, code=8, modes=None, magic=MAGIC, version=1, sequences=None, doc_entries=None) -> bytes:
    """An .idx built from the layout table: header, int32 lengths, int64 pointers, int64 document
    indices, optional int8 modes (all little-endian)."""
    header = struct.pack(
        "<9sQBQQ",
        magic,
        version,
        code,
        len(lengths) if sequences is None else sequences,
        len(documents) if doc_entries is None else doc_entries,
    )
    body = np.asarray(lengths, "<i4").tobytes() + np.asarray(pointers, "<i8").tobytes() + np.asarray(documents, "<i8").tobytes()
    if modes is not None:
        body += np.asarray(modes, "i1").tobytes()
    return header + body


def write_pair(prefix: Path, idx: bytes, tokens=b"") -> Path:
    prefix.with_name(prefix.name + ".idx").write_bytes(idx)
    prefix.with_name(prefix.name + ".bin").write_bytes(tokens)
    return prefix


# Three documents, the second of two sequences: [10 11 12] [20] [21 22 23] [30 31] as uint16.
SEQUENCES = [[10, 11, 12], [20], [21, 22, 23], [30, 31]]
GOLDEN_LENGTHS = [3, 1, 3, 2]
GOLDEN_POINTERS = [0, 6, 8, 14]  # bytes: cumulative lengths x 2
GOLDEN_DOCUMENTS = [0, 1, 3, 4]


def write_golden(prefix: Path, *, multimodal: bool = False) -> None:
    with IndexedWriter(prefix, np.uint16, multimodal=multimodal) as writer:
        writer.add_document([10, 11, 12], modes=[5] if multimodal else None)
        writer.add_document(np.array([20, 21, 22, 23], dtype=np.int64), [1, 3], modes=[-1, 2] if multimodal else None)
        writer.add_document(np.array([30, 31], dtype=np.uint16))


def test_writer_bytes_match_the_format(tmp_path: Path) -> None:
    write_golden(tmp_path / "golden")
    expected_idx = idx_bytes(GOLDEN_LENGTHS, GOLDEN_POINTERS, GOLDEN_DOCUMENTS, code=8)
    assert len(expected_idx) == 34 + 12 * 4 + 8 * 4
    assert (tmp_path / "golden.idx").read_bytes() == expected_idx
    assert (tmp_path / "golden.bin").read_bytes() == np.array(sum(SEQUENCES, []), "<u2").tobytes()
    assert sorted(os.listdir(tmp_path)) == ["golden.bin", "golden.idx"]  # no temporary left


def test_multimodal_writer_bytes_match_the_format(tmp_path: Path) -> None:
    write_golden(tmp_path / "mm", multimodal=True)
    # Modes default to 0 for a document written without them.
    expected = idx_bytes(GOLDEN_LENGTHS, GOLDEN_POINTERS, GOLDEN_DOCUMENTS, code=8, modes=[5, -1, 2, 0])
    assert (tmp_path / "mm.idx").read_bytes() == expected
    index = read_index(tmp_path / "mm.idx")
    assert index.sequence_modes.tolist() == [5, -1, 2, 0]
    assert read_index(write_pair(tmp_path / "plain", idx_bytes([1], [0], [0, 1]), b"\0\0")).sequence_modes is None


def test_reader_on_hand_built_files(tmp_path: Path) -> None:
    tokens = np.array(sum(SEQUENCES, []), "<u2")
    prefix = write_pair(tmp_path / "hand", idx_bytes(GOLDEN_LENGTHS, GOLDEN_POINTERS, GOLDEN_DOCUMENTS), tokens.tobytes())
    reader = IndexedReader(prefix)
    assert (len(reader), reader.num_documents, reader.num_sequences, reader.num_tokens) == (3, 3, 4, 9)
    assert reader.dtype == np.dtype("uint16")
    assert reader.document_starts.tolist() == [0, 3, 7, 9]
    assert [reader.document(i).tolist() for i in range(3)] == [[10, 11, 12], [20, 21, 22, 23], [30, 31]]
    assert [reader.sequence(i).tolist() for i in range(4)] == SEQUENCES
    assert reader.read_tokens(2, 8).tolist() == [12, 20, 21, 22, 23, 30]
    assert reader.read_tokens(4, 4).tolist() == []
    assert reader.document(1, readahead_stop=9).tolist() == [20, 21, 22, 23]  # read-ahead: remote only
    assert reader.document(1).dtype == np.dtype("uint16")
    assert reader.prefix == prefix and reader.idx_path == tmp_path / "hand.idx" and reader.bin_path == tmp_path / "hand.bin"
    index = reader.index
    assert index.sequence_lengths.dtype == np.int32 and index.sequence_lengths.tolist() == GOLDEN_LENGTHS
    assert index.sequence_pointers.dtype == np.int64 and index.sequence_pointers.tolist() == GOLDEN_POINTERS
    assert index.document_indices.dtype == np.int64 and index.document_indices.tolist() == GOLDEN_DOCUMENTS
    reader.close()


def test_empty_dataset(tmp_path: Path) -> None:
    IndexedWriter(tmp_path / "empty", np.int32).finalize()
    assert (tmp_path / "empty.idx").read_bytes() == idx_bytes([], [], [0], code=4)
    assert (tmp_path / "empty.bin").read_bytes() == b""
    reader = IndexedReader(tmp_path / "empty")
    assert (len(reader), reader.num_sequences, reader.num_tokens) == (0, 0, 0)
    assert reader.document_starts.tolist() == [0]
    with pytest.raises(ConfigError, match="no documents"):
        reader.document(0)


def _documents(code: int):
    dtype = np.dtype(FORMAT_DTYPES[code])
    if dtype.kind == "f":
        value = st.floats(allow_nan=False, width=dtype.itemsize * 8)
    else:
        info = np.iinfo(dtype)
        value = st.integers(int(info.min), int(info.max))
    sequence = st.lists(value, max_size=5)
    return st.lists(st.lists(sequence, max_size=3), max_size=6)  # documents -> sequences -> tokens


@pytest.mark.parametrize("code", sorted(FORMAT_DTYPES))
def test_round_trip_every_dtype(code: int) -> None:
    dtype = np.dtype(FORMAT_DTYPES[code])
    assert DTYPE_CODES[code] == dtype

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(documents=_documents(code), cut=st.data())
    def check(documents: list[list[list]], cut) -> None:
        with tempfile.TemporaryDirectory() as folder:
            prefix = Path(folder) / "data.v1"  # a dot in the prefix: X.bin is appended, not swapped in
            with IndexedWriter(prefix, dtype) as writer:
                for sequences in documents:
                    tokens = [t for s in sequences for t in s]
                    writer.add_document(tokens, [len(s) for s in sequences])
            assert (Path(folder) / "data.v1.idx").read_bytes()[17] == code
            reader = IndexedReader(prefix)
            flat_docs = [np.array([t for s in d for t in s], dtype=dtype) for d in documents]
            stream = np.concatenate(flat_docs) if flat_docs else np.zeros(0, dtype)
            assert reader.dtype == dtype and len(reader) == len(documents)
            assert reader.num_sequences == sum(len(d) for d in documents)
            assert reader.num_tokens == len(stream)
            assert reader.document_starts.tolist() == np.cumsum([0] + [len(d) for d in flat_docs]).tolist()
            for i, expected in enumerate(flat_docs):
                got = reader.document(i)
                assert got.dtype == dtype and np.array_equal(got, expected)
            all_sequences = [s for d in documents for s in d]
            for j, expected in enumerate(all_sequences):
                assert np.array_equal(reader.sequence(j), np.array(expected, dtype=dtype))
            start = cut.draw(st.integers(0, len(stream)))
            stop = cut.draw(st.integers(start, len(stream)))
            assert np.array_equal(reader.read_tokens(start, stop), stream[start:stop])
            reader.close()

    check()


def test_read_tokens_across_many_documents(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    documents = [rng.integers(0, 2**31 - 1, size=int(rng.integers(0, 50)), dtype=np.int32) for _ in range(200)]
    with IndexedWriter(tmp_path / "many") as writer:  # default dtype int32
        for doc in documents:
            writer.add_document(doc)
    stream = np.concatenate(documents)
    reader = IndexedReader(tmp_path / "many")
    for _ in range(50):
        start = int(rng.integers(0, len(stream)))
        stop = int(rng.integers(start, min(len(stream), start + 400) + 1))
        assert np.array_equal(reader.read_tokens(start, stop), stream[start:stop])
    assert np.array_equal(reader.read_tokens(0, len(stream)), stream)


def test_reader_pickles_as_its_prefix(tmp_path: Path) -> None:
    write_golden(tmp_path / "p")
    reader = IndexedReader(tmp_path / "p")
    data = pickle.dumps(reader)
    assert len(data) < 400  # the prefix, not the arrays
    again = pickle.loads(data)
    assert again.prefix == tmp_path / "p" and again.document(1).tolist() == [20, 21, 22, 23]


def test_writer_to_a_shared_pool_reader(tmp_path: Path) -> None:
    from megatron_energon_lite.storage import LocalFilePool

    write_golden(tmp_path / "a")
    write_golden(tmp_path / "b")
    pool = LocalFilePool()
    first, second = IndexedReader(tmp_path / "a", pool=pool), IndexedReader(tmp_path / "b", pool=pool)
    first.close()  # a pool the reader did not make stays open
    assert second.document(2).tolist() == [30, 31]
    pool.close()


# --- indexed_prefix ---------------------------------------------------------------------------


def test_indexed_prefix(tmp_path: Path) -> None:
    prefix = tmp_path / "web_text_document"
    write_golden(prefix)
    assert indexed_prefix(prefix) == prefix
    assert indexed_prefix(str(prefix) + ".idx") == prefix
    assert indexed_prefix(str(prefix) + ".bin") == prefix
    assert indexed_prefix(tmp_path) is None
    assert indexed_prefix(tmp_path / "nothing") is None
    # Other formats' index files.
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "a.jsonl.idx").write_bytes(b"\0" * 16)
    assert indexed_prefix(tmp_path / "a.jsonl") is None
    assert indexed_prefix(tmp_path / "a.jsonl.idx") is None
    (tmp_path / "x.tar").write_bytes(b"")
    (tmp_path / "x.tar.idx").write_bytes(b"")
    assert indexed_prefix(tmp_path / "x.tar.idx") is None
    # A folder with an .idx beside it is a folder.
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder.idx").write_bytes(b"")
    assert indexed_prefix(tmp_path / "folder") is None
    # An .idx whose .bin is missing still names a dataset: the reader says what is missing.
    (tmp_path / "half.idx").write_bytes(b"")
    assert indexed_prefix(tmp_path / "half.idx") == tmp_path / "half"


# --- validation -------------------------------------------------------------------------------


def _error(prefix: Path) -> str:
    with pytest.raises(DatasetError) as info:
        IndexedReader(prefix)
    return str(info.value)


def test_bad_magic(tmp_path: Path) -> None:
    message = _error(write_pair(tmp_path / "m", idx_bytes([1], [0], [0, 1], magic=b"MMIDIDX\x00\x01"), b"\0\0"))
    assert "bad magic" in message and "m.idx" in message and "MMIDIDX\\x00\\x01" in message and "fix:" in message


def test_unknown_version(tmp_path: Path) -> None:
    message = _error(write_pair(tmp_path / "v", idx_bytes([1], [0], [0, 1], version=2), b"\0\0"))
    assert "version 2" in message and "expected: version 1" in message and "v.idx" in message


def test_unknown_dtype_code(tmp_path: Path) -> None:
    message = _error(write_pair(tmp_path / "d", idx_bytes([1], [0], [0, 1], code=9), b"\0\0"))
    assert "code 9" in message
    assert all(f"{code} {name}" in message for code, name in FORMAT_DTYPES.items())


def test_idx_size_does_not_match_header(tmp_path: Path) -> None:
    good = idx_bytes([2, 1], [0, 4], [0, 2])
    message = _error(write_pair(tmp_path / "s", good[:-3], b"\0" * 6))
    # 34 + 12 * 2 + 8 * 2 = 74 bytes expected (76 with one mode byte per sequence), 71 found.
    assert "74 bytes" in message and "76" in message and "found: 71 bytes" in message and "s.idx" in message


def test_hostile_header_fails_fast(tmp_path: Path) -> None:
    # 2**60 sequences claimed in a 100-byte file: refused from the sizes, nothing allocated.
    data = struct.pack("<9sQBQQ", MAGIC, 1, 8, 2**60, 2**60) + b"\0" * 66
    assert len(data) == 100
    message = _error(write_pair(tmp_path / "h", data, b""))
    assert "found: 100 bytes" in message and str(34 + 12 * 2**60 + 8 * 2**60) in message


def test_short_header(tmp_path: Path) -> None:
    message = _error(write_pair(tmp_path / "t", MAGIC + b"\x01", b""))
    assert "too short" in message and "10 bytes" in message


@pytest.mark.parametrize(
    "documents, words",
    [
        ([1, 2], "does not start at 0"),
        ([0, 1], "does not end at the sequence count"),
        ([0, 2, 1, 2], "decreases"),
    ],
)
def test_bad_document_indices(tmp_path: Path, documents: list[int], words: str) -> None:
    message = _error(write_pair(tmp_path / "x", idx_bytes([1, 1], [0, 2], documents), b"\0" * 4))
    assert words in message and "x.idx" in message


def test_decreasing_document_index_names_the_place(tmp_path: Path) -> None:
    message = _error(write_pair(tmp_path / "x", idx_bytes([1, 1, 1], [0, 2, 4], [0, 2, 1, 3]), b"\0" * 6))
    assert "document_indices[1] = 2 > document_indices[2] = 1" in message


def test_negative_length(tmp_path: Path) -> None:
    message = _error(write_pair(tmp_path / "n", idx_bytes([2, -1], [0, 4], [0, 2]), b"\0" * 2))
    assert "negative sequence length" in message and "sequence 1" in message and "found: -1" in message


def test_non_contiguous_pointers(tmp_path: Path) -> None:
    # Second sequence should start at byte 4 (2 uint16 tokens before it).
    message = _error(write_pair(tmp_path / "c", idx_bytes([2, 1], [0, 6], [0, 2]), b"\0" * 6))
    assert "not contiguous" in message and "sequence 1" in message
    assert "expected: byte offset 4" in message and "found: byte offset 6" in message


@pytest.mark.parametrize("size, word", [(16, "shorter"), (20, "longer")])
def test_bin_size_does_not_match_idx(tmp_path: Path, size: int, word: str) -> None:
    write_golden(tmp_path / "g")  # 9 uint16 tokens: 18 bytes
    (tmp_path / "g.bin").write_bytes(b"\0" * size)
    message = _error(tmp_path / "g")
    idx_size = 34 + 12 * 4 + 8 * 4
    assert word in message
    assert f"g.bin ({size} bytes)" in message and f"g.idx ({idx_size} bytes)" in message
    assert "18 bytes (9 tokens x 2 bytes" in message


def test_missing_files(tmp_path: Path) -> None:
    write_golden(tmp_path / "g")
    (tmp_path / "g.bin").unlink()
    message = _error(tmp_path / "g")
    assert "g.bin" in message and "missing" in message
    write_golden(tmp_path / "h")
    (tmp_path / "h.idx").unlink()
    message = _error(tmp_path / "h")
    assert "h.idx" in message and "missing" in message
    message = _error(tmp_path / "none")
    assert "none.idx" in message and "none.bin" in message
    with pytest.raises(DatasetError, match="i.idx"):
        read_index(tmp_path / "i")


def test_out_of_range_reads_name_the_valid_range(tmp_path: Path) -> None:
    write_golden(tmp_path / "g")
    reader = IndexedReader(tmp_path / "g")
    with pytest.raises(ConfigError, match=r"0 <= start <= stop <= 9(.|\n)*start 5, stop 10"):
        reader.read_tokens(5, 10)
    with pytest.raises(ConfigError, match="start -1"):
        reader.read_tokens(-1, 2)
    with pytest.raises(ConfigError, match="start 4, stop 3"):
        reader.read_tokens(4, 3)
    with pytest.raises(ConfigError, match=r"0 <= index <= 2(.|\n)*found: 3"):
        reader.document(3)
    with pytest.raises(ConfigError, match="found: -1"):
        reader.document(-1)
    with pytest.raises(ConfigError, match=r"0 <= index <= 3"):
        reader.sequence(4)


# --- writer errors ----------------------------------------------------------------------------


def test_writer_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="uint16"):
        IndexedWriter(tmp_path / "w", np.complex64)
    writer = IndexedWriter(tmp_path / "w", np.uint16)
    with pytest.raises(ConfigError, match=r"sum\(sequence_lengths\) == 3"):
        writer.add_document([1, 2, 3], [1, 1])
    with pytest.raises(ConfigError, match="0 <= token <= 65535(.|\n)*from 1 to 70000"):
        writer.add_document([1, 70000])
    with pytest.raises(ConfigError, match="not integers"):
        writer.add_document(np.array([1.5]))
    with pytest.raises(ConfigError, match="one-dimensional"):
        writer.add_document(np.zeros((2, 2), np.uint16))
    with pytest.raises(ConfigError, match="multimodal"):
        writer.add_document([1], modes=[0])
    with pytest.raises(ConfigError, match="length out of range"):
        writer.add_document([1, 2], [3, -1])
    writer.add_document([7, 8])
    writer.finalize()
    writer.finalize()  # a second call does nothing
    with pytest.raises(ConfigError, match="finalized"):
        writer.add_document([1])
    # The rejected documents left no trace.
    assert IndexedReader(tmp_path / "w").document(0).tolist() == [7, 8]
    with IndexedWriter(tmp_path / "m", np.uint8, multimodal=True) as mm, pytest.raises(ConfigError, match="2 integers"):
        mm.add_document([1, 2], [1, 1], modes=[1])


def test_writer_leaves_nothing_on_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with IndexedWriter(tmp_path / "x", np.uint16) as writer:
            writer.add_document([1, 2, 3])
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []


def test_writer_replaces_an_old_pair(tmp_path: Path) -> None:
    write_golden(tmp_path / "g")
    with IndexedWriter(tmp_path / "g", np.int8) as writer:
        writer.add_document([-3, 4])
    reader = IndexedReader(tmp_path / "g")
    assert reader.dtype == np.int8 and reader.document(0).tolist() == [-3, 4] and len(reader) == 1


# --- object storage ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from energon_lite_dev.s3server import LocalS3Server

    with LocalS3Server() as server:
        yield server


@pytest.fixture
def bucket(s3, tmp_path: Path, monkeypatch, request) -> str:
    from megatron_energon_lite.storage import remote

    monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(tmp_path / "cache"))
    # What configure_storage sets, undone after the test.
    monkeypatch.setitem(remote._CONFIGURED, "s3", (s3.storage_options(), None))
    s3.create_bucket("indexed")
    return f"s3://indexed/{request.node.name}"


def test_remote_reader(s3, bucket: str, tmp_path: Path) -> None:
    from megatron_energon_lite.storage import RemotePath, read_counters

    rng = np.random.default_rng(3)
    documents = [rng.integers(0, 60000, size=int(rng.integers(1, 30))).astype(np.uint16) for _ in range(20)]
    with IndexedWriter(tmp_path / "local", np.uint16) as writer:
        for doc in documents:
            writer.add_document(doc)
    for suffix in (".bin", ".idx"):
        s3.put_bytes(f"{bucket}/ds{suffix}", (tmp_path / f"local{suffix}").read_bytes())
    prefix = indexed_prefix(f"{bucket}/ds")
    assert isinstance(prefix, RemotePath) and prefix.url == f"{bucket}/ds"
    assert indexed_prefix(f"{bucket}/ds.idx") == prefix and indexed_prefix(f"{bucket}/ds.bin") == prefix
    assert indexed_prefix(f"{bucket}/other") is None
    reader = IndexedReader(f"{bucket}/ds")
    assert len(reader) == 20
    for i, doc in enumerate(documents):
        assert np.array_equal(reader.document(i), doc)
    stream = np.concatenate(documents)
    before = read_counters.requests
    assert np.array_equal(reader.read_tokens(5, len(stream) - 5), stream[5:-5])
    assert read_counters.requests - before == 1  # one ranged GET for a range over 20 documents
    again = pickle.loads(pickle.dumps(reader))
    assert np.array_equal(again.document(19), documents[19])
    # Reading documents 0..19 in order with read-ahead to their end: one GET, not twenty.
    fresh = IndexedReader(f"{bucket}/ds")
    before = read_counters.requests
    end = int(fresh.document_starts[-1])
    assert all(np.array_equal(fresh.document(i, readahead_stop=end), doc) for i, doc in enumerate(documents))
    assert read_counters.requests - before == 1


def test_remote_writer_writes_the_local_bytes(s3, bucket: str, tmp_path: Path) -> None:
    write_golden(tmp_path / "golden", multimodal=True)
    from megatron_energon_lite.storage import as_path

    write_golden(as_path(f"{bucket}/golden"), multimodal=True)
    fs = s3.filesystem()
    for suffix in (".bin", ".idx"):
        assert fs.cat_file(f"{bucket}/golden{suffix}") == (tmp_path / f"golden{suffix}").read_bytes()
    assert IndexedReader(f"{bucket}/golden").document(1).tolist() == [20, 21, 22, 23]


def test_remote_missing_bin_is_named(s3, bucket: str, tmp_path: Path) -> None:
    write_golden(tmp_path / "g")
    s3.put_bytes(f"{bucket}/g.idx", (tmp_path / "g.idx").read_bytes())
    with pytest.raises(DatasetError, match=f"{bucket}/g.bin(.|\n)*missing|missing(.|\n)*{bucket}/g.bin"):
        IndexedReader(f"{bucket}/g")
