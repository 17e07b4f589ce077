"""Replay with skips (issue 41): the loader's skip list, how it is named, checked and saved.

``loader.restore_state_rank(state, skip_samples=[...])`` (or ``ENERGON_LITE_SKIP_SAMPLES=FILE``,
read by ``env_settings.skips_from_env``) resumes the run without the named samples: the stage
of ``pipeline/skip.py`` drops them where they would enter batching or packing.  A sample is named

* by its ``__key__`` (a string, or ``{"key": ..., "dataset": k}``), looked up in each dataset's
  index.sqlite;
* by manifest entry: a :class:`~megatron_energon_lite.manifest.ManifestSample` (every sample of a
  packed or grouped item it stands for), a whole :class:`~megatron_energon_lite.manifest.ManifestStep`,
  or ``{"step": N}`` / ``{"steps": [...]}`` (every sample of those steps on every rank, or
  ``"rank": R`` only) read from the loader's manifest (or ``"manifest": DIR``);
* by position: ``{"dataset": k, "index": i}`` (the split index), ``{"dataset": k, "shard": name,
  "index_in_shard": i}``, or a sample's restore key (a tuple, or ``{"restore_key": [...]}``).

Names that match nothing (an unknown key, dataset, shard, index or step; a manifest entry of
other data) are listed and refused with a :class:`ConfigError`, unless ``ignore_unknown_skips=True``
(then they are logged and left out).  The resolved list is saved in the rank state as its own
versioned field, so a later resume keeps skipping::

    "sample_skips": {"version": 1, "samples": [{"dataset": 0, "index": 83, "path": "...",
                     "shard": "shards/002.tar", "index_in_shard": 9, "key": "0002_000009"}, ...]}
"""

from __future__ import annotations

import bisect
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import ConfigError, format_message
from ..format.sqlite_index import sample_key_positions, shard_sample_keys
from ..manifest import ManifestSample, ManifestStep, read_manifest
from ..pipeline.build import PipelineSpec
from ..pipeline.node import as_key
from ..pipeline.skip import sample_identity
from ..pipeline.state_check import invalid

__all__ = ["SKIPS_VERSION", "SkipList", "SkippedSample", "resolve_skips"]

logger = logging.getLogger("megatron_energon_lite.loader")

SKIPS_VERSION = 1
#: Unknown names a refusal lists (then only counted).
_LISTED_UNKNOWN = 20


@dataclass(frozen=True)
class SkippedSample:
    """One sample of a skip list: its identity (``dataset``, split ``index``) and, for the
    report, where it is and its key when known."""

    dataset: int
    index: int
    path: str = "?"
    shard: str | None = None
    index_in_shard: int | None = None
    key: str | None = None

    def describe(self) -> str:
        where = f"{self.shard} #{self.index_in_shard}" if self.shard is not None else f"index {self.index}"
        return f"{where} of dataset {self.dataset} ({self.path})" + (f", key {self.key!r}" if self.key is not None else "")

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "index": self.index, "path": self.path, "shard": self.shard, "index_in_shard": self.index_in_shard, "key": self.key}


@dataclass(frozen=True)
class SkipList:
    """The samples a loader skips, in the order they were named, each once."""

    samples: tuple[SkippedSample, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def identities(self) -> dict[tuple[int, int], str]:
        """``(dataset, split index)`` -> description: what the pipeline's skip stage matches."""
        return {(s.dataset, s.index): s.describe() for s in self.samples}

    def merged(self, other: SkipList) -> SkipList:
        seen = {(s.dataset, s.index) for s in self.samples}
        added = []
        for sample in other.samples:
            if (sample.dataset, sample.index) not in seen:
                seen.add((sample.dataset, sample.index))
                added.append(sample)
        return SkipList(self.samples + tuple(added))

    def to_json(self) -> dict[str, Any]:
        return {"version": SKIPS_VERSION, "samples": [s.to_json() for s in self.samples]}

    @classmethod
    def from_json(cls, value: Any) -> SkipList:
        """The skip list of a saved rank state (its ``sample_skips`` field), checked."""
        if not isinstance(value, dict) or value.get("version") != SKIPS_VERSION or not isinstance(value.get("samples"), list):
            raise invalid(("sample_skips",), f'{{"version": {SKIPS_VERSION}, "samples": [...]}} (the skip list of a replay)', value)
        samples = []
        for i, entry in enumerate(value["samples"]):
            if not isinstance(entry, dict) or not all(_count(entry.get(k)) for k in ("dataset", "index")):
                raise invalid(("sample_skips", "samples", i), 'a skipped sample {"dataset": int >= 0, "index": int >= 0, ...}', entry)
            optional = {k: entry.get(k) for k in ("shard", "key") if isinstance(entry.get(k), str)}
            samples.append(
                SkippedSample(
                    entry["dataset"], entry["index"], path=str(entry.get("path", "?")), index_in_shard=entry["index_in_shard"] if _count(entry.get("index_in_shard")) else None, **optional
                )
            )
        return cls(tuple(samples))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class _Datasets:
    """The loader's datasets as a skip list names them: paths, sizes and shards."""

    def __init__(self, spec: PipelineSpec) -> None:
        self.paths = [str(leaf.path) for leaf in spec.plan.leaves]
        self.totals = [resolved.total for resolved in spec.datasets]
        self.starts = [list(resolved.shard_starts) for resolved in spec.datasets]
        self.shards = [list(resolved.split.names) if resolved.split is not None else None for resolved in spec.datasets]

    def sample(self, dataset: int, index: int, key: str | None = None) -> SkippedSample | str:
        """The skipped sample at ``(dataset, index)``, or why there is none."""
        if not 0 <= dataset < len(self.paths):
            return f"dataset {dataset}: the loader reads {len(self.paths)} dataset(s) (0 .. {len(self.paths) - 1})"
        if not 0 <= index < self.totals[dataset]:
            return f"index {index} of dataset {dataset} ({self.paths[dataset]}): it has {self.totals[dataset]} samples"
        shard = index_in_shard = None
        names = self.shards[dataset]
        if names is not None:
            k = bisect.bisect_right(self.starts[dataset], index) - 1
            shard, index_in_shard = names[k], index - self.starts[dataset][k]
            if key is None:  # for the report and checkpoint info: from the index.sqlite, when there is one
                key = next(iter(shard_sample_keys(f"{self.paths[dataset].rstrip('/')}/{shard}", index_in_shard, limit=1)), None)
        return SkippedSample(dataset, index, self.paths[dataset], shard, index_in_shard, key)

    def by_shard(self, dataset: int, shard: str, index_in_shard: int, key: str | None = None) -> SkippedSample | str:
        names = self.shards[dataset] if 0 <= dataset < len(self.paths) else None
        if names is None or shard not in names:
            return f"shard {shard!r} of dataset {dataset}: not a shard of {self.paths[dataset] if 0 <= dataset < len(self.paths) else 'any dataset of the loader'}"
        k = names.index(shard)
        if not 0 <= index_in_shard < self.starts[dataset][k + 1] - self.starts[dataset][k]:
            return f"sample #{index_in_shard} of shard {shard!r} (dataset {dataset}): the shard has {self.starts[dataset][k + 1] - self.starts[dataset][k]} samples"
        return self.sample(dataset, self.starts[dataset][k] + index_in_shard, key)

    def by_key(self, key: str, dataset: int | None) -> list[SkippedSample] | str:
        candidates = range(len(self.paths)) if dataset is None else [dataset]
        found: list[SkippedSample] = []
        unreadable = []
        for k in candidates:
            if not 0 <= k < len(self.paths):
                return f"key {key!r} in dataset {k}: the loader reads {len(self.paths)} dataset(s)"
            positions = sample_key_positions(self.paths[k], key) if self.shards[k] is not None else None
            if positions is None:
                unreadable.append(self.paths[k])
                continue
            for shard, index_in_shard in positions:
                sample = self.by_shard(k, shard, index_in_shard, key)
                if isinstance(sample, SkippedSample):  # a shard of another split: not read here
                    found.append(sample)
        if found:
            return found
        if unreadable:
            return f"key {key!r}: not found{' elsewhere' if len(unreadable) < len(candidates) else ''}, and {', '.join(unreadable)} cannot be searched by key (no index.sqlite); name the sample by manifest entry or {{'dataset': k, 'index': i}}"
        return f"key {key!r}: no sample of {'the loader' if dataset is None else f'dataset {dataset}'} has it"

    def of_restore_key(self, key: tuple) -> list[SkippedSample | str]:
        """The samples a restore key names: itself (a sample's), or every sample inside it (a
        batch's, a pack's, a group's)."""
        identity = sample_identity(key)
        if identity is not None:
            return [self.sample(*identity)]
        members = [part for part in key if isinstance(part, tuple)]
        if not members:
            return [f"restore key {key!r}: names no sample (expected e.g. ('Webdataset', 12) or ('Blend', 1, 'Webdataset', 12))"]
        return [found for member in members for found in self.of_restore_key(member)]

    def of_manifest(self, sample: ManifestSample) -> list[SkippedSample | str]:
        if not 0 <= sample.dataset < len(self.paths) or sample.dataset_path != self.paths[sample.dataset]:
            return [f"manifest entry of {sample.dataset_path} (dataset {sample.dataset}): the loader reads {', '.join(self.paths)}; a manifest of another run or dataset"]
        return self.of_restore_key(sample.restore_key)


def resolve_skips(entries: Iterable[Any], spec: PipelineSpec, *, manifest: str | os.PathLike[str] | None = None, ignore_unknown: bool = False) -> SkipList:
    """The skip list ``entries`` name (module docstring) for a loader of ``spec`` (``manifest``:
    the loader's manifest folder, for steps).  Unknown names are refused together, or with
    ``ignore_unknown`` logged and left out."""
    if isinstance(entries, (str, bytes, dict, ManifestSample, ManifestStep)) or not isinstance(entries, Iterable):
        entries = [entries]
    datasets = _Datasets(spec)
    found: list[SkippedSample] = []
    unknown: list[str] = []
    manifests: dict[str, dict[int, ManifestStep]] = {}
    for entry in entries:
        for result in _resolve(entry, datasets, manifest, manifests):
            (found.append if isinstance(result, SkippedSample) else unknown.append)(result)
    if unknown:
        listed = "\n".join(f"    {line}" for line in unknown[:_LISTED_UNKNOWN]) + (f"\n    ... and {len(unknown) - _LISTED_UNKNOWN} more" if len(unknown) > _LISTED_UNKNOWN else "")
        if not ignore_unknown:
            raise ConfigError(
                format_message(
                    f"{len(unknown)} name(s) in the skip list match no sample of this loader",
                    where=spec.path,
                    found="\n" + listed,
                    fix="correct or remove them, or pass ignore_unknown_skips=True (the file's \"ignore_unknown\": true) to skip only the others",
                )
            )
        logger.warning("ignoring %d name(s) in the skip list that match no sample of %s (ignore_unknown_skips):\n%s", len(unknown), spec.path, listed)
    return SkipList().merged(SkipList(tuple(found)))


def _resolve(entry: Any, datasets: _Datasets, manifest: Any, manifests: dict) -> list[SkippedSample | str]:
    if isinstance(entry, ManifestStep):
        return [found for sample in entry.samples() for found in datasets.of_manifest(sample)]
    if isinstance(entry, ManifestSample):
        return datasets.of_manifest(entry)
    if isinstance(entry, str):
        entry = {"key": entry}
    if isinstance(entry, tuple):
        return datasets.of_restore_key(entry)
    if not isinstance(entry, dict):
        return [f"{entry!r}: not a way to name a sample (a __key__, a manifest entry or step, {{'dataset': k, 'index': i}}, a restore key)"]
    dataset = entry.get("dataset")
    if dataset is not None and not _count(dataset):
        return [f"{entry!r}: dataset must be an integer >= 0 (the blend's index)"]
    if "restore_key" in entry and isinstance(entry["restore_key"], list):
        return datasets.of_restore_key(as_key(entry["restore_key"]))
    if "step" in entry or "steps" in entry:
        return _steps(entry, datasets, manifest, manifests)
    if isinstance(entry.get("key"), str):
        found = datasets.by_key(entry["key"], dataset)
        return [found] if isinstance(found, str) else list(found)
    if dataset is not None and isinstance(entry.get("shard"), str) and _count(entry.get("index_in_shard")):
        return [datasets.by_shard(dataset, entry["shard"], entry["index_in_shard"])]
    if dataset is not None and _count(entry.get("index")):
        return [datasets.sample(dataset, entry["index"])]
    return [f"{entry!r}: expected {{'key': ...}}, {{'step': N}}, {{'dataset': k, 'index': i}}, {{'dataset': k, 'shard': ..., 'index_in_shard': i}} or {{'restore_key': [...]}}"]


def _steps(entry: dict, datasets: _Datasets, manifest: Any, manifests: dict) -> list[SkippedSample | str]:
    steps = entry.get("steps", [entry.get("step")])
    folder = entry.get("manifest", manifest)
    rank = entry.get("rank")
    if not isinstance(steps, list) or not all(_count(s) for s in steps) or (rank is not None and not _count(rank)):
        return [f"{entry!r}: step(s) and rank must be integers >= 0"]
    if folder is None:
        return [f"{entry!r}: steps are read from a manifest: make the loader with manifest=DIR or add \"manifest\": DIR"]
    folder = str(folder)
    wanted = set(steps)
    known = manifests.setdefault(folder, {})
    if not wanted <= set(known):  # read once more, keeping only the steps asked for
        known.update((s.step, s) for s in read_manifest(folder) if s.step in wanted)
    found: list[SkippedSample | str] = []
    for step in steps:
        recorded = known.get(step)
        if recorded is None:
            found.append(f"step {step}: not in the manifest {folder}")
        elif rank is not None and rank not in recorded.batches:
            found.append(f"step {step} rank {rank}: the manifest {folder} records ranks {sorted(recorded.batches)} of it")
        else:
            found += [f for sample in recorded.samples(rank) for f in datasets.of_manifest(sample)]
    return found
