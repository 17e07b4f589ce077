"""Finds the code blocks of README.md and docs/ and runs one page's blocks (the driver behind
tests/docs/test_code_blocks.py; ``python run_doc_blocks.py PAGE`` in a folder holding the
fixture data).

Rules a page's author follows:
- ```` ```python ```` and ```` ```sh ```` blocks run, in page order, in one folder; the Python
  blocks of a page share one namespace (as a doctest file does), so a later block may use what an
  earlier one defined. Shell blocks run with bash (``set -euo pipefail``).
- A ```` ```yaml ```` block whose first line is a comment naming a file (``# blend.yaml ...``) is
  written to that file before the blocks after it run; other blocks (yaml, output, trees) are text.
- A block that cannot run on the generated data carries ``<!-- doc-test: skip (why) -->`` on the
  line before it.
- ``<!-- doc-test: setup`` ... ``-->`` holds Python that runs (unseen by readers) in the page's
  namespace before the blocks after it, e.g. to make the ``sample`` a fragment talks about.
- ``<!-- doc-test: torchrun N`` ... ``-->`` right before a Python block runs that block on N ranks
  (torchrun, gloo) instead of in the page's namespace: the comment is the script, with the line
  ``{block}`` standing for the block (so it sets up what the block uses and checks what it did).
- ``<!-- doc-test: needs MODULE, ... (why) -->`` anywhere on a page: the page runs only where
  those modules import (e.g. a local S3 server, a dev dependency); elsewhere it is reported as
  skipped, with the reason.
- The folder (``make_fixture``, or ``python run_doc_blocks.py --fixture FOLDER``) holds
  ``my_data/`` (10 shards x 4 unprepared jpg/txt/json/cls samples), ``coco/`` (the same, prepared
  as CaptioningSample, split 8,1,1) and ``more_captions/`` (another such dataset). It needs only
  the installed package, so the wheel's smoke test (scripts/smoke_wheel.sh) runs the pages too."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

SKIP = re.compile(r"^<!-- doc-test: skip \((?P<why>[^)]+)\) -->$")
NEEDS = re.compile(r"^<!-- doc-test: needs (?P<modules>[\w., ]+) \((?P<why>[^)]+)\) -->$", re.M)
RUNNABLE = ("python", "sh")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    language: str  # "setup" for a hidden setup comment
    text: str
    skip: str | None  # the reason, for a skipped block
    torchrun: tuple[int, str] | None = None  # ranks, and the script around the block

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path, name: str) -> list[Block]:
    lines = path.read_text().split("\n")
    found, index, torchrun = [], 0, None
    while index < len(lines):
        if lines[index].strip() == "<!-- doc-test: setup":
            end = lines.index("-->", index)
            found.append(Block(name, index + 1, "setup", "\n".join(lines[index + 1 : end]), None))
            index = end + 1
            continue
        ranks = re.match(r"^<!-- doc-test: torchrun (\d+)$", lines[index].strip())
        if ranks:
            end = lines.index("-->", index)
            torchrun = (int(ranks.group(1)), "\n".join(lines[index + 1 : end]))
            index = end + 1
            continue
        fence = re.match(r"^```(\w*)\s*$", lines[index])
        if not fence:
            index += 1
            continue
        end = index + 1
        while not lines[end].startswith("```"):
            end += 1
        before = next((line for line in reversed(lines[:index]) if line.strip()), "")
        skip = SKIP.match(before.strip())
        found.append(Block(name, index + 1, fence.group(1), "\n".join(lines[index + 1 : end]), skip.group("why") if skip else None, torchrun))
        torchrun = None
        index = end + 1
    return found


def make_fixture(folder: Path) -> None:
    """The data the pages' blocks use (see the module docstring), made with the installed package."""
    from megatron_energon_lite.synthetic import generate_captioning_dataset

    for name, seed in (("my_data", 0), ("coco", 0), ("more_captions", 1)):
        generate_captioning_dataset(folder / name, num_shards=10, samples_per_shard=4, seed=seed, shard_pattern="data-{:04d}.tar")
    for name in ("coco", "more_captions"):
        prepare = [sys.executable, "-m", "megatron_energon_lite.cli.main", "prepare", str(folder / name), "--non-interactive", "--split-ratio", "8,1,1",
                   "--sample-type", "CaptioningSample", "--field-map", json.dumps({"image": "jpg", "caption": "txt"})]
        subprocess.run(prepare, check=True, capture_output=True)


def missing_needs(path: Path) -> str | None:
    """Why the page cannot run here (a module it needs does not import), else None."""
    for need in NEEDS.finditer(path.read_text()):
        missing = [module.strip() for module in need.group("modules").split(",") if importlib.util.find_spec(module.strip()) is None]
        if missing:
            return f"needs {', '.join(missing)}: {need.group('why')}"
    return None


def run_page(path: Path, name: str) -> int:
    """Runs the page's blocks in the current folder; returns how many ran."""
    # A real module, as a reader's script is: dataclasses and pickle look classes up in sys.modules.
    page = types.ModuleType("__doc_page__")
    sys.modules[page.__name__] = page
    namespace = page.__dict__
    ran = 0
    for block in blocks(path, name):
        if block.skip:
            continue
        if block.language == "yaml":
            target = re.match(r"^# (\S+\.ya?ml)\b", block.text)
            if target:
                Path(target.group(1)).write_text(block.text + "\n")
            continue
        if block.language == "setup":
            exec(compile(block.text, block.where, "exec", dont_inherit=True), namespace)
            continue
        if block.language not in RUNNABLE:
            continue
        print(f"--- {block.where} ({block.language}{f', {block.torchrun[0]} ranks' if block.torchrun else ''})", flush=True)
        if block.torchrun:
            run_on_ranks(block)
        elif block.language == "python":
            exec(compile(block.text, block.where, "exec", dont_inherit=True), namespace)
        else:
            result = subprocess.run(["bash", "-c", "set -euo pipefail\n" + block.text])
            if result.returncode:
                sys.exit(f"{block.where}: the shell block exited with status {result.returncode}")
        ran += 1
    return ran


def run_on_ranks(block: Block) -> None:
    ranks, script = block.torchrun
    if "{block}" not in script.split("\n"):
        sys.exit(f"{block.where}: the torchrun comment has no line {{block}}")
    with tempfile.NamedTemporaryFile("w", suffix=".py", dir=".", delete=False) as file:
        file.write(script.replace("{block}", block.text))
    try:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", file.name]
        result = subprocess.run(command)
    finally:
        Path(file.name).unlink()
    if result.returncode:
        sys.exit(f"{block.where}: the block on {ranks} ranks exited with status {result.returncode}")


if __name__ == "__main__":
    if sys.argv[1] == "--fixture":
        make_fixture(Path(sys.argv[2]))
    elif why := missing_needs(Path(sys.argv[1])):
        print(f"skipped {sys.argv[2]}: {why}")
    else:
        print(f"ran {run_page(Path(sys.argv[1]), sys.argv[2])} blocks")
