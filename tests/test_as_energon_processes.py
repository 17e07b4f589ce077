"""The ``as_energon`` switch in every process of a program: spawned and forkserver children start
a fresh interpreter, and the startup hook the package installs into site-packages
(``megatron_energon_lite_as_energon.pth``) switches them where ``ENERGON_LITE_AS_ENERGON`` is set.

The programs run under a throwaway virtual environment on top of this one whose site-packages
holds the hook as an install puts it there (this checkout is not reinstalled for the test).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import generate_text_dataset

from megatron_energon_lite.format.prepare import prepare_dataset

REPO = Path(__file__).resolve().parents[1]
HOOK = "megatron_energon_lite_as_energon.pth"
ENV_VAR = "ENERGON_LITE_AS_ENERGON"  # documented; importing as_energon here would switch this process
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


@pytest.fixture(scope="module")
def hooked_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python whose site-packages holds the startup hook and reaches this environment's packages."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    purelib = Path(subprocess.run([root / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True, capture_output=True, text=True).stdout.strip())
    # Sorted before the hook: this environment's site-packages (and its .pth files) come first.
    (purelib / "_outer_site.pth").write_text("".join(f"import site; site.addsitedir({path!r})\n" for path in site.getsitepackages()))
    (purelib / HOOK).write_bytes((REPO / HOOK).read_bytes())
    return str(root / "bin" / "python")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ds") / "text"
    generate_text_dataset(path, num_shards=2, samples_per_shard=6, max_words=8, seed=3, key_pattern="s{shard:02d}_{index:03d}")
    prepare_dataset(path, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return path


def run(python: str, tmp_path: Path, code: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Runs ``code`` as the main module of a program (a file: spawned children re-import it)."""
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(code))
    done = subprocess.run([python, str(script), *args], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1]


# The task encoder is defined in the main module, so each worker unpickles it by re-importing the
# module, whose first lines import megatron.energon: without the switch in the worker, it dies.
LOADER_PROGRAM = """
    import concurrent.futures
    import importlib.metadata
    import json
    import multiprocessing
    import sys

    import megatron_energon_lite.as_energon  # noqa: F401
    import megatron.energon
    from megatron.energon import DefaultTaskEncoder, WorkerConfig, get_val_dataset


    class Upper(DefaultTaskEncoder):
        def encode_sample(self, sample):
            sample.text = sample.text.upper()
            return sample


    def versions():
        import megatron.energon
        return megatron.energon.__version__, importlib.metadata.version("megatron-energon")


    if __name__ == "__main__":
        import torch  # here: the pool's child need not load it

        path, method = sys.argv[1:]
        dataset = get_val_dataset(path, split_part="train", batch_size=None, task_encoder=Upper(), worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1))
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context=method)
        samples = [(sample.__key__, sample.text) for sample in loader]
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method)) as pool:
            child = pool.submit(versions).result()
        print(json.dumps({"samples": samples, "child": child, "parent": megatron.energon.__version__}))
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_dataloader_workers_and_pools_of_any_start_method_see_the_switch(hooked_python: str, dataset: Path, tmp_path: Path, method: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}  # the program's own import sets it
    out = json.loads(run(hooked_python, tmp_path, LOADER_PROGRAM, str(dataset), method, env=env))
    keys = sorted(key for key, _ in out["samples"])
    assert keys == sorted(f"s{shard:02d}_{index:03d}" for shard in range(2) for index in range(6))
    assert all(text == text.upper() for _, text in out["samples"])
    assert out["child"] == [out["parent"], out["parent"]]


NO_SWITCH_PROGRAM = """
    import json
    import multiprocessing
    import os
    import sys


    def report(queue):
        queue.put({"ours": sorted(name for name in sys.modules if name.startswith("megatron_energon_lite")), "env": os.environ.get(sys.argv[1] if len(sys.argv) > 1 else "", None)})


    if __name__ == "__main__":
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=report, args=(queue,))
        child.start()
        print(json.dumps(queue.get(timeout=120)))
        child.join()
"""


def test_a_child_of_a_program_without_the_switch_is_not_switched(hooked_python: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    out = json.loads(run(hooked_python, tmp_path, NO_SWITCH_PROGRAM, ENV_VAR, env=env))
    assert out == {"ours": [], "env": None}


def test_the_variable_alone_switches_a_program(hooked_python: str, tmp_path: Path) -> None:
    """``ENERGON_LITE_AS_ENERGON=1 python train.py``: the hook switches a program that does not
    import the switch itself (and ``=0`` does not)."""
    code = "import json, megatron.energon, megatron_energon_lite\nprint(json.dumps(megatron.energon is megatron_energon_lite))\n"
    assert run(hooked_python, tmp_path, code, env={**os.environ, ENV_VAR: "1"}) == "true"
    code = "import json, sys\nprint(json.dumps('megatron_energon_lite.as_energon' in sys.modules))\n"
    assert run(hooked_python, tmp_path, code, env={**os.environ, ENV_VAR: "0"}) == "false"


BUILD = """
import json
from setuptools import build_meta
print(json.dumps([build_meta.build_wheel("out"), build_meta.build_editable("out")]))
"""


def test_wheels_and_editable_installs_put_the_hook_into_site_packages(tmp_path: Path) -> None:
    """Both wheels pip installs from this project, the regular one and the editable one that
    scripts/setup.sh makes, carry the hook at their top level (= site-packages)."""
    pytest.importorskip("setuptools")
    source = tmp_path / "src"  # a copy: building writes build/ and *.egg-info next to the sources
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", HOOK):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "megatron_energon_lite", source / "megatron_energon_lite", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-c", BUILD], cwd=source, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    for wheel in json.loads(done.stdout.strip().splitlines()[-1]):
        with zipfile.ZipFile(source / "out" / wheel) as archive:
            assert archive.read(HOOK) == (REPO / HOOK).read_bytes(), wheel


def test_the_documented_variable_is_the_one_the_switch_sets() -> None:
    code = "import os, megatron_energon_lite.as_energon as s; print(s.ENV_VAR, os.environ[s.ENV_VAR])"
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=True)
    assert done.stdout.split() == [ENV_VAR, "1"]
