"""Fixtures of the preview tests (the helpers are in preview_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from preview_helpers import CAPTIONING_YAML, COLOURS, make_dataset, png, solid


@pytest.fixture
def colour_dataset(tmp_path: Path) -> Path:
    """CaptioningSample: sample i is a solid COLOURS[i] PNG (40x30) with caption "colour i"."""
    samples = [(f"c{i:03d}", {"png": png(solid(colour)), "txt": f"colour {i}".encode()}) for i, colour in enumerate(COLOURS[:4])]
    return make_dataset(tmp_path / "colours", samples, CAPTIONING_YAML, shards=2)
