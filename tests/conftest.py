"""Shared fixtures: tiny real datasets generated in tmp_path."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import write_tar


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
