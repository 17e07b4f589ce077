"""Fuzzing the tar and index layer with corrupt inputs (issue 13).

A few hundred generated corruptions of small valid tars (byte flips, truncations, header-field
mutations, hand-made PAX records), of ``.tar.idx`` files, of ``.nv-meta`` files, of
``index.sqlite``, of the split cache (which must never serve other shards than ``split.yaml``
names), of metadataset YAML (generated blend trees, alias bombs, deep nesting, byte flips), of
the ``index.sqlite`` rows ``aux:`` member reads go by, and of saved loader states (JSON values
replaced or removed anywhere, restored with ``restore_state_rank`` / ``restore_state_global``).
Whatever the damage, reading must finish and either succeed or raise one of
our own errors (an :class:`EnergonLiteError`) whose message names the file; never hang, never
raise a bare ``ValueError``/``MemoryError``/``sqlite3`` error, never take the machine's memory.

The examples run in a child process whose address space is capped (``RLIMIT_AS``) a little above
what it holds after its imports, and each example under an alarm, so that a missing bound or an
endless loop fails this test instead of the machine or the suite.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

EXTRA_MEMORY = 1 << 30  # what the child may allocate beyond its imports
EXAMPLE_ALARM_S = 20  # a hang detector, not a timing assertion: a healthy example takes milliseconds
OK_MARKER = "fuzz: all targets passed"


@pytest.mark.timeout(300)
def test_corrupt_inputs_raise_our_errors_under_a_memory_limit(tmp_path: Path) -> None:
    child = subprocess.run(
        [sys.executable, __file__, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
    )
    output = (child.stdout[-6000:] + "\n" + child.stderr[-6000:]).strip()
    assert child.returncode == 0 and OK_MARKER in child.stdout, output


# --- the child process ------------------------------------------------------------------------


class Hang(Exception):
    """An example ran past the alarm: the reader loops (or is pathologically slow)."""


def _alarm(signum, frame):
    raise Hang(f"example still running after {EXAMPLE_ALARM_S} s")


def _cap_memory() -> str:
    import resource

    try:
        with open("/proc/self/status") as f:
            size_kib = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        return "no memory cap (no /proc/self/status)"
    limit = size_kib * 1024 + EXTRA_MEMORY
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return f"address space capped at {limit >> 20} MiB"


def _tar(members: list[tuple[str, bytes]], fmt: int, **kwargs) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt, **kwargs) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _base_tars() -> dict[str, bytes]:
    plain = [(f"k{i}.{part}", f"{part} {i}".encode() * (1 + 60 * i)) for i in range(3) for part in ("txt", "json")]
    long = [("dir/" * 30 + f"k{i}.txt", b"x" * 700) for i in range(2)] + [("ü_key.txt", b"y")]
    return {
        "ustar": _tar(plain, tarfile.USTAR_FORMAT),
        "gnu": _tar(long, tarfile.GNU_FORMAT),
        "pax": _tar(long + plain[:2], tarfile.PAX_FORMAT, pax_headers={"comment": "fuzz"}),
    }


def _header_offsets(data: bytes) -> list[int]:
    """Every header block of a valid tar: extended headers and the members' own headers."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        found = {0}
        for member in tar.getmembers():
            found |= {member.offset, member.offset_data - 512}
    return sorted(found)


_FIELDS = {"name": (0, 100), "size": (124, 12), "checksum": (148, 8), "type": (156, 1), "magic": (257, 6), "prefix": (345, 155)}
_SPECIAL_SIZES = [
    b"-0000001000\0", b"\xff" * 12, b"\x80" + b"\xff" * 11, b"\x80" + b"\0" * 10 + b"\x01", b"77777777777\0",
    b"00000000000\0", b"\0" * 12, b" " * 12, b"0x10\0", b"1_000\0", b"+0000001000\0",
]


def _fix_checksum(data: bytearray, offset: int) -> None:
    header = data[offset : offset + 512]
    if len(header) == 512:
        header[148:156] = b" " * 8
        data[offset + 148 : offset + 156] = b"%06o\0 " % sum(header)


def json_places(value, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON value, as a path of keys and indexes."""
    found = [prefix]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += json_places(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            found += json_places(inner, (*prefix, i))
    return found


def _check_error(exc: BaseException, names: tuple[str, ...]) -> None:
    from megatron_energon_lite.errors import EnergonLiteError

    if isinstance(exc, Hang) or not isinstance(exc, EnergonLiteError):
        raise exc
    message = str(exc)
    if not any(name in message for name in names):
        raise AssertionError(f"error names none of {names}:\n{message}") from exc


def _run_targets(workdir: Path) -> None:
    import numpy as np
    from energon_lite_dev.synthetic import write_tar
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from megatron_energon_lite.cli.lint import check_indexes
    from megatron_energon_lite.errors import EnergonLiteError
    from megatron_energon_lite.format.metadata import resolve_split
    from megatron_energon_lite.format.metadataset import load_blend_plan
    from megatron_energon_lite.format.prepare import prepare_dataset
    from megatron_energon_lite.format.split_cache import SPLIT_CACHE, cached_split
    from megatron_energon_lite.format.split_reader import SplitReader
    from megatron_energon_lite.format.tar_reader import (
        group_samples,
        iter_members,
        parse_sample,
    )

    def fuzz_settings(examples: int):
        return settings(
            max_examples=examples,
            deadline=None,  # hangs are caught by the alarm; the machine is shared and slow
            database=None,
            derandomize=True,  # the same examples on every run
            phases=[Phase.explicit, Phase.generate],  # no shrinking: a hang would be retried for long
            suppress_health_check=list(HealthCheck),
        )

    bases = _base_tars()
    headers = {kind: _header_offsets(data) for kind, data in bases.items()}

    def guarded(fn, names):
        signal.alarm(EXAMPLE_ALARM_S)
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - classified by _check_error
            _check_error(exc, names)
        finally:
            signal.alarm(0)

    # --- 1. tar bytes -> members, samples --------------------------------------------------------
    @fuzz_settings(300)
    @given(data=st.data())
    def fuzz_tar_bytes(data) -> None:
        kind = data.draw(st.sampled_from(sorted(bases)), label="base")
        buf = bytearray(bases[kind])
        mutation = data.draw(st.sampled_from(["field", "field", "field", "flips", "truncate", "field+truncate"]), label="mutation")
        if "field" in mutation:
            offset = data.draw(st.sampled_from(headers[kind]), label="header")
            field = data.draw(st.sampled_from(["size", "size", "size", *sorted(_FIELDS)]), label="field")
            start, length = _FIELDS[field]
            special = _SPECIAL_SIZES if field == "size" else [b"\0" * length, b"\xff" * length, b"x", b"g", b"L", b"K", b"5"]
            value = data.draw(st.sampled_from(special) | st.binary(min_size=1, max_size=length), label="value")[:length]
            buf[offset + start : offset + start + len(value)] = value
            if data.draw(st.booleans(), label="fix checksum"):
                _fix_checksum(buf, offset)
        if mutation == "flips":
            for position, xor in data.draw(st.lists(st.tuples(st.integers(0, len(buf) - 1), st.integers(1, 255)), min_size=1, max_size=6), label="flips"):
                buf[position] ^= xor
        if "truncate" in mutation:
            del buf[data.draw(st.integers(0, len(buf)), label="cut at") :]
        checksums = data.draw(st.booleans(), label="verify checksums")

        def read() -> None:
            list(group_samples(iter_members(bytes(buf), where="fuzz.tar", verify_checksums=checksums)))
            parse_sample(bytes(buf), where="fuzz.tar")

        guarded(read, ("fuzz.tar",))

    # --- 2. PAX records --------------------------------------------------------------------------
    record = st.tuples(
        st.integers(-12, 12) | st.sampled_from([-10**6, 10**6]),  # error in the length field
        st.sampled_from(["path", "size", "linkpath", "mtime", "x", ""]),
        st.binary(max_size=30),
        st.booleans(),  # write the length as digits, or as junk
    )

    @fuzz_settings(200)
    @given(records=st.lists(record, min_size=1, max_size=4), pad=st.integers(0, 20))
    def fuzz_pax(records, pad) -> None:
        raw = b""
        for delta, key, value, digits in records:
            body = b" " + key.encode() + b"=" + value + b"\n"
            length = len(body) + len(str(len(body) + 3))
            raw += (str(length + delta).encode() if digits else b"x" + value[:3]) + body
        raw += b"\0" * pad
        pax = tarfile.TarInfo("././@PaxHeader")
        pax.type, pax.size = tarfile.XHDTYPE, len(raw)
        buf = pax.tobuf(tarfile.USTAR_FORMAT) + raw + b"\0" * (-len(raw) % 512) + bases["ustar"]
        guarded(lambda: list(iter_members(buf, where="fuzz.tar", verify_checksums=True)), ("fuzz.tar",))

    # --- 3. a prepared dataset: .tar.idx, tars, .nv-meta files --------------------------------------
    root = workdir / "ds"
    for shard, fmt in enumerate(["ustar", "pax"]):
        write_tar(root / f"shards/{shard}.tar", [(f"s{shard}_{i}", {"txt": b"t" * (100 * i), "json": b"{}"}) for i in range(5)], tar_format=fmt)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text("sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n")
    pristine = {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    pristine_names = [p.relative_to(root).as_posix() for p in pristine if p.suffix == ".tar"]
    mtimes = {p: p.stat().st_mtime_ns for p in pristine}

    def restore(path: Path | None = None, content: bytes | None = None) -> None:
        """Puts the prepared files back (or ``content`` into ``path``) with their old mtimes, so
        that prepare's record of them still matches."""
        for each in [path] if path is not None else list(pristine):
            each.write_bytes(pristine[each] if content is None else content)
            os.utime(each, ns=(mtimes[each], mtimes[each]))
        for extra in root.rglob("*"):
            if path is None and extra.is_file() and extra not in pristine:
                extra.unlink()

    def read_dataset() -> None:
        check_indexes(root)
        reader = SplitReader(root, "train")
        try:
            for index in range(len(reader)):
                reader.read(index)
        finally:
            reader.close()

    idx = root / "shards/0.tar.idx"
    offsets = np.frombuffer(pristine[idx], dtype="<u8")

    @fuzz_settings(150)
    @given(data=st.data())
    def fuzz_index_and_tar(data) -> None:
        restore()
        new = offsets.copy()
        for position, value in data.draw(st.lists(st.tuples(st.integers(0, len(new) - 1), st.integers(0, 2**64 - 1) | st.integers(0, 8192)), max_size=3), label="offsets"):
            new[position] = value
        raw = new.tobytes()
        if data.draw(st.booleans(), label="cut index"):
            raw = raw[: data.draw(st.integers(0, len(raw)), label="index length")]
        idx.write_bytes(raw)
        tar = root / "shards/0.tar"
        content = bytearray(pristine[tar])
        for position, xor in data.draw(st.lists(st.tuples(st.integers(0, len(content) - 1), st.integers(1, 255)), max_size=3), label="tar flips"):
            content[position] ^= xor
        tail = data.draw(st.sampled_from(["keep", "cut", "grow"]), label="tar length")
        if tail == "cut":
            del content[data.draw(st.integers(0, len(content)), label="tar length") :]
        elif tail == "grow":
            content += data.draw(st.binary(min_size=1, max_size=3000), label="appended")
        tar.write_bytes(bytes(content))
        guarded(read_dataset, ("shards/0.tar",))

    info, split = root / ".nv-meta/.info.json", root / ".nv-meta/split.yaml"

    @fuzz_settings(100)
    @given(data=st.data())
    def fuzz_meta_files(data) -> None:
        restore()
        target = data.draw(st.sampled_from([info, split]), label="file")
        content = bytearray(pristine[target])
        for position, xor in data.draw(st.lists(st.tuples(st.integers(0, len(content) - 1), st.integers(1, 255)), min_size=1, max_size=4), label="flips"):
            content[position] ^= xor
        target.write_bytes(bytes(content))
        guarded(read_dataset, (str(root),))

    sqlite_path = root / ".nv-meta/index.sqlite"

    @fuzz_settings(40)
    @given(data=st.data())
    def fuzz_sqlite(data) -> None:
        restore()
        content = bytearray(pristine[sqlite_path])
        for position, xor in data.draw(st.lists(st.tuples(st.integers(0, len(content) - 1), st.integers(1, 255)), min_size=1, max_size=50), label="flips"):
            content[position] ^= xor
        restore(sqlite_path, bytes(content))  # same size and mtime: prepare reuses it, or must notice

        def reprepare() -> None:
            prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, force_overwrite=True, num_workers=1)
            read_dataset()

        guarded(reprepare, (str(root),))

    def flipped(data, raw: bytes) -> bytes:
        """``raw`` with one to four bytes xor-ed."""
        out = bytearray(raw)
        for position, xor in data.draw(st.lists(st.tuples(st.integers(0, len(out) - 1), st.integers(1, 255)), min_size=1, max_size=4), label="flips"):
            out[position] ^= xor
        return bytes(out)

    # --- 4. the split cache: whatever it says, the loader serves what split.yaml says -------------
    cache_path = root / ".nv-meta" / SPLIT_CACHE
    restore()
    expected = resolve_split(root, "train")
    json_value = st.recursive(
        st.none() | st.booleans() | st.integers(-3, 10**20) | st.text(max_size=12) | st.sampled_from(sorted(pristine_names)),
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=25,
    )

    @fuzz_settings(150)
    @given(data=st.data())
    def fuzz_split_cache(data) -> None:
        restore()
        cache = json.loads(pristine[cache_path])
        train = cache["splits"]["train"]
        kind = data.draw(st.sampled_from(["value", "runs", "counts", "deep", "bytes"]), label="kind")
        shards = sum(run[1] for run in train["counts"])
        if kind == "value":  # any JSON value at any key the cache has
            holder = data.draw(st.sampled_from([cache, train]), label="holder")
            key = data.draw(st.sampled_from(sorted(holder)), label="key")
            holder[key] = data.draw(json_value, label="value")
        elif kind == "runs":  # counts for more or fewer shards than the split has, zeros, negatives
            train["counts"] = data.draw(st.lists(st.lists(st.integers(-1, 7), min_size=2, max_size=2), max_size=6), label="runs")
        elif kind == "counts":  # one count per shard, any of them wrong
            train["counts"] = [[count, 1] for count in data.draw(st.lists(st.integers(-1, 7), min_size=shards, max_size=shards), label="counts")]
        text = json.dumps(cache)
        if kind == "deep":
            depth = data.draw(st.integers(150, 20_000), label="depth")
            text = text.replace('"unknown_excludes": []', '"unknown_excludes": ' + "[" * depth + "]" * depth, 1)
        cache_path.write_bytes(flipped(data, text.encode()) if kind == "bytes" else text.encode())

        def read() -> None:
            served = cached_split(root, "train", None)
            if served is None:
                return  # ignored: the files are read
            assert served.names == expected.names and served.excluded_keys == expected.excluded_keys, (served.names, expected.names)
            if served.counts != expected.counts:  # a wrong count is caught when its shard is read
                reader = SplitReader(root, "train", split=served)
                try:
                    for index in range(len(reader)):
                        reader.read(index)
                except EnergonLiteError as exc:
                    assert "shards/" in str(exc), str(exc)
                    return
                finally:
                    reader.close()
                raise AssertionError(f"counts {served.counts} served without an error (the files say {expected.counts})")

        guarded(read, (str(root),))

    # --- 5. metadataset YAML: generated trees and text-level bombs --------------------------------
    yaml_path = workdir / "blend.yaml"
    header = "__module__: megatron.energon\n__class__: MetadatasetV2\n"
    scalar = st.none() | st.booleans() | st.integers(-5, 10) | st.floats(allow_nan=True) | st.text(max_size=8)
    leaf = st.fixed_dictionaries(
        {"path": st.sampled_from([str(root), "missing", "", "../..", str(yaml_path)]) | scalar},
        optional={
            "weight": scalar | st.integers(0, 5),
            "subflavors": json_value,
            "split_part": st.sampled_from(["train", "val", "nope"]) | scalar,
            "subset": st.dictionaries(st.sampled_from(["range", "absolute_range", "x"]), st.lists(scalar | st.sampled_from(["10%", "0%", "100%"]), max_size=3), max_size=2),
            "shuffle_over_epochs_multiplier": scalar,
            "bogus": scalar,
        },
    )
    tree = st.recursive(leaf, lambda inner: st.fixed_dictionaries({"blend": st.lists(inner, max_size=3)}) | st.fixed_dictionaries({"blend_epochized": st.lists(inner, max_size=3)}), max_leaves=6)

    @fuzz_settings(150)
    @given(data=st.data())
    def fuzz_metadataset_yaml(data) -> None:
        import yaml

        kind = data.draw(st.sampled_from(["tree", "tree", "aliases", "deep", "bytes"]), label="kind")
        text = header + yaml.safe_dump({"splits": {"train": data.draw(tree, label="tree")}})
        if kind == "aliases":  # anchors of anchors: a few hundred bytes, width**levels values
            levels, width = data.draw(st.integers(2, 14), label="levels"), data.draw(st.integers(2, 9), label="width")
            lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
            text = header + f"splits:\n  train:\n    path: {root}\n    subflavors:\n" + "\n".join("      " + line for line in lines) + "\n"
        elif kind == "deep":
            depth = data.draw(st.integers(150, 5000), label="depth")
            text = header + f"splits:\n  train:\n    path: {root}\n    subflavors: " + "{a: " * depth + "1" + "}" * depth + "\n"
        yaml_path.write_bytes(flipped(data, text.encode()) if kind == "bytes" else text.encode())

        def read() -> None:
            plan = load_blend_plan(yaml_path, "train", training=True)
            json.dumps([leaf.subflavors for leaf in plan.leaves], default=str)  # what a saved state holds

        guarded(read, (str(yaml_path), str(root)))

    # --- 6. aux: reads by member name through a damaged index.sqlite or a rewritten tar ---------------
    from megatron_energon_lite.cache import WebdatasetFileStore

    restore()
    members = [f"s{shard}_{i}.{part}" for shard in range(2) for i in range(5) for part in ("txt", "json")]
    columns = ["p.content_byte_offset", "p.content_byte_size", "p.tar_file_id", "p.part_name", "s.sample_key", "s.byte_offset"]
    column_values = st.integers(-(2**63), 2**63 - 1) | st.integers(-2, 9000) | st.sampled_from(["txt", "json", "", "s0_1", None, 1.5])

    @fuzz_settings(120)
    @given(data=st.data())
    def fuzz_aux_store(data) -> None:
        restore()
        import sqlite3

        db = sqlite3.connect(sqlite_path)
        try:
            for _ in range(data.draw(st.integers(0, 3), label="row changes")):
                column = data.draw(st.sampled_from(columns), label="column")
                table, name = ("sample_parts", column[2:]) if column.startswith("p.") else ("samples", column[2:])
                db.execute(f"UPDATE {table} SET {name} = ? WHERE rowid = ?", (data.draw(column_values, label="value"), data.draw(st.integers(1, 20), label="row")))
            db.commit()
        finally:
            db.close()
        tar = root / "shards/0.tar"
        content = bytearray(pristine[tar])
        for position, xor in data.draw(st.lists(st.tuples(st.integers(0, len(content) - 1), st.integers(1, 255)), max_size=3), label="tar flips"):
            content[position] ^= xor
        tar.write_bytes(bytes(content))
        names = data.draw(st.lists(st.sampled_from(members) | st.text(max_size=12), min_size=1, max_size=6), label="names")

        def read_members() -> None:
            store = WebdatasetFileStore(root)
            for name in names:
                try:
                    store[name]
                except KeyError as exc:  # AuxFileNotFoundError: one sample's problem; also ours
                    _check_error(exc, (str(root),))

        guarded(read_members, (str(root),))

    # --- 7. checkpoints: hypothesis-made JSON states fed to restore_state_rank / _global ---------------
    from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset

    restore()

    def make_loader():
        config = WorkerConfig(rank=0, world_size=1, num_workers=0)
        return get_savable_loader(get_train_dataset(root, worker_config=config, batch_size=2, shuffle_buffer_size=3, max_samples_per_sequence=2))

    running = make_loader()
    for _, _batch in zip(range(3), running):
        pass
    saved_state = json.loads(json.dumps(running.save_state_rank()))
    del running
    places = json_places(saved_state)
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=10,
    )

    @fuzz_settings(150)
    @given(data=st.data())
    def fuzz_states(data) -> None:
        state = json.loads(json.dumps(saved_state))
        for _ in range(data.draw(st.integers(1, 3), label="changes")):
            path = data.draw(st.sampled_from(places), label="place")
            target = state
            for part in path[:-1]:
                target = target[part] if isinstance(target, (dict, list)) and (part in target if isinstance(target, dict) else part < len(target)) else None
            if not path or not isinstance(target, (dict, list)) or (isinstance(target, list) and path[-1] >= len(target)):
                continue
            if data.draw(st.booleans(), label="delete") and isinstance(target, dict):
                target.pop(path[-1], None)
            else:
                target[path[-1]] = data.draw(json_values, label="value")
        as_global = data.draw(st.booleans(), label="global")

        def restore_and_read() -> None:
            loader = make_loader()
            if as_global:
                loader.restore_state_global([state])
            else:
                loader.restore_state_rank(state)
            for _, _batch in zip(range(3), loader):
                pass

        guarded(restore_and_read, ("$", "state", "restore"))

    for target in (fuzz_tar_bytes, fuzz_pax, fuzz_index_and_tar, fuzz_meta_files, fuzz_sqlite, fuzz_split_cache, fuzz_metadataset_yaml, fuzz_aux_store, fuzz_states):
        started = time.monotonic()
        target()
        print(f"{target.__name__}: ok in {time.monotonic() - started:.1f} s", flush=True)


def main(workdir: Path) -> None:
    import logging

    logging.disable(logging.WARNING)  # prepare logs each fallback; the output would drown the report
    # Everything is imported before the cap: torch alone maps a lot of address space.
    import hypothesis  # noqa: F401

    import megatron_energon_lite.cli.lint  # noqa: F401
    import megatron_energon_lite.format.prepare  # noqa: F401
    import megatron_energon_lite.loader.api  # noqa: F401 - the checkpoint target's loader (torch)

    print(_cap_memory(), flush=True)
    signal.signal(signal.SIGALRM, _alarm)
    _run_targets(workdir)
    print(OK_MARKER, flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
