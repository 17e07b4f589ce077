"""One leaf dataset, by random access: split index -> decoded, typed sample.

This is the "load" step every pipeline starts from: read the sample's bytes (one read), keep
only the parts the dataset.yaml needs, decode them, and build the sample.  Works for prepared
WebDataset folders and for prepared ``.jsonl`` files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..decode import SampleDecoder
from ..errors import DatasetError, format_message
from ..format.dataset_config import DatasetConfig, load_dataset_config, make_sample
from ..format.jsonl import JsonlReader
from ..format.metadata import require_prepared
from ..format.split_reader import SplitReader
from ..samples import CrudeSample, Sample, SourceInfo

RESTORE_TAG = "Webdataset"  # Energon's tag for a raw sample's restore key


class SampleLoader:
    """Loads samples of one split of one dataset (a prepared folder or a ``.jsonl`` file)."""

    def __init__(
        self,
        path: str | os.PathLike,
        split_part: str = "train",
        *,
        dataset_config: str | None = None,
        split_config: str | None = None,
        decoder: SampleDecoder | None = None,
        subflavors: dict[str, Any] | None = None,
        trust_dataset_code: bool = False,
    ) -> None:
        self.path = Path(path)
        self.split_part = split_part
        self.decoder = decoder
        self.subflavors = dict(subflavors or {})
        self._jsonl: JsonlReader | None = None
        self._reader: SplitReader | None = None
        self.config: DatasetConfig | None = None
        if self.path.suffix == ".jsonl" and self.path.is_file():
            self._jsonl = JsonlReader(self.path)  # a JSONL file is one split, always crude
            return
        if self.path.is_file():
            raise DatasetError(
                format_message(
                    "not a dataset",
                    where=str(self.path),
                    expected="a prepared dataset folder, a .jsonl file or a metadataset .yaml",
                )
            )
        require_prepared(self.path)
        self.config = load_dataset_config(self.path, dataset_config, trust_dataset_code=trust_dataset_code)
        split_config = split_config or self.config.loader_options.get("split_config")
        self._reader = SplitReader(self.path, split_part, split_config=split_config)

    def __len__(self) -> int:
        return len(self._jsonl) if self._jsonl is not None else len(self._reader)

    @property
    def reader(self) -> SplitReader | None:
        return self._reader

    def load(self, index: int) -> Sample | CrudeSample | None:
        """The sample at split index ``index``; None if ``split.yaml`` excludes its key."""
        if self._jsonl is not None:
            return self._load_jsonl(index)
        config = self.config
        raw = self._reader.read(index, wanted=config.wanted_parts)
        if raw is None:
            return None
        parts = raw.parts if config.wanted_parts is not None else {p: v for p, v in raw.parts.items() if config.keep_part(p)}
        decoded = self.decoder.decode(parts, key=raw.key) if self.decoder is not None else dict(parts)
        source = SourceInfo(
            dataset_path=str(self.path),
            index=index,
            shard_name=raw.shard,
            file_names=tuple(f"{raw.key}.{p}" for p in parts),
        )
        return make_sample(
            config,
            key=raw.key,
            decoded=decoded,
            restore_key=(RESTORE_TAG, index),
            source=source,
            subflavors=self.subflavors,
        )

    def _load_jsonl(self, index: int) -> CrudeSample:
        sample = CrudeSample(json=self._jsonl.read(index))
        sample.update(
            __key__=str(index),
            __shard__=self.path.name,
            __restore_key__=(RESTORE_TAG, index),
            __sources__=(SourceInfo(str(self.path), index, self.path.name, (f"{index}.json",)),),
            __subflavors__=dict(self.subflavors) or None,  # as Energon: None without subflavors
        )
        return sample

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
