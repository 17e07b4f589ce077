"""Makes the pipeline tests' helper module ``resume.py`` (its ``ListSource``) importable here."""

from __future__ import annotations

import sys
from pathlib import Path

_PIPELINE_TESTS = str(Path(__file__).resolve().parent.parent / "pipeline")
if _PIPELINE_TESTS not in sys.path:
    sys.path.insert(0, _PIPELINE_TESTS)
