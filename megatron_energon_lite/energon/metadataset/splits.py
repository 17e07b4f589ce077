"""What ``MetadatasetV2.splits`` holds: a read-only view of the metadataset YAML with Energon's
attribute names (Energon keeps its parsed config objects there, and client code reads them, e.g.
``mds.splits["train"].blend[0].path``).  Every mapping is an object whose attributes are its keys
(a key the YAML leaves out reads as None), except ``subflavors`` (a dict) and the named ``aux:``
and ``join:`` maps (dicts of those); ``path`` is an absolute :class:`EPath`, an ``aux:`` source an
:class:`AuxDatasetReference` or :class:`AuxFilesystemReference`.  The loader itself reads the
YAML through ``format/metadataset.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...format.metadataset import AuxSource, resolved_splits
from ..epathlib import EPath

__all__ = ["AuxDatasetReference", "AuxFilesystemReference", "MetadatasetEntry", "splits_view"]


@dataclass(frozen=True)
class AuxDatasetReference:
    """An ``aux:`` source that is a prepared dataset, read by member name."""

    path: EPath


@dataclass(frozen=True)
class AuxFilesystemReference:
    """An ``aux:`` source that is a plain folder (``filesystem://...``), read by relative path."""

    fs_path: EPath


class MetadatasetEntry:
    """One mapping of the metadataset YAML: its keys as attributes (absent keys read as None)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe for dunders
            raise AttributeError(name)
        return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MetadatasetEntry) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"MetadatasetEntry({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


def _view(node: Any, key: str | None = None) -> Any:
    if isinstance(node, AuxSource):
        return AuxFilesystemReference(EPath(node.path)) if node.kind == "folder" else AuxDatasetReference(EPath(node.path))
    if isinstance(node, list):
        return [_view(item) for item in node]
    if isinstance(node, dict):
        if key == "subflavors":  # free data, a dict in Energon too
            return dict(node)
        if key in ("aux", "join"):  # named sources / joined datasets
            return {name: _view(value) for name, value in node.items()}
        return MetadatasetEntry({name: _view(value, name) for name, value in node.items()})
    if key == "path" and isinstance(node, str):
        return EPath(node)
    return node


def splits_view(source: Any) -> dict[str, MetadatasetEntry]:
    """``MetadatasetV2.splits`` of a metadataset file or dict."""
    return {name: _view(node) for name, node in resolved_splits(source).items()}
