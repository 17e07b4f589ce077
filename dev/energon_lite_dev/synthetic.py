"""Test fixtures built on :mod:`megatron_energon_lite.synthetic` (which the tests also import under
this module's name: every public name of the library module is re-exported here)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.synthetic import *  # noqa: F403 - the tests' historical import path
from megatron_energon_lite.synthetic import TEXT_SAMPLE_YAML, __all__ as _library_names, write_tar

__all__ = [*_library_names, "prepare_text", "sized_keys", "write_numbered_shards", "write_text_blend", "write_text_shard"]


def write_numbered_shards(root: str | os.PathLike[str], *, offset: int = 0, shards: int = 3, per_shard: int = 4) -> None:
    """``parts/data-{k}.tar`` under ``root``: samples keyed ``{offset + i:06d}`` whose ``txt`` part is
    that number, ``per_shard`` per shard (crude datasets whose samples name each other)."""
    for shard in range(shards):
        indices = range(offset + shard * per_shard, offset + (shard + 1) * per_shard)
        write_tar(Path(root) / f"parts/data-{shard}.tar", [(f"{i:06d}", {"txt": str(i).encode()}) for i in indices])


def sized_keys(name: str, sizes: Sequence[int]) -> list[str]:
    """The sample keys :func:`write_text_blend` gives dataset ``name`` of shards of ``sizes``, sorted."""
    return sorted(f"{name}{shard}_{i:03d}" for shard, size in enumerate(sizes) for i in range(size))


def write_text_blend(base: str | os.PathLike[str], sizes: Mapping[str, Sequence[int]], weights: Mapping[str, int]) -> Path:
    """One prepared ``TextSample`` dataset ``base/NAME`` per entry of ``sizes`` (shards of those
    sample counts, keys from :func:`sized_keys`) and ``base/blend.yaml`` blending them by
    ``weights``; returns the YAML's path (elastic-resume tests of blends)."""
    base = Path(base)
    for name, shard_sizes in sizes.items():
        for shard, size in enumerate(shard_sizes):
            write_tar(base / name / f"shards/{shard:03d}.tar", [(f"{name}{shard}_{i:03d}", {"txt": f"{name} {shard} {i}".encode()}) for i in range(size)])
        prepare_dataset(base / name, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_SAMPLE_YAML)
    path = base / "blend.yaml"
    entries = "".join(f"      - {{weight: {weights[name]}, path: {name}}}\n" for name in sizes)
    path.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n{entries}")
    return path


def write_text_shard(root: str | os.PathLike[str], name: str, first: int, count: int) -> None:
    """``root/parts/{name}.tar``: ``count`` samples keyed ``{first + i:05d}`` whose ``txt`` is that
    number (a shard to append, rewrite or remove between a save and a restore)."""
    write_tar(Path(root) / f"parts/{name}.tar", [(f"{i:05d}", {"txt": str(i).encode()}) for i in range(first, first + count)])


def prepare_text(root: str | os.PathLike[str]) -> None:
    """(Re-)prepares ``root`` as one ``TextSample`` training split of all its shards."""
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_SAMPLE_YAML, force_overwrite=True)
