"""Click parameter types shared by the commands."""

from __future__ import annotations

import click

from ..storage import AnyPath, RemotePath, as_path


class DatasetPathType(click.ParamType):
    """A local path that must exist, or a storage URL (``s3://…``, ``msc://…``) checked on use.

    Remote credentials and endpoints come from the environment (``AWS_ENDPOINT_URL``,
    ``AWS_PROFILE``, ``MSC_CONFIG``, ...), as for the loader.
    """

    name = "path"

    def convert(self, value, param, ctx) -> AnyPath:
        if isinstance(value, RemotePath):
            return value
        path = as_path(value)
        if not isinstance(path, RemotePath) and not path.exists():
            self.fail(f"{value!r} does not exist", param, ctx)
        return path


DATASET_PATH = DatasetPathType()
