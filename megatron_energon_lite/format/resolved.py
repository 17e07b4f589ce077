"""A dataset of a plan, read once: what its metadata says, frozen for the life of a loader.

The process that makes a loader reads each dataset's ``.info.json``, split file and
``dataset.yaml`` once (the splits from the start-up summary ``.lite-split-cache.json`` when
prepare wrote one and the files are unchanged: on object storage five small requests whatever
the shard count), into a :class:`ResolvedDataset`; sizes, shard boundaries, worker slices
and every sample loader come from it. Forked workers inherit it and read no metadata (only the
``.tar.idx`` of the shards they open, when they first open them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable

from ..policy import PLAIN, Policy
from ..samples import CrudeSample, TokensSample
from ..storage import RemotePath, as_path, file_stat
from .dataset_config import DatasetConfig, load_dataset_config
from .indexed import indexed_prefix
from .indexed_samples import IndexedSamples
from .join import join_index, require_energon_join_index
from .jsonl import JsonlReader
from .metadata import INFO_JSON, ResolvedSplit, meta_dir, require_prepared, resolve_split
from .metadataset import LeafDataset
from .split_cache import cached_split

__all__ = ["ResolvedDataset", "as_recorded", "data_record", "resolve_dataset", "resolve_datasets", "shard_prefix"]

#: A data record lists shard names and counts up to this many shards (beyond: totals and the digest).
RECORDED_SHARDS = 1000


@dataclass(frozen=True)
class ResolvedDataset:
    """One dataset split as its metadata described it when the loader was made."""

    #: Samples in the split (before any subset).
    total: int
    #: Split index of the first sample of each shard, then ``total``.
    shard_starts: tuple[int, ...]
    #: The split's shards, counts and excludes (a prepared folder; None for JSONL files and joins).
    split: ResolvedSplit | None = None
    #: Its ``dataset.yaml`` (a prepared folder).
    config: DatasetConfig | None = None
    #: The split file read: the argument's, else ``dataset.yaml``'s ``split_config``, else the default.
    split_config: str | None = None
    #: A Megatron ``.bin/.idx`` dataset: its prefix (its samples are TokensSamples).
    indexed_prefix: str | None = None

    @property
    def yields(self) -> type:
        """The type of its samples before cooking (a JSONL file yields crude dicts); for a
        prepared folder or a JSONL file, not a join (whose samples are its joiner's)."""
        if self.indexed_prefix is not None:
            return TokensSample
        return CrudeSample if self.config is None else self.config.yields


def resolve_dataset(leaf: LeafDataset, *, dataset_config: str | None, split_config: str | None, trust_dataset_code: bool, policy: Policy = PLAIN) -> ResolvedDataset:
    """Reads the metadata of ``leaf`` (``dataset_config`` / ``split_config``: the loader's
    defaults, for leaves that do not name their own; ``policy``: the loader's)."""
    if leaf.join is not None:
        if policy.as_energon:
            require_energon_join_index(leaf.join, leaf.where)
        index = join_index(leaf.join, policy=policy)
        return ResolvedDataset(total=len(index), shard_starts=tuple(index.shard_starts))
    if leaf.path.endswith(".jsonl"):
        count = len(JsonlReader(leaf.path))  # a JSONL file is one shard
        return ResolvedDataset(total=count, shard_starts=(0, count))
    root = as_path(leaf.path)
    # On object storage one HEAD of .info.json says "a prepared folder" (a folder is never a
    # Megatron prefix) and gives the stamp the start-up summary is checked against.
    info_stat = file_stat(meta_dir(root) / INFO_JSON) if isinstance(root, RemotePath) else None
    if info_stat is None:
        prefix = indexed_prefix(leaf.path)
        if prefix is not None:
            samples = IndexedSamples(prefix, leaf.sequence_length)  # one shard, whatever the split
            samples.close()
            return ResolvedDataset(total=len(samples), shard_starts=(0, len(samples)), indexed_prefix=str(prefix))
        require_prepared(leaf.path)
    config = load_dataset_config(leaf.path, leaf.dataset_config or dataset_config, trust_dataset_code=trust_dataset_code, policy=policy)
    split_name = leaf.split_config or split_config or config.loader_options.get("split_config")
    # The start-up summary prepare wrote, if the files it was made from are unchanged; else the files.
    split = cached_split(leaf.path, leaf.split_part, split_name, info_stat=info_stat) or resolve_split(leaf.path, leaf.split_part, split_config=split_name, policy=policy)
    return ResolvedDataset(total=split.total_samples, shard_starts=split.shard_starts, split=split, config=config, split_config=split_name)


def resolve_datasets(leaves: Iterable[LeafDataset], *, dataset_config: str | None, split_config: str | None, trust_dataset_code: bool, policy: Policy = PLAIN) -> tuple[ResolvedDataset, ...]:
    """:func:`resolve_dataset` of each leaf; a dataset split named several times (a blend of
    one dataset with different subflavors or subsets) is read once."""
    seen: dict[tuple, ResolvedDataset] = {}
    resolved = []
    for leaf in leaves:
        key = (leaf.path, leaf.split_part, leaf.dataset_config or dataset_config, leaf.split_config or split_config, leaf.join, leaf.sequence_length)
        if key not in seen:
            seen[key] = resolve_dataset(leaf, dataset_config=dataset_config, split_config=split_config, trust_dataset_code=trust_dataset_code, policy=policy)
        resolved.append(seen[key])
    return tuple(resolved)


def shard_prefix(resolved: ResolvedDataset, shards: int) -> ResolvedDataset:
    """The dataset as its first ``shards`` shards (a prepared split): what it was before shards
    were appended to it (its split indices are those of the grown one)."""
    split = resolved.split
    if split is None or not 0 < shards <= len(split.names):
        raise ValueError(f"no prefix of {shards} shards of a split of {len(split.names) if split is not None else 'no'} shards")
    names = split.names[:shards]
    kept = set(names)
    prefix = dataclasses.replace(split, names=names, counts=split.counts[:shards], excluded_keys={n: k for n, k in split.excluded_keys.items() if n in kept})
    return dataclasses.replace(resolved, total=prefix.total_samples, shard_starts=prefix.shard_starts, split=prefix)


def as_recorded(resolved: ResolvedDataset, names: list[str], counts: list[int]) -> ResolvedDataset:
    """The dataset (a prepared split) as a state's data record lists it: ``names`` with their
    sample counts, whatever its shards are now.  Only its positions are meant (to compute what a
    saved state had not delivered): shards no longer there are never read."""
    split = resolved.split
    if split is None:
        raise ValueError("only a prepared split has named shards")
    kept = set(names)
    recorded = dataclasses.replace(split, names=list(names), counts=list(counts), excluded_keys={n: k for n, k in split.excluded_keys.items() if n in kept}, stats={})
    return dataclasses.replace(resolved, total=recorded.total_samples, shard_starts=recorded.shard_starts, split=recorded)


def data_record(path: str, split_part: str, resolved: ResolvedDataset) -> dict[str, Any]:
    """What a loader state records of one dataset it was saved against: the split's shards with
    their sample counts (listed up to :data:`RECORDED_SHARDS`), the total, and a digest of the
    shard list, counts and sample excludes: everything that fixes which sample a split index is.
    A restore compares it with the data it finds (``loader/rank_state.check_saved_data``)."""
    split = resolved.split
    if split is None:  # a join, a JSONL file, a .bin/.idx dataset: its positions are its boundaries
        shards: list[list[Any]] = [[f"part {i}", end - start] for i, (start, end) in enumerate(zip(resolved.shard_starts, resolved.shard_starts[1:]))]
        excluded: list[Any] = []
    else:
        shards = [[name, count] for name, count in zip(split.names, split.counts)]
        excluded = sorted([name, sorted(keys)] for name, keys in split.excluded_keys.items())
    digest = hashlib.sha256(json.dumps([shards, excluded], separators=(",", ":")).encode()).hexdigest()[:32]
    record: dict[str, Any] = {"path": str(path), "split_part": split_part, "samples": resolved.total, "shards": len(shards), "digest": digest}
    if len(shards) <= RECORDED_SHARDS:
        record["shard_counts"] = shards
    return record
