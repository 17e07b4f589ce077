"""Energon's ``DefaultGenericWebdatasetFactory``: samples built as ``dataset.yaml`` says, parts undecoded."""

from __future__ import annotations

from typing import Any, TypeVar

from ...errors import ConfigError, NotSupportedError, format_message
from ...format.dataset_config import load_dataset_config
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
        self._check_sample_type()
        return spec

    def _check_sample_type(self) -> None:
        """A class that names its sample type must read a dataset that yields it."""
        wanted = getattr(self, "__sample_type__", None)
        if wanted is None or str(self.path).endswith(".jsonl"):
            return
        config = load_dataset_config(self.path, self.dataset_config, trust_dataset_code=self.trust_dataset_code)
        from ...samples import CrudeSample

        found = CrudeSample if config.kind == "crude" else config.sample_type
        if not (isinstance(found, type) and issubclass(found, wanted)):
            raise ConfigError(
                format_message(
                    f"{type(self).__name__} reads {wanted.__name__} samples, but the dataset yields {getattr(found, '__name__', found)}",
                    where=str(config.path),
                    expected=f"a dataset.yaml for {wanted.__name__}",
                    found=f"{getattr(found, '__module__', '?')}.{getattr(found, '__qualname__', found)}",
                    fix="use the factory class of the dataset's sample type (get_dataset_from_config picks it from dataset.yaml), or fix dataset.yaml",
                )
            )
