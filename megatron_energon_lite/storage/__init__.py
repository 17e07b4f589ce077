"""Where bytes come from: local files now; object storage joins through the same interface."""

from .local import LocalFilePool, atomic_write_bytes, atomic_write_text

__all__ = ["LocalFilePool", "atomic_write_bytes", "atomic_write_text"]
