"""Shared fixtures: tiny real datasets generated in tmp_path.

``text_dataset`` is a fresh unprepared dataset per test.  ``prepared_text``,
``prepared_captioning`` and ``prepared_blend`` are prepared datasets built once per session
(``PREPARED_TEXT``, ``PREPARED_CAPTIONING`` and ``PREPARED_BLEND_*`` say what they hold) and
shared by every test that asks for them: they are READ-ONLY.  A test must not write into them,
not even next to them (a YAML beside the dataset, a prepare with ``force_overwrite``, a deleted
shard): copy one (``shutil.copytree(prepared_text, tmp_path / "copy")``) or write the YAML into
``tmp_path`` with absolute paths.  After every test the files of the shared datasets built so
far are compared with how they were built (names, sizes, modification times); a test that
changed them fails at teardown, naming what changed.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import (
    CAPTIONING_SAMPLE_YAML,
    generate_captioning_dataset,
    prepared_text_dataset,
    write_tar,
    write_text_blend,
)


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

#: ``prepared_text``: ``prepared_text_dataset`` arguments; 3 shards x 37 ``TextSample`` of 1-8
#: words, keys ``{shard:04d}_{index:06d}``, all in the train split (111 samples).
PREPARED_TEXT = dict(num_shards=3, samples_per_shard=37, min_words=1, max_words=8, seed=3)
#: ``prepared_captioning``: ``generate_captioning_dataset`` arguments; 6 shards x 9
#: ``CaptioningSample`` (8x6 JPEG, caption), keys ``{shard:04d}_{index:06d}``, split
#: ``PREPARED_CAPTIONING_SPLIT`` by shards: 4 train (36 samples), 2 val (18).
PREPARED_CAPTIONING = dict(num_shards=6, samples_per_shard=9, image_size=(8, 6), seed=3)
PREPARED_CAPTIONING_SPLIT = (4, 2, 0)
#: ``prepared_blend``: ``write_text_blend`` arguments; ``TextSample`` datasets ``a`` (24 samples)
#: and ``b`` (39) of uneven shards, keys ``sized_keys(name, sizes)``, blended 1:2 in the train split.
PREPARED_BLEND_SIZES = {"a": [7, 5, 9, 3], "b": [11, 4, 8, 6, 10]}
PREPARED_BLEND_WEIGHTS = {"a": 1, "b": 2}

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
    """A prepared ``TextSample`` dataset (``PREPARED_TEXT``), shared by the session: read-only."""
    return _shared(prepared_text_dataset(tmp_path_factory.mktemp("prepared_text") / "text", **PREPARED_TEXT))


@pytest.fixture(scope="session")
def prepared_captioning(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared ``CaptioningSample`` dataset with train and val splits (``PREPARED_CAPTIONING``),
    shared by the session: read-only."""
    from megatron_energon_lite.format.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("prepared_captioning") / "captions"
    generate_captioning_dataset(root, **PREPARED_CAPTIONING)
    prepare_dataset(root, split_ratio=PREPARED_CAPTIONING_SPLIT, progress=False, num_workers=1, dataset_yaml=CAPTIONING_SAMPLE_YAML)
    return _shared(root)


@pytest.fixture(scope="session")
def prepared_blend(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The path of a metadataset YAML (``blend.yaml``) blending two prepared ``TextSample``
    datasets ``a`` and ``b`` beside it (``PREPARED_BLEND_*``), shared by the session: read-only,
    the folder of the YAML too."""
    path = write_text_blend(tmp_path_factory.mktemp("prepared_blend"), PREPARED_BLEND_SIZES, PREPARED_BLEND_WEIGHTS)
    _shared(path.parent)
    return path
