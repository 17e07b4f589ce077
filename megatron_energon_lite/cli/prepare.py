"""``energon-lite prepare``: same flags as ``energon prepare``, parallel and incremental.

Exit status as ``energon prepare`` in the same situations: 0 when the dataset was prepared, and
also when there is no tar file to index (nothing is written); 1 when a flag value, the dataset or
the metadataset is wrong; 2 for click's usage errors (an unknown option, ``--media-metadata-by-*``
with ``--tar-index-only``).  Two deliberate differences: a malformed ``--split-ratio`` and a
``--field-map`` naming fields the sample type lacks fail with 1 before any work (``energon``
prints a message and exits 0, or writes a dataset.yaml that cannot load).

Under ``torchrun``, or with ``--rank``/``--world-size`` on each node, the ranks share the indexing
of a dataset folder and rank 0 merges (:mod:`megatron_energon_lite.format.prepare.nodes`); nothing
is asked then.

A metadataset YAML builds the joins it defines (Energon's join index cache files), see
:func:`~megatron_energon_lite.format.join.prepare_metadataset_joins`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from pathlib import Path

import click
import yaml

from ..errors import ConfigError, format_message
from ..format.dataset_config import FieldAccess, render_dataset_yaml
from ..format.join import prepare_metadataset_joins
from ..format.jsonl import write_jsonl_index
from ..format.media_metadata import MediaFilter
from ..format.metadata import is_prepared, meta_dir, read_info
from ..format.metadataset import is_metadataset_path
from ..format.prepare import FileRanks, Ranks, TorchRanks, discover_shards, prepare_across_ranks, prepare_dataset
from ..format.split_reader import SplitReader
from ..format.sqlite_index import part_counts
from ..samples import registered_sample_types, sample_type_by_name
from ..storage import AnyPath, RemotePath, atomic_write_text
from .fix_duplicates import fix_duplicates as fix_duplicate_keys
from .params import DATASET_PATH, Command, ValueProblem, counted

CRUDE = "CrudeWebdataset"
#: With more part types than this, Energon asks for a sample_loader instead of a field map.
_MAX_FIELD_MAP_PARTS = 10


def _parse_ratio(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.replace(" ", "").split(","))
    except ValueError:
        raise ValueProblem(f"{text!r} is not a list of numbers; use e.g. 8,1,1", param_hint="'--split-ratio'") from None
    if len(values) != 3:
        raise ValueProblem(f"{text!r} has {len(values)} values; give train,val,test, e.g. 8,1,1", param_hint="'--split-ratio'")
    return values


def _prompted_ratio(text: str) -> tuple[float, ...]:
    """A ratio typed at the prompt: a bad one is asked again."""
    try:
        return _parse_ratio(text)
    except ValueProblem as exc:
        raise click.UsageError(exc.message.removeprefix("Invalid value for '--split-ratio': ")) from None


def _parse_split_parts(values: tuple[str, ...]) -> list[tuple[str, str]] | None:
    if not values:
        return None
    parsed = []
    for value in values:
        name, sep, pattern = value.partition(":")
        if not sep or not name or not pattern:
            raise ValueProblem(f"{value!r} is not NAME:REGEX, e.g. 'train:shards/train/.*'", param_hint="'--split-parts'")
        parsed.append((name, pattern))
    return parsed


def _sample_fields(sample_type: str) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(sample_type_by_name(sample_type)) if not f.name.startswith("__")]


def _check_sample_type(sample_type: str | None, field_map: str | None, interactive: bool) -> dict | None:
    """Validates --sample-type and --field-map before any indexing work starts.

    None means: no field map (no sample type, a crude dataset, ask interactively, or write a
    sample_loader.py template in non-interactive mode, as ``energon prepare`` does).
    """
    if sample_type is None:
        if field_map is not None:
            click.echo("Note: --field-map is ignored without --sample-type (no dataset.yaml is written).", err=True)
        return None
    names = [*registered_sample_types(), CRUDE]
    if sample_type not in names:
        raise ValueProblem(f"{sample_type!r} is not one of {', '.join(names)}", param_hint="'--sample-type'")
    if sample_type == CRUDE or field_map is None:
        return None
    try:
        mapping = json.loads(field_map)
    except json.JSONDecodeError as exc:
        raise ValueProblem(f"not valid JSON ({exc})", param_hint="'--field-map'") from None
    if not isinstance(mapping, dict):
        raise ValueProblem("must be a JSON object of field name -> part expression", param_hint="'--field-map'")
    fields = [f.name for f in _sample_fields(sample_type)]
    unknown = [k for k in mapping if k not in fields]
    if unknown:
        raise ValueProblem(f"{sample_type} has no field {unknown[0]!r}; its fields are {', '.join(fields)}", param_hint="'--field-map'")
    return mapping


def _fields_without_parts(mapping: dict[str, str], parts: list[str]) -> list[str]:
    """The ``field: expression`` entries of a field map none of whose alternatives is a part type
    the shards hold (``image: png`` when the shards have jpg, json, txt)."""
    return [
        f"{field}: {expression}"
        for field, expression in mapping.items()
        if not any(part in parts for part in FieldAccess.parse(str(expression), where=f"--field-map {field}").parts)
    ]


def _empty_split_warnings(splits: dict[str, list[str]], ratio: tuple[float, ...] | None, shard_count: int) -> list[str]:
    """A warning, with the fix, for each split that got no shard although it was meant to get some."""
    warnings = []
    for i, (split, split_shards) in enumerate(splits.items()):
        if split_shards:
            continue
        if ratio is not None:
            share = ratio[i] / sum(ratio) if i < len(ratio) and sum(ratio) else 0.0
            if share <= 0:
                continue  # a 0 in the ratio: empty on purpose
            why = f"{counted(shard_count, 'shard')} at --split-ratio {','.join(f'{r:g}' for r in ratio)} give it {share * shard_count:.2g} of a shard"
            fix = f"pass a --split-ratio that gives every split at least one whole shard (each share times {shard_count}), or split with --split-parts; then re-run with --force-overwrite"
        else:
            why = "no shard matched its --split-parts pattern"
            fix = "check the pattern (re.match on each shard's path relative to the dataset), then re-run with --force-overwrite"
        warnings.append(f"Warning: split {split} is empty: {why}. Loading it will fail. Fix: {fix}.")
    return warnings


def _sample_loader_template(sample_type: str, parts: list[str]) -> str:
    """A ``sample_loader.py`` to edit, for a sample type without --field-map (as energon writes)."""
    lines = []
    for f in _sample_fields(sample_type):
        default = "" if f.default is dataclasses.MISSING else f", default {f.default!r}"
        type_name = getattr(f.type, "__name__", None) or str(f.type)
        lines.append(f'        {f.name}=raw["TODO"],  # {type_name}{default}')
    return "\n".join(
        [
            "# Written by `energon-lite prepare` because no --field-map was given.",
            f"# Edit sample_loader to return the fields of {sample_type}. energon-lite runs this file only",
            "# when asked to (trust_dataset_code=True, or --trust-dataset-code on the command line).",
            "",
            "",
            "def sample_loader(raw: dict) -> dict:",
            "    # raw holds the sample's decoded parts by extension, e.g. raw[\"jpg\"], raw[\"txt\"].",
            "    return dict(",
            *lines,
            "    )",
            "",
            "",
            "def part_filter(part: str) -> bool:",
            "    # The parts sample_loader reads: the others are not decoded.",
            f"    return part in {tuple(parts)!r}",
            "",
        ]
    )


def _write_sample_loader_template(path: AnyPath, sample_type: str, parts: list[str], dataset_yaml_name: str, *, interactive: bool) -> None:
    """dataset.yaml pointing at ``sample_loader.py``; the template is written when there is none
    (an existing one is replaced only when the user says so, interactively, as in Energon)."""
    meta = meta_dir(path)
    loader_file = meta / "sample_loader.py"
    if not loader_file.is_file() or (interactive and click.confirm("Do you want to override the existing sample loader?", default=False)):
        atomic_write_text(loader_file, _sample_loader_template(sample_type, parts))
        click.echo(f"Created {loader_file}. Please edit it to return the proper values.")
        click.echo("It is Python code shipped with the dataset: lint, preview and the loader run it only when asked to (--trust-dataset-code, or trust_dataset_code=True).")
    data = {
        "sample_type": {"__module__": "megatron.energon", "__class__": sample_type},
        "sample_loader": "sample_loader.py:sample_loader",
        "part_filter": "sample_loader.py:part_filter",
    }
    atomic_write_text(meta / dataset_yaml_name, yaml.safe_dump(data, sort_keys=False))


@contextlib.contextmanager
def _local_build_folder(path: AnyPath, tmp_path: Path | None):
    """``--tmp-path``: where index.sqlite of a remote dataset is built before the upload.

    Local datasets build it next to the old one (for an atomic rename) and ignore the option, as
    Energon does.  The build folder is created under ``tmp_path`` and removed afterwards.
    """
    if tmp_path is None or not isinstance(path, RemotePath):
        yield
        return
    tmp_path.mkdir(parents=True, exist_ok=True)
    saved = tempfile.tempdir
    tempfile.tempdir = str(tmp_path)  # the scratch folder of a remote prepare is made by mkdtemp
    try:
        yield
    finally:
        tempfile.tempdir = saved


def _prepare_metadataset(path: AnyPath) -> None:
    """``prepare meta.yaml``: build every join's index, as ``energon prepare`` does."""
    click.echo(f"Preparing metadataset {path}")
    prepared, removed = prepare_metadataset_joins(path)
    for join in prepared:
        info = join.index_file
        names = " + ".join(f"{m.path} ({m.split_part})" for m in join.spec.members)
        skipped = info.primary_samples - info.rows
        detail = f"{info.rows} of {info.primary_samples} primary samples joined" + (f", {skipped} skipped (nonmatch: skip)" if skipped else "")
        missing = [f"{n} missing in {m.path}" for n, m in zip(info.missing[1:], join.spec.members[1:]) if n]
        if missing:
            detail += ", " + ", ".join(missing) + " (nonmatch: none)"
        action = "wrote" if info.written else "up to date"
        click.echo(f"  join {join.where}: {names}\n    {detail}; {action}: {info.path}")
    for stale in removed:
        click.echo(f"  removed stale join index {stale}")
    if not prepared:
        click.echo("  no joins: nothing to prepare (the datasets themselves are prepared one by one)")
    click.echo("Done")


def _crude_label(name: str) -> str:
    return "CrudeWebdataset (plain dicts for cooking)" if name == CRUDE else name


def _ask_sample_type() -> str:
    choices = [*registered_sample_types(), CRUDE]
    click.echo("The following sample types are available:")
    for i, name in enumerate(choices):
        click.echo(f"{i}. {_crude_label(name)}")
    index = click.prompt("Please enter a number to choose a class", type=click.IntRange(0, len(choices) - 1))
    return choices[index]


def _describe_fields(sample_type: str) -> str:
    return ", ".join(f"{f.name}: {getattr(f.type, '__name__', f.type)}" for f in _sample_fields(sample_type))


def _ask_field(field: dataclasses.Field, parts: list[str]) -> str:
    """One field's part expression ('' to skip an optional field); re-asked until its parts exist."""
    required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    default = "" if required else f", default: {field.default if field.default is not dataclasses.MISSING else field.default_factory!r}"
    type_name = getattr(field.type, "__name__", field.type)
    while True:
        answer = click.prompt(f"Please enter a webdataset field name for {field.name!r} ({type_name}{default})", default="", show_default=False).strip()
        if not answer and not required:
            return ""
        unknown = [option for option in answer.split(",") if option.split("[", 1)[0].strip() not in parts]
        if answer and not unknown:
            return answer
        click.echo(f"That type doesn't exist in the WebDataset ({', '.join(unknown) or 'empty'}). Please try again.")


def _ask_field_map(sample_type: str, parts: list[str]) -> dict[str, str]:
    click.echo("\nFor each field, please specify the corresponding name in the WebDataset.")
    click.echo(f"Available types in WebDataset: {', '.join(parts)}")
    click.echo("Leave empty for skipping optional field")
    click.echo("You may also access json fields e.g. by setting the field to: json[field][field]")
    click.echo("You may also specify alternative fields e.g. by setting to: jpg,png")
    click.echo(f"Please enter the field_map for {sample_type}:")
    mapping = {}
    for field in _sample_fields(sample_type):
        answer = _ask_field(field, parts)
        if answer:
            mapping[field.name] = answer
    return mapping


def _write_dataset_yaml(path: AnyPath, *, sample_type: str | None, parts: list[str], interactive: bool, dataset_yaml_name: str) -> None:
    """After indexing: dataset.yaml (and maybe a sample_loader.py), asked as ``energon prepare`` asks.

    Only reached when the yaml was not already written with the dataset (no --field-map given).
    """
    if sample_type is None:
        if not interactive:
            click.echo("Skipping dataset.yaml creation (use --sample-type to create it).")
            click.echo("You will have to add a dataset.yaml manually.")
            return
        if not click.confirm("Do you want to create a dataset.yaml interactively?", default=True):
            click.echo("You will have to add a dataset.yaml manually.")
            return
        sample_type = _ask_sample_type()
    if sample_type == CRUDE:
        click.echo("CrudeWebdataset does not need a field map. You will need to provide a `Cooker` for your dataset samples in your `TaskEncoder`.")
        text = render_dataset_yaml(CRUDE, None)
    else:
        if interactive:
            click.echo(f"The sample type you selected: {sample_type}({_describe_fields(sample_type)})")
        field_map_possible = 0 < len(parts) <= _MAX_FIELD_MAP_PARTS
        if interactive and not field_map_possible:
            click.echo("You cannot set a field_map for this dataset. You will need a sample_loader.")
        use_field_map = interactive and field_map_possible and click.confirm("Do you want to set a simple field_map[Y] (or write your own sample_loader [n])?", default=True)
        if not use_field_map:
            _write_sample_loader_template(path, sample_type, parts if field_map_possible else ["TODO"], dataset_yaml_name, interactive=interactive)
            return
        text = render_dataset_yaml(sample_type, _ask_field_map(sample_type, parts))
    atomic_write_text(meta_dir(path) / dataset_yaml_name, text)
    click.echo(f"Wrote {meta_dir(path) / dataset_yaml_name}")


def _ranks(rank: int | None, world_size: int | None, wait_timeout: float) -> Ranks | None:
    """Who shares this prepare: explicit ``--rank``/``--world-size``, else torchrun's environment
    (``RANK`` and ``WORLD_SIZE`` above 1), else nobody (None)."""
    if (rank is None) != (world_size is None):
        raise click.UsageError("--rank and --world-size go together (e.g. --rank 0 --world-size 4 on the first node)")
    if rank is not None and world_size is not None:
        if rank >= world_size:
            raise ValueProblem(f"{rank} is not below --world-size {world_size}", param_hint="'--rank'")
        return FileRanks(rank, world_size, wait_timeout) if world_size > 1 else None
    if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return TorchRanks(wait_timeout)
    return None


def _check_across_ranks(
    path: AnyPath, ranks: Ranks, *, fix_duplicates: bool, tar_index_only: bool, split_parts: tuple[str, ...], split_ratio: str | None
) -> None:
    """What a prepare across ranks cannot do: ask questions, rename members, or work on anything
    but a dataset folder."""
    where = f"rank {ranks.rank} of {ranks.world_size}"
    if not path.is_dir():
        raise ConfigError(format_message("prepare across ranks takes a dataset folder", where=where, found=str(path), fix="prepare a .jsonl file or a metadataset on one process (without torchrun or --rank)"))
    if fix_duplicates:
        raise ConfigError(format_message("--fix-duplicates rewrites shards and runs on one process only", where=where, fix="run prepare --fix-duplicates once without torchrun or --rank, then prepare across ranks"))
    if not tar_index_only and not split_parts and not split_ratio:
        raise ConfigError(
            format_message(
                "prepare across ranks asks no questions",
                where=where,
                expected="--split-ratio TRAIN,VAL,TEST or --split-parts NAME:REGEX (or --tar-index-only), and for dataset.yaml "
                "--sample-type NAME --field-map JSON, or --skip-dataset-yaml",
                fix="pass those flags, the same on every rank",
            )
        )


def _part_types(root: AnyPath, split: str | None) -> list[str]:
    """Every part name of the dataset (from index.sqlite), else those of the first samples."""
    counts = part_counts(root)
    if counts:
        return list(counts)
    return _first_parts(root, split) if split else []


def _first_parts(root: AnyPath, split: str) -> list[str]:
    reader = SplitReader(root, split, allow_empty=True)
    try:
        parts: list[str] = []
        for index in range(min(2, len(reader))):
            sample = reader.read(index)
            if sample is not None:
                parts += [p for p in sample.parts if p not in parts]
        return parts
    finally:
        reader.close()


@click.command(
    cls=Command,
    no_input_hint="To prepare without questions, pass --non-interactive with --split-ratio TRAIN,VAL,TEST (or --split-parts) "
    "and --sample-type NAME --field-map JSON (or --skip-dataset-yaml).",
)
@click.argument("path", type=DATASET_PATH)
@click.option("--progress/--no-progress", default=True, help="Show a progress bar.")
@click.option("--split-parts", multiple=True, metavar="NAME:REGEX", help="Assign shards matching REGEX (re.match on the relative path) to split NAME. Repeatable; --split-ratio is then ignored.")
@click.option("--exclude", metavar="REGEX", help="Skip shards whose path matches REGEX (re.search).")
@click.option("--num-workers", type=click.IntRange(min=1), default=min(16, os.cpu_count() or 1), show_default=True, help="Processes that index shards in parallel.")
@click.option("--tar-index-only", is_flag=True, help="Only (re)build .tar.idx and index.sqlite; keep splits and dataset.yaml.")
@click.option("--shuffle-tars", is_flag=True, help="Shuffle shards (seed 42, as Energon) before the ratio split.")
@click.option("--fix-duplicates", is_flag=True, help="If a sample key occurs in more than one shard, rename every member of every shard in place to <shard path>/<name> first (as Energon's --fix-duplicates).")
@click.option("--non-interactive", is_flag=True, help="Never ask; fail when information is missing.")
@click.option("--split-ratio", metavar="TRAIN,VAL,TEST", help="Split shards by ratio, e.g. 8,1,1 (no shard is lost to rounding).")
@click.option("--force-overwrite", is_flag=True, help="Prepare again an already prepared dataset (unchanged shards are reused).")
@click.option("--skip-dataset-yaml", is_flag=True, help="Do not write dataset.yaml.")
@click.option("--dataset-yaml-name", default="dataset.yaml", show_default=True, help="File name of the dataset yaml in .nv-meta/.")
@click.option("--sample-type", metavar="NAME", help="Sample class, e.g. CaptioningSample, or CrudeWebdataset.")
@click.option("--field-map", metavar="JSON", help="Field -> part expression, e.g. '{\"image\": \"jpg\", \"caption\": \"txt\"}'. Without it (non-interactive), a sample_loader.py template is written.")
@click.option("--allow-missing-parts", is_flag=True, help="Write --field-map even when a field names a part type the shards do not hold (by default prepare refuses, listing the part types found).")
@click.option("--media-metadata-by-extension", is_flag=True, help="Store media metadata (size, duration, ...) of parts with an image/audio/video extension.")
@click.option("--media-metadata-by-glob", metavar="PATTERNS", help="Store media metadata of parts matching globs such as '*.jpg,*.wav' (comma-separated).")
@click.option("--media-metadata-by-header", is_flag=True, help="Store media metadata of parts recognised by their first bytes.")
@click.option("--rank", type=click.IntRange(min=0), default=None, help="Prepare across nodes without torchrun: this process's rank (0 merges); give the same command with --rank 0..N-1 and --world-size N on each node. Under torchrun the ranks are taken from its environment (--rank 0 --world-size 1 prepares on this process alone).")
@click.option("--world-size", type=click.IntRange(min=1), default=None, help="With --rank: how many ranks share the indexing.")
@click.option("--wait-timeout", type=click.FloatRange(min=0), default=86400.0, show_default=True, help="Across nodes: how many seconds rank 0 waits for the other ranks' shares before giving up (nothing is merged then).")
@click.option("--tmp-path", type=click.Path(path_type=Path, file_okay=False), default=None, help="When PATH is remote (e.g. s3://...), the local folder to build index.sqlite in before the upload. Default: a new folder under the system temp folder, removed afterwards.")
def prepare(
    path: AnyPath,
    progress: bool,
    split_parts: tuple[str, ...],
    exclude: str | None,
    num_workers: int,
    tar_index_only: bool,
    shuffle_tars: bool,
    fix_duplicates: bool,
    non_interactive: bool,
    split_ratio: str | None,
    force_overwrite: bool,
    skip_dataset_yaml: bool,
    dataset_yaml_name: str,
    sample_type: str | None,
    field_map: str | None,
    allow_missing_parts: bool,
    media_metadata_by_extension: bool,
    media_metadata_by_glob: str | None,
    media_metadata_by_header: bool,
    rank: int | None,
    world_size: int | None,
    wait_timeout: float,
    tmp_path: Path | None,
) -> None:
    """Index the tar shards under PATH and write .nv-meta/ (or index a .jsonl file, or build the
    joins of a metadataset .yaml)."""
    wants_media = bool(media_metadata_by_glob is not None or media_metadata_by_header or media_metadata_by_extension)
    if wants_media and tar_index_only:
        raise click.UsageError("--media-metadata-by-... cannot be combined with --tar-index-only")
    media_filter = MediaFilter.from_options(
        glob=media_metadata_by_glob, header=media_metadata_by_header, extension=media_metadata_by_extension
    )
    ranks = _ranks(rank, world_size, wait_timeout)
    if ranks is not None:
        click.get_current_context().call_on_close(ranks.close)  # leaves the gloo group it joined
        _check_across_ranks(path, ranks, fix_duplicates=fix_duplicates, tar_index_only=tar_index_only, split_parts=split_parts, split_ratio=split_ratio)
        non_interactive = True
    if is_metadataset_path(path):
        if media_filter is not None:
            raise ValueProblem("Metadatasets cannot store media metadata. Remove --media-metadata-by-... to continue.")
        _prepare_metadataset(path)
        return
    if media_filter is not None and path.is_file():
        raise ConfigError(format_message("JSONL datasets do not support media metadata", found=str(path), fix="remove --media-metadata-by-..."))
    if path.is_file():
        if path.suffix != ".jsonl":
            raise ConfigError(format_message("prepare takes a dataset folder, a .jsonl file or a metadataset .yaml", found=str(path)))
        click.echo("Preparing jsonl dataset...")
        count = write_jsonl_index(path)
        click.echo(f"Indexed {count} records of {path} into {path.name}.idx")
        click.echo(f"Done. Found {count} samples.")  # energon's line
        return
    interactive = not non_interactive
    mapping = _check_sample_type(sample_type, field_map, interactive)
    patterns = _parse_split_parts(split_parts)
    ratio = _parse_ratio(split_ratio) if split_ratio else None
    if patterns is not None and ratio is not None:
        click.echo("Note: --split-ratio is ignored because --split-parts is given (as energon prepare does).", err=True)
        ratio = None
    if not tar_index_only and patterns is None and ratio is None and not interactive:
        raise ValueProblem("--split-ratio is required in non-interactive mode (unless --split-parts or --tar-index-only is used).")
    if not tar_index_only and is_prepared(path) and not force_overwrite:
        if not interactive:
            # After a refused --field-map the shards are indexed but dataset.yaml is not written:
            # "already prepared" would read as if it had worked.
            half_done = not skip_dataset_yaml and not (meta_dir(path) / dataset_yaml_name).is_file()
            what = f"the shards are indexed already, but {dataset_yaml_name} is not written" if half_done else "the dataset is already prepared"
            raise ConfigError(format_message(what, where=str(meta_dir(path)), fix="pass --force-overwrite (unchanged shards are not re-indexed) or --tar-index-only"))
        if not click.confirm("It seems the dataset had already been prepared. Do you want to continue?", default=False):
            click.echo("Stopped; the dataset was not changed.")  # energon stops here with status 0 too
            return
        force_overwrite = True
    shards = list(read_info(path).shard_counts) if tar_index_only and is_prepared(path) else discover_shards(path, exclude)
    if not shards and not tar_index_only:
        click.echo("Did not find any tar files. Exiting.")  # energon prepare stops here with status 0 too
        return
    if not tar_index_only:
        click.echo(f"Found {len(shards)} tar files in total. The first and last ones are:\n- {shards[0]}\n- {shards[-1]}")
        if interactive:
            click.echo("If you want to exclude some of them, cancel with ctrl+c and specify an exclude filter in the command line.")
    if not tar_index_only and patterns is None and ratio is None:
        ratio = click.prompt('Please enter a desired train/val/test split like "0.5, 0.2, 0.3" or "8,1,1"', value_proc=_prompted_ratio)
    if fix_duplicates:
        click.echo(fix_duplicate_keys(path, shards))

    write_yaml_now = None
    if not skip_dataset_yaml and not tar_index_only and sample_type is not None and (mapping is not None or sample_type == CRUDE):
        write_yaml_now = render_dataset_yaml(sample_type, mapping)
    options = dict(
        split_ratio=ratio,
        split_parts=patterns,
        exclude=exclude,
        num_workers=num_workers,
        progress=progress,
        tar_index_only=tar_index_only,
        shuffle_tars=shuffle_tars,
        force_overwrite=force_overwrite,
        dataset_yaml=None,  # written below, once its field map is checked against the parts found
        dataset_yaml_name=dataset_yaml_name,
        media_filter=media_filter,
    )
    with _local_build_folder(path, tmp_path):
        result = prepare_dataset(path, **options) if ranks is None else prepare_across_ranks(path, ranks, **options)
    if result is None:
        click.echo(f"Rank {ranks.rank} of {ranks.world_size}: indexed its share of the shards; rank 0 merges them.")
        return
    click.echo(
        f"Indexed {len(result.shard_counts)} shards, {result.total_samples} samples "
        f"({len(result.scanned)} scanned, {len(result.reused)} unchanged)."
    )
    if result.media_filter is not None:
        skipped = f", {result.media_skipped} media parts could not be parsed (see the warnings)" if result.media_skipped else ""
        click.echo(f"Stored media metadata of {result.media_entries} entries (by {result.media_filter.strategy.value.lower()}){skipped}.")
    for split, split_shards in result.splits.items():
        click.echo(f"  split {split}: {counted(len(split_shards), 'shard')}, {counted(sum(result.shard_counts[s] for s in split_shards), 'sample')}")
    if not tar_index_only:
        for warning in _empty_split_warnings(result.splits, ratio, len(result.shard_counts)):
            click.echo(warning, err=True)
    if tar_index_only:
        click.echo("Done")
        return
    first_split = next((s for s, split_shards in result.splits.items() if split_shards), None)
    parts = _part_types(path, first_split)
    if parts:
        click.echo(f"Found the following part types in the dataset: {', '.join(parts[:_MAX_FIELD_MAP_PARTS])}{' and more..' if len(parts) > _MAX_FIELD_MAP_PARTS else ''}")
    if write_yaml_now is not None:
        missing = _fields_without_parts(mapping, parts) if mapping and parts and not allow_missing_parts else []
        if missing:
            raise ConfigError(
                format_message(
                    "--field-map names part types the shards do not hold",
                    where=f"{path}: --field-map",
                    expected=f"part types found in the shards: {', '.join(parts)}",
                    found=", ".join(missing),
                    fix="the indexes are written but dataset.yaml is not: correct --field-map and run prepare again with "
                    "--force-overwrite (unchanged shards are reused), or pass --allow-missing-parts if those parts come later",
                )
            )
        atomic_write_text(meta_dir(path) / dataset_yaml_name, write_yaml_now)
        click.echo(f"Wrote {meta_dir(path) / dataset_yaml_name}")
    elif skip_dataset_yaml:
        click.echo("You will have to add a dataset.yaml manually.")
    else:
        _write_dataset_yaml(path, sample_type=sample_type, parts=parts, interactive=interactive, dataset_yaml_name=dataset_yaml_name)
    click.echo("Done")
