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


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="energon-lite")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
def cli(verbose: bool) -> None:
    """Prepare, inspect and lint Energon datasets (fast, and compatible with Energon 7.x)."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _register() -> None:
    from .info import info
    from .lint import lint
    from .prepare import prepare
    from .preview import preview

    for command in (prepare, info, lint, preview):
        cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="energon-lite")


if __name__ == "__main__":
    main()
