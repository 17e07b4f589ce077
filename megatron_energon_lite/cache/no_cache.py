"""NoCachePool: aux files read when asked, nothing cached (Energon's ``cache.no_cache``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..source_info import SourceInfo, add_source_info
from .base import CachePool, FileStore, Lazy, MockLazy

__all__ = ["DirectLazy", "NoCachePool"]

T = TypeVar("T")


@dataclass(kw_only=True, eq=False)
class DirectLazy(Lazy[T]):
    """Reads its file on the first :meth:`get` and keeps it; every ``get(sample)`` adds the source."""

    _data: tuple[T, SourceInfo] | None = field(default=None, init=False, repr=False)

    def get(self, sample: Any = None) -> T:
        if self._data is None:
            self._data = self.ds[self.fname]
        data, source_info = self._data
        add_source_info(sample, source_info)
        return data

    __hash__ = Lazy.__hash__
    __eq__ = Lazy.__eq__


class NoCachePool(CachePool):
    """Reads every file directly, in the calling thread, when it is asked for."""

    def get(self, ds: FileStore, fname: str, sample: Any = None) -> Any:
        return ds.get(fname, sample)

    def get_lazy(self, ds: FileStore, fname: str) -> DirectLazy:
        return DirectLazy(ds=ds, fname=fname, pool=self)

    def to_cache(self, data: T, name: str) -> MockLazy[T]:
        return MockLazy(fname=name, get_fn=_Constant(data))

    def close(self) -> None:
        """Nothing to stop."""


class _Constant:
    """``get_fn`` of :meth:`NoCachePool.to_cache` (a class, so the lazy pickles)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self, _name: str) -> Any:
        return self.value
