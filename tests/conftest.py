"""Shared fixtures: tiny real datasets generated in tmp_path.

``text_dataset`` is a fresh unprepared dataset per test.  ``prepared_text``,
``prepared_captioning`` and ``prepared_blend`` are prepared datasets built once per session
(``energon_lite_dev.prepared`` says what they hold; import the counts from there) and shared by
every test that asks for them: they are READ-ONLY.  A test must not write into them,
not even next to them (a YAML beside the dataset, a prepare with ``force_overwrite``, a deleted
shard): copy one (``shutil.copytree(prepared_text, tmp_path / "copy")``) or write the YAML into
``tmp_path`` with absolute paths.  After every test the files of the shared datasets built so
far are compared with how they were built (names, sizes, modification times); a test that
changed them fails at teardown, naming what changed.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from energon_lite_dev.prepared import build_prepared_blend, build_prepared_captioning, build_prepared_text
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite import policy


def tar_members(path: Path) -> list[tarfile.TarInfo]:
    """What Python's tarfile sees in a tar: the oracle for offsets and names."""
    with tarfile.open(path, "r:") as tar:
        return tar.getmembers()


def add_raw_member(tar: tarfile.TarFile, name: str, data: bytes = b"", *, kind: bytes = tarfile.REGTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def text_samples(prefix: str, count: int, *, start: int = 0) -> list[tuple[str, dict[str, bytes]]]:
    return [
        (f"{prefix}{i:06d}", {"txt": f"text of {prefix}{i}".encode(), "json": f'{{"i": {i}, "tags": ["a", "b"]}}'.encode()})
        for i in range(start, start + count)
    ]


@pytest.fixture
def text_dataset(tmp_path: Path) -> Path:
    """Four shards of five text samples each (ustar, gnu, pax, pax with long keys); not prepared."""
    root = tmp_path / "text_ds"
    formats = ["ustar", "gnu", "pax", "pax"]
    for shard, fmt in enumerate(formats):
        prefix = f"s{shard}_" if shard < 3 else "long/" * 25 + f"s{shard}_"
        write_tar(root / f"shards/shard_{shard:03d}.tar", text_samples(prefix, 5), tar_format=fmt)
    return root


# --- shared prepared datasets (read-only) --------------------------------------------------------

#: The shared datasets built so far: root -> its files as built (see ``_files``).
_SHARED: dict[Path, dict[str, tuple]] = {}


def _files(root: Path) -> dict[str, tuple]:
    """Every file and folder under ``root``: relative name -> (size, mtime_ns, mode)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            found[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return found


def _shared(root: Path) -> Path:
    _SHARED[root] = _files(root)
    return root


@pytest.fixture(autouse=True)
def _log_once_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages logged once per process are logged once per test: a test that checks one does
    not depend on which test ran before it."""
    monkeypatch.setattr(policy, "_logged", set())


@pytest.fixture(autouse=True)
def _shared_datasets_stay_unchanged():
    """Fails the test (at teardown) that changed a shared prepared dataset."""
    yield
    for root, built in _SHARED.items():
        now = _files(root)
        if now == built:
            continue
        _SHARED[root] = now  # blame this test only
        added = sorted(set(now) - set(built))
        removed = sorted(set(built) - set(now))
        changed = sorted(name for name in set(now) & set(built) if now[name] != built[name])
        pytest.fail(
            f"this test changed the shared read-only dataset {root} (tests/conftest.py): "
            f"added {added[:5]}, removed {removed[:5]}, changed {changed[:5]}; "
            "copy it into tmp_path (shutil.copytree) to change it, or write YAMLs into tmp_path with absolute paths",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def prepared_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared ``TextSample`` dataset (``energon_lite_dev.prepared.PREPARED_TEXT``), shared by
    the session: read-only."""
    return _shared(build_prepared_text(tmp_path_factory.mktemp("prepared_text") / "text"))


@pytest.fixture(scope="session")
def prepared_captioning(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared ``CaptioningSample`` dataset with train and val splits
    (``energon_lite_dev.prepared.PREPARED_CAPTIONING``), shared by the session: read-only."""
    return _shared(build_prepared_captioning(tmp_path_factory.mktemp("prepared_captioning") / "captions"))


@pytest.fixture(scope="session")
def prepared_blend(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The path of a metadataset YAML (``blend.yaml``) blending two prepared ``TextSample``
    datasets ``a`` and ``b`` beside it (``energon_lite_dev.prepared.PREPARED_BLEND_*``), shared by
    the session: read-only, the folder of the YAML too."""
    path = build_prepared_blend(tmp_path_factory.mktemp("prepared_blend"))
    _shared(path.parent)
    return path


@pytest.fixture
def small_disk(tmp_path: Path):
    """An 8 MiB filesystem (tmpfs); skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
