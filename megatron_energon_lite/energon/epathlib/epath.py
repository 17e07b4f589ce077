"""``EPath``: Energon's path class, one type for local files and object storage.

An :class:`EPath` names a file or folder in one of four places:

* a local path (``/data/ds``, ``./ds``, ``file:///data/ds``, or a :class:`pathlib.Path`),
  always made absolute, ``.`` and ``..`` resolved by name (symlinks are not followed);
* ``msc://PROFILE/bucket/key`` (Multi-Storage Client; ``rclone://`` is its deprecated spelling),
  where the profile :data:`DEFAULT_PROFILE_NAME` means the local file system;
* ``s3://bucket/key`` and other fsspec URLs;
* ``dss://NAME@VERSION/path``: a dataset in the local dataset cache :data:`NVDATASET_CACHE_DIR`
  (read from the environment variable of that name at import), at ``NAME/VERSION/path`` there.

It behaves as Energon's ``EPath``: ``/`` joins (an absolute or URL right side replaces the left),
``str()`` is the URL (the plain path for local files), ``relative_to`` returns a string,
``glob`` and ``walk`` yield files only (following symlinked folders), writing a file creates its
folders, and pickling keeps the URL but no connection or credentials.  The bytes move through
this package's storage layer (:func:`megatron_energon_lite.storage.as_path`): local files
directly, remote ones through fsspec with retries.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob as globlib
import io
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ...errors import ConfigError, format_message
from ...storage import RemotePath, as_path
from ...storage.dss import parse_dss, resolve_dots, set_dataset_cache_lookup
from ...storage.paths import dss_path
from ...storage.remote import with_retries

__all__ = ["DEFAULT_PROFILE_NAME", "NVDATASET_CACHE_DIR", "EPath", "EPathStat"]

#: The Multi-Storage Client profile of the local file system (MSC's reserved POSIX profile):
#: ``msc://__filesystem__/etc/hosts`` is ``/etc/hosts``.
DEFAULT_PROFILE_NAME = "__filesystem__"

_URL = re.compile(r"^(?P<protocol>[a-z][a-z0-9+.-]*)://(?P<rest>.*)$")
_MAGIC = re.compile(r"[*?\[]")

# Where ``profile`` is not an MSC profile: "dss" paths and other URL protocols (s3, gs, ...).
# Their names are parsed and resolved by the storage layer (storage/dss.py).
_DSS = "dss"


@dataclasses.dataclass(frozen=True)
class EPathStat:
    """What :meth:`EPath.stat` reports (the fields of MSC's ``ObjectMetadata`` that Energon uses)."""

    key: str
    content_length: int
    last_modified: datetime.datetime | None
    type: str  # "file" or "directory"
    etag: str | None = None

    @property
    def st_size(self) -> int:
        return self.content_length

    @property
    def st_mtime(self) -> float | None:
        return None if self.last_modified is None else self.last_modified.timestamp()


class EPath:
    """A local or remote path with Energon's ``EPath`` interface (see the module docstring).

    ``protocol`` is None for local paths, else ``"msc"``, ``"dss"``, ``"s3"``, ...; ``profile``
    is the MSC profile (:data:`DEFAULT_PROFILE_NAME` for local paths, ``"dss"`` for dataset-cache
    paths, ``""`` for other URLs); ``internal_path`` is the absolute path below it.
    """

    __slots__ = ("internal_path", "profile", "protocol")

    protocol: str | None
    profile: str
    internal_path: PurePosixPath

    def __init__(self, initial_path: str | EPath | os.PathLike) -> None:
        if isinstance(initial_path, EPath):
            self.protocol, self.profile, self.internal_path = initial_path.protocol, initial_path.profile, initial_path.internal_path
            return
        if isinstance(initial_path, os.PathLike) and not isinstance(initial_path, RemotePath):
            self._set_local(os.fspath(initial_path))
            return
        text = str(initial_path)
        match = _URL.match(text)
        if match is None:
            self._set_local(text)
            return
        protocol, rest = match["protocol"], match["rest"]
        if protocol == "file":
            self._set_local(rest)
            return
        if protocol == "rclone":
            warnings.warn("rclone:// protocol is deprecated. Use msc:// instead.", FutureWarning, stacklevel=2)
            protocol = "msc"
        first, _, inner = rest.partition("/")
        if not first:
            raise ConfigError(format_message("invalid path URL", expected=f"{protocol}://NAME/path", found=repr(text)))
        if protocol == "msc":
            if first == DEFAULT_PROFILE_NAME:
                self._set_local("/" + inner)
                return
            self.protocol, self.profile = "msc", first
            self.internal_path = resolve_dots(PurePosixPath("/", inner), text)
        elif protocol == _DSS:
            self.protocol, self.profile = _DSS, _DSS
            self.internal_path = parse_dss(first, inner, text)
        else:
            self.protocol, self.profile = protocol, ""
            self.internal_path = resolve_dots(PurePosixPath("/", rest), text)

    def _set_local(self, path: str) -> None:
        self.protocol, self.profile = None, DEFAULT_PROFILE_NAME
        self.internal_path = resolve_dots(PurePosixPath(os.path.join(os.getcwd(), path)), path)

    def _derive(self, internal_path: PurePosixPath) -> EPath:
        new = object.__new__(EPath)
        new.protocol, new.profile, new.internal_path = self.protocol, self.profile, internal_path
        return new

    def __reduce__(self):
        return (_rebuild, (self.protocol, self.profile, str(self.internal_path)))

    # --- names -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The path as a string: the plain path for local files, else the URL."""
        if self.protocol is None:
            return str(self.internal_path)
        if self.protocol == "msc":
            return f"msc://{self.profile}{self.internal_path}"
        return f"{self.protocol}://{str(self.internal_path)[1:]}"

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"EPath({self.url!r})"

    def __fspath__(self) -> str:
        """The local file system path; remote paths have none (TypeError, as for ``RemotePath``)."""
        path = self.storage_path()
        if isinstance(path, RemotePath):
            raise TypeError(f"{self.url} is remote; it has no local file system path")
        return os.fspath(path)

    def __hash__(self) -> int:
        return hash((self.protocol, self.profile, self.internal_path))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, EPath)
            and self.protocol == other.protocol
            and self.profile == other.profile
            and self.internal_path == other.internal_path
        )

    def __lt__(self, other: EPath) -> bool:
        return (self.protocol or "", self.profile, self.internal_path) < (other.protocol or "", other.profile, other.internal_path)

    def __truediv__(self, other: str | EPath | os.PathLike) -> EPath:
        if isinstance(other, EPath):
            return other
        text = os.fspath(other) if isinstance(other, os.PathLike) else str(other)
        if text.startswith("/") or "://" in text:
            return EPath(text)
        return self._derive(resolve_dots(self.internal_path / text, text))

    @property
    def name(self) -> str:
        return self.internal_path.name

    @property
    def suffix(self) -> str:
        return self.internal_path.suffix

    @property
    def stem(self) -> str:
        return self.internal_path.stem

    @property
    def parent(self) -> EPath:
        return self._derive(self.internal_path.parent)

    @property
    def display_name(self) -> str:
        """The dataset name for ``dss://`` paths, else the file name."""
        if self.protocol == _DSS:
            return self.internal_path.parts[1] if len(self.internal_path.parts) > 1 else ""
        return self.name

    def with_suffix(self, suffix: str) -> EPath:
        return self._derive(self.internal_path.with_suffix(suffix))

    def with_name(self, name: str) -> EPath:
        return self._derive(self.internal_path.with_name(name))

    def relative_to(self, other: EPath) -> str:
        """This path relative to ``other``, as a string (``"images/000.jpg"``)."""
        if (self.protocol, self.profile) != (other.protocol, other.profile):
            raise ConfigError(
                format_message(
                    "relative_to needs two paths in the same place",
                    found=f"{self.url!r} and {other.url!r}",
                    fix="compare paths of one file system, bucket profile or dataset",
                )
            )
        return str(self.internal_path.relative_to(other.internal_path))

    # --- where the bytes are ---------------------------------------------------------------
    def storage_path(self) -> Path | RemotePath:
        """The storage layer's name for this path: a local :class:`Path` or a :class:`RemotePath`."""
        if self.protocol is None:
            return Path(self.internal_path)
        if self.protocol == _DSS:
            return self._dss_path()
        return as_path(self.url)

    def _dss_path(self) -> Path | RemotePath:
        # The module global, read at call time (it may be reassigned).
        return dss_path(self.internal_path, NVDATASET_CACHE_DIR)

    def is_local(self) -> bool:
        return not isinstance(self.storage_path(), RemotePath)

    def local_path(self) -> Path:
        """The local :class:`Path`; a :class:`ConfigError` (a ValueError) for a remote path."""
        path = self.storage_path()
        if isinstance(path, RemotePath):
            raise ConfigError(
                format_message(
                    f"{self.url} is remote; it has no local file system path",
                    fix="read it through EPath.open/read_bytes, or copy it to a local EPath first",
                )
            )
        return path

    # --- queries ---------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.storage_path().exists()

    def is_file(self) -> bool:
        return self.storage_path().is_file()

    def is_dir(self) -> bool:
        return self.storage_path().is_dir()

    def size(self) -> int:
        path = self.storage_path()
        return path.stat().size if isinstance(path, RemotePath) else os.path.getsize(path)

    def stat(self) -> EPathStat:
        path = self.storage_path()
        if isinstance(path, RemotePath):
            info = with_retries(lambda: path.fs.info(path.url), what=f"stat {path.url}", settings=path.settings)
            modified = info.get("LastModified") or info.get("last_modified") or info.get("mtime")
            if isinstance(modified, (int, float)):
                modified = datetime.datetime.fromtimestamp(modified, datetime.timezone.utc)
            elif isinstance(modified, str):
                modified = datetime.datetime.fromisoformat(modified)
            etag = info.get("ETag") or info.get("etag")
            return EPathStat(
                key=path.key,
                content_length=int(info.get("size") or 0),
                last_modified=modified if isinstance(modified, datetime.datetime) else None,
                type="directory" if info.get("type") == "directory" else "file",
                etag=None if etag is None else str(etag).strip('"'),
            )
        st = os.stat(path)
        return EPathStat(
            key=str(path),
            content_length=st.st_size,
            last_modified=datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc),
            type="directory" if os.path.isdir(path) else "file",
        )

    # --- reading and writing ---------------------------------------------------------------
    def open(self, mode: str = "r", block_size: int | None = None, prefetch_file: bool = False) -> IO[Any]:
        """Opens the file (``"r"``, ``"rb"``, ``"w"``, ``"wb"``); writing creates the folders."""
        path = self.storage_path()
        if isinstance(path, RemotePath):
            if prefetch_file and "r" in mode:
                data = path.read_bytes()
                return io.BytesIO(data) if "b" in mode else io.StringIO(data.decode("utf-8"))
            options = {} if block_size is None else {"block_size": block_size}
            return path.fs.open(path.url, mode, **options)
        if "w" in mode or "a" in mode or "x" in mode:
            os.makedirs(path.parent, exist_ok=True)
        return open(path, mode, encoding=None if "b" in mode else "utf-8")

    def read_bytes(self) -> bytes:
        return self.storage_path().read_bytes()

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def write_bytes(self, data: bytes) -> None:
        path = self.storage_path()
        if not isinstance(path, RemotePath):
            os.makedirs(path.parent, exist_ok=True)
        path.write_bytes(data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8"))

    def mkdir(self, exist_ok: bool = True, parents: bool = False) -> None:
        """Creates the folder (with its parents) locally; object stores have no folders to create."""
        path = self.storage_path()
        if not isinstance(path, RemotePath):
            os.makedirs(path, exist_ok=True)

    def unlink(self, missing_ok: bool = False) -> None:
        self.storage_path().unlink(missing_ok=missing_ok)

    def copy(self, target: EPath) -> None:
        """Copies this file (or every file under this folder) to ``target``, across file systems."""
        if not self.is_file():
            for path in self.walk():
                path.copy(target / path.relative_to(self))
            return
        source, dest = self.storage_path(), target.storage_path()
        if isinstance(dest, RemotePath):
            if isinstance(source, RemotePath):
                dest.write_bytes(source.read_bytes())
            else:
                dest.upload(source)
            return
        os.makedirs(dest.parent, exist_ok=True)
        if isinstance(source, RemotePath):
            with open(dest, "wb") as out, source.fs.open(source.url, "rb") as src:
                shutil.copyfileobj(src, out)
        else:
            shutil.copyfile(source, dest)

    def move(self, target: EPath) -> None:
        source, dest = self.storage_path(), target.storage_path()
        if not isinstance(source, RemotePath) and not isinstance(dest, RemotePath):
            os.makedirs(dest.parent, exist_ok=True)
            os.replace(source, dest)
            return
        self.copy(target)
        self.unlink()

    # --- listing ---------------------------------------------------------------------------
    def walk(self) -> Iterator[EPath]:
        """Every file under this folder (not the folders), following symlinked folders locally."""
        for relative in sorted(self._relative_files()):
            yield self / relative

    def glob(self, pattern: str) -> Iterator[EPath]:
        """The files under this folder matching ``pattern`` (``*``, ``?``, ``[...]``, ``**`` for
        any number of folders), sorted."""
        path = self.storage_path()
        if isinstance(path, RemotePath):
            literal, rest = _literal_prefix(pattern)
            base = self / literal if literal else self
            found = [f"{literal}/{name}" if literal else name for name in base._relative_files() if _match(rest, name)]
        else:
            found = [
                name
                for name in globlib.glob(pattern, root_dir=path, recursive=True)
                if os.path.isfile(os.path.join(path, name))
            ]
        for relative in sorted(found):
            yield self / relative

    def _relative_files(self) -> list[str]:
        path = self.storage_path()
        if isinstance(path, RemotePath):
            try:
                return list(path.list_files())
            except FileNotFoundError:
                return []
        found = []
        for folder, _, files in os.walk(path, followlinks=True):
            rel = os.path.relpath(folder, path)
            found.extend(name if rel == "." else f"{rel}/{name}" for name in files)
        return found


def _rebuild(protocol: str | None, profile: str, internal_path: str) -> EPath:
    new = object.__new__(EPath)
    new.protocol, new.profile, new.internal_path = protocol, profile, PurePosixPath(internal_path)
    return new


def _literal_prefix(pattern: str) -> tuple[str, list[str]]:
    """``"parts/**/*.tar"`` -> (``"parts"``, ``["**", "*.tar"]``): the folders before the first wildcard."""
    parts = [p for p in pattern.split("/") if p and p != "."]
    literal: list[str] = []
    while len(parts) > 1 and not _MAGIC.search(parts[0]):
        literal.append(parts.pop(0))
    return "/".join(literal), parts


def _match(pattern: list[str], name: str) -> bool:
    """Whether the relative key ``name`` matches the pattern segments (glob rules: ``*`` stays
    within a folder and skips names starting with ``.``; ``**`` spans zero or more folders)."""
    return _match_parts(pattern, name.split("/"))


def _match_parts(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_parts(rest, parts[i:]) for i in range(len(parts) + 1) if not any(p.startswith(".") for p in parts[:i]))
    if not parts:
        return False
    if parts[0].startswith(".") and not head.startswith("."):
        return False
    return fnmatchcase(parts[0], head) and _match_parts(rest, parts[1:])


#: The local dataset cache that ``dss://`` paths live in (the ``NVDATASET_CACHE_DIR`` environment
#: variable at import), or None.
NVDATASET_CACHE_DIR: EPath | None = EPath(os.environ["NVDATASET_CACHE_DIR"]) if os.environ.get("NVDATASET_CACHE_DIR") else None


def _dataset_cache_dir() -> EPath | None:
    return NVDATASET_CACHE_DIR


# storage.as_path reads dss:// URLs too (a metadataset's paths): it looks the cache folder up here.
set_dataset_cache_lookup(_dataset_cache_dir)
