"""``energon-lite checkpoint``: look at saved loader states (``info``) and make states for another
topology (``redist``).

A checkpoint file holds what ``save_state_rank()`` returns (one rank) or what
``save_state_global()`` returns (a list, one entry per rank), saved with ``torch.save`` (``.pt``,
any other suffix) or as JSON (``.json``). Energon's own checkpoint files are not read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import click

from ..errors import ConfigError, StateError, format_message
from ..format.safe_parse import check_nesting, parse_json
from ..loader.blend_report import blend_report
from ..loader.rank_state import MOVED_FROM, REDISTRIBUTED_FROM, saved_sample_skips
from .params import Command, ValueProblem

_FILES = click.Path(exists=True, dir_okay=False, path_type=Path)


@dataclass(frozen=True)
class SavedRank:
    """One rank's saved loader state as a checkpoint file holds it (unchecked: any configuration;
    ``rank_state.RankState`` is the checked form a loader restores)."""

    file: Path
    index: int  # position in a global checkpoint's list; 0 for a per-rank file
    state: dict

    @property
    def rank(self) -> int | None:
        return self.state.get("config", {}).get("worker_config.rank")

    @property
    def redistributed(self) -> bool:
        """Made by ``checkpoint redist``: a place in a new topology and the saved global state."""
        return REDISTRIBUTED_FROM in self.state

    @property
    def num_workers(self) -> int:
        if self.redistributed:
            return max(1, int(self.state.get("config", {}).get("worker_config.num_workers", 0)))
        return len(self.state["worker_states"])


def _load(file: Path) -> object:
    if file.suffix == ".json":
        try:
            return parse_json(file.read_text(), str(file))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueProblem(format_message("not a JSON checkpoint", where=str(file), found=str(exc))) from None
        except ConfigError as exc:  # nesting too deep
            raise ValueProblem(str(exc)) from None
    import torch

    try:
        data = torch.load(file, map_location="cpu", weights_only=True)  # our states are plain data
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same explanation
        raise ValueProblem(
            format_message(
                "cannot read the checkpoint",
                where=str(file),
                expected="a loader state saved with torch.save (plain dicts and lists) or as .json",
                found=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                fix="an Energon checkpoint is read with Energon's `energon checkpoint`, not here",
            )
        ) from None
    try:
        check_nesting(data, str(file))
    except ConfigError as exc:
        raise ValueProblem(str(exc)) from None
    return data


def _is_state(value: object) -> bool:
    if isinstance(value, dict) and isinstance(value.get(REDISTRIBUTED_FROM), list):
        return True
    return isinstance(value, dict) and "worker_states" in value and isinstance(value["worker_states"], list)


def _shape_problem(state: dict) -> str | None:
    """What is wrong with the fields ``info`` and ``redist`` read of a rank state (a damaged
    file), or None; the pipeline states inside are checked by the loader when it restores them."""
    config = state.get("config", {})
    if not isinstance(config, dict):
        return f"config is {type(config).__name__}, not an object"
    for key in ("worker_config.rank", "worker_config.world_size", "worker_config.num_workers"):
        value = config.get(key)
        if key in config and (not isinstance(value, int) or isinstance(value, bool) or value < 0):  # null too: saved states hold counts
            return f"config.{key} is {value!r}, not a count"
    if REDISTRIBUTED_FROM in state:
        source = state[REDISTRIBUTED_FROM]
        bad = next((i for i, s in enumerate(source) if not _is_state(s) or _shape_problem(s)), None)
        return None if bad is None else f"{REDISTRIBUTED_FROM}[{bad}] is not a loader state"
    bad = next((i for i, w in enumerate(state["worker_states"]) if w is not None and not isinstance(w, dict)), None)
    if bad is not None:
        return f"worker_states[{bad}] is {type(state['worker_states'][bad]).__name__}, not a pipeline state or null"
    return None


def read_rank_states(files: tuple[Path, ...]) -> tuple[bool, list[SavedRank]]:
    """(whether it is one global checkpoint, every rank's state in rank order)."""
    states: list[SavedRank] = []
    is_global = False
    for file in files:
        data = _load(file)
        for i, state in enumerate(data if isinstance(data, list) else [data]):
            problem = _is_state(state) and _shape_problem(state)
            if problem:
                raise ValueProblem(format_message("a damaged loader state", where=f"{file}" + (f", rank entry {i}" if isinstance(data, list) else ""), found=problem, fix="use an intact checkpoint (an older one of the same run may be)"))
        if isinstance(data, list) and data and all(_is_state(s) for s in data):
            is_global = True
            states += [SavedRank(file, i, s) for i, s in enumerate(data)]
        elif _is_state(data):
            states.append(SavedRank(file, 0, data))
        else:
            raise ValueProblem(
                format_message(
                    "not an energon-lite loader state",
                    where=str(file),
                    expected="what save_state_rank() returns (a dict with worker_states) or save_state_global() (a list of them)",
                    found=type(data).__name__ + (f" with keys {sorted(data)[:8]}" if isinstance(data, dict) else ""),
                )
            )
    if is_global and len(files) > 1:
        raise ValueProblem("pass either one global checkpoint (from save_state_global) or the per-rank files, not several global ones")
    states.sort(key=lambda s: (s.rank if s.rank is not None else s.index))
    return is_global, states


def describe_pipeline(state: object) -> list[str]:
    """A worker's pipeline state in words, outermost stage first (one line per stage)."""
    lines: list[str] = []
    node = state
    while isinstance(node, dict):
        lines.append(_describe_checked(node))
        if isinstance(node.get("sources"), list):
            for i, source in enumerate(node["sources"]):
                lines += [f"dataset {i}: " + line for line in describe_pipeline(source)]
            break
        node = node.get("source")
    return lines


def _samples(keys: list) -> str:
    """A few buffered restore keys as sample indices: ``Webdataset 12, 40, ...``."""
    shown = [str(key[-1]) if isinstance(key, list) and key else repr(key) for key in keys[:6]]
    return ", ".join(shown) + (", ..." if len(keys) > 6 else "")


def _describe_checked(node: dict) -> str:
    """:func:`_describe_stage`, or the raw fields of a stage state whose values are not what a
    stage saves (a damaged file: ``info`` shows it; restoring it gives the StateError)."""
    try:
        return _describe_stage(node)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        fields = {k: v for k, v in node.items() if k not in ("source", "sources")}
        return f"{node.get('stage', '?')}: damaged state {repr(fields)[:200]}"


def _describe_stage(node: dict) -> str:
    stage = node.get("stage", "?")
    if stage == "Pass":
        return f"Pass: {node.get('offset')} items into the current pass"
    if stage == "Batch":
        return f"Batch: {node.get('index')} batches made"
    if stage == "Shuffle":
        buffer = node.get("buffer") or []
        return f"Shuffle buffer: {len(buffer)} samples waiting" + (f" (sample indices {_samples(buffer)})" if buffer else "")
    if stage == "Group":
        buckets = node.get("buckets") or []
        waiting = sum(len(bucket[2]) for bucket in buckets if isinstance(bucket, list) and len(bucket) == 3)
        return f"Length grouping: {len(buckets)} buckets holding {waiting} samples, {node.get('index')} batches made"
    if stage == "Pack":
        state = f"buffer open, {node.get('groups_done')} of its groups emitted" if node.get("open") else "no buffer open"
        return f"Packing: {state}, {node.get('index')} packs made, {node.get('left_out', 0)} samples left out by the selection"
    if stage == "Repeat":
        return f"Repeat: epoch {node.get('epoch')}, {node.get('taken')} items of it"
    if stage == "Blend":
        return f"Blend: epoch {node.get('epoch')}, {node.get('emitted')} samples drawn, per dataset {node.get('counts')}"
    if stage == "Source":
        opened = node.get("open") or []
        read = sum(entry[1] for entry in opened if isinstance(entry, list) and len(entry) == 2)
        carried = node.get("carried") or []
        text = f"Slices: epoch {node.get('epoch')}, {node.get('next_slice')} slices opened, {len(opened)} open ({read} samples read from them)"
        return text + (f", {len(carried)} ranges carried from another topology" if carried else "")
    if "index" in node:
        return f"{stage}: {node['index']} inputs"
    return f"{stage}: {', '.join(k for k in node if k not in ('stage', 'source', 'sources'))}"


@click.command(cls=Command, name="info")
@click.argument("input_files", nargs=-1, required=True, type=_FILES)
@click.option("--workers/--no-workers", "show_workers", default=True, help="Describe each worker's position, stage by stage.")
def info(input_files: tuple[Path, ...], show_workers: bool) -> None:
    """Show ranks, workers and position of the loader states in INPUT_FILES."""
    is_global, states = read_rank_states(input_files)
    click.echo(f"Checkpoint type: {'Global checkpoint' if is_global else 'Per-rank checkpoint files'}")
    click.echo(f"Number of DP ranks: {len(states)}")
    click.echo(f"Number of workers per DP rank: {states[0].num_workers}")
    click.echo("\nDetailed information:")
    for i, rank_state in enumerate(states):
        state = rank_state.state
        origin = "" if is_global else f" ({rank_state.file.name})"
        click.echo(f"  Rank {rank_state.rank if rank_state.rank is not None else i}{origin}:")
        click.echo(f"    Written by: {state.get('writer', 'unknown')}, state version {state.get('version', '?')}")
        click.echo(f"    Dataset: {state.get('config', {}).get('path', 'unknown')} (split {state.get('config', {}).get('split_part', '?')})")
        config = state.get("config", {})
        if rank_state.redistributed:
            source = state[REDISTRIBUTED_FROM]
            source_config = source[0].get("config", {}) if source and isinstance(source[0], dict) else {}
            click.echo(
                f"    Redistributed (energon-lite checkpoint redist) for rank {config.get('worker_config.rank', '?')} of "
                f"{config.get('worker_config.world_size', '?')}, {config.get('worker_config.num_workers', '?')} workers per rank, "
                f"from a checkpoint of {len(source)} rank(s) x {source_config.get('worker_config.num_workers', '?')} worker(s); "
                "the rest of the running epoch is divided when this rank restores it"
            )
            _echo_sample_skips(state)
            continue
        moved = state.get(MOVED_FROM)
        placed = "Moved to" if isinstance(moved, dict) else "Saved on"
        click.echo(f"    {placed}: rank {config.get('worker_config.rank', '?')} of {config.get('worker_config.world_size', '?')}, {config.get('worker_config.num_workers', '?')} workers per rank")
        if isinstance(moved, dict):
            click.echo(
                f"    Moved (energon-lite checkpoint redist) from a checkpoint of {moved.get('world_size', '?')} rank(s) x {moved.get('num_workers', '?')} worker(s): "
                "the same global workers, each worker's state as saved"
            )
        click.echo(f"    Next worker ID: {state.get('next_worker')}; the loop over the loader had {'ended' if state.get('pass_ended') else 'not ended'}")
        click.echo(f"    Number of worker states: {rank_state.num_workers}")
        _echo_sample_skips(state)
        if not show_workers:
            continue
        for worker, worker_state in enumerate(state["worker_states"]):
            if worker_state is None:
                click.echo(f"    Worker {worker}: has not yielded yet")
                continue
            click.echo(f"    Worker {worker}:")
            for line in describe_pipeline(worker_state):
                click.echo(f"      {line}")
    for line in blend_lines(states):
        click.echo(line)


def blend_lines(states: list[SavedRank]) -> list[str]:
    """Where a blend stands: the clock of its weight schedules and, per dataset, the realized
    share against the target so far and now (nothing for a state without a blend)."""
    config = states[0].state.get("config", {})
    if len(config.get("datasets") or ()) < 2 or any(rank.redistributed for rank in states):
        return []
    try:
        rows = blend_report([rank.state for rank in states])
    except (ConfigError, KeyError, TypeError, ValueError, IndexError) as exc:
        return [f"\nBlend: not shown, the states' blend is not readable ({type(exc).__name__}: {str(exc)[:200]})"]
    clock = rows[0]["clock"]
    scheduled = any(leaf.get("weight_schedule") for leaf in config["datasets"])
    where = "" if clock is None else f" at clock {clock} (its place in the global stream: samples the blend yielded, shuffle buffers included{'; the weight schedules read it' if scheduled else ''})"
    partial = "" if len(states) > 1 or config.get("worker_config.world_size") == 1 else f", this rank's samples of {config.get('worker_config.world_size')} ranks"
    lines = [f"\nBlend ({config.get('blend_kind', 'blend')}, mode {config.get('blend_mode') or 'random'}){where}{partial}:"]
    for k, row in enumerate(rows):
        lines.append(
            f"  ds{k} {row['path']} [{row['split_part']}]: {row['samples']} samples, share {row['share']:.3f}; "
            f"target so far {row['target_share_so_far']:.3f}, now {row['target_share_now']:.3f}"
        )
    return lines


def _echo_sample_skips(state: dict) -> None:
    """The replay's skip list a state carries (``loader/sample_skips.py``), when it has one."""
    skips = saved_sample_skips(state)
    if not skips:
        return
    click.echo(f"    Skip list: {len(skips)} sample(s) left out of the run (a replay's; restored states keep skipping them)")
    for sample in skips.samples[:20]:
        click.echo(f"      {sample.describe()}")
    if len(skips) > 20:
        click.echo(f"      ... and {len(skips) - 20} more")


@click.command(cls=Command, name="redist")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "output_option", type=click.Path(file_okay=False, path_type=Path), default=None, help="The output folder (else the last argument is).")
@click.option("--new-world-size", "--world-size", type=click.IntRange(min=1), default=None, help="Number of ranks of the new topology.")
@click.option(
    "--new-num-workers",
    "--num-workers",
    type=click.IntRange(min=0),
    default=None,
    help="Loader workers per rank of the new topology (default: the saved number of global workers divided over the new ranks, as Energon's redist).",
)
def redist(paths: tuple[Path, ...], output_option: Path | None, new_world_size: int | None, new_num_workers: int | None) -> None:
    """Make the loader states of another number of ranks or workers from a saved checkpoint.

    PATHS: the input files, then the output folder (or give it with -o OUT). The inputs are one
    global checkpoint (save_state_global) or every rank's file; the output folder gets one
    global checkpoint named like the input, or one file per rank named like the inputs
    (state_rank0.pt, ...: the number is the rank), else rank0, rank1, ...

    Any new world size and number of workers. With the number of global workers kept, each
    worker's state moves to the worker with its global id (as Energon's redist does). Otherwise
    what each new worker reads of the rest of the running epoch depends on the dataset, which
    only the training process has: each new rank's state holds its place and the saved states,
    checked here, and restore_state_rank divides the rest when it restores it (as
    restore_state_global does).
    """
    from ..loader.elastic import redistribute  # on use only: it loads torch, which other commands never need

    input_files, output_path = _inputs_and_output(paths, output_option)
    is_global, saved = read_rank_states(input_files)
    if any(s.redistributed for s in saved):
        raise ValueProblem("the checkpoint was redistributed already; redistribute the original one")
    if new_world_size is None:
        raise ValueProblem(format_message("the new number of ranks is missing", fix="pass --new-world-size N (and --new-num-workers M to change the workers per rank)"))
    workers = _same_global_workers(saved, new_world_size) if new_num_workers is None else new_num_workers
    try:
        states = redistribute([s.state for s in saved], new_world_size, workers)
    except (StateError, ConfigError) as exc:
        raise ValueProblem(str(exc)) from None
    output_path.mkdir(parents=True, exist_ok=True)
    if is_global:
        written = [output_path / input_files[0].name]
        _save(states, written[0])
    else:
        written = [output_path / name for name in _rank_file_names(input_files, len(states))]
        for state, file in zip(states, written):
            _save(state, file)
    click.echo(f"{len(saved)} rank(s) x {saved[0].num_workers} worker(s) -> {new_world_size} rank(s) x {workers} worker(s): wrote {', '.join(str(f) for f in written[:4])}{' ...' if len(written) > 4 else ''}")


def _inputs_and_output(paths: tuple[Path, ...], output: Path | None) -> tuple[tuple[Path, ...], Path]:
    """The input files and the output folder: ``-o OUT``, else the last path (Energon's order)."""
    if output is None:
        if len(paths) < 2:
            raise click.UsageError("give the input file(s) and then the output folder, or the output with -o OUT")
        paths, output = paths[:-1], paths[-1]
    for path in paths:
        _FILES.convert(str(path), None, None)  # an input that is missing or a folder: a usage error
    if output.exists() and not output.is_dir():
        raise click.UsageError(f"the output {output} is a file; give a folder (it is made if missing)")
    return paths, output


def _same_global_workers(saved: list[SavedRank], new_world_size: int) -> int:
    """Workers per new rank that keep the saved number of global workers (Energon's redist)."""
    saved_workers = int(saved[0].state.get("config", {}).get("worker_config.num_workers", saved[0].num_workers))
    total = len(saved) * max(1, saved_workers)
    if total % new_world_size:
        raise ValueProblem(
            format_message(
                f"{total} global workers do not divide over {new_world_size} ranks",
                found=f"a checkpoint of {len(saved)} rank(s) x {saved_workers} worker(s)",
                fix="pass --new-num-workers M (any number: the rest of the epoch is divided anew)",
            )
        )
    per_rank = total // new_world_size
    return 0 if saved_workers == 0 and per_rank == 1 else per_rank


def _rank_file_names(inputs: tuple[Path, ...], ranks: int) -> list[str]:
    """Per-rank output names: the inputs' own pattern when their names differ only in a number
    that is their rank (``state_rank0.pt``, ``state_rank1.pt``, as Energon names them), else
    ``rank0``, ``rank1``, ... with the inputs' suffix."""
    match = re.fullmatch(r"(.*?)(\d+)(\D*)", inputs[0].name)
    if match is not None and {p.name for p in inputs} == {f"{match[1]}{rank}{match[3]}" for rank in range(len(inputs))}:
        return [f"{match[1]}{rank}{match[3]}" for rank in range(ranks)]
    return [f"rank{rank}{inputs[0].suffix}" for rank in range(ranks)]


def _save(value: object, file: Path) -> None:
    if file.suffix == ".json":
        file.write_text(json.dumps(value))
        return
    import torch

    torch.save(value, file)


@click.group(name="checkpoint", context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.pass_context
def checkpoint(ctx: click.Context) -> None:
    """Tools for saved loader states (checkpoints)."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


checkpoint.add_command(info)
checkpoint.add_command(redist)
