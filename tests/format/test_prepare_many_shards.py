"""prepare on a few hundred shards: what it writes does not depend on the code path taken.

Every output of a prepare (``.info.json``, ``split.yaml``, each ``.tar.idx`` and the tables of
``index.sqlite``) must be the same whether the shards were scanned in this process or by worker
processes, and whether a re-prepare updated a copy of the previous index in place, built a new
one from the rows of unchanged shards, or a fresh prepare indexed them all (only rowids may
differ: see :func:`_outputs`).  ``.tar.idx`` files and index rows are also checked against
Python's ``tarfile``, an independent reader.  A re-prepare after one shard changed scans exactly
that shard and reads no other shard's ``.tar.idx``.  A previous index that cannot be updated is
rebuilt or re-scanned, and a duplicate key is reported as a fresh prepare reports it.  Nothing
here asserts on timing.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import shutil
import sqlite3
import tarfile
from pathlib import Path, PurePosixPath

import pytest
import yaml
from energon_lite_dev.synthetic import make_png, make_text, write_tar

from megatron_energon_lite.format.prepare import discover, incremental
from megatron_energon_lite.format.media_metadata import MediaFilter
from megatron_energon_lite.format.metadata import (
    SplitConfig,
    read_split_config,
    split_config_text,
)
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.format.sqlite_index import (
    DuplicateSampleKeyError,
    SqliteIndexWriter,
)
from megatron_energon_lite.format.tar_index import index_name

SHARDS = 240
FOLDERS = ("a", "b/c", "é ü", "z")
RATIO = (8, 1, 1)


def _shard_samples(shard: int, extra: int = 0) -> list[tuple[str, dict[str, bytes]]]:
    samples = []
    for i in range(1 + shard % 5 + extra):
        key = f"s{shard:04d}_{i}" + ("_" + "L" * 110 if (shard + i) % 7 == 0 and shard % 3 else "")
        parts = {"txt": make_text((shard, i, extra), max_words=8).encode(), "json": b'{"a": 1}'}
        if i % 2:  # part names not in alphabetical order inside the tar
            parts = {"json": parts["json"], "cls": str(i).encode(), "txt": parts["txt"]}
        samples.append((key, parts))
    return samples


def _shard_path(root: Path, shard: int) -> Path:
    return root / FOLDERS[shard % len(FOLDERS)] / f"shard_{shard:04d}.tar"


def _write_shard(root: Path, shard: int, extra: int = 0) -> Path:
    path = _shard_path(root, shard)
    write_tar(path, _shard_samples(shard, extra), tar_format=("ustar", "gnu", "pax")[shard % 3])
    return path


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few hundred small shards in four folders (ustar, GNU and PAX; long names; samples
    with one to five members per part set); never prepared itself, only copied."""
    root = tmp_path_factory.mktemp("many") / "pristine"
    for shard in range(SHARDS):
        _write_shard(root, shard)
    return root


def _copy(source: Path, target: Path) -> Path:
    """A copy of the shards (no metadata, no .tar.idx), with their mtimes."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".nv-meta", "*.idx", "*.tmp-*"))
    return target


def _touch(root: Path, shard: int) -> str:
    """Rewrites one shard with one more sample; returns its name relative to ``root``."""
    return _changed(root, _write_shard(root, shard, extra=1))


def _changed(root: Path, path: Path) -> str:
    """Moves ``path``'s mtime a second on (a new mtime on any clock); returns its name."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    return path.relative_to(root).as_posix()


@pytest.fixture
def index_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """How each prepare wrote index.sqlite, in order: "build" (a new file), "update" (a copy of
    the previous one updated in place), "refused" (a previous index update_copy would not update,
    a build follows), "unusable" (it raised; every shard is scanned again for a build)."""
    writes: list[str] = []
    update_copy, init = SqliteIndexWriter.update_copy.__func__, SqliteIndexWriter.__init__

    def spy_update_copy(cls, *args, **kwargs):
        try:
            writer = update_copy(cls, *args, **kwargs)
        except Exception:
            writes.append("unusable")
            raise
        writes.append("refused" if writer is None else "update")
        return writer

    def spy_init(self, *args, **kwargs) -> None:
        writes.append("build")
        init(self, *args, **kwargs)

    monkeypatch.setattr(SqliteIndexWriter, "update_copy", classmethod(spy_update_copy))
    monkeypatch.setattr(SqliteIndexWriter, "__init__", spy_init)
    return writes


def _edit_index(root: Path, *statements: str) -> None:
    """Changes index.sqlite behind prepare's back, then records the file's new stamp as the one
    the previous run left (so that the record is trusted and the index is what is tested)."""
    index = root / ".nv-meta/index.sqlite"
    db = sqlite3.connect(index)
    try:
        for statement in statements:
            db.execute(statement)
        db.commit()
    finally:
        db.close()
    state_path = root / ".nv-meta/.lite-prepare.json"
    state = json.loads(state_path.read_text())
    stat = index.stat()
    state["index_stamp"] = [stat.st_size, str(stat.st_mtime_ns)]
    state_path.write_text(json.dumps(state))


def _outputs(root: Path) -> dict[str, object]:
    """Everything a prepare wrote that must not depend on how it got there."""
    out: dict[str, object] = {
        name: (root / ".nv-meta" / name).read_bytes() for name in (".info.json", "split.yaml")
    }
    for index in sorted(root.rglob("*.tar.idx")):
        out[index.relative_to(root).as_posix()] = index.read_bytes()
    db = sqlite3.connect(f"file:{root / '.nv-meta/index.sqlite'}?mode=ro", uri=True)
    try:
        out["schema"] = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        for table in ("samples", "sample_parts"):
            # The rows of each shard in the order they were inserted (rowid order within the
            # shard), not the rowids themselves: a re-prepare that updates the previous index in
            # place inserts a changed shard's rows after all others.  No reader depends on the
            # order across shards: ours look rows up by key or place them by (tar_file_id,
            # sample_index); Energon's order by (tar_file_id, sample_index, content_byte_offset)
            # or look up by key, and its join sorts by shard (split order), keeping a shard's
            # rows in the order it scans them.  Energon's own prepare inserts the rows in the
            # order its worker processes deliver them (batches of different shards interleave),
            # so rowid order across shards differs from run to run there as well.
            out[table] = db.execute(f"SELECT * FROM {table} ORDER BY tar_file_id, rowid").fetchall()
    finally:
        db.close()
    return out


def _leftovers(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if ".tmp-" in p.name)


def _assert_same(ours: dict[str, object], reference: dict[str, object]) -> None:
    assert sorted(ours) == sorted(reference)
    different = [name for name in reference if ours[name] != reference[name]]
    assert different == []


def _tarfile_index(tar: Path) -> tuple[list[int], list[str], list[tuple[str, int, int]]]:
    """Energon's .tar.idx offsets, the sample keys and the (part, data offset, size) of each
    member, as Python's tarfile reads the tar."""
    with tarfile.open(tar, "r:") as handle:
        members = [m for m in handle.getmembers() if m.isreg()]
        end = handle.offset
    offsets, keys, parts = [], [], []
    for member in members:
        folder, _, base = member.name.rpartition("/")
        key, _, part = base.partition(".")
        key = f"{folder}/{key}" if folder else key
        if not keys or keys[-1] != key:
            offsets.append(member.offset)
            keys.append(key)
        parts.append((part, member.offset_data, member.size))
    return offsets + [end], keys, parts


def test_workers_and_in_process_scans_write_the_same_files(pristine: Path, tmp_path: Path) -> None:
    one = _copy(pristine, tmp_path / "one")
    two = _copy(pristine, tmp_path / "two")
    prepare_dataset(one, split_ratio=RATIO, num_workers=1, progress=False)
    result = prepare_dataset(two, split_ratio=RATIO, num_workers=2, progress=False)
    assert len(result.scanned) == SHARDS and result.reused == []
    _assert_same(_outputs(two), _outputs(one))
    assert _leftovers(one) == [] and _leftovers(two) == []

    # Both agree with an independent reader: tarfile's offsets, keys and parts, in shard order.
    db = sqlite3.connect(two / ".nv-meta/index.sqlite")
    try:
        for shard_id, name in enumerate(result.shard_counts):
            offsets, keys, parts = _tarfile_index(two / name)
            idx = (two / (name + ".idx")).read_bytes()
            assert idx == b"".join(o.to_bytes(8, "little") for o in offsets), name
            rows = db.execute(
                "SELECT sample_key, sample_index, byte_offset, byte_size FROM samples WHERE tar_file_id = ? ORDER BY rowid",
                (shard_id,),
            ).fetchall()
            assert rows == [(k, i, offsets[i], offsets[i + 1] - offsets[i]) for i, k in enumerate(keys)], name
            stored = db.execute(
                "SELECT part_name, content_byte_offset, content_byte_size FROM sample_parts WHERE tar_file_id = ? ORDER BY rowid",
                (shard_id,),
            ).fetchall()
            assert stored == parts, name
    finally:
        db.close()


def test_incremental_reprepare_writes_what_a_fresh_prepare_writes(pristine: Path, tmp_path: Path, index_writes: list[str]) -> None:
    incremental = _copy(pristine, tmp_path / "incremental")
    prepare_dataset(incremental, split_ratio=RATIO, num_workers=2, progress=False)
    touched = _touch(incremental, 101)
    # A shard removed and one added: the shards after them change ids, so the copied runs shift.
    removed = _shard_path(incremental, 37)
    removed.unlink()
    removed.with_name(removed.name + ".idx").unlink()
    write_tar(incremental / "b/c/shard_0050x.tar", [("added_0", {"txt": b"new"}), ("added_1", {"txt": b"newer"})])
    result = prepare_dataset(incremental, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    assert result.scanned == ["b/c/shard_0050x.tar", touched]
    assert len(result.reused) == SHARDS - 2
    assert index_writes == ["build", "build"]  # shard ids moved: no update in place

    fresh = _copy(incremental, tmp_path / "fresh")
    prepare_dataset(fresh, split_ratio=RATIO, num_workers=1, progress=False)
    _assert_same(_outputs(incremental), _outputs(fresh))
    assert _leftovers(incremental) == []


def test_reprepare_after_touching_one_shard_scans_only_it(pristine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _copy(pristine, tmp_path / "ds")
    first = prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False)
    names = list(first.shard_counts)
    again = prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    assert again.scanned == [] and again.reused == names

    touched = _touch(root, 150)
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, *args, **kwargs):
        opened.append(os.fspath(file) if isinstance(file, (str, os.PathLike)) else repr(file))
        return real_open(file, *args, **kwargs)

    def spy_os_open(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(io, "open", spy_open)  # pathlib's read_bytes / read_text
    monkeypatch.setattr(os, "open", spy_os_open)
    result = prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    monkeypatch.undo()

    assert result.scanned == [touched]
    assert result.reused == [name for name in names if name != touched]
    assert result.shard_counts[touched] == first.shard_counts[touched] + 1
    # No .tar.idx was read: the only one touched is the new index of the changed shard.
    touched_index = (root / touched).with_name(Path(touched).name + ".idx")
    index_files = {Path(p).name for p in opened if ".tar.idx" in Path(p).name}
    assert all(name.startswith(f".{touched_index.name}.tmp-{os.getpid()}-") for name in index_files), sorted(index_files)[:5]
    # ... and the result is the one a fresh prepare gives.
    fresh = _copy(root, tmp_path / "fresh")
    prepare_dataset(fresh, split_ratio=RATIO, num_workers=1, progress=False)
    _assert_same(_outputs(root), _outputs(fresh))


@pytest.mark.parametrize(
    ("changed", "repeated"),
    [(200, 5), (3, 100)],  # the repeated key is in an earlier shard (scanned rows) or a later one (copied rows)
)
def test_failed_reprepare_with_workers_leaves_no_temporary_index(pristine: Path, tmp_path: Path, changed: int, repeated: int) -> None:
    root = _copy(pristine, tmp_path / "ds")
    prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False)
    before = _outputs(root)
    _touch(root, 150)  # another changed shard, scanned too
    key = _shard_samples(repeated)[0][0]
    write_tar(_shard_path(root, changed), _shard_samples(changed, extra=1) + [(key, {"txt": b"again"})], tar_format="gnu")
    with pytest.raises(DuplicateSampleKeyError) as info:
        prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    assert [d.key for d in info.value.duplicates] == [key]
    assert _leftovers(root) == []
    _assert_same(_outputs(root), before)


def test_in_place_update_writes_what_a_fresh_prepare_writes(pristine: Path, tmp_path: Path, index_writes: list[str]) -> None:
    root = _copy(pristine, tmp_path / "ds")
    names = list(prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False).shard_counts)
    again = prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    assert again.scanned == [] and index_writes == ["build", "update"]
    # The first and the last shard grow by a sample, one in the middle shrinks to one sample.
    changed = {names[0], names[-1], names[120]}
    for name in (names[0], names[-1]):
        _touch(root, int(name[-8:-4]))
    middle = int(names[120][-8:-4])
    write_tar(_shard_path(root, middle), _shard_samples(middle, extra=2)[-1:], tar_format="pax")
    _changed(root, _shard_path(root, middle))
    result = prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    assert index_writes == ["build", "update", "update"]
    assert set(result.scanned) == changed and len(result.reused) == SHARDS - 3
    assert result.shard_counts[names[120]] == 1

    # The updated index put the changed shards' rows last (a fresh one has them in shard order) ...
    db = sqlite3.connect(root / ".nv-meta/index.sqlite")
    try:
        first_rows = db.execute("SELECT MIN(rowid) FROM samples WHERE tar_file_id = 0").fetchone()[0]
        kept_rows = db.execute("SELECT MAX(rowid) FROM samples WHERE tar_file_id = 1").fetchone()[0]
    finally:
        db.close()
    assert first_rows > kept_rows
    # ... and holds what a fresh prepare writes.
    fresh = _copy(root, tmp_path / "fresh")
    prepare_dataset(fresh, split_ratio=RATIO, num_workers=1, progress=False)
    _assert_same(_outputs(root), _outputs(fresh))
    assert _leftovers(root) == []


def test_many_changed_shards_build_a_new_index(pristine: Path, tmp_path: Path, index_writes: list[str]) -> None:
    root = _copy(pristine, tmp_path / "ds")
    prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False)
    changed = [_changed(root, _shard_path(root, shard)) for shard in range(0, SHARDS, 3)]  # a third
    _touch(root, 100)
    result = prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    assert len(result.scanned) == len(changed) + 1 and index_writes == ["build", "build"]
    fresh = _copy(root, tmp_path / "fresh")
    prepare_dataset(fresh, split_ratio=RATIO, num_workers=1, progress=False)
    _assert_same(_outputs(root), _outputs(fresh))


@pytest.mark.parametrize(
    ("damage", "writes", "rescan"),
    [
        ("missing", ["build"], True),  # no previous index: every shard is scanned
        ("not a database", ["unusable", "build"], True),
        ("rows missing", ["unusable", "build"], True),  # a kept shard lost a row
        ("stray rows", ["update"], False),  # rows of a shard id the record does not know: deleted
        ("other index", ["refused", "build"], False),  # another layout: a new index, copied rows
        ("other table", ["refused", "build"], False),
    ],
)
def test_previous_index_that_cannot_be_updated_as_it_is(
    pristine: Path, tmp_path: Path, index_writes: list[str], caplog: pytest.LogCaptureFixture, damage: str, writes: list[str], rescan: bool
) -> None:
    root = _copy(pristine, tmp_path / "ds")
    names = list(prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False).shard_counts)
    touched = _touch(root, 150)
    index = root / ".nv-meta/index.sqlite"
    if damage == "missing":
        index.unlink()
    elif damage == "not a database":
        stat = index.stat()
        with open(index, "r+b") as f:  # the header overwritten, the size and mtime kept
            f.write(b"not an index" * 8)
        os.utime(index, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    elif damage == "rows missing":
        _edit_index(root, "DELETE FROM samples WHERE tar_file_id = 3 AND sample_index = 0")
    elif damage == "stray rows":
        _edit_index(root, "INSERT INTO samples VALUES (9999, 'stray', 0, 0, 1024)", "INSERT INTO sample_parts VALUES (9999, 0, 'txt', 512, 3)")
    elif damage == "other index":
        _edit_index(root, "CREATE INDEX idx_extra ON samples(byte_size)")
    else:
        _edit_index(root, "CREATE TABLE extra (x)", "INSERT INTO extra VALUES (1)")
    result = prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    assert index_writes == ["build", *writes]
    assert result.scanned == (names if rescan else [touched])
    assert ("the previous index cannot be read" in caplog.text) == ("unusable" in writes)
    fresh = _copy(root, tmp_path / "fresh")
    prepare_dataset(fresh, split_ratio=RATIO, num_workers=1, progress=False)
    _assert_same(_outputs(root), _outputs(fresh))
    assert _leftovers(root) == []


@pytest.mark.parametrize("case", ["kept key earlier", "kept key later", "three places", "twice in the shard"])
def test_duplicate_key_from_an_updated_shard_is_reported_as_by_a_fresh_prepare(
    pristine: Path, tmp_path: Path, index_writes: list[str], case: str
) -> None:
    root = _copy(pristine, tmp_path / "ds")
    names = list(prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False).shard_counts)
    before = _outputs(root)
    # Shards by position (tar_file_id), numbered as _write_shard numbers them.
    early, middle, late = (int(names[i][-8:-4]) for i in (10, 120, 230))

    def rewrite(shard: int, again: str) -> None:
        write_tar(_shard_path(root, shard), _shard_samples(shard, extra=1) + [(again, {"txt": b"again"})], tar_format="gnu")
        _changed(root, _shard_path(root, shard))

    kept = _shard_samples(middle)[0][0]
    if case == "kept key earlier":
        rewrite(late, kept)
    elif case == "kept key later":  # the update meets the key in the other order than a full build
        rewrite(early, kept)
    elif case == "three places":  # twice in changed shards, once in a kept one between them
        rewrite(early, kept)
        rewrite(late, kept)
    else:
        rewrite(early, _shard_samples(early, extra=1)[0][0])
    with pytest.raises(DuplicateSampleKeyError) as updated:
        prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    assert index_writes == ["build", "update"]
    assert _leftovers(root) == []
    _assert_same(_outputs(root), before)  # nothing written

    fresh = _copy(root, tmp_path / "fresh")
    with pytest.raises(DuplicateSampleKeyError) as built:
        prepare_dataset(fresh, split_ratio=RATIO, num_workers=1, progress=False)
    assert index_writes[-1] == "build"
    assert updated.value.duplicates == built.value.duplicates
    assert str(updated.value) == str(built.value) and updated.value.sample_key == built.value.sample_key
    assert len(updated.value.duplicates) == (2 if case == "three places" else 1)


def test_in_place_update_with_media_metadata(tmp_path: Path, index_writes: list[str]) -> None:
    pytest.importorskip("PIL")
    root = tmp_path / "media"

    def shard(number: int, samples: int, width: int) -> Path:
        path = root / f"m/shard_{number}.tar"
        write_tar(path, [(f"img_{number}_{i}", {"png": make_png(width + i, 3, seed=(number, i)), "txt": b"x"}) for i in range(samples)])
        return path

    for number in range(8):
        shard(number, 2, 4)
    kwargs = dict(split_ratio=RATIO, num_workers=1, progress=False, media_filter=MediaFilter.by_extension())
    prepare_dataset(root, **kwargs)
    changed = _changed(root, shard(5, 3, 9))
    result = prepare_dataset(root, force_overwrite=True, **kwargs)
    assert result.scanned == [changed] and index_writes == ["build", "update"]

    def media_rows(at: Path) -> tuple[list, list]:
        db = sqlite3.connect(at / ".nv-meta/index.sqlite")
        try:
            return (
                db.execute("SELECT * FROM media_metadata ORDER BY entry_key").fetchall(),
                db.execute("SELECT filter_id, strategy, patterns FROM media_filters").fetchall(),
            )
        finally:
            db.close()

    fresh = _copy(root, tmp_path / "fresh")
    prepare_dataset(fresh, **kwargs)
    _assert_same(_outputs(root), _outputs(fresh))
    rows, filters = media_rows(root)
    assert (rows, filters) == media_rows(fresh)
    assert {row[0] for row in rows} == {f"img_{n}_{i}.png" for n in range(8) for i in range(3 if n == 5 else 2)}
    assert json.loads(dict((row[0], row[2]) for row in rows)["img_5_2.png"])["width"] == 11


@pytest.mark.energon
def test_energon_joins_an_updated_index_as_a_fresh_one(pristine: Path, tmp_path: Path, index_writes: list[str]) -> None:
    """Energon's join orders rows by shard only (split order), and within a shard takes them in
    the order it reads the table: an update in place keeps each shard's rows in scan order."""
    join = pytest.importorskip("megatron.energon.metadataset.join_dataset_loader")
    from megatron.energon.epathlib import EPath as EnergonPath

    root = _copy(pristine, tmp_path / "ds")
    names = list(prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False).shard_counts)
    for shard in (0, 150, SHARDS - 1):
        _touch(root, shard)
    prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    assert index_writes == ["build", "update"]
    fresh = _copy(root, tmp_path / "fresh")
    total = prepare_dataset(fresh, split_ratio=RATIO, num_workers=1, progress=False).total_samples
    order = list(range(len(names)))[::-2] + list(range(len(names)))[-2::-2]  # not the index order

    def joined(primary: Path, secondary: Path, out: str) -> bytes:
        infos = [
            join.JoinedDatasetMetaInfo(
                db_path=EnergonPath(at / ".nv-meta/index.sqlite"),
                uuid=(at / ".nv-meta/index.uuid").read_text(),
                excludes=[],
                shard_name_to_info_idx={name: i for i, name in enumerate(names)},
                split_part_oder=order,
                nonmatch="error",
            )
            for at in (primary, secondary)
        ]
        join.join_multiple_indices(infos, EnergonPath(tmp_path / out))
        return (tmp_path / out).read_bytes()

    reference = joined(fresh, fresh, "fresh.idx")
    assert len(reference) == 16 + total * 2 * 24  # magic, column count, then 2 x (shard, offset, size) per row
    assert joined(root, fresh, "primary.idx") == reference
    assert joined(fresh, root, "secondary.idx") == reference


def test_split_yaml_is_kept_when_unchanged_and_reread_when_edited(pristine: Path, tmp_path: Path) -> None:
    root = _copy(pristine, tmp_path / "ds")
    prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False)
    split = root / ".nv-meta/split.yaml"
    text = split.read_text()
    assert text == yaml.safe_dump(yaml.safe_load(text), sort_keys=False, default_flow_style=False)

    # A user's exclude is kept by the next prepare, which writes the same file otherwise.
    config = read_split_config(root)
    config.exclude = ["a/shard_0000.tar", "z/shard_0003.tar/s0003_0"]
    split.write_text(split_config_text(config))
    prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    assert split.read_text() == split_config_text(config)
    _touch(root, 7)
    prepare_dataset(root, split_ratio=RATIO, num_workers=2, progress=False, force_overwrite=True)
    assert read_split_config(root).exclude == config.exclude
    assert split.read_text() == split_config_text(config)

    # Other split parts: the file is rewritten, with the exclude.
    prepare_dataset(root, split_ratio=(1, 1, 0), num_workers=2, progress=False, force_overwrite=True)
    again = read_split_config(root)
    assert again.exclude == config.exclude and again.split_parts != config.split_parts


@pytest.mark.parametrize(
    "names",
    [
        ["shards/000/shard_00000.tar", "shards/000/shard_00001.tar"],
        ["yes", "no", "null", "~", "123", "0x1f", "1e3", "2024-01-01", "-a", "a: b", "#x", "a #b", "'q'", '"q"', "[x]", "*a", "&a", "!t", "|x", ">x", "%x", "@x", "`x", " lead", "trail ", "", "a" * 200, "a b " * 40],
        ["é ü/shard.tar", "日本/シャード.tar", "tab\there.tar", "line\u2028sep.tar", "nel\x85.tar", "bom\ufeff.tar"],
        ["undecodable_\udcff.tar", "x.tar"],  # libyaml cannot encode a lone surrogate: pure-Python emitter
    ],
)
def test_split_yaml_text_is_pyyaml_safe_dump(names: list[str]) -> None:
    config = SplitConfig(split_parts={"train": names, "val": names[:1], "test": []}, exclude=names[-1:])
    expected = yaml.safe_dump({"split_parts": config.split_parts, "exclude": config.exclude}, sort_keys=False, default_flow_style=False)
    assert split_config_text(config) == expected


def test_discovery_matches_pathlib_glob(tmp_path: Path) -> None:
    root = tmp_path / "d"
    for name in ("x.tar", "a/b.tar", "a/c.tgz", ".hidden/h.tar", "a/deep/er/e.tar", "not.tarx", "a/n.TAR"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    (root / "dir.tar").mkdir()
    (root / ".nv-meta").mkdir()
    (root / ".nv-meta/m.tar").write_bytes(b"")
    (root / "link.tar").symlink_to(root / "x.tar")
    (root / "broken.tar").symlink_to(root / "missing.tar")
    (root / "linked_dir").symlink_to(root / "a")  # glob("**") does not descend into it
    expected = sorted(
        (p.relative_to(root).as_posix() for pattern in ("**/*.tar", "**/*.tgz") for p in root.glob(pattern) if p.is_file()),
        key=lambda n: Path(n).parts,
    )
    expected = [n for n in expected if not n.startswith(".nv-meta/")]
    assert discover.discover_shards(root) == expected
    assert "linked_dir/b.tar" not in expected and "link.tar" in expected


@pytest.mark.parametrize("name", ["a.tar", "d/a.tar", ".tar", "d/.tar", "..tar", "d/..tar", "d/a.b.tar", "d/a.tgz", "x.y/z.tar", "x.tar/.tar"])
def test_index_names_are_pathlib_s(name: str) -> None:
    assert index_name(name) == str(PurePosixPath(name).with_suffix(".tar.idx"))
    assert incremental._index_name(name) == index_name(name)  # the shortcut a re-prepare takes
