"""README stays the short front door, and its links into the repository resolve."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_is_short():
    assert len(README.splitlines()) <= 250


def test_readme_links_resolve():
    targets = [target for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README) if "://" not in target]
    assert len(targets) >= 20
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert missing == []


def test_readme_keeps_the_install_line_and_the_two_commands():
    for text in ('pip install "megatron-energon-lite[av,s3]"', "bash scripts/demo.sh", "bash scripts/test.sh", "import megatron_energon_lite.as_energon"):
        assert text in README
