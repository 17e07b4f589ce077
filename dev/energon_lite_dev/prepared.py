"""The prepared datasets the tests share: what they hold and how they are built.

``tests/conftest.py`` builds each once per session (fixtures ``prepared_text``,
``prepared_captioning`` and ``prepared_blend``); tests that count samples import the
specifications from here (``from conftest import`` is ambiguous: there are several conftests).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from .synthetic import CAPTIONING_SAMPLE_YAML, generate_captioning_dataset, prepared_text_dataset, write_text_blend

__all__ = [
    "PREPARED_BLEND_SIZES",
    "PREPARED_BLEND_WEIGHTS",
    "PREPARED_CAPTIONING",
    "PREPARED_CAPTIONING_SPLIT",
    "PREPARED_TEXT",
    "build_prepared_blend",
    "build_prepared_captioning",
    "build_prepared_text",
    "prepared_content",
]

#: ``prepared_text``: ``prepared_text_dataset`` arguments; 3 shards x 37 ``TextSample`` of 1-8
#: words, keys ``{shard:04d}_{index:06d}``, all in the train split (111 samples).
PREPARED_TEXT = dict(num_shards=3, samples_per_shard=37, min_words=1, max_words=8, seed=3)
#: ``prepared_captioning``: ``generate_captioning_dataset`` arguments; 6 shards x 9
#: ``CaptioningSample`` (8x6 JPEG, caption), keys ``{shard:04d}_{index:06d}``, split
#: ``PREPARED_CAPTIONING_SPLIT`` by shards: 4 train (36 samples), 2 val (18).
PREPARED_CAPTIONING = dict(num_shards=6, samples_per_shard=9, image_size=(8, 6), seed=3)
PREPARED_CAPTIONING_SPLIT = (4, 2, 0)
#: ``prepared_blend``: ``write_text_blend`` arguments; ``TextSample`` datasets ``a`` (24 samples)
#: and ``b`` (39) of uneven shards, keys ``sized_keys(name, sizes)``, blended 1:2 in the train split.
PREPARED_BLEND_SIZES = {"a": [7, 5, 9, 3], "b": [11, 4, 8, 6, 10]}
PREPARED_BLEND_WEIGHTS = {"a": 1, "b": 2}


def build_prepared_text(root: str | os.PathLike[str]) -> Path:
    """The ``prepared_text`` dataset at ``root``; returns ``root``."""
    return prepared_text_dataset(root, **PREPARED_TEXT)


def build_prepared_captioning(root: str | os.PathLike[str]) -> Path:
    """The ``prepared_captioning`` dataset at ``root`` (train and val splits); returns ``root``."""
    from megatron_energon_lite.format.prepare import prepare_dataset

    root = Path(root)
    generate_captioning_dataset(root, **PREPARED_CAPTIONING)
    prepare_dataset(root, split_ratio=PREPARED_CAPTIONING_SPLIT, progress=False, num_workers=1, dataset_yaml=CAPTIONING_SAMPLE_YAML)
    return root


def build_prepared_blend(base: str | os.PathLike[str]) -> Path:
    """The ``prepared_blend`` datasets under ``base`` (``base/a``, ``base/b``); returns the
    path of the YAML blending them (``base/blend.yaml``)."""
    return write_text_blend(base, PREPARED_BLEND_SIZES, PREPARED_BLEND_WEIGHTS)


#: ``.nv-meta`` files that differ between two prepares of the same shards: a random UUID, and
#: files that record modification times.
VOLATILE_META = {"index.uuid", ".lite-prepare.json", ".lite-split-cache.json"}


def prepared_content(root: str | os.PathLike[str]) -> dict:
    """What a prepare wrote under ``root``, to compare two prepares: every table of
    ``index.sqlite`` row by row (in rowid order) with its schema, every other ``.nv-meta`` file
    byte by byte (only the names of :data:`VOLATILE_META`), and every ``.tar.idx``.  Only the
    time ``media_filters`` records is left out."""
    root = Path(root)
    meta = root / ".nv-meta"
    db = sqlite3.connect(f"file:{meta / 'index.sqlite'}?mode=ro", uri=True)
    try:
        schema = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name").fetchall()
        tables = {name: db.execute(f'SELECT * FROM "{name}" ORDER BY rowid').fetchall() for kind, name, _, _ in schema if kind == "table"}
        if "media_filters" in tables:  # its last column is when the row was written
            tables["media_filters"] = [row[:-1] for row in tables["media_filters"]]
    finally:
        db.close()
    files = {p.name: (None if p.name in VOLATILE_META else p.read_bytes()) for p in meta.iterdir() if p.name != "index.sqlite"}
    indexes = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.tar.idx"))}
    return {"schema": schema, "tables": tables, "files": files, "tar_idx": indexes}
