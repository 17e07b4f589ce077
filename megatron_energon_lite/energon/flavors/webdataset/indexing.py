"""Energon's ``flavors.webdataset.indexing`` names for the ``index.sqlite`` writer.

The writer lives in :mod:`megatron_energon_lite.format.sqlite_index`, where ``prepare`` uses it.
"""

from ....format.sqlite_index import DuplicateSampleKeyError, SqliteIndexWriter

__all__ = ["DuplicateSampleKeyError", "SqliteIndexWriter"]
