"""Energon's ``flavors.webdataset.prepare`` row types for the ``index.sqlite`` writer.

They live in :mod:`megatron_energon_lite.format.sqlite_index`; preparing a dataset is
:func:`megatron_energon_lite.format.prepare.prepare_dataset` (and the ``prepare`` command).
"""

from ....format.sqlite_index import (
    IndexAggregatable,
    IndexMediaMetadata,
    IndexSample,
    IndexSamplePart,
)

__all__ = ["IndexAggregatable", "IndexMediaMetadata", "IndexSample", "IndexSamplePart"]
