"""Every ``ENERGON_LITE_*`` variable the package reads has a row in docs/reference/settings.md."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_environment_variable_is_in_the_settings_table():
    used = set()
    for path in (ROOT / "megatron_energon_lite").rglob("*.py"):
        used |= set(re.findall(r"ENERGON_LITE_[A-Z_]+[A-Z]", path.read_text()))
    rows = set(re.findall(r"^\| `(ENERGON_LITE_[A-Z_]+)` \|", (ROOT / "docs/reference/settings.md").read_text(), re.MULTILINE))
    assert len(used) >= 12
    assert used - rows == set(), f"undocumented: {sorted(used - rows)}"
    assert rows - used == set(), f"documented but not read anywhere: {sorted(rows - used)}"
