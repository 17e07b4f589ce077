"""Media metadata at prepare time: Energon's ``media_metadata`` and ``media_filters`` tables.

``energon prepare --media-metadata-by-{extension,glob,header}`` stores, for every media part of
every sample, a compact JSON row in ``.nv-meta/index.sqlite``::

    media_metadata(entry_key TEXT PRIMARY KEY,   -- "<sample key>.<part>", no shard prefix
                   metadata_type TEXT NOT NULL,  -- "image" | "av"
                   metadata_json TEXT NOT NULL)  -- e.g. {"width":6,"height":4,"format":"PNG","mode":"RGB"}
    media_filters(filter_id INTEGER PRIMARY KEY AUTOINCREMENT, strategy TEXT NOT NULL,
                  patterns TEXT, created_at_utc TEXT DEFAULT CURRENT_TIMESTAMP,
                  UNIQUE(strategy, patterns))  -- ("EXTENSION", ""), ("GLOB", "*.jpg,*.wav"), ...

Which parts count as media follows Energon 7.4 (``media/extractor.py``):

1. ``EXTENSION``: the part's last suffix is a known image or audio/video extension
   (case-insensitive).
2. ``HEADER``: the first bytes decide (magic numbers, :func:`sniff_media_type`); content that is
   not recognised falls back to the extension.
3. ``GLOB``: the entry key matches one of the patterns, both as written and lowercased (so
   patterns are effectively lowercase; ``*`` also matches ``/``); the type is then found as in
   2.  Energon 7.4.1 selects names the same way but then fails on every matching part
   (``AssertionError: Unexpected media filter strategy``, the shard is dropped and prepare
   aborts), so there is no Energon behaviour to follow past the selection; sniffing makes
   patterns such as ``*.bin`` useful.

A part whose content cannot be parsed gets no row, as in Energon; we also log a warning naming
shard, sample key and part (Energon logs at debug level, or fails the whole shard for a broken
image).  Image fields are Pillow's ``width, height, format, mode`` after a full ``load()``; audio
and video fields are those of Energon's ``AVMetadata`` computed the same way (see
:func:`av_metadata`), with ``None`` fields left out of the JSON.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
from dataclasses import dataclass
from enum import Enum
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import IO, Any, Iterable, Sequence

from ..errors import ConfigError, DatasetError, MissingDependencyError, format_message
from ..storage import local_view
from .metadata import INDEX_SQLITE, meta_dir
from .tar_reader import SampleEntry

IMAGE = "image"
AV = "av"

# Energon's extension tables (media/extractor.py), compared lowercase without the dot.
IMAGE_EXTENSIONS = frozenset(
    {"bmp", "gif", "ico", "j2k", "jp2", "jpx", "jpeg", "jpg", "png", "tif", "tiff", "webp"}
)
AV_EXTENSIONS = frozenset(
    {"aac", "avi", "flac", "m4a", "m4v", "mkv", "mov", "mp3", "mp4", "ogg", "wav", "webm"}
)

MEDIA_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS media_metadata (entry_key TEXT PRIMARY KEY, "
    "metadata_type TEXT NOT NULL, metadata_json TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS media_filters (filter_id INTEGER PRIMARY KEY AUTOINCREMENT, "
    "strategy TEXT NOT NULL, patterns TEXT, created_at_utc TEXT DEFAULT CURRENT_TIMESTAMP, "
    "UNIQUE(strategy, patterns))",
)

_AV_FIELDS = (
    "video_duration", "video_num_frames", "video_fps", "video_width", "video_height",
    "audio_duration", "audio_channels", "audio_sample_rate", "audio_num_samples",
)  # fmt: skip


class MediaStrategy(str, Enum):
    """How media parts are recognised; the value is what ``media_filters.strategy`` stores."""

    EXTENSION = "EXTENSION"
    GLOB = "GLOB"
    HEADER = "HEADER"


@dataclass(frozen=True)
class MediaFilter:
    """Which parts get metadata: one strategy, plus the glob patterns of ``GLOB``."""

    strategy: MediaStrategy
    patterns: tuple[str, ...] = ()

    @classmethod
    def by_extension(cls) -> MediaFilter:
        return cls(MediaStrategy.EXTENSION)

    @classmethod
    def by_header(cls) -> MediaFilter:
        return cls(MediaStrategy.HEADER)

    @classmethod
    def by_glob(cls, patterns: str | Sequence[str]) -> MediaFilter:
        """``"*.jpg,*.wav"`` or ``["*.jpg", "*.wav"]``; blanks around each pattern are dropped."""
        items = patterns.split(",") if isinstance(patterns, str) else list(patterns)
        cleaned = tuple(p.strip() for p in items if p.strip())
        if not cleaned:
            raise ConfigError(
                format_message(
                    "empty glob pattern for media metadata",
                    expected="one or more comma-separated globs, e.g. '*.jpg,*.wav'",
                    found=repr(patterns),
                )
            )
        return cls(MediaStrategy.GLOB, cleaned)

    @classmethod
    def from_options(
        cls, *, glob: str | None = None, header: bool = False, extension: bool = False
    ) -> MediaFilter | None:
        """The filter the three ``--media-metadata-by-*`` options ask for; None if none is set."""
        chosen = [
            name
            for name, on in (
                ("--media-metadata-by-glob", glob is not None),
                ("--media-metadata-by-header", header),
                ("--media-metadata-by-extension", extension),
            )
            if on
        ]
        if len(chosen) > 1:
            raise ConfigError(
                format_message(
                    "media metadata options are mutually exclusive",
                    expected="at most one of --media-metadata-by-extension, "
                    "--media-metadata-by-glob, --media-metadata-by-header",
                    found=", ".join(chosen),
                    fix="keep one; several globs go into one option: "
                    "--media-metadata-by-glob '*.jpg,*.wav'",
                )
            )
        if glob is not None:
            return cls.by_glob(glob)
        if header:
            return cls.by_header()
        if extension:
            return cls.by_extension()
        return None

    @property
    def patterns_text(self) -> str:
        """What ``media_filters.patterns`` stores: the patterns joined by commas ("" if none)."""
        return ",".join(self.patterns)

    def to_json(self) -> list[str]:
        return [self.strategy.value, self.patterns_text]

    @classmethod
    def from_row(cls, strategy: str, patterns: str | None) -> MediaFilter:
        """Reads a ``media_filters`` row back (also one written by Energon)."""
        try:
            kind = MediaStrategy(strategy)
        except ValueError:
            raise DatasetError(
                format_message(
                    "unknown media filter strategy in index.sqlite",
                    expected=", ".join(s.value for s in MediaStrategy),
                    found=repr(strategy),
                    fix="prepare the dataset again with one of the --media-metadata-by-* options",
                )
            ) from None
        if kind is MediaStrategy.GLOB:
            return cls.by_glob(patterns or "")
        return cls(kind)

    def wants(self, entry_key: str) -> bool:
        """Cheap check by name, before the part's bytes are read."""
        if self.strategy is MediaStrategy.HEADER:
            return True
        if self.strategy is MediaStrategy.EXTENSION:
            return type_from_extension(entry_key) is not None
        return self._glob_matches(entry_key)

    def media_type(self, entry_key: str, data: bytes) -> str | None:
        """``"image"``, ``"av"`` or None (not media under this filter)."""
        if self.strategy is MediaStrategy.EXTENSION:
            return type_from_extension(entry_key)
        if self.strategy is MediaStrategy.GLOB and not self._glob_matches(entry_key):
            return None
        return sniff_media_type(data) or type_from_extension(entry_key)

    def _glob_matches(self, name: str) -> bool:
        # Energon tests the lowercased name first and the name as written later.
        lower = name.lower()
        return any(fnmatchcase(lower, p) for p in self.patterns) and any(
            fnmatchcase(name, p) for p in self.patterns
        )


def type_from_extension(name: str) -> str | None:
    suffix = PurePosixPath(name).suffix[1:].lower()
    if suffix in IMAGE_EXTENSIONS:
        return IMAGE
    if suffix in AV_EXTENSIONS:
        return AV
    return None


# ---------------------------------------------------------------------------------------------
# Magic numbers
# ---------------------------------------------------------------------------------------------

# ISO-BMFF major brands of still images (HEIF/AVIF); every other ``ftyp`` file is audio/video.
_IMAGE_BRANDS = frozenset({b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1", b"avif", b"avis"})

# (offset, magic, type), tried in order.
_MAGICS: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xff\xd8\xff", IMAGE),  # JPEG
    (0, b"\x89PNG\r\n\x1a\n", IMAGE),
    (0, b"GIF87a", IMAGE),
    (0, b"GIF89a", IMAGE),
    (0, b"II*\x00", IMAGE),  # TIFF, little endian
    (0, b"MM\x00*", IMAGE),  # TIFF, big endian
    (0, b"\x00\x00\x00\x0cjP  \r\n\x87\n", IMAGE),  # JPEG 2000 (jp2/jpx)
    (0, b"\xff\x4f\xff\x51", IMAGE),  # JPEG 2000 codestream (j2k)
    (0, b"\x00\x00\x01\x00", IMAGE),  # ICO
    (0, b"8BPS", IMAGE),  # PSD
    (0, b"\x1a\x45\xdf\xa3", AV),  # EBML: Matroska, WebM
    (0, b"fLaC", AV),
    (0, b"OggS", AV),
    (0, b"ID3", AV),  # MP3 with an ID3v2 tag
    (0, b"FLV\x01", AV),
    (0, b"\x00\x00\x01\xba", AV),  # MPEG program stream
    (0, b"\x00\x00\x01\xb3", AV),  # MPEG video elementary stream
    (0, b"#!AMR", AV),
    (0, b"MThd", AV),  # MIDI
    (0, b"\x30\x26\xb2\x75\x8e\x66\xcf\x11", AV),  # ASF: WMV/WMA
)
_RIFF_FORMS = {b"WEBP": IMAGE, b"WAVE": AV, b"AVI ": AV}


def sniff_media_type(data: bytes) -> str | None:
    """``"image"`` or ``"av"`` from the first bytes, or None when they are not recognised."""
    head = bytes(data[:32])
    for offset, magic, kind in _MAGICS:
        if head.startswith(magic, offset):
            return kind
    if head.startswith(b"RIFF") and head[8:12] in _RIFF_FORMS:
        return _RIFF_FORMS[head[8:12]]
    if head.startswith(b"FORM") and head[8:12] in (b"AIFF", b"AIFC"):
        return AV
    if head[4:8] == b"ftyp":
        return IMAGE if head[8:12] in _IMAGE_BRANDS else AV
    if head.startswith(b"BM") and len(head) >= 14:
        return IMAGE
    if len(head) >= 2 and head[0] == 0xFF and head[1] in (0xF2, 0xF3, 0xFB, 0xF1, 0xF9):
        return AV  # MPEG audio frame sync (MP3) or ADTS (AAC)
    return None


# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------


def image_metadata(data: bytes) -> dict[str, Any]:
    """Pillow's view of an encoded image, after decoding it fully (as Energon does)."""
    return image_metadata_of_file(io.BytesIO(data))


def image_metadata_of_file(file: IO[bytes]) -> dict[str, Any]:
    """:func:`image_metadata` of an open binary file (read without loading it all first)."""
    from PIL import Image

    with Image.open(file) as image:
        image.load()
        return {
            "width": image.width,
            "height": image.height,
            "format": image.format or "UNKNOWN",
            "mode": image.mode or "UNKNOWN",
        }


def _import_av():
    try:
        import av
    except ImportError:
        raise MissingDependencyError(
            format_message(
                "audio/video metadata needs PyAV, which is not installed",
                fix="pip install megatron-energon-lite[av]  (or use "
                "--media-metadata-by-glob with image patterns only)",
            )
        ) from None
    return av


def av_metadata(data: bytes) -> dict[str, Any]:
    """Energon's ``AVMetadata`` fields for the first video and the first audio stream.

    Video: ``video_duration`` is the stream's duration from the header (else the last packet's
    end), minus the stream start, in seconds; ``video_num_frames`` counts demuxed packets with a
    timestamp; ``video_fps`` is the average rate; width and height come from the first decoded
    frame.  Audio: every frame is decoded; ``audio_num_samples`` is their sum and
    ``audio_duration`` ends at the last frame's end (header duration as a fallback).
    """
    return av_metadata_of_file(io.BytesIO(data))


def av_metadata_of_file(file: IO[bytes]) -> dict[str, Any]:
    """:func:`av_metadata` of an open binary file (PyAV reads and seeks it as it needs)."""
    av = _import_av()
    fields: dict[str, Any] = {}
    with av.open(file, "r") as container:
        for stream in container.streams:
            codec = stream.codec_context
            if codec is not None:  # no decoder threads: we run inside forked workers
                codec.thread_type = "NONE"
                codec.thread_count = 0
        if container.streams.video:
            fields.update(_video_fields(container, container.streams.video[0]))
        if container.streams.audio:
            fields.update(_audio_fields(container, container.streams.audio[0]))
    return {name: fields[name] for name in _AV_FIELDS if fields.get(name) is not None}


def stream_seconds(ticks: int | None, stream) -> float | int | None:
    """A timestamp or duration in ``stream``'s ticks as seconds from the stream's start, computed as
    Energon does (``(ticks - start_time) * float(time_base)``, so the floats are Energon's too)."""
    if ticks is None:
        return None
    if stream.start_time is not None:
        ticks -= stream.start_time
    return ticks * float(stream.time_base) if stream.time_base is not None else ticks


def last_end(items: Iterable) -> int | None:
    """End timestamp (pts + duration) of the last packet or frame that has a pts."""
    last = None
    for item in items:
        if item.pts is not None:
            last = item
    duration = getattr(last, "duration", None)
    return None if last is None or duration is None else last.pts + duration


def _video_fields(container, stream) -> dict[str, Any]:
    ticks, num_frames = stream.duration, None
    if ticks is None:  # no duration in the header: count packets and take the last one's end
        num_frames, last = 0, None
        for packet in container.demux(video=0):
            if packet.pts is not None:
                num_frames += 1
                last = packet
        ticks = last_end([last] if last is not None else [])
    duration = stream_seconds(ticks, stream)
    if num_frames is None:
        num_frames = sum(1 for packet in container.demux(video=0) if packet.pts is not None)
    if stream.average_rate is not None:
        fps = float(stream.average_rate)
    elif duration:
        fps = num_frames / duration
    else:
        fps = None
    width, height = stream.width, stream.height
    container.seek(0)
    for frame in container.decode(video=0):
        width, height = frame.width, frame.height
        break
    return {
        "video_duration": duration,
        "video_num_frames": num_frames,
        "video_fps": fps,
        "video_width": width,
        "video_height": height,
    }


def _audio_fields(container, stream) -> dict[str, Any]:
    num_samples, frames_with_pts = 0, []
    container.seek(0)
    for frame in container.decode(audio=0):
        num_samples += frame.samples
        if frame.pts is not None:
            frames_with_pts[:] = [frame]
    ticks = last_end(frames_with_pts)
    if ticks is None:
        ticks = stream.duration
    if ticks is None:
        container.seek(0)
        ticks = last_end(container.demux(audio=0))
    return {
        "audio_duration": stream_seconds(ticks, stream),
        "audio_channels": stream.channels,
        "audio_sample_rate": stream.sample_rate,
        "audio_num_samples": num_samples,
    }


_EXTRACTORS = {IMAGE: image_metadata, AV: av_metadata}


def extract_metadata(media_type: str, data: bytes) -> dict[str, Any]:
    """The metadata dict of one part; raises whatever the parser raises on bad content."""
    return _EXTRACTORS[media_type](data)


_FILE_EXTRACTORS = {IMAGE: image_metadata_of_file, AV: av_metadata_of_file}


def extract_metadata_of_file(media_type: str, path: str | os.PathLike) -> dict[str, Any]:
    """:func:`extract_metadata` of a local file, read as the parser needs (a large video is not
    loaded into memory); raises whatever the parser raises on bad content."""
    with open(path, "rb") as file:
        return _FILE_EXTRACTORS[media_type](file)


@dataclass(frozen=True)
class MediaRow:
    """One ``media_metadata`` row."""

    entry_key: str
    metadata_type: str
    metadata_json: str


@dataclass
class MediaScan:
    """What one shard's media pass found: rows to store, and messages for the parts skipped."""

    rows: list[MediaRow]
    failures: list[str]


def scan_media(
    media_filter: MediaFilter, buffer: bytes | memoryview, samples: Iterable[SampleEntry], *, where: str
) -> MediaScan:
    """Extracts the metadata of every media part of one shard held in ``buffer`` (the tar)."""
    scan = MediaScan([], [])
    for sample in samples:
        for part, offset, size in sample.parts:
            entry_key = f"{sample.key}.{part}"
            if not media_filter.wants(entry_key):
                continue
            data = bytes(buffer[offset : offset + size])
            media_type = media_filter.media_type(entry_key, data)
            if media_type is None:
                continue
            try:
                values = extract_metadata(media_type, data)
            except MissingDependencyError:
                raise
            except Exception as exc:  # noqa: BLE001 - any parser failure means "no metadata"
                scan.failures.append(
                    format_message(
                        f"no media metadata for part {part!r} of sample {sample.key!r}: "
                        f"it cannot be parsed as {media_type}",
                        where=where,
                        found=f"{type(exc).__name__}: {exc}",
                        fix="re-encode or remove the part; the entry is stored without metadata",
                    )
                )
                continue
            scan.rows.append(MediaRow(entry_key, media_type, json.dumps(values, separators=(",", ":"))))
    return scan


# ---------------------------------------------------------------------------------------------
# index.sqlite
# ---------------------------------------------------------------------------------------------


class MediaIndexWriter:
    """Adds the media tables and rows to an existing ``index.sqlite`` (replacing old rows)."""

    def __init__(self, index: str | os.PathLike) -> None:
        self.path = Path(index)
        if not self.path.is_file():
            raise DatasetError(
                format_message(
                    "index.sqlite not found", where=str(self.path), fix="run prepare first"
                )
            )
        self._db = sqlite3.connect(f"file:{self.path}", uri=True)
        self._db.execute("DROP TABLE IF EXISTS media_metadata")
        self._db.execute("DROP TABLE IF EXISTS media_filters")
        for statement in MEDIA_SCHEMA:
            self._db.execute(statement)
        self.count = 0

    def add(self, rows: Iterable[MediaRow]) -> None:
        before = self._db.total_changes
        self._db.executemany(
            "INSERT OR REPLACE INTO media_metadata VALUES (?, ?, ?)",
            ((r.entry_key, r.metadata_type, r.metadata_json) for r in rows),
        )
        self.count += self._db.total_changes - before

    def copy_shards(self, previous_index: str | os.PathLike, shard_ids: Sequence[int]) -> None:
        """Copies the rows of some shards (ids in the previous index) from a previous index."""
        if not shard_ids:
            return
        self._db.execute("ATTACH DATABASE ? AS prev", (f"file:{previous_index}?mode=ro",))
        try:
            for shard_id in shard_ids:
                before = self._db.total_changes
                self._db.execute(
                    "INSERT OR REPLACE INTO media_metadata SELECT m.entry_key, m.metadata_type, "
                    "m.metadata_json FROM prev.samples s JOIN prev.sample_parts p "
                    "ON p.tar_file_id = s.tar_file_id AND p.sample_index = s.sample_index "
                    "JOIN prev.media_metadata m ON m.entry_key = s.sample_key || '.' || p.part_name "
                    "WHERE s.tar_file_id = ?",
                    (shard_id,),
                )
                self.count += self._db.total_changes - before
            self._db.commit()
        finally:
            self._db.execute("DETACH DATABASE prev")

    def copy_entries(self, previous_index: str | os.PathLike, entry_keys: Iterable[str]) -> int:
        """Copies the rows of ``entry_keys`` from a previous index; returns how many it found."""
        self._db.execute("CREATE TEMP TABLE IF NOT EXISTS copy_keys (entry_key TEXT PRIMARY KEY)")
        self._db.executemany("INSERT OR IGNORE INTO temp.copy_keys VALUES (?)", ((k,) for k in entry_keys))
        self._db.commit()
        self._db.execute("ATTACH DATABASE ? AS prev", (f"file:{previous_index}?mode=ro",))
        try:
            before = self._db.total_changes
            self._db.execute(
                "INSERT OR REPLACE INTO media_metadata SELECT m.entry_key, m.metadata_type, "
                "m.metadata_json FROM prev.media_metadata m JOIN temp.copy_keys k "
                "ON k.entry_key = m.entry_key"
            )
            copied = self._db.total_changes - before
            self._db.commit()
        except BaseException:
            self._db.rollback()
            raise
        finally:
            self._db.execute("DETACH DATABASE prev")
            self._db.execute("DROP TABLE temp.copy_keys")
        self.count += copied
        return copied

    def finish(self, media_filter: MediaFilter) -> int:
        """Records the filter (with SQLite's UTC ``CURRENT_TIMESTAMP``) and commits."""
        self._db.execute(
            "INSERT OR IGNORE INTO media_filters (strategy, patterns) VALUES (?, ?)",
            (media_filter.strategy.value, media_filter.patterns_text),
        )
        self._db.commit()
        self._db.close()
        return self.count

    def abort(self) -> None:
        self._db.rollback()
        self._db.close()


def write_media_metadata(index: str | os.PathLike, media_filter: MediaFilter, rows: Iterable[MediaRow]) -> int:
    """Replaces the media tables of an existing index with ``rows``; returns the row count."""
    writer = MediaIndexWriter(index)
    try:
        writer.add(rows)
    except BaseException:
        writer.abort()
        raise
    return writer.finish(media_filter)


def open_index(index: Any) -> sqlite3.Connection | None:
    """A read-only connection to an ``index.sqlite`` (local, or a cached copy of a remote one); None if it does not exist."""
    local = local_view(index)  # a remote index is read from its cached copy
    if local is None:
        return None
    return sqlite3.connect(f"file:{local}?mode=ro", uri=True)


def read_media_filter(index: str | os.PathLike) -> MediaFilter | None:
    """The most recent filter recorded in an index (Energon appends one per run), or None."""
    db = open_index(index)
    if db is None:
        return None
    try:
        row = db.execute(
            "SELECT strategy, patterns FROM media_filters ORDER BY filter_id DESC LIMIT 1"
        ).fetchone()
    except sqlite3.Error:
        return None
    finally:
        db.close()
    return None if row is None else MediaFilter.from_row(*row)


def read_media_metadata(root: str | os.PathLike, entry_key: str) -> dict[str, Any] | None:
    """The stored metadata of ``"<sample key>.<part>"`` in a prepared dataset, or None."""
    db = open_index(meta_dir(root) / INDEX_SQLITE)
    if db is None:
        return None
    try:
        row = db.execute(
            "SELECT metadata_json FROM media_metadata WHERE entry_key = ?", (entry_key,)
        ).fetchone()
    except sqlite3.DatabaseError as exc:
        if _no_media_table(exc):  # prepared without media metadata
            return None
        raise _corrupt_index(root, exc) from None
    finally:
        db.close()
    return None if row is None else json.loads(row[0])


def media_counts(root: str | os.PathLike) -> dict[str, int] | None:
    """Stored entries per metadata type, or None when the dataset has no media tables."""
    db = open_index(meta_dir(root) / INDEX_SQLITE)
    if db is None:
        return None
    try:
        rows = db.execute(
            "SELECT metadata_type, COUNT(*) FROM media_metadata GROUP BY metadata_type "
            "ORDER BY metadata_type"
        ).fetchall()
    except sqlite3.DatabaseError as exc:
        if _no_media_table(exc):
            return None
        raise _corrupt_index(root, exc) from None
    finally:
        db.close()
    return dict(rows)


def _no_media_table(exc: sqlite3.DatabaseError) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "no such table" in str(exc)


def _corrupt_index(root: str | os.PathLike, exc: sqlite3.DatabaseError) -> DatasetError:
    return DatasetError(
        format_message(
            "cannot read the dataset's sample index",
            where=str(meta_dir(root) / INDEX_SQLITE),
            found=f"{type(exc).__name__}: {exc}",
            fix=f"run `energon-lite prepare {root}` again (it rewrites index.sqlite)",
        )
    )
