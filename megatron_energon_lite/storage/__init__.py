"""Where bytes come from: local files and object storage, behind one set of functions.

Format code names data with :func:`as_path` (a ``Path`` or a :class:`RemotePath`), reads sample
bytes through :func:`file_pool`, writes with :func:`atomic_write_bytes`/:func:`atomic_write_text`,
and asks for :func:`local_file`/:func:`cached_copy` where it needs a real file (mmap, SQLite).
"""

from .local import (
    LocalFilePool,
    is_no_room,
    no_room_error,
    create_temporary,
    create_temporary_folder,
    remove_own_temporaries,
    remove_stale_temporaries,
    reporting_no_room,
)
from .paths import (
    AnyPath,
    FileStat,
    as_path,
    atomic_write_bytes,
    atomic_write_text,
    cached_copy,
    file_pool,
    file_stat,
    is_remote,
    list_files,
    local_file,
    local_scratch,
    local_view,
    remove_scratch,
    replace_with,
)
from .remote import (
    RemoteFilePool,
    RemotePath,
    RemoteSettings,
    configure_storage,
    configured_storage,
    read_counters,
)

__all__ = [
    "AnyPath",
    "FileStat",
    "LocalFilePool",
    "is_no_room",
    "no_room_error",
    "create_temporary",
    "create_temporary_folder",
    "remove_own_temporaries",
    "remove_stale_temporaries",
    "reporting_no_room",
    "RemoteFilePool",
    "RemotePath",
    "RemoteSettings",
    "as_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "cached_copy",
    "configure_storage",
    "configured_storage",
    "file_pool",
    "file_stat",
    "is_remote",
    "list_files",
    "local_file",
    "local_scratch",
    "local_view",
    "read_counters",
    "remove_scratch",
    "replace_with",
]
