"""``energon-lite``: prepare, inspect and check datasets from the shell."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any

import click

from .._version import __version__
from ..errors import EnergonLiteError

#: Every command: its name -> (its module in this package, the command object's name there, the
#: first sentence of its help).  ``energon-lite --help`` lists the commands with that sentence, so
#: it imports none of their modules, and ``energon-lite info`` imports the modules of ``info``
#: only (tests/cli/test_cli_startup.py checks each sentence against the command's own help).
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "prepare": (
        "prepare",
        "prepare",
        "Index the tar shards under PATH and write .nv-meta/ (or index a .jsonl file, or build the joins of a metadataset .yaml).",
    ),
    "prepare-media": (
        "prepare_media",
        "prepare_media",
        "Store media metadata (size, format, duration, ...) of the media files under PATH in PATH/.nv-meta/index.sqlite, for aux: sources.",
    ),
    "info": ("info", "info", "Print sample counts, sizes, splits, sample type and parts of the dataset at PATH."),
    "lint": ("lint", "lint", "Check the dataset at PATH: indexes vs counts, then decode every sample."),
    "preview": ("preview", "preview", "Show samples of the dataset or metadataset at PATH: drawn in the terminal, or as an HTML page or a contact sheet."),
    "analyze-debug": (
        "analyze_debug",
        "analyze_debug",
        "Analyze the debug logs at LOG_PATHS (folders of *.jsonl, or files): which sample keys came at which step, as counts and a heatmap PNG.",
    ),
    "checkpoint": ("checkpoint", "checkpoint", "Tools for saved loader states (checkpoints)."),
    "manifest": ("manifest", "manifest", "Read the per-step data manifest of a run: the samples of a step on every rank, and the realized blend."),
    "bench": ("bench", "bench", "Measure the loader's throughput on DATASET_OR_YAML against its mock-data ceiling."),
}


class _LazyCommands(MutableMapping[str, click.Command]):
    """``cli.commands``: every command by name, its module imported on the first look-up.

    Listing the names (``list_commands``, ``in``, iteration) imports nothing; ``cli.commands[name]``
    and ``get_command`` give the real command object.  ``add_command`` works as on any group.
    """

    def __init__(self, lazy: dict[str, tuple[str, str, str]]) -> None:
        self._loaded: dict[str, click.Command] = {}
        self._lazy = dict(lazy)

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            module, attribute, _ = self._lazy[name]  # KeyError for an unknown name, as a dict
            self._loaded[name] = getattr(importlib.import_module(f"{__package__}.{module}"), attribute)
            del self._lazy[name]
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._lazy.pop(name, None)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name in self._lazy:
            del self._lazy[name]
        else:
            del self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter([*self._loaded, *self._lazy])

    def __len__(self) -> int:
        return len(self._loaded) + len(self._lazy)

    def for_listing(self, name: str) -> click.Command:
        """The command if it is loaded, else a stand-in that carries its recorded help sentence."""
        if name in self._lazy:
            return click.Command(name, help=self._lazy[name][2])
        return self._loaded[name]


class _Group(click.Group):
    """Turns our errors into one clean message and exit code 1 instead of a traceback, and loads
    each command's module when that command runs (see :class:`_LazyCommands`)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except EnergonLiteError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(1)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The ``Commands:`` section as click writes it, without importing the commands."""
        commands = self.commands
        listed = [
            (name, commands.for_listing(name) if isinstance(commands, _LazyCommands) else self.get_command(ctx, name))
            for name in self.list_commands(ctx)
        ]
        listed = [(name, command) for name, command in listed if command is not None and not command.hidden]
        if listed:
            limit = formatter.width - 6 - max(len(name) for name, _ in listed)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in listed])


@click.group(
    cls=_Group,
    commands=_LazyCommands(_COMMANDS),
    context_settings={"help_option_names": ["-h", "--help"]},
    invoke_without_command=True,
)
@click.version_option(__version__, "-V", "--version", prog_name="energon-lite")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Prepare, inspect and lint Energon datasets (fast, and compatible with Energon 7.x).

    Exit status as Energon's `energon` command: 0 on success (and, as there, when prepare finds
    no tar files), 1 when the command fails (a bad dataset, path or flag value), 2 for an
    unknown command or option.
    """
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if ctx.invoked_subcommand is None:  # as `energon` alone: the help, and success
        click.echo(ctx.get_help())


def __getattr__(name: str) -> Any:
    # Energon's name for the command object (``cli.main.prepare_media_command``), loaded on use.
    if name == "prepare_media_command":
        return cli.commands["prepare-media"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    cli(prog_name="energon-lite")


if __name__ == "__main__":
    main()
