"""Run by scripts/smoke_wheel.sh inside a fresh venv holding only torch and the installed wheel:
what a user's first minutes do (import, the CLI, prepare and load a dataset, save and restore, the
one-line switch from Energon), then README's and every docs page's code blocks (through
tests/docs/run_doc_blocks.py, on data the installed package generates).

Usage: python smoke_wheel.py WORK_FOLDER CHECKOUT"""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def check(condition: bool, what: str) -> None:
    if not condition:
        sys.exit(f"smoke: FAILED: {what}")


def write_shards(root: Path, shards: int = 3, per_shard: int = 8) -> None:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for shard in range(shards):
        with tarfile.open(root / f"shard-{shard:03d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for index in range(per_shard):
                key = f"{shard:03d}{index:04d}"
                jpeg = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8)).save(jpeg, format="JPEG")
                for ext, data in (("jpg", jpeg.getvalue()), ("txt", f"caption {key}".encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def run_every_page(checkout: Path, folder: Path) -> None:
    """README's and every docs page's code blocks (tests/docs/run_doc_blocks.py), each page in its
    own copy of the driver's generated data, with this venv's energon-lite first on PATH. A page
    that needs a dev-only module (its ``doc-test: needs`` line) is reported as skipped."""
    driver = str(checkout / "tests/docs/run_doc_blocks.py")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([sys.executable, driver, "--fixture", str(folder / "fixture")], env=env, check=True)
    pages = [checkout / "README.md", *sorted((checkout / "docs").rglob("*.md"))]
    for page in pages:
        name = str(page.relative_to(checkout))
        work = folder / name.replace("/", "_")
        shutil.copytree(folder / "fixture", work)
        result = subprocess.run([sys.executable, driver, str(page), name], cwd=work, env=env, capture_output=True, text=True)
        check(result.returncode == 0, f"the code blocks of {name}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        print(f"smoke: {name}: {result.stdout.strip().splitlines()[-1]}")


def main() -> None:
    work, checkout = Path(sys.argv[1]), Path(sys.argv[2])
    data = work / "data"
    cli = str(Path(sys.executable).with_name("energon-lite"))
    import megatron_energon_lite as lite

    check(Path(lite.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), f"imported from the venv, not {lite.__file__}")
    check((Path(lite.__file__).parent / "py.typed").is_file(), "py.typed is installed")
    for absent in ("energon_lite_dev", "megatron"):
        check(subprocess.run([sys.executable, "-c", f"import {absent}"], capture_output=True).returncode != 0, f"{absent} is not installed")
    version = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True).stdout
    check(lite.__version__ in version, f"energon-lite --version prints {lite.__version__}: {version!r}")
    check("object at 0x" not in lite.get_train_dataset.__doc__ + str(__import__("inspect").signature(lite.get_train_dataset)), "clean signature")

    write_shards(data)
    subprocess.run([cli, "prepare", str(data), "--non-interactive", "--split-ratio", "1,0,0", "--sample-type", "CaptioningSample",
                    "--field-map", json.dumps({"image": "jpg", "caption": "txt"})], check=True, capture_output=True)
    subprocess.run([cli, "lint", str(data)], check=True, capture_output=True)

    def loader():
        config = lite.WorkerConfig(rank=0, world_size=1, num_workers=1)
        return lite.get_savable_loader(lite.get_train_dataset(str(data), batch_size=4, shuffle_buffer_size=8, max_samples_per_sequence=4, worker_config=config))

    first = loader()
    batches = iter(first)
    for _ in range(3):
        batch = next(batches)
    check(tuple(batch.image.shape) == (4, 3, 32, 48), f"batch image shape {tuple(batch.image.shape)}")
    state = json.loads(json.dumps(first.save_state_rank()))
    expected = next(batches).__key__
    second = loader()
    second.restore_state_rank(state)
    check(next(iter(second)).__key__ == expected, "the restored loader gives the next batch")

    switch = "import megatron_energon_lite.as_energon; import megatron.energon as e; assert e.get_train_dataset.__module__.startswith('megatron_energon_lite'), e.get_train_dataset.__module__"
    subprocess.run([sys.executable, "-c", switch], check=True)
    print(f"smoke: megatron-energon-lite {lite.__version__}: import, CLI, prepare, lint, load, save/restore and the switch work")
    run_every_page(checkout, work / "pages")
    print("smoke: README's and the docs' code blocks ran from the installed wheel")


if __name__ == "__main__":
    main()
