"""README's and the docs' code blocks run, on generated data (the rules: run_doc_blocks.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from run_doc_blocks import RUNNABLE, blocks, make_fixture

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("run_doc_blocks.py")
PAGES = {str(path.relative_to(ROOT)): path for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}
CODE = {name: [block for block in blocks(path, name) if block.language in RUNNABLE] for name, path in PAGES.items()}


@pytest.fixture(scope="session")
def doc_folder(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The data the pages' blocks use, and an environment whose `energon-lite` is this checkout's."""
    base = tmp_path_factory.mktemp("doc_blocks")
    bin_dir = base.parent / f"{base.name}_bin"
    bin_dir.mkdir()
    (bin_dir / "energon-lite").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m megatron_energon_lite.cli.main "$@"\n')
    (bin_dir / "energon-lite").chmod(0o755)
    make_fixture(base)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return base, env


@pytest.mark.parametrize("page", [name for name, code in CODE.items() if any(block.skip is None for block in code)])
def test_page_blocks_run(page, doc_folder, tmp_path):
    base, env = doc_folder
    folder = tmp_path / "page"
    shutil.copytree(base, folder)
    result = subprocess.run([sys.executable, str(DRIVER), str(PAGES[page]), page], cwd=folder, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"{page}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    runnable = sum(block.skip is None for block in CODE[page])
    assert f"ran {runnable} blocks" in result.stdout


SKIPPED = {block.where: block.skip for code in CODE.values() for block in code if block.skip}


@pytest.mark.parametrize("where", sorted(SKIPPED))
def test_skipped_block(where):
    """Each block that cannot run here, reported with the reason its page gives."""
    pytest.skip(f"{where}: {SKIPPED[where]}")


def test_nearly_every_code_block_runs():
    every = [block for code in CODE.values() for block in code]
    assert len(every) >= 20
    assert len(SKIPPED) * 4 < len(every), f"only {len(every) - len(SKIPPED)} of {len(every)} blocks run; skipped: {SKIPPED}"


def test_the_quick_start_runs():
    """README's quick start is among the blocks that run."""
    assert [block.language for block in CODE["README.md"] if block.skip is None][:2] == ["sh", "python"]
