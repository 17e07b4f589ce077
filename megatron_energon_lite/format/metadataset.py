"""Metadataset YAML (Energon's ``MetadatasetV2`` and the legacy V1 format) -> a flat blend plan.

A metadataset names, per split, one dataset or a tree of blends over datasets, possibly through
other metadataset files (research/energon.md 3).  The loader never walks that tree: it asks for a
:class:`BlendPlan`, the list of leaf datasets with everything the tree said about each one
multiplied or merged down to the leaf:

* ``weight``: product over the levels of ``weight / sum(sibling weights)`` (``blend``);
* ``repetitions``: product over the levels (``blend_epochized``);
* ``subflavors``: outer levels override inner ones, which override ``dataset.yaml``;
* ``shuffle_over_epochs_multiplier``: product over the levels, except that ``None`` (no
  shuffling) on any level wins, then ``-1`` (slices drawn with replacement), as in Energon;
* ``subset``: the leaf's own range (absolute sample indices or percentages) first, then each outer
  percentage range applied to what is left, innermost first.

Parsing is strict like Energon's (unknown keys are errors), and every error names the YAML file
and the key path (``splits.train.blend[2].weight``).  Our two extensions, which Energon would
reject as unknown keys: ``blend_mode: exact`` on a ``blend`` (see :data:`BLEND_MODES`), and a
top-level ``mock: true`` (or ``copy``) for mock data (``loader/mock.py``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..errors import ConfigError, DatasetError, format_message
from ..storage import AnyPath, RemotePath, as_path
from .indexed import indexed_prefix
from .indexed_samples import check_sequence_length
from .jsonl import jsonl_index_path
from .metadata import check_mapping, is_prepared, load_structured
from .weight_schedule import LeafSchedule, WeightSchedule, check_level, parse_weight_schedule

__all__ = [
    "repeated_length",
    "BLEND_MODES",
    "WITH_REPLACEMENT",
    "AuxSource",
    "BlendPlan",
    "Blender",
    "JoinMember",
    "JoinSpec",
    "LeafDataset",
    "check_shuffle_over_epochs",
    "combine_shuffle_over_epochs",
    "is_metadataset_path",
    "load_blend_plan",
    "resolved_splits",
    "single_dataset_plan",
    "with_subflavors",
    "with_subset",
]

_OUR_MODULES = ("megatron.energon", "megatron_energon_lite")
#: ``random``: Energon's per-sample weighted draw.  ``exact``: a deterministic schedule whose
#: per-dataset counts stay within one sample of the weights at every prefix of the global stream.
#: ``cost``: weights share a cost the task encoder reports per sample (``sample_cost``, e.g.
#: tokens) instead of the number of samples.
BLEND_MODES = ("random", "exact", "cost")
_REF_KEYS = ("path", "split_part", "subflavors", "shuffle_over_epochs_multiplier", "dataset_config", "split_config", "subset", "sequence_length")
_V1_REF_KEYS = ("path", "weight", "split_part", "subflavor", "subflavors", "shuffle_over_epochs_multiplier", "dataset_config", "split_config")
_NODE_KINDS = ("path", "blend", "blend_epochized", "join")
_JOIN_KEYS = ("join", "joiner", "split_part", "subflavors", "shuffle_over_epochs_multiplier", "subset")
_JOIN_MEMBER_KEYS = ("path", "split_part", "nonmatch", "subflavors", "dataset_config", "split_config")
NONMATCH = ("error", "skip", "none")
#: Most metadataset files in a chain of references (a file referring to one that refers to ...).
MAX_METADATASET_NESTING = 32


@dataclass(frozen=True)
class JoinMember:
    """One dataset of a join; the first member of a join is its primary."""

    path: str
    split_part: str
    nonmatch: str  # error | skip | none: what a primary sample without a match here does
    where: str
    dataset_config: str | None = None
    split_config: str | None = None
    #: This member's own subflavors (Energon's join member ``subflavors:``).  Its samples get
    #: ``{**subflavors, **the join's subflavors}`` (outer levels win, as everywhere); the default
    #: joiner keeps the primary's.  Not part of equality: the join index does not depend on it.
    subflavors: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def sample_subflavors(self, outer: Mapping[str, Any] | None) -> dict[str, Any]:
        """The subflavors this member's samples carry, given the join's (merged) subflavors."""
        return {**self.subflavors, **(outer or {})}


@dataclass(frozen=True)
class JoinSpec:
    """Datasets joined by sample key: every primary sample with its matches in the others."""

    members: tuple[JoinMember, ...]
    names: tuple[str, ...] | None  # the dict form's names (joiner gets keyword arguments)
    joiner: tuple[str, str, str]  # (module, "__class__" or "__function__", name)
    #: The metadataset file that defines the join (Energon keeps its join index cache next to it).
    file: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class AuxSource:
    """One ``aux:`` source of a metadataset entry, resolved against the YAML's folder."""

    #: ``"dataset"``: a prepared dataset, read by tar member name; ``"folder"``: a plain folder
    #: (``filesystem://``), read by relative path.
    kind: str
    path: str
    #: The YAML path of the entry, for messages.
    where: str


@dataclass(frozen=True)
class LeafDataset:
    """One dataset split as a blend sees it, with the tree's settings folded in."""

    path: str
    split_part: str
    where: str  # "file.yaml: splits.train.blend[2]" (or the Python call) for messages
    weight: Fraction = Fraction(1)  # exact, so that an exact blend follows the ratios as written
    repetitions: float = 1.0
    subflavors: Mapping[str, Any] = field(default_factory=dict)
    shuffle_over_epochs_multiplier: int | None = 1  # None: no shuffling; -1: with replacement
    dataset_config: str | None = None
    split_config: str | None = None
    #: Absolute ``[start, end)`` sample indices of the split (``end`` None: to the end), or None.
    absolute_range: tuple[int, int | None] | None = None
    #: Fractions ``(start, end)`` of what the absolute range left, or None for all of it.
    relative_range: tuple[float, float] | None = None
    #: Set when this "dataset" is a join of several (``path`` is then the primary's).
    join: JoinSpec | None = None
    #: Energon's ``aux:`` sources by name: what the cooker of this (crude) dataset may read from.
    aux: Mapping[str, AuxSource] = field(default_factory=dict, compare=False)
    #: A dataset factory the user constructed whose ``load_sample`` builds this dataset's samples
    #: (None: the loader builds them as ``dataset.yaml`` says).
    sample_factory: Any = field(default=None, compare=False, repr=False)
    #: Ours, for a Megatron ``.bin/.idx`` dataset: samples are windows of this many tokens (plus
    #: one, for the labels) instead of whole documents (``format/indexed_samples.py``).
    sequence_length: int | None = None
    #: Ours: the scheduled levels above this leaf (``weight:`` schedules, issue 40); its weight at
    #: a clock is ``weight`` times the schedule's factor.  None: the weight is constant.
    weight_schedule: LeafSchedule | None = None

    def sample_range(self, total: int) -> tuple[int, int]:
        """``[start, end)`` of the split's samples this leaf reads (Energon's subset arithmetic)."""
        start, end = 0, total
        if self.absolute_range is not None:
            start = self.absolute_range[0]
            end = total if self.absolute_range[1] is None else self.absolute_range[1]
            if not 0 <= start <= end <= total:
                raise ConfigError(
                    format_message(
                        "subset range lies outside the dataset split",
                        where=f"{self.where}.subset.range",
                        expected=f"0 <= start <= end <= {total} (samples in {self.path} split {self.split_part!r})",
                        found=f"[{self.absolute_range[0]}, {'end' if self.absolute_range[1] is None else self.absolute_range[1]}]",
                        fix="use indices inside the split, or 'end' for its last sample",
                    )
                )
        if self.relative_range is not None:
            left = end - start
            end = start + int(left * self.relative_range[1])
            start = start + int(left * self.relative_range[0])
        return start, end

    def describe(self) -> dict[str, Any]:
        """Plain JSON for fingerprints and reports."""
        return {
            "path": self.path,
            "split_part": self.split_part,
            "weight": float(self.weight),
            "repetitions": self.repetitions,
            "subflavors": dict(self.subflavors),
            "shuffle_over_epochs_multiplier": self.shuffle_over_epochs_multiplier,
            "subset": None if self.absolute_range is None and self.relative_range is None else [self.absolute_range, self.relative_range],
            **({"join": [[m.path, m.split_part, m.nonmatch, *([dict(m.subflavors)] if m.subflavors else [])] for m in self.join.members]} if self.join is not None else {}),
            # Only when set, so that the fingerprints of states saved before it existed still match.
            **({"sequence_length": self.sequence_length} if self.sequence_length is not None else {}),
            **({"weight_schedule": self.weight_schedule.describe()} if self.weight_schedule is not None else {}),
        }


@dataclass(frozen=True)
class BlendPlan:
    """What one split of a metadataset (or a single dataset) reads.

    ``kind`` is ``"single"`` (one dataset, no blend), ``"blend"`` (weights; each leaf repeats
    forever) or ``"blend_epochized"`` (each leaf read ``repetitions`` times per composed epoch).
    """

    kind: str
    leaves: tuple[LeafDataset, ...]
    blend_mode: str | None = None  # set by the YAML; the Python argument may also set it
    source: str | None = None  # the YAML file, if any
    #: Ours: the YAML's top-level ``mock:`` (true, "copy" or false): the loader yields the first
    #: real item again and again (``megatron_energon_lite/loader/mock.py``).  Only the file the loader
    #: is given decides; a referenced metadataset's flag is read but not used.
    mock: bool | str = False

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "blend_mode": self.blend_mode, "leaves": [leaf.describe() for leaf in self.leaves]}


#: ``shuffle_over_epochs_multiplier`` that draws slices with replacement, without end (Energon's -1).
WITH_REPLACEMENT = -1


def check_shuffle_over_epochs(value: Any, *, where: str | None = None) -> int | None:
    """Validates a ``shuffle_over_epochs(_multiplier)``: ``None``, ``-1`` or an integer >= 1.

    Energon's meanings: ``k >= 1`` shuffles the slices of ``k`` epochs together (each slice ``k``
    times per super-epoch); ``None`` does not shuffle (the slices in order, every epoch the same);
    ``-1`` draws slices uniformly with replacement, forever (an epoch never ends).
    """
    if value is None:
        return None
    if not isinstance(value, bool) and hasattr(value, "__index__") and (int(value) == WITH_REPLACEMENT or int(value) >= 1):
        return int(value)
    raise ConfigError(
        format_message(
            "invalid shuffle_over_epochs_multiplier",
            where=where,
            expected="an integer >= 1 (epochs shuffled together), -1 (slices drawn with replacement, "
            "without end) or None (no shuffling: slices in order)",
            found=repr(value),
        )
    )


def repeated_length(samples: int, repetitions: float) -> int:
    """Items of a dataset of ``samples`` items repeated ``repetitions`` times in a pass of a
    ``blend_epochized`` blend (Energon's ``RepeatDataset.len_worker``: the fraction rounds down)."""
    return int(samples * repetitions)


def combine_shuffle_over_epochs(outer: int | None, inner: int | None) -> int | None:
    """Two levels' multipliers as Energon combines them: ``None`` wins, then ``-1``, else the product.

    (An outer and an inner metadataset level, or ``get_train_dataset``'s argument and a leaf's.)
    """
    if outer is None or inner is None:
        return None
    if outer == WITH_REPLACEMENT or inner == WITH_REPLACEMENT:
        return WITH_REPLACEMENT
    return outer * inner


# --- entry points ----------------------------------------------------------------------------


def is_metadataset_path(path: Any) -> bool:
    """True for a metadataset given as a ``.yaml``/``.yml``/``.json`` file, a dict or a Blender."""
    if isinstance(path, (Mapping, Blender)):
        return True
    if not isinstance(path, (str, os.PathLike, RemotePath)):
        return False
    path = as_path(path)
    return path.suffix in (".yaml", ".yml", ".json") and path.is_file()


def single_dataset_plan(path: str | os.PathLike, split_part: str, **settings: Any) -> BlendPlan:
    """The plan for a plain dataset path (a prepared folder or a ``.jsonl`` file)."""
    where = f"dataset {path}"
    leaf = LeafDataset(path=str(path), split_part=split_part, where=where, **settings)
    _check_dataset(leaf, where)
    return BlendPlan("single", (leaf,))


def with_subflavors(plan: BlendPlan, subflavors: Any) -> BlendPlan:
    """Energon's ``subflavors`` argument: merged into every dataset's, winning over the YAML's."""
    if subflavors is None:
        return plan
    if not isinstance(subflavors, Mapping):
        raise ConfigError(format_message("subflavors must be a dict", found=repr(subflavors)[:80], fix="pass e.g. subflavors={'source': 'coco'}"))
    leaves = tuple(replace(leaf, subflavors={**leaf.subflavors, **subflavors}) for leaf in plan.leaves)
    return replace(plan, leaves=leaves)


def with_subset(plan: BlendPlan, subset: Any) -> BlendPlan:
    """Energon's ``subset`` argument (its ``DatasetSubset``, or a dict with the same keys):
    ``range`` (fractions) applies to what each dataset's own subset leaves, as an outer
    metadataset subset does; ``absolute_range`` (sample indices) only to a single dataset."""
    if subset is None:
        return plan
    get = subset.get if isinstance(subset, Mapping) else lambda key: getattr(subset, key, None)
    fraction, absolute = get("range"), get("absolute_range")
    expected = "DatasetSubset(range=(start, end)) with 0 <= start <= end <= 1, or absolute_range=(first, end or None) for a single dataset"
    try:
        if fraction is not None:
            start, end = (float(v) for v in fraction)
            if not 0 <= start <= end <= 1:
                raise ValueError
        if absolute is not None:
            first, last = absolute
            if not isinstance(first, int) or not (last is None or isinstance(last, int)) or first < 0 or (last is not None and last < first):
                raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(format_message("invalid subset", expected=expected, found=repr(subset)[:120])) from None
    leaves = []
    for leaf in plan.leaves:
        if absolute is not None:
            if plan.kind != "single" or leaf.absolute_range is not None or leaf.relative_range is not None:
                raise ConfigError(
                    format_message(
                        "an absolute subset range applies to a single dataset only",
                        where=leaf.where,
                        expected=expected,
                        found=repr(subset)[:120],
                        fix="use a fractional range, or put the index range on the dataset entry of the metadataset",
                    )
                )
            leaf = replace(leaf, absolute_range=(absolute[0], absolute[1]))
        if fraction is not None:
            inner = leaf.relative_range or (0.0, 1.0)
            width = inner[1] - inner[0]
            leaf = replace(leaf, relative_range=(inner[0] + start * width, inner[0] + end * width))
        leaves.append(leaf)
    return replace(plan, leaves=tuple(leaves))


def load_blend_plan(source: Any, split_part: str, *, training: bool, check_datasets: bool = True) -> BlendPlan:
    """The plan of split ``split_part`` of a metadataset file, dict or :class:`Blender`.

    For validation (``training=False``) every leaf is read once, in YAML order: weights,
    repetitions and blend modes are ignored.
    """
    if isinstance(source, Blender):
        plan = source.plan(split_part)
    elif isinstance(source, Mapping):
        plan = _Parser(Path.cwd(), "<metadataset dict>", (), check_datasets=check_datasets).split(source, split_part)
    else:
        path = as_path(source).resolve()
        plan = _Parser(path.parent, str(path), (path,), check_datasets=check_datasets).split(load_structured(path), split_part)
    if not training:
        leaves = tuple(replace(leaf, weight=Fraction(1), repetitions=1.0) for leaf in plan.leaves)
        return BlendPlan("single" if len(leaves) == 1 else "concat", leaves, None, plan.source, plan.mock)
    return plan


def resolved_splits(source: Any) -> dict[str, Any]:
    """The ``splits`` of a metadataset file (or dict) as written, with every ``path`` resolved
    against the YAML file (URLs as written) and every ``aux:`` source as an :class:`AuxSource` (what Energon's
    ``MetadatasetV2.splits`` holds, as plain data).  Nothing else is checked or opened."""
    if isinstance(source, Mapping):
        parser, raw = _Parser(Path.cwd(), "<metadataset dict>", (), check_datasets=False, keep_urls=True), source
    else:
        path = as_path(source).resolve()
        parser, raw = _Parser(path.parent, str(path), (path,), check_datasets=False, keep_urls=True), load_structured(path)
    top = check_mapping(raw, file=parser.file, key_path="", allowed=None, required=("splits",))

    def resolve(node: Any, key_path: str) -> Any:
        if isinstance(node, list):
            return [resolve(item, f"{key_path}[{i}]") for i, item in enumerate(node)]
        if not isinstance(node, Mapping):
            return node
        out = {}
        for key, value in node.items():
            where = f"{key_path}.{key}"
            if key == "path" and isinstance(value, str):
                out[key] = str(parser._resolve(value, where))
            elif key == "aux" and value is not None:
                out[key] = parser._aux(value, where)
            else:
                out[key] = resolve(value, where)
        return out

    splits = check_mapping(top["splits"], file=parser.file, key_path="splits", allowed=None)
    return {str(name): resolve(node, f"splits.{name}") for name, node in splits.items()}


class Blender:
    """A blend built in Python: ``Blender([(path, 0.6), (path, 0.3), (path, 0.1)])``.

    Each entry is ``(path, weight)`` where ``path`` is a prepared dataset folder, a ``.jsonl`` file
    or a metadataset YAML; pass the Blender as ``path`` to ``get_train_dataset`` /
    ``get_val_dataset``.  ``mode`` is ``"random"`` (Energon's draw) or ``"exact"``.
    """

    def __init__(self, entries: Sequence[tuple[Any, float]], *, mode: str = "random", split_part: str | None = None) -> None:
        self.entries = [tuple(entry) for entry in entries]
        self.mode = mode
        self.split_part = split_part
        _check_mode(mode, "Blender(mode=...)")
        for i, entry in enumerate(self.entries):
            if len(entry) != 2:
                raise ConfigError(format_message("invalid Blender entry", where=f"Blender entry {i}", expected="(path, weight)", found=repr(entry)[:120]))

    def plan(self, split_part: str) -> BlendPlan:
        node = {"blend": [{"path": os.fspath(path), "weight": weight, **({"split_part": self.split_part} if self.split_part else {})} for path, weight in self.entries], "blend_mode": self.mode}
        return _Parser(Path.cwd(), "Blender", ()).node_plan(node, "Blender", split_part)


# --- parsing -----------------------------------------------------------------------------------


def _check_mode(mode: Any, where: str) -> str:
    if mode not in BLEND_MODES:
        raise ConfigError(format_message("unknown blend mode", where=where, expected=" or ".join(BLEND_MODES), found=repr(mode)))
    return mode


def _number(value: Any, where: str, what: str, *, allow_zero: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(
            format_message(
                f"invalid {what}",
                where=where,
                expected=f"a number {'>= 0' if allow_zero else '> 0'}",
                found=repr(value),
                fix=f"give every entry a {'non-negative' if allow_zero else 'positive'} {what}",
            )
        )
    return float(value)


def _exact(value: float | int) -> Fraction:
    """A weight as the number it was written as: 0.6 -> 3/5 (not the nearest binary float)."""
    return Fraction(value) if isinstance(value, int) else Fraction(repr(float(value)))


def _range_bound(value: Any, where: str) -> tuple[str, float | int | None]:
    """One end of a subset range: ("relative", fraction), ("absolute", index) or ("end", None)."""
    if value == "end":
        return "end", None
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            fraction = float(value.strip()[:-1]) / 100
        except ValueError:
            fraction = -1.0
        if 0 <= fraction <= 1:
            return "relative", fraction
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return "absolute", value
    raise ConfigError(
        format_message(
            "invalid subset range bound",
            where=where,
            expected="a percentage string like '12.5%' (0% to 100%), a sample index >= 0, or 'end'",
            found=repr(value),
        )
    )


class _Parser:
    """Reads one metadataset file (or dict); ``chain`` holds the files being read, for cycles."""

    def __init__(self, base: AnyPath, file: str, chain: tuple[AnyPath, ...], *, check_datasets: bool = True, keep_urls: bool = False) -> None:
        self.base = base
        self.file = file
        self.chain = chain
        #: False: datasets are not opened (``traverse_metadataset`` lists missing ones too).
        self.check_datasets = check_datasets
        #: True: URLs stay as written (``dss://NAME@VERSION`` is not replaced by its cache folder).
        self.keep_urls = keep_urls

    def where(self, key_path: str) -> str:
        return f"{self.file}: {key_path}"

    def split(self, raw: Any, split_part: str) -> BlendPlan:
        top = check_mapping(raw, file=self.file, key_path="", allowed=("__module__", "__class__", "splits", "mock"), required=("splits",))
        mock = top.get("mock", False)
        if not (isinstance(mock, bool) or mock in ("copy", "same")):
            raise ConfigError(format_message("invalid mock", where=self.where("mock"), expected="true (mock data: the first real item again and again), 'copy' or false", found=repr(mock)[:80]))
        module = top.get("__module__")
        if module is not None and module not in _OUR_MODULES:
            raise ConfigError(format_message("unknown __module__", where=self.where("__module__"), expected=" or ".join(_OUR_MODULES), found=repr(module)))
        cls = top.get("__class__")
        if cls not in (None, "MetadatasetV2", "Metadataset"):
            raise ConfigError(format_message("unknown __class__", where=self.where("__class__"), expected="MetadatasetV2 (or Metadataset / none for the legacy format)", found=repr(cls)))
        splits = check_mapping(top["splits"], file=self.file, key_path="splits", allowed=None)
        if split_part not in splits:
            raise ConfigError(
                format_message(
                    f"metadataset has no split {split_part!r}",
                    where=self.where("splits"),
                    expected=f"one of {', '.join(map(repr, splits)) or '(no splits)'}",
                    fix="add the split to the YAML or pass another split_part",
                )
            )
        key_path = f"splits.{split_part}"
        if cls == "MetadatasetV2":
            plan = self.node_plan(splits[split_part], key_path, split_part)
        else:
            plan = self.v1_plan(splits[split_part], key_path, split_part)
        return replace(plan, source=self.file, mock=mock)

    # V2 ------------------------------------------------------------------------------------------
    def node_plan(self, node: Any, key_path: str, split_part: str) -> BlendPlan:
        if not isinstance(node, Mapping):
            raise ConfigError(format_message("expected a mapping", where=self.where(key_path), expected=f"a mapping with one of {', '.join(_NODE_KINDS)}", found=repr(node)[:80]))
        kinds = [k for k in _NODE_KINDS if k in node]
        if len(kinds) != 1:
            hint = " ('split' is spelled 'split_part')" if "split" in node else ""
            raise ConfigError(
                format_message(
                    "cannot tell what this entry is" + hint,
                    where=self.where(key_path),
                    expected=f"exactly one of the keys {', '.join(_NODE_KINDS)}",
                    found=f"keys {', '.join(map(str, node)) or '(none)'}",
                )
            )
        kind = kinds[0]
        if kind == "path":
            return self.ref_plan(node, key_path, split_part, extra=())
        if kind == "join":
            return self.join_plan(node, key_path, split_part, extra=())
        return self.blend_plan(node, key_path, split_part, kind)

    def join_plan(self, node: Mapping, key_path: str, split_part: str, *, extra: Iterable[str]) -> BlendPlan:
        for key in ("dataset_config", "split_config"):
            if key in node:
                raise ConfigError(format_message(f"{key} is not allowed on a join", where=self.where(f"{key_path}.{key}"), fix=f"set {key} on the joined datasets' entries"))
        check_mapping(node, file=self.file, key_path=key_path, allowed=(*_JOIN_KEYS, *extra), required=("join", "joiner"))
        entries = node["join"]
        if isinstance(entries, Mapping):
            names: tuple[str, ...] | None = tuple(str(name) for name in entries)
            items = [(f"{key_path}.join.{name}", entry) for name, entry in entries.items()]
        elif isinstance(entries, list):
            names = None
            items = [(f"{key_path}.join[{i}]", entry) for i, entry in enumerate(entries)]
        else:
            items = []
        if len(items) < 2:
            raise ConfigError(format_message("a join needs at least two datasets", where=self.where(f"{key_path}.join"), expected="a list or a mapping of at least two dataset references", found=repr(entries)[:120]))
        join_part = node.get("split_part")
        members = []
        for i, (member_path, entry) in enumerate(items):
            check_mapping(entry, file=self.file, key_path=member_path, allowed=_JOIN_MEMBER_KEYS, required=("path",))
            nonmatch = entry.get("nonmatch", "error")
            if nonmatch not in NONMATCH or (i == 0 and nonmatch != "error"):
                expected = "error (the primary dataset: the first entry)" if i == 0 else " | ".join(NONMATCH)
                raise ConfigError(format_message("invalid nonmatch", where=self.where(f"{member_path}.nonmatch"), expected=expected, found=repr(nonmatch)))
            target = self._resolve(entry["path"], f"{member_path}.path")
            member_flavors = entry.get("subflavors") or {}
            check_mapping(member_flavors, file=self.file, key_path=f"{member_path}.subflavors", allowed=None)
            member = JoinMember(
                path=str(target),
                # Energon's precedence: the dataset's own split_part, the join's, the split's.
                split_part=entry.get("split_part") or join_part or split_part,
                nonmatch=nonmatch,
                where=self.where(member_path),
                dataset_config=entry.get("dataset_config"),
                split_config=entry.get("split_config"),
                subflavors=dict(member_flavors),
            )
            if target.suffix in (".jsonl", ".yaml", ".yml", ".json"):
                raise ConfigError(format_message("only prepared dataset folders can be joined", where=self.where(f"{member_path}.path"), found=str(target)))
            if self.check_datasets:
                _check_dataset(LeafDataset(path=member.path, split_part=member.split_part, where=member.where), self.where(f"{member_path}.path"))
            members.append(member)
        joiner = node["joiner"]
        check_mapping(joiner, file=self.file, key_path=f"{key_path}.joiner", allowed=("__module__", "__class__", "__function__"), required=("__module__",))
        kinds = [k for k in ("__class__", "__function__") if k in joiner]
        if len(kinds) != 1:
            raise ConfigError(format_message("invalid joiner", where=self.where(f"{key_path}.joiner"), expected="__module__ and exactly one of __class__ (a Sample type) or __function__", found=repr(dict(joiner))))
        spec = JoinSpec(tuple(members), names, (str(joiner["__module__"]), kinds[0], str(joiner[kinds[0]])), file=self.file if self.chain else None)
        settings = self._ref_settings({k: v for k, v in node.items() if k in ("subflavors", "shuffle_over_epochs_multiplier")}, key_path, members[0].split_part)
        leaf = LeafDataset(path=members[0].path, where=self.where(key_path), join=spec, **settings)
        if "subset" in node:
            leaf = _leaf_subset(leaf, node["subset"], self.where(f"{key_path}.subset"), innermost=True)
        return BlendPlan("single", (leaf,))

    def blend_plan(self, node: Mapping, key_path: str, split_part: str, kind: str) -> BlendPlan:
        allowed = (kind, "subset", "blend_mode") if kind == "blend" else (kind, "subset")
        check_mapping(node, file=self.file, key_path=key_path, allowed=allowed)
        mode = _check_mode(node["blend_mode"], self.where(f"{key_path}.blend_mode")) if "blend_mode" in node else None
        entries = node[kind]
        if not isinstance(entries, list) or not entries:
            raise ConfigError(format_message(f"{kind} needs a list of entries", where=self.where(f"{key_path}.{kind}"), expected="a non-empty list", found=repr(entries)[:80]))
        extra_key = "weight" if kind == "blend" else "repetitions"
        children: list[tuple[Any, BlendPlan]] = []
        for i, entry in enumerate(entries):
            entry_path = f"{key_path}.{kind}[{i}]"
            if not isinstance(entry, Mapping):
                raise ConfigError(format_message("expected a mapping", where=self.where(entry_path), expected="a dataset reference with path and " + extra_key, found=repr(entry)[:80]))
            raw = entry.get(extra_key, 1)
            factor = self._weight(raw, f"{entry_path}.{extra_key}", kind)
            if "join" in entry:
                child = self.join_plan(entry, entry_path, split_part, extra=(extra_key,))
                children.append((factor, child))
                continue
            if "path" not in entry:
                raise ConfigError(format_message(f"{kind} entry without path", where=self.where(entry_path), expected="a dataset reference with a path", found=f"keys {', '.join(map(str, entry))}"))
            child = self.ref_plan(entry, entry_path, split_part, extra=(extra_key,))
            if child.kind != "single" and child.kind != kind:
                raise ConfigError(
                    format_message(
                        "blend and blend_epochized are mixed in one tree",
                        where=self.where(entry_path),
                        expected=f"only {kind} below this {kind}",
                        found=f"{child.kind} in {child.source or 'the referenced file'}",
                        fix="use weights (blend) or repetitions (blend_epochized) throughout one split",
                    )
                )
            mode = self._merge_mode(mode, child.blend_mode, entry_path)
            children.append((factor, child))
        leaves: list[LeafDataset] = []
        if kind == "blend" and any(isinstance(weight, WeightSchedule) for weight, _ in children):
            weights = tuple(weight for weight, _ in children)
            check_level(weights, self.where(f"{key_path}.blend"))
            for i, (weight, child) in enumerate(children):
                # A constant 0 next to schedules: weight 0, so the loader leaves it out as usual.
                zero = Fraction(0) if weight == 0 else Fraction(1)
                leaves.extend(replace(leaf, weight=leaf.weight * zero, weight_schedule=(leaf.weight_schedule or LeafSchedule(())).outer(weights, i)) for leaf in child.leaves)
        elif kind == "blend":
            total = sum(weight for weight, _ in children)
            if total <= 0:
                raise ConfigError(format_message("all blend weights are zero", where=self.where(f"{key_path}.blend"), expected="at least one positive weight", found="weights " + ", ".join(f"{float(w):g}" for w, _ in children)))
            for weight, child in children:
                leaves.extend(replace(leaf, weight=leaf.weight * weight / total) for leaf in child.leaves)
        else:
            for repetitions, child in children:
                leaves.extend(replace(leaf, repetitions=leaf.repetitions * repetitions) for leaf in child.leaves)
        plan = BlendPlan(kind, tuple(leaves), mode)
        if "subset" in node:
            plan = self._apply_outer_subset(plan, node["subset"], f"{key_path}.subset")
        return plan

    def _weight(self, raw: Any, key_path: str, kind: str) -> Fraction | WeightSchedule | float:
        """A blend entry's weight (a number, or a schedule: ``weight_schedule.py``) or a
        blend_epochized entry's repetitions."""
        if isinstance(raw, Mapping) and kind == "blend":
            return parse_weight_schedule(raw, self.where(key_path))
        if isinstance(raw, Mapping):
            raise ConfigError(
                format_message(
                    "repetitions cannot be a schedule",
                    where=self.where(key_path),
                    expected="a number > 0",
                    found=repr(raw)[:80],
                    fix="schedules are for blend weights (blend); a blend_epochized pass reads each dataset a fixed number of times, which a schedule over the run cannot change",
                )
            )
        factor = _number(raw, self.where(key_path), "weight" if kind == "blend" else "repetitions", allow_zero=kind == "blend")
        return _exact(raw) if kind == "blend" else factor

    def _merge_mode(self, mode: str | None, inner: str | None, key_path: str) -> str | None:
        if mode is not None and inner is not None and mode != inner:
            raise ConfigError(format_message("conflicting blend_mode values in one tree", where=self.where(key_path), found=f"{mode!r} above, {inner!r} in the referenced file", fix="use one blend_mode per split"))
        return mode or inner

    def ref_plan(self, ref: Mapping, key_path: str, split_part: str, *, extra: Iterable[str]) -> BlendPlan:
        if "split" in ref:
            raise ConfigError(format_message("unknown key 'split'", where=self.where(f"{key_path}.split"), expected="split_part", found="split", fix="rename 'split' to 'split_part' (Energon's docs show 'split' by mistake)"))
        check_mapping(ref, file=self.file, key_path=key_path, allowed=(*_REF_KEYS, "aux", *extra), required=("path",))
        settings = self._ref_settings(ref, key_path, split_part)
        target = self._resolve(ref["path"], f"{key_path}.path")
        if is_metadataset_path(target):
            if "aux" in ref:
                raise ConfigError(format_message("aux is not allowed on a reference to a metadataset", where=self.where(f"{key_path}.aux"), fix=f"set aux on the dataset entries inside {target}"))
            return self._nested(target, ref, key_path, settings)
        leaf = LeafDataset(path=str(target), where=self.where(key_path), aux=self._aux(ref.get("aux"), f"{key_path}.aux"), **settings)
        if leaf.sequence_length is not None and indexed_prefix(target) is None:
            raise ConfigError(format_message("sequence_length applies only to Megatron .bin/.idx datasets", where=self.where(f"{key_path}.sequence_length"), found=f"path {target}", fix="remove sequence_length, or point path at the dataset's .idx/.bin file or prefix"))
        if "subset" in ref:
            leaf = _leaf_subset(leaf, ref["subset"], self.where(f"{key_path}.subset"), innermost=True)
        if self.check_datasets:
            _check_dataset(leaf, self.where(f"{key_path}.path"))
        return BlendPlan("single", (leaf,))

    def _ref_settings(self, ref: Mapping, key_path: str, split_part: str) -> dict[str, Any]:
        subflavors = ref.get("subflavors") or {}
        check_mapping(subflavors, file=self.file, key_path=f"{key_path}.subflavors", allowed=None)
        if ref.get("subflavor") is not None:  # V1's single subflavor, as Energon maps it
            subflavors = {"__subflavor__": ref["subflavor"], **subflavors}
        multiplier = check_shuffle_over_epochs(ref.get("shuffle_over_epochs_multiplier", 1), where=self.where(f"{key_path}.shuffle_over_epochs_multiplier"))
        part = ref.get("split_part", split_part)
        if not isinstance(part, str) or not part:
            raise ConfigError(format_message("invalid split_part", where=self.where(f"{key_path}.split_part"), expected="a split name such as train, val or test", found=repr(part)))
        return {
            "split_part": part,
            "subflavors": dict(subflavors),
            "shuffle_over_epochs_multiplier": multiplier,
            "dataset_config": ref.get("dataset_config"),
            "split_config": ref.get("split_config"),
            "sequence_length": check_sequence_length(ref.get("sequence_length"), self.where(f"{key_path}.sequence_length")),
        }

    def _aux(self, raw: Any, key_path: str) -> dict[str, AuxSource]:
        """``aux: {name: source}``, as Energon reads it: ``filesystem://folder`` (or
        ``filesystem+<scheme>://...``, or ``{fs_path: folder}``) is a plain folder; any other
        value (a path, a URL, ``{path: ...}``) is a prepared dataset. Relative paths are relative
        to the YAML file."""
        if raw is None:
            return {}
        aux = check_mapping(raw, file=self.file, key_path=key_path, allowed=None)
        resolved = {}
        for name, value in aux.items():
            where = f"{key_path}.{name}"
            kind = "dataset"
            if isinstance(value, Mapping):
                check_mapping(value, file=self.file, key_path=where, allowed=("path", "fs_path"))
                if len(value) != 1:
                    raise ConfigError(format_message("an aux source has one key", where=self.where(where), expected="path: <prepared dataset> or fs_path: <folder>", found=", ".join(map(str, value)) or "none"))
                kind = "folder" if "fs_path" in value else "dataset"
                value = value.get("fs_path", value.get("path"))
            elif isinstance(value, str):
                scheme, sep, rest = value.partition("://")
                if sep and scheme.lower().split("+")[0] == "filesystem":
                    kind = "folder"
                    inner = scheme.partition("+")[2]
                    if "+" in inner or (scheme.lower() != "filesystem" and not inner):
                        raise ConfigError(format_message("unknown aux source scheme", where=self.where(where), expected="filesystem://<folder> or filesystem+<scheme>://<url>", found=repr(value)))
                    value = f"{inner}://{rest}" if inner else rest
            resolved[str(name)] = AuxSource(kind=kind, path=str(self._resolve(value, where)), where=self.where(where))
        return resolved

    def _resolve(self, value: Any, key_path: str) -> AnyPath:
        """A path from the YAML: a URL or an absolute path as is, else relative to the YAML file
        (also when the YAML file itself is remote)."""
        if not isinstance(value, str) or not value:
            raise ConfigError(format_message("invalid path", where=self.where(key_path), expected="a path relative to the YAML file, or absolute", found=repr(value)))
        if self.keep_urls and "://" in value:
            return value
        path = as_path(value)
        if isinstance(path, RemotePath) or path.is_absolute():
            return path.resolve()
        return (self.base / value).resolve()

    def _nested(self, target: AnyPath, ref: Mapping, key_path: str, settings: dict[str, Any]) -> BlendPlan:
        if target in self.chain:
            cycle = " -> ".join(str(p) for p in (*self.chain, target))
            raise ConfigError(format_message("circular metadataset reference", where=self.where(f"{key_path}.path"), found=cycle, fix="remove the reference that points back to a file that includes it"))
        if len(self.chain) >= MAX_METADATASET_NESTING:
            raise ConfigError(
                format_message(
                    "metadataset files nest too deep",
                    where=self.where(f"{key_path}.path"),
                    expected=f"at most {MAX_METADATASET_NESTING} metadataset files, each included by the one before",
                    found=f"{len(self.chain) + 1} files: {self.chain[0]} -> ... -> {self.chain[-1]} -> {target}",
                    fix="include the innermost files directly from an outer one",
                )
            )
        for key in ("dataset_config", "split_config", "sequence_length"):
            if settings[key] is not None:
                raise ConfigError(format_message(f"{key} is not allowed on a reference to a metadataset", where=self.where(f"{key_path}.{key}"), fix=f"set {key} on the dataset entries inside {target}"))
        plan = _Parser(target.parent, str(target), (*self.chain, target), check_datasets=self.check_datasets).split(load_structured(target), settings["split_part"])
        outer_flavors = settings["subflavors"]
        multiplier = settings["shuffle_over_epochs_multiplier"]
        leaves = tuple(
            replace(leaf, subflavors={**leaf.subflavors, **outer_flavors}, shuffle_over_epochs_multiplier=combine_shuffle_over_epochs(multiplier, leaf.shuffle_over_epochs_multiplier))
            for leaf in plan.leaves
        )
        plan = replace(plan, leaves=leaves)
        if "subset" in ref:
            plan = self._apply_outer_subset(plan, ref["subset"], f"{key_path}.subset")
        return plan

    def _apply_outer_subset(self, plan: BlendPlan, subset: Any, key_path: str) -> BlendPlan:
        return replace(plan, leaves=tuple(_leaf_subset(leaf, subset, self.where(key_path), innermost=False) for leaf in plan.leaves))

    # V1 ------------------------------------------------------------------------------------------
    def v1_plan(self, node: Any, key_path: str, split_part: str) -> BlendPlan:
        check_mapping(node, file=self.file, key_path=key_path, allowed=("datasets",), required=("datasets",))
        entries = node["datasets"]
        if not isinstance(entries, list) or not entries:
            raise ConfigError(format_message("datasets needs a list of entries", where=self.where(f"{key_path}.datasets"), expected="a non-empty list", found=repr(entries)[:80]))
        for i, entry in enumerate(entries):
            check_mapping(entry, file=self.file, key_path=f"{key_path}.datasets[{i}]", allowed=_V1_REF_KEYS, required=("path",))
        # The same rules as a V2 blend: weights normalised per level, subflavors merged.
        converted = [{k: v for k, v in entry.items()} for entry in entries]
        return self.v1_blend(converted, key_path, split_part)

    def v1_blend(self, entries: list[dict], key_path: str, split_part: str) -> BlendPlan:
        children = []
        for i, entry in enumerate(entries):
            entry_path = f"{key_path}.datasets[{i}]"
            raw = entry.pop("weight", 1)
            _number(raw, self.where(f"{entry_path}.weight"), "weight", allow_zero=True)
            weight = _exact(raw)
            settings = self._ref_settings(entry, entry_path, split_part)
            target = self._resolve(entry["path"], f"{entry_path}.path")
            if is_metadataset_path(target):
                child = self._nested(target, entry, entry_path, settings)
            else:
                leaf = LeafDataset(path=str(target), where=self.where(entry_path), **settings)
                if self.check_datasets:
                    _check_dataset(leaf, self.where(f"{entry_path}.path"))
                child = BlendPlan("single", (leaf,))
            children.append((weight, child))
        total = sum(w for w, _ in children)
        if total <= 0:
            raise ConfigError(format_message("all blend weights are zero", where=self.where(f"{key_path}.datasets"), expected="at least one positive weight"))
        leaves = [replace(leaf, weight=leaf.weight * w / total) for w, child in children for leaf in child.leaves]
        return BlendPlan("blend", tuple(leaves))


def _leaf_subset(leaf: LeafDataset, subset: Any, where: str, *, innermost: bool) -> LeafDataset:
    """Folds one ``subset: {range: [start, end]}`` into ``leaf`` (inner ranges come first)."""
    if not isinstance(subset, Mapping) or set(subset) != {"range"} or not isinstance(subset["range"], list) or len(subset["range"]) != 2:
        raise ConfigError(format_message("invalid subset", where=where, expected="{range: [start, end]} with percentages ('10%'), sample indices or 'end'", found=repr(subset)[:120]))
    (kind_a, a), (kind_b, b) = (_range_bound(v, f"{where}.range[{i}]") for i, v in enumerate(subset["range"]))
    if kind_a == "end":
        raise ConfigError(format_message("invalid subset range start", where=f"{where}.range[0]", expected="a percentage or a sample index", found="'end'"))
    if kind_a == "absolute" or kind_b == "absolute":
        if not innermost:
            raise ConfigError(format_message("absolute subset ranges are only allowed for a leaf dataset", where=where, expected="percentages on blends and references to metadatasets", found=repr(subset["range"]), fix="use percentages here, or put the index range on the dataset entry"))
        if kind_a != "absolute" or kind_b == "relative":
            raise ConfigError(format_message("subset range mixes sample indices and percentages", where=where, expected="[index, index or 'end'] or [percent, percent]", found=repr(subset["range"])))
        if b is not None and b < a:
            raise ConfigError(format_message("subset range ends before it starts", where=where, found=repr(subset["range"])))
        return replace(leaf, absolute_range=(a, b))
    start, end = a, 1.0 if b is None else b
    if end < start:
        raise ConfigError(format_message("subset range ends before it starts", where=where, found=repr(subset["range"])))
    if leaf.relative_range is None:
        return replace(leaf, relative_range=(start, end))
    inner_start, inner_end = leaf.relative_range
    width = inner_end - inner_start  # an outer range selects a part of what the inner one left
    return replace(leaf, relative_range=(inner_start + start * width, inner_start + end * width))


def _check_dataset(leaf: LeafDataset, where: str) -> None:
    """The leaf's path must be a prepared dataset folder, a ``.jsonl`` file or a Megatron
    ``.bin/.idx`` dataset (its ``.idx``, its ``.bin`` or their common prefix)."""
    path = as_path(leaf.path)
    if path.suffix == ".jsonl" and path.is_file():
        if not jsonl_index_path(path).is_file():
            raise DatasetError(format_message("JSONL file was never prepared", where=where, found=f"{path} has no {jsonl_index_path(path).name}", fix=f"run `energon-lite prepare {path}` first"))
        return
    if isinstance(path, RemotePath) and path.suffix not in (".idx", ".bin") and is_prepared(path):
        return  # one request (HEAD .nv-meta/.info.json): a folder is never a Megatron prefix
    prefix = indexed_prefix(path)
    if prefix is not None:
        missing = [p for p in (as_path(f"{prefix}.idx"), as_path(f"{prefix}.bin")) if not p.is_file()]
        if missing:
            raise DatasetError(format_message("Megatron indexed dataset is incomplete", where=where, expected=f"{prefix}.bin and {prefix}.idx", found=f"no {', '.join(str(p) for p in missing)}", fix="copy the missing file next to the other one"))
        return
    if not path.exists():
        raise DatasetError(format_message("dataset path does not exist", where=where, found=str(path), fix="check the path (relative paths are relative to the YAML file)"))
    if path.is_file():
        raise DatasetError(format_message("not a dataset", where=where, expected="a prepared dataset folder, a .jsonl file, a Megatron .bin/.idx dataset or a metadataset .yaml", found=str(path)))
    if not is_prepared(path):
        raise DatasetError(format_message("dataset was never prepared", where=where, found=f"{path} has no .nv-meta/.info.json", fix=f"run `energon-lite prepare {path}` first"))
