"""Click parameter types shared by the commands."""

from __future__ import annotations

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


class Command(click.Command):
    """A command that reports our errors as one message and exit status 1 (``Error: ...``), also
    when it runs on its own, outside ``energon-lite`` (``megatron_energon_lite.energon.tools.*.command``)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except EnergonLiteError as exc:
            raise ValueProblem(str(exc)) from exc


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
