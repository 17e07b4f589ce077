"""examples/ run after a plain ``pip install``: without the dev package, and on a dataset of one's own.

The dev package (``energon_lite_dev``) is not installed for users; each example here runs in a
fresh interpreter in which importing it fails, and two run on a dataset given with ``--dataset``
instead of the one they would generate.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.synthetic import generate_text_dataset, make_jpeg, write_tar

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEV_PACKAGE = "energon_lite_dev"
# A fresh interpreter in which the dev package cannot be imported, running the example as __main__.
WITHOUT_DEV = "import runpy, sys; sys.modules[{dev!r}] = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def _run(script: str, *args: str) -> str:
    command = [sys.executable, "-c", WITHOUT_DEV.format(dev=DEV_PACKAGE), str(EXAMPLES / script), *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_no_example_imports_the_dev_package() -> None:
    offenders = []
    for path in sorted(EXAMPLES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == DEV_PACKAGE]
    assert not offenders


@pytest.mark.parametrize(("script", "args", "expected"), [
    ("text_packing.py", ["--workers", "0", "--batches", "12", "--seq-length", "512"], "continuation matches"),
    ("aspect_ratio_grouping.py", ["--images", "30"], "bucket  2.0: 3 batch(es) of 4"),
    ("blend_mix.py", ["--workers", "0", "--batches", "20", "--every", "10", "--mode", "exact"], "blend_mode: exact"),
    ("elastic_resume.py", ["--samples", "60"], "every sample of the epoch exactly once"),
])
def test_example_runs_without_the_dev_package(tmp_path: Path, script: str, args: list[str], expected: str) -> None:
    assert expected in _run(script, "--data-dir", str(tmp_path), *args)


def test_example_reads_the_dataset_it_is_given(tmp_path: Path) -> None:
    # square images only: the generated set would give wide (2.0) and tall buckets too
    root = tmp_path / "mine"
    write_tar(root / "s.tar", [(f"sq{i}", {"jpg": make_jpeg(40, 40, seed=i)}) for i in range(10)])
    prepare_dataset(root, split_ratio=(0, 1, 0), progress=False, num_workers=1, dataset_yaml="sample_type:\n  __module__: megatron.energon\n  __class__: ImageSample\nfield_map:\n  image: jpg\n")
    out = _run("aspect_ratio_grouping.py", "--dataset", str(root))
    assert "bucket  1.0: 1 batch(es) of 8" in out and "bucket  1.0: 1 batch(es) of 2" in out
    assert "2.0" not in out and "0.5" not in out


def test_elastic_resume_example_counts_the_given_dataset(tmp_path: Path) -> None:
    root = tmp_path / "texts"
    generate_text_dataset(root, num_shards=3, samples_per_shard=14, min_words=2, max_words=5, seed=9)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml="sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n")
    out = _run("elastic_resume.py", "--dataset", str(root))
    assert "distinct: 42 of 42" in out and "every sample of the epoch exactly once" in out
