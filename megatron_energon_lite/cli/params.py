"""Click parameter types and small output helpers shared by the commands."""

from __future__ import annotations

import sys

import click

from ..errors import EnergonLiteError
from ..format.indexed import indexed_prefix
from ..storage import AnyPath, RemotePath, as_path


class ValueProblem(click.ClickException):
    """A flag or argument value that cannot work: exit status 1, as Energon's ``energon`` fails
    there (a ClickException or an exception), while click's usage errors (unknown options and
    commands) keep status 2."""

    exit_code = 1

    def __init__(self, message: str, param_hint: str | None = None) -> None:
        super().__init__(f"Invalid value for {param_hint}: {message}" if param_hint else message)


#: The shell's exit status for a program stopped by Ctrl-C (128 + SIGINT).
INTERRUPTED_EXIT = 130


class Command(click.Command):
    """A command that reports our errors as one message and exit status 1 (``Error: ...``), also
    when it runs on its own, outside ``energon-lite`` (``megatron_energon_lite.energon.tools.*.command``).

    Ctrl-C exits with 130, as shell commands do (click's default is 1).  A question asked with no
    one to answer it (input closed, e.g. a job without a terminal) fails with the command's own
    hint (``no_input_hint``) instead of click's bare ``Aborted!``.
    """

    def __init__(self, *args, no_input_hint: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: What to pass so that the command asks nothing (None: the command asks nothing).
        self.no_input_hint = no_input_hint

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except EnergonLiteError as exc:
            raise ValueProblem(str(exc)) from exc
        except KeyboardInterrupt:
            _interrupted()
        except click.Abort as exc:
            # click.prompt turns Ctrl-C and a closed input into Abort; the original is the context.
            if isinstance(exc.__context__, EOFError) and self.no_input_hint:
                raise ValueProblem(f"a question needs an answer but the input is closed (no terminal). {self.no_input_hint}") from None
            if isinstance(exc.__context__, KeyboardInterrupt):
                _interrupted()
            raise


def _interrupted() -> None:
    click.echo("\nAborted (Ctrl-C).", err=True)
    sys.exit(INTERRUPTED_EXIT)


class DatasetPathType(click.ParamType):
    """A local path that must exist, or a storage URL (``s3://…``, ``msc://…``) checked on use.

    Remote credentials and endpoints come from the environment (``AWS_ENDPOINT_URL``,
    ``AWS_PROFILE``, ``MSC_CONFIG``, ...), as for the loader.  A missing path fails with status 1
    (Energon's commands fail there too, with 1).
    """

    name = "path"

    def convert(self, value, param, ctx) -> AnyPath:
        if isinstance(value, RemotePath):
            return value
        path = as_path(value)
        # The prefix X of a Megatron X.bin/X.idx pair names a dataset without being a file.
        if not isinstance(path, RemotePath) and not path.exists() and indexed_prefix(path) is None:
            raise ValueProblem(f"{value!r} does not exist", param_hint="'PATH'")
        return path


DATASET_PATH = DatasetPathType()


def counted(count: int, noun: str) -> str:
    """``1 shard``, ``3 shards``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
