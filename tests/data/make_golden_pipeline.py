"""Writes golden_pipeline.json: what today's loader does on small synthetic data, for
tests/test_golden_pipeline.py to check that refactors change neither the iteration order nor
the checkpoints.

Regenerate only for a deliberate, announced change of iteration order or checkpoint shape:

    python tests/data/make_golden_pipeline.py [OUT]    # default OUT: tests/data/golden_pipeline.json

The configurations, the data and the recording live in tests/golden_pipeline.py (shared with the
test). This script records the code of the checkout it lives in: it puts that checkout's root,
``dev/`` and ``tests/`` first on ``sys.path``, whatever is installed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: A JSON value whose compact form is at most this long is written on one line.
LINE = 110


def dumps(value: Any, indent: str = "") -> str:
    """``value`` as JSON, short values on one line, longer dicts and lists one entry per line."""
    compact = json.dumps(value, separators=(", ", ": "))
    if len(indent) + len(compact) <= LINE or not isinstance(value, (dict, list)) or not value:
        return compact
    inner = indent + " "
    if isinstance(value, dict):
        lines = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(lines) + "\n" + indent + "}"
    return "[\n" + ",\n".join(inner + dumps(v, inner) for v in value) + "\n" + indent + "]"


def main(argv: list[str]) -> None:
    sys.path[:0] = [str(REPO), str(REPO / "dev"), str(REPO / "tests")]
    import golden_pipeline
    import megatron_energon_lite

    library = Path(megatron_energon_lite.__file__).resolve()
    if REPO not in library.parents:
        raise SystemExit(f"megatron_energon_lite was imported from {library}, not from this checkout ({REPO})")
    out = Path(argv[0]) if argv else golden_pipeline.GOLDEN
    with tempfile.TemporaryDirectory() as tmp:
        result = golden_pipeline.record(golden_pipeline.make_data(Path(tmp) / "data"))
    start, stop = golden_pipeline.RESTORE_FROM + 1, golden_pipeline.RESTORE_FROM + 1 + golden_pipeline.RESTORE_STEPS
    for name, config in result["configs"].items():
        if config[f"restored_from_{golden_pipeline.RESTORE_FROM}"] != config["batches"][start:stop]:
            raise SystemExit(f"{name}: the loader restored from step {golden_pipeline.RESTORE_FROM} does not read batches {start}..{stop - 1}; not recorded")
    out.write_text(dumps(result) + "\n")
    print(f"wrote {out} ({out.stat().st_size:,} bytes; {len(result['configs'])} configurations, library {library.parent})")


if __name__ == "__main__":
    main(sys.argv[1:])
