"""Energon's ``DefaultGenericWebdatasetFactory``: samples built as ``dataset.yaml`` says, parts undecoded."""

from __future__ import annotations

from typing import Any, TypeVar

from ...errors import NotSupportedError, format_message
from ...format.dataset_config import dataset_sample_type, require_sample_type
from ...pipeline.build import PipelineSpec
from .base_webdataset import BaseWebdatasetFactory

T_sample = TypeVar("T_sample")

__all__ = ["DefaultGenericWebdatasetFactory"]


class DefaultGenericWebdatasetFactory(BaseWebdatasetFactory[T_sample]):
    """A dataset whose samples are ``__sample_type__``, filled as its ``dataset.yaml`` says
    (``field_map`` or ``sample_loader``), with ``subflavors`` on every sample.

    Energon also takes ``field_map`` / ``sample_loader`` / ``part_filter`` here (its
    ``get_dataset_from_config`` passes them from ``dataset.yaml``); this package reads them from
    ``dataset.yaml`` itself, so passing them is refused with a clear error.
    """

    def __init__(self, path: Any, *, subflavors: dict[str, Any] | None = None, field_map: Any = None, sample_loader: Any = None, **kwargs: Any) -> None:
        for name, value in (("field_map", field_map), ("sample_loader", sample_loader)):
            if value is not None:
                raise NotSupportedError(
                    format_message(
                        f"{type(self).__name__}({name}=...) is not supported",
                        found=repr(value)[:80],
                        fix=f"put {name} into the dataset's .nv-meta/dataset.yaml (or a file named by dataset_config=...)",
                    )
                )
        self.subflavors = dict(subflavors or {})
        super().__init__(path, **kwargs)

    def _own_spec(self) -> PipelineSpec:
        spec = super()._own_spec()
        # A class that names its sample type must read a dataset that yields it.
        wanted = getattr(self, "__sample_type__", None)
        if wanted is not None:
            found = dataset_sample_type(self.path, self.dataset_config, trust_dataset_code=self.trust_dataset_code)
            require_sample_type(found, wanted, where=str(self.path), reader=type(self).__name__)
        return spec
