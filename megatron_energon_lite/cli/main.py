"""``energon-lite``: prepare, inspect and check datasets from the shell."""

from __future__ import annotations

import logging
import sys

import click

from .._version import __version__
from ..errors import EnergonLiteError


class _Group(click.Group):
    """Turns our errors into one clean message and exit code 1 instead of a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except EnergonLiteError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
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


def _register() -> None:
    from .analyze_debug import analyze_debug
    from .checkpoint import checkpoint
    from .info import info
    from .lint import lint
    from .prepare import prepare
    from .prepare_media import prepare_media
    from .preview import preview

    for command in (prepare, prepare_media, info, lint, preview, analyze_debug, checkpoint):
        cli.add_command(command)


_register()

#: Energon's name for the command object (``cli.main.prepare_media_command``).
prepare_media_command = cli.commands["prepare-media"]


def main() -> None:
    cli(prog_name="energon-lite")


if __name__ == "__main__":
    main()
