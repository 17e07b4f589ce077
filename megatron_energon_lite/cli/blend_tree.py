"""What a metadataset YAML reads, split by split: for ``energon-lite info`` and ``lint``.

Each split is shown as the loader sees it after :func:`load_blend_plan` folded the tree down to
its leaf datasets: the effective weight (``blend``) or repetitions (``blend_epochized``) and the
samples left after ``subset``.  Then warnings for entries that are legal but rarely meant: one
dataset split reached through two entries, and weights of zero.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import click

from ..errors import ConfigError, EnergonLiteError, format_message
from ..format.metadata import load_structured
from ..format.metadataset import BlendPlan, LeafDataset, load_blend_plan, repeated_length

__all__ = ["LeafRow", "SplitTree", "echo_trees", "leaf_datasets", "read_trees", "split_names"]


@dataclass(frozen=True)
class LeafRow:
    """One leaf of a split and the samples it reads; ``problem`` says why they are unknown."""

    leaf: LeafDataset
    total: int | None = None  # samples in the dataset's split, before subset
    sample_range: tuple[int, int] | None = None
    problem: str | None = None

    @property
    def samples(self) -> int | None:
        return None if self.sample_range is None else self.sample_range[1] - self.sample_range[0]


@dataclass(frozen=True)
class SplitTree:
    """One split of the YAML: its plan (always read with ``training=True``) and its leaves."""

    split: str
    plan: BlendPlan
    rows: tuple[LeafRow, ...]

    def warnings(self, top: Path) -> list[str]:
        found = []
        weighted = self.plan.kind == "blend"
        read = [row for row in self.rows if not (weighted and row.leaf.weight == 0)]
        groups: dict[tuple[str, str], list[LeafRow]] = {}
        for row in read:
            groups.setdefault((row.leaf.path, row.leaf.split_part), []).append(row)
        for (path, split_part), rows in groups.items():
            if len(rows) > 1 and _overlap(rows):
                entries = ", ".join(_entry(row.leaf, top) for row in rows)
                found.append(
                    f"split {self.split}: {_display(path, top)} (split {split_part}) is reached through {len(rows)} entries ({entries}): "
                    "its samples appear through each of them, each entry in its own shuffled order "
                    "(in Megatron Energon the copies even read in the same order, en#266)"
                )
        if weighted:
            for row in self.rows:
                if row.leaf.weight == 0:
                    effect = "the entry is never read" if self.split == "train" else "get_train_dataset never reads it, but get_val_dataset ignores weights and does"
                    found.append(f"split {self.split}: {_entry(row.leaf, top)} ({_display(row.leaf.path, top)}) has weight 0: {effect}")
        return found


def split_names(path: Path) -> list[str]:
    """The split names under ``splits:`` in YAML order; a YAML without them raises the parser's error."""
    raw = load_structured(path)
    splits = raw.get("splits") if isinstance(raw, Mapping) else None
    if isinstance(splits, Mapping) and splits:
        return [str(name) for name in splits]
    load_blend_plan(path, "train", training=True)  # names the file and the key that is wrong
    raise ConfigError(format_message("metadataset has no splits", where=f"{path}: splits", expected="a mapping of split names (train, val, ...) to datasets or blends"))


def read_trees(path: Path, splits: list[str] | None = None) -> list[SplitTree]:
    """Every split of the YAML (or only ``splits``); raises :class:`ConfigError` on a bad YAML."""
    trees = []
    for split in splits or split_names(path):
        # training=True for every split: that is where weights and repetitions mean something.
        plan = load_blend_plan(path, split, training=True)
        trees.append(SplitTree(split, plan, tuple(_row(leaf) for leaf in plan.leaves)))
    return trees


def _row(leaf: LeafDataset) -> LeafRow:
    # Imported on use only: `info` and `lint` of a plain dataset never need it.
    from ..format.resolved import resolve_dataset

    try:
        total = resolve_dataset(leaf, dataset_config=None, split_config=None, trust_dataset_code=False).total
        return LeafRow(leaf, total, leaf.sample_range(total))
    except EnergonLiteError as exc:  # an empty split, a subset past the end: shown on the leaf
        return LeafRow(leaf, problem=str(exc))


def leaf_datasets(trees: list[SplitTree]) -> dict[tuple[str, str | None, str | None], list[str]]:
    """``(path, dataset_config, split_config)`` -> the split parts the YAML reads of it, in order."""
    found: dict[tuple[str, str | None, str | None], list[str]] = {}
    for tree in trees:
        for row in tree.rows:
            # A join reads each of its members.
            members = row.leaf.join.members if row.leaf.join is not None else [row.leaf]
            for member in members:
                parts = found.setdefault((member.path, member.dataset_config, member.split_config), [])
                if member.split_part not in parts:
                    parts.append(member.split_part)
    return found


def echo_trees(path: Path, trees: list[SplitTree]) -> int:
    """Prints every split, its leaves and its warnings; returns how many leaves could not be read."""
    top = path.resolve()  # what the parser writes into leaf.where
    click.echo(f"Metadataset {path}")
    problems = 0
    for tree in trees:
        click.echo(f"  split {tree.split}: {_summary(tree)}")
        for line in _table(_columns(tree, top)):
            click.echo(f"    {line}")
        for row in tree.rows:
            if row.problem is not None:
                problems += 1
                first, *rest = row.problem.splitlines()
                click.echo(f"error: split {tree.split}: {_entry(row.leaf, top)}: {first}")
                for line in rest:
                    click.echo(f"  {line.strip()}")
        for warning in tree.warnings(top):
            click.echo(f"warning: {warning}")
    return problems


def _summary(tree: SplitTree) -> str:
    plan, count = tree.plan, len(tree.rows)
    if plan.kind == "single":
        text = "one dataset"
    elif plan.kind == "blend":
        mode = plan.blend_mode or "random (default)"
        text = f"blend of {count} datasets, blend_mode {mode}"
    else:
        per_pass = [repeated_length(row.samples, row.leaf.repetitions) for row in tree.rows if row.samples is not None]
        text = f"blend_epochized of {count} datasets, {sum(per_pass)} samples per pass"
    if tree.split != "train" and plan.kind != "single":
        text += "; get_val_dataset reads each entry once, in order"
    return text


def _columns(tree: SplitTree, top: Path) -> list[list[str]]:
    kind = tree.plan.kind
    subsets = any(row.sample_range is not None and row.sample_range != (0, row.total) for row in tree.rows)
    header = ["entry", "dataset", "split", *{"blend": ["weight"], "blend_epochized": ["repetitions"]}.get(kind, []), "samples"]
    header += [*(["per pass"] if kind == "blend_epochized" else []), *(["subset"] if subsets else []), "subflavors"]
    lines = [header]
    for row in tree.rows:
        leaf, samples = row.leaf, row.samples
        line = [_entry(leaf, top), _dataset_label(leaf, top), leaf.split_part]
        if kind == "blend":
            if leaf.weight_schedule is not None:  # its share at the start of the run
                line.append(f"{float(leaf.weight) * leaf.weight_schedule.factor(0):.1%} scheduled")
            else:
                line.append(f"{float(leaf.weight):.1%}")  # float(): the plan may hold Fractions
        elif kind == "blend_epochized":
            line.append(f"x{float(leaf.repetitions):g}")
        line.append("?" if samples is None else str(samples))
        if kind == "blend_epochized":
            line.append("?" if samples is None else str(repeated_length(samples, leaf.repetitions)))
        if subsets:
            line.append("-" if row.sample_range in (None, (0, row.total)) else f"[{row.sample_range[0]}, {row.sample_range[1]}) of {row.total}")
        line.append(", ".join(f"{k}={v}" for k, v in leaf.subflavors.items()) or "-")
        lines.append(line)
    return lines


_NUMBER_COLUMNS = ("weight", "repetitions", "samples", "per pass")


def _table(lines: list[list[str]]) -> list[str]:
    """Aligned columns: numbers to the right, text to the left; ``lines[0]`` is the header."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    right = [name in _NUMBER_COLUMNS for name in lines[0]]
    return [
        "  ".join(cell.rjust(width) if r else cell.ljust(width) for cell, width, r in zip(line, widths, right)).rstrip()
        for line in lines
    ]


def _entry(leaf: LeafDataset, top: Path) -> str:
    """``leaf.where`` without the file when it is the top YAML, else with the file relative to it."""
    file, _, key_path = leaf.where.rpartition(": ")
    if not file:
        return leaf.where
    return key_path if Path(file) == top else f"{_display(file, top)}: {key_path}"


def _dataset_label(leaf: LeafDataset, top: Path) -> str:
    """The dataset path; for a join, every member (the primary first) with its nonmatch."""
    if leaf.join is None:
        return _display(leaf.path, top)
    members = [_display(m.path, top) + ("" if i == 0 else f" ({m.nonmatch})") for i, m in enumerate(leaf.join.members)]
    return "join " + " + ".join(members)


def _display(path: str, top: Path) -> str:
    """Paths as the YAML writes them: relative to its folder."""
    return os.path.relpath(path, top.parent)


def _overlap(rows: list[LeafRow]) -> bool:
    """Whether any two of the rows read a common sample (unknown ranges count as overlapping)."""
    ranges = sorted(row.sample_range or (0, float("inf")) for row in rows)
    return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(ranges))
