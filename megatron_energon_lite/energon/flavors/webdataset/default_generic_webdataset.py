"""Energon's ``DefaultGenericWebdatasetFactory``: samples built as ``dataset.yaml`` says, parts undecoded."""

from __future__ import annotations

from typing import Any, TypeVar

from ....format.dataset_config import (
    DatasetConfig,
    dataset_sample_type,
    make_sample,
    require_sample_type,
    sample_fields_config,
)
from ....format.metadata import DATASET_YAML, meta_dir
from ....pipeline.build import PipelineSpec
from ....samples import SourceInfo
from .base_webdataset import BaseWebdatasetFactory

T_sample = TypeVar("T_sample")

__all__ = ["DefaultGenericWebdatasetFactory"]


class DefaultGenericWebdatasetFactory(BaseWebdatasetFactory[T_sample]):
    """A dataset whose samples are ``__sample_type__``, filled as its ``dataset.yaml`` says
    (``field_map`` or ``sample_loader``), with ``subflavors`` on every sample.

    ``field_map`` / ``sample_loader`` / ``part_filter`` given here (Energon's
    ``get_dataset_from_config`` passes them from ``dataset.yaml``, and a user's factory named in
    ``dataset.yaml`` receives them so) replace the file's: a ``sample_loader`` may then be a
    function, or ``FILE.py:FUNCTION`` in ``.nv-meta/`` (dataset code: see ``trust_dataset_code``).
    """

    def __init__(self, path: Any, *, subflavors: dict[str, Any] | None = None, field_map: Any = None, sample_loader: Any = None, **kwargs: Any) -> None:
        self.subflavors = dict(subflavors or {})
        self.field_map = field_map
        self.sample_loader = sample_loader
        self._fields: DatasetConfig | None = None
        super().__init__(path, **kwargs)

    def sample_config(self) -> DatasetConfig:
        if self._fields is None:
            if self.field_map is None and self.sample_loader is None:
                self._fields = super().sample_config()
            else:
                given = {"field_map": self.field_map, "sample_loader": self.sample_loader, "part_filter": self.part_filter}
                file = meta_dir(self.path) / (self.dataset_config or DATASET_YAML)
                self._fields = sample_fields_config(given, self.__sample_type__, file, trust_dataset_code=self.trust_dataset_code, policy=self._policy())
        return self._fields

    def builds_own_samples(self) -> bool:
        return super().builds_own_samples() or self.field_map is not None or self.sample_loader is not None or self.part_filter is not None

    def load_sample(self, raw_data: dict[str, Any]) -> T_sample:
        """``__sample_type__`` filled from the raw sample's parts by the field_map (or sample_loader)."""
        sources = raw_data.get("__sources__") or (SourceInfo(str(self.path), -1, str(raw_data.get("__shard__", "?")), ()),)
        return make_sample(
            self.sample_config(),
            key=raw_data["__key__"],
            decoded={name: value for name, value in raw_data.items() if not name.startswith("__")},
            restore_key=raw_data.get("__restore_key__"),
            source=sources[0],
            subflavors=self.subflavors,
        )

    def _own_spec(self) -> PipelineSpec:
        spec = super()._own_spec()
        # A class that names its sample type must read a dataset that yields it.
        wanted = getattr(self, "__sample_type__", None)
        if wanted is not None and self.field_map is None and self.sample_loader is None:
            found = dataset_sample_type(self.path, self.dataset_config, trust_dataset_code=self.trust_dataset_code, policy=spec.policy)
            require_sample_type(found, wanted, where=str(self.path), reader=type(self).__name__)
        return spec
