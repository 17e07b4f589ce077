#!/usr/bin/env python
"""Runs Megatron Energon's own test suite against Energon and against megatron_energon_lite.

    python scripts/energon_suite.py --energon-repo /path/to/Megatron-Energon --out suite_out

1. Extracts Energon's ``tests/`` folder at a tag (default 7.4.0) from a git checkout or a bare
   mirror (``git archive``) into a scratch folder outside this project (a temporary folder unless
   ``--scratch`` names one), so no Energon code ever lands in the project tree.
2. Makes a second copy in which only ``megatron.energon`` is renamed to ``megatron_energon_lite``
   in the test files (``*.py``): the rename-only shim. Data files are left as they are, and so is
   data the tests write: ``__module__: megatron.energon`` in the YAML text of a dataset.yaml or
   metadataset is Energon's file format (which this package reads as it is), not an import.
3. Runs pytest on each test file on its own, in a subprocess, once for the original tests (against
   the installed Energon) and once for the renamed copy (against us), with ``--timeout``,
   ``-p no:cacheprovider -q -rA`` and an empty pytest config (this project's settings, such as
   warnings as errors, do not apply).
4. Prints a markdown table per file: tests passing on Energon, passing here, and the names of the
   tests that pass on Energon but not here. ``--out`` receives the raw logs
   (``logs/energon/<file>.log``, ``logs/ours/<file>.log``), the results (``results.json``) and the
   table (``report.md``).

``torchvision``: Energon's ``test_av_decoder.py`` imports ``torchvision.transforms`` at the top, so
where torchvision does not import (a CPU torch without a matching torchvision) the whole file
would fail to collect.  ``--torchvision-stub auto`` (the default) then writes a stub ``torchvision``
package into the scratch folder and puts it on ``PYTHONPATH`` for every run: any use of one of its
attributes raises ``unittest.SkipTest``, so only the tests that use torchvision are skipped
(``test_transforms.py`` whole, ``test_av_decoder``'s resize test).  ``always`` / ``never`` force it.

``--only FILE`` (repeatable) runs some files; ``--ours-only`` skips the Energon runs and reuses
their results from ``results.json`` in ``--out``.

``--switch`` runs our side differently: the original, unrenamed tests with the one-line switch
``megatron_energon_lite.as_energon`` loaded first (``pytest -p megatron_energon_lite.as_energon``),
so ``megatron.energon`` is this package and the behaviours where Energon and this package differ
on principle (unpickling dataset parts, importing dataset code) follow Energon, as they do for a
user of the switch.  The plain rename keeps this package's own rules (for example, pickle parts
need ``ENERGON_LITE_TRUST_PICKLE=1``).  Switch results are kept apart (``logs/switch/``, the
``switch`` entry of ``results.json``).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from megatron_energon_lite.energon import OURS, our_module

logger = logging.getLogger("energon_suite")

RESULTS = "results.json"
REPORT = "report.md"
SIDES = ("energon", "ours", "switch")
#: The pytest plugin our side loads with --switch: importing it is the switch.
SWITCH_PLUGIN = "megatron_energon_lite.as_energon"

# Every ``megatron.energon`` name (with its dotted tail) except the value of a YAML
# ``__module__:`` line (file format data).
_ENERGON_NAME = re.compile(r"(?<!__module__: )\bmegatron\.energon((?:\.\w+)*)")
# `-rA` summary lines: "PASSED tests/test_x.py::Class::test_y", "FAILED tests/... - reason",
# "ERROR tests/test_x.py - reason" (a collection error), "XPASS ...", "XFAIL ...".
_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL) (\S+)(?: - (.*))?$")
_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\]")
# pytest's last line: "3 passed, 1 failed, 2 warnings in 4.56s" (with or without "=" bars).
_SUMMARY = re.compile(r"^(?:\d+ [a-z]+(?:, )?)+ in [\d.]+s|^no tests ran in [\d.]+s")


TORCHVISION_STUB = '''"""Written by energon_suite.py: torchvision does not import here; using it skips the test."""
import unittest


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise unittest.SkipTest(f"torchvision is stubbed by energon_suite.py ({__name__}.{name} was used)")
'''


def torchvision_imports(python: str) -> bool:
    """Whether ``python`` can import ``torchvision.transforms``."""
    return subprocess.run([python, "-c", "import torchvision.transforms"], capture_output=True).returncode == 0


def write_torchvision_stub(dest: Path) -> Path:
    """Writes the stub ``torchvision`` package (with ``transforms``) under ``dest``; returns ``dest``,
    the folder to put on ``PYTHONPATH``."""
    for package in (dest / "torchvision", dest / "torchvision" / "transforms"):
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(TORCHVISION_STUB)
    return dest


def extract_tests(repo: Path, tag: str, dest: Path) -> None:
    """``tests/`` of ``repo`` at ``tag`` into ``dest/tests`` (works for checkouts and bare mirrors)."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", tag, "tests"], check=True, capture_output=True
    ).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


def _our_name(match: re.Match) -> str:
    name = match.group(0)
    return our_module(name) or OURS + match.group(1)


def make_renamed_copy(original: Path, dest: Path) -> int:
    """Copies ``original`` to ``dest`` and renames ``megatron.energon`` in the ``*.py`` files as the
    switch's table maps its modules (``megatron.energon.wrappers`` -> ``megatron_energon_lite.
    energon.wrappers``; a module we do not provide keeps its tail under our root); returns the
    number of replacements."""
    shutil.copytree(original, dest)
    count = 0
    for path in sorted(dest.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        renamed, n = _ENERGON_NAME.subn(_our_name, text)
        if n:
            path.write_text(renamed, encoding="utf-8")
            count += n
    return count


def parse_log(text: str) -> dict:
    """Passed, failed and errored test ids, the skip count and pytest's summary line."""
    passed, failed, errors = [], [], []
    skipped = 0
    summary = ""
    for line in text.splitlines():
        match = _OUTCOME.match(line)
        if match:
            outcome, test_id = match.group(1), match.group(2)
            if outcome in ("PASSED", "XPASS"):
                passed.append(test_id)
            elif outcome == "FAILED":
                failed.append(test_id)
            elif outcome == "ERROR":
                errors.append(test_id)
            continue
        match = _SKIPPED.match(line)
        if match:
            skipped += int(match.group(1))
            continue
        if _SUMMARY.match(line.strip("= ")):
            summary = line.strip("= ")
    return {"passed": sorted(set(passed)), "failed": sorted(set(failed)), "errors": sorted(set(errors)), "skipped": skipped, "summary": summary}


def run_file(
    python: str,
    root: Path,
    test_file: str,
    timeout: int,
    file_timeout: int,
    log: Path,
    plugins: tuple[str, ...] = (),
    pythonpath: tuple[Path, ...] = (),
) -> dict:
    """Runs pytest on one file with ``root`` as the working folder (loading ``plugins`` first, with
    ``pythonpath`` after ``root`` on ``PYTHONPATH``); returns the parsed outcome."""
    config = root / "suite_pytest.ini"
    if not config.exists():
        config.write_text("[pytest]\n")
    command = [
        python, "-m", "pytest", test_file,
        f"--timeout={timeout}", "-p", "no:cacheprovider", "-q", "-rA",
        "-c", str(config), "--rootdir", str(root),
        *(arg for plugin in plugins for arg in ("-p", plugin)),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), *map(str, pythonpath), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=file_timeout)
        output, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        partial = (exc.stdout or b"") + (exc.stderr or b"")
        output = (partial.decode(errors="replace") if isinstance(partial, bytes) else partial) + f"\n[killed after {file_timeout} s]\n"
        returncode = None
    seconds = round(time.monotonic() - started, 1)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ (cd {root} && {' '.join(command)})\n\n{output}", encoding="utf-8")
    result = parse_log(output)
    result.update(returncode=returncode, seconds=seconds)
    return result


def short_name(test_id: str) -> str:
    """``tests/test_x.py::TestX::test_y`` -> ``TestX::test_y``."""
    return test_id.split("::", 1)[1] if "::" in test_id else test_id


def table(results: dict, files: list[str], side: str = "ours") -> str:
    lines = [
        "| test file | passing on Energon | passing here | passing on Energon, failing here |",
        "|---|---:|---:|---|",
    ]
    totals = [0, 0]
    for name in files:
        theirs, ours = results["energon"].get(name), results[side].get(name)
        if theirs is None or ours is None:
            continue
        lost = [short_name(t) for t in theirs["passed"] if t not in set(ours["passed"])]
        note = ""
        if ours["returncode"] is None:
            note = " (timed out)"
        elif not ours["passed"] and not ours["failed"] and ours["errors"]:
            note = " (collection error)"
        lines.append(
            f"| {name} | {len(theirs['passed'])} | {len(ours['passed'])}{note} | {', '.join(lost) if lost else '-'} |"
        )
        totals[0] += len(theirs["passed"])
        totals[1] += len(ours["passed"])
    lines.append(f"| **total** | **{totals[0]}** | **{totals[1]}** | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--energon-repo", type=Path, required=True, help="git checkout or bare mirror of NVIDIA/Megatron-Energon")
    parser.add_argument("--out", type=Path, required=True, help="folder for logs, results.json and report.md")
    parser.add_argument("--tag", default="7.4.0", help="git tag or commit of Energon's tests (default 7.4.0)")
    parser.add_argument("--only", action="append", default=[], metavar="FILE", help="run only this test file (repeatable)")
    parser.add_argument("--ours-only", action="store_true", help="skip the Energon runs; reuse their results from --out")
    parser.add_argument("--timeout", type=int, default=300, help="pytest-timeout per test in seconds (default 300)")
    parser.add_argument("--file-timeout", type=int, default=3600, help="wall-clock limit per test file run (default 3600)")
    parser.add_argument("--python", default=sys.executable, help="interpreter with pytest, Energon and this package")
    parser.add_argument("--scratch", type=Path, help="where to extract the tests (default: a temporary folder, removed after)")
    parser.add_argument(
        "--switch", action="store_true", help=f"run our side as the original tests with the as_energon switch (pytest -p {SWITCH_PLUGIN})"
    )
    parser.add_argument(
        "--torchvision-stub",
        choices=("auto", "always", "never"),
        default="auto",
        help="put a stub torchvision on PYTHONPATH (auto: when torchvision does not import; default)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    previous = json.loads((out / RESULTS).read_text()) if (out / RESULTS).exists() else {}
    results = {"tag": args.tag, **{side: dict(previous.get(side, {})) for side in SIDES}}
    if previous.get("tag") not in (None, args.tag):
        logger.warning("results.json holds tag %s; this run is %s: stale Energon results are dropped", previous["tag"], args.tag)
        results.update({side: {} for side in SIDES})
    our_side = "switch" if args.switch else "ours"

    scratch = args.scratch.resolve() if args.scratch else Path(tempfile.mkdtemp(prefix="energon_suite_"))
    try:
        original, renamed = scratch / "energon", scratch / "ours"
        for folder in (original, renamed, scratch / "stubs"):
            shutil.rmtree(folder, ignore_errors=True)
        extract_tests(args.energon_repo, args.tag, original)
        replaced = make_renamed_copy(original, renamed)
        logger.info("extracted Energon %s tests to %s; %d renames in the shim copy", args.tag, scratch, replaced)
        stub = args.torchvision_stub == "always" or (args.torchvision_stub == "auto" and not torchvision_imports(args.python))
        pythonpath = (write_torchvision_stub(scratch / "stubs"),) if stub else ()
        if stub:
            logger.info("torchvision stubbed (%s): tests that use it are skipped", pythonpath[0])

        files = sorted(p.name for p in (original / "tests").glob("test_*.py"))
        if args.only:
            wanted = {Path(name).name for name in args.only}
            unknown = wanted - set(files)
            if unknown:
                parser.error(f"no such test file in Energon {args.tag}: {', '.join(sorted(unknown))} (there are: {', '.join(files)})")
            files = [name for name in files if name in wanted]
        if args.ours_only:
            missing = [name for name in files if name not in results["energon"]]
            if missing:
                parser.error(f"--ours-only needs Energon results in {out / RESULTS} for: {', '.join(missing)}; run once without it")

        runs = [] if args.ours_only else [("energon", original, ())]
        runs.append((our_side, original, (SWITCH_PLUGIN,)) if args.switch else ("ours", renamed, ()))
        for name in files:
            for side, root, plugins in runs:
                logger.info("%s: %s ...", side, name)
                log = out / "logs" / side / f"{name}.log"
                result = run_file(args.python, root, f"tests/{name}", args.timeout, args.file_timeout, log, plugins, pythonpath)
                results[side][name] = result
                logger.info("%s: %s: %s (%.0f s)", side, name, result["summary"] or f"exit {result['returncode']}", result["seconds"])
                (out / RESULTS).write_text(json.dumps(results, indent=1, sort_keys=True))
    finally:
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)

    ours = f"the as_energon switch ({SWITCH_PLUGIN})" if args.switch else "rename-only shim"
    report = f"Energon {args.tag} test suite: original tests on the installed Energon vs. {ours} on megatron_energon_lite"
    report += " (torchvision stubbed: tests that use it are skipped)\n\n" if stub else "\n\n"
    report += table(results, files, our_side)
    (out / REPORT).write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
