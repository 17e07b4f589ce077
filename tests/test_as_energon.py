"""The one-line switch ``import megatron_energon_lite.as_energon``.

Each test runs its scenario in a fresh interpreter of its own, so the switch never leaks into
the other tests of this process. The interpreters are started together when the first test of
this module asks for its result (importing the package costs seconds, most of it torch), and
each test then checks its own.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from typing import Iterator

import pytest


def _has_energon() -> bool:
    try:
        return importlib.util.find_spec("megatron.energon") is not None
    except ModuleNotFoundError:
        return False


# The real Energon is the oracle of two scenarios; without it they are skipped.
HAS_ENERGON = _has_energon()
needs_energon = pytest.mark.skipif(not HAS_ENERGON, reason="needs the real megatron-energon installed")

ALIASES = """
    import sys
    import megatron_energon_lite.as_energon
    import megatron.energon
    import megatron.energon.source_info
    import megatron.energon.epathlib.epath as aliased_epath
    import megatron_energon_lite, megatron_energon_lite.source_info, megatron_energon_lite.energon.epathlib.epath

    assert megatron.energon is megatron_energon_lite
    assert megatron.energon.source_info is megatron_energon_lite.source_info
    assert aliased_epath is megatron_energon_lite.energon.epathlib.epath
    # Energon's API lives in our energon package: the alias table names it.
    import megatron.energon.wrappers, megatron_energon_lite.energon.wrappers
    assert megatron.energon.wrappers is megatron_energon_lite.energon.wrappers
    assert sys.modules["megatron.energon.epathlib"] is sys.modules["megatron_energon_lite.energon.epathlib"]
    # The module keeps its own identity: its name and spec still agree.
    assert megatron.energon.source_info.__name__ == "megatron_energon_lite.source_info"
    assert megatron.energon.source_info.__spec__.name == "megatron_energon_lite.source_info"
    # The switch also turns on Energon's behaviour where the two differ on principle.
    from megatron.energon import energon_mode
    assert energon_mode is megatron_energon_lite.energon_mode and energon_mode.enabled()
    print("ok")
"""

FROM_IMPORT = """
    import megatron_energon_lite.as_energon
    from megatron.energon import Sample, TextSample, WorkerConfig
    from megatron.energon.edataclass import edataclass
    from megatron.energon.epathlib import EPath
    from megatron.energon.errors import reraise_exception
    import megatron_energon_lite as lite
    from megatron_energon_lite.energon.epathlib import EPath as OurEPath

    assert Sample is lite.Sample and WorkerConfig is lite.WorkerConfig and EPath is OurEPath
    assert reraise_exception is lite.errors.reraise_exception

    @edataclass
    class MySample(Sample):
        text: str

    assert isinstance(MySample(__key__="k", text="t"), lite.Sample)
    assert isinstance(lite.TextSample(__key__="k", text="t"), TextSample)
"""

MISSING_MODULE = """
    import megatron_energon_lite.as_energon
    try:
        import megatron.energon.no_such_module.inner
    except ModuleNotFoundError as exc:
        text = str(exc)
        assert "megatron.energon.no_such_module" in text, text
        assert "does not implement this part of Energon" in text, text
        assert exc.name == "megatron.energon.no_such_module", exc.name
    else:
        raise SystemExit("no error")
    try:  # a module of ours that Energon does not have is not Energon's
        import megatron.energon.samples
    except ModuleNotFoundError as exc:
        assert "megatron.energon.samples" in str(exc), str(exc)
    else:
        raise SystemExit("no error")
    try:
        from megatron.energon import no_such_name
    except ImportError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise SystemExit("no error")
"""

FORKED_CHILD = """
    import multiprocessing
    import megatron_energon_lite.as_energon

    def child(queue):
        import megatron.energon
        import megatron.energon.source_info
        import megatron_energon_lite
        from megatron_energon_lite import energon_mode
        queue.put((megatron.energon is megatron_energon_lite, energon_mode.enabled()))

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue,))
        proc.start()
        result = queue.get(timeout=60)
        proc.join(60)
        assert proc.exitcode == 0, proc.exitcode
        assert result == (True, True), result
"""

REAL_ENERGON_FIRST = """
    import logging, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
    import megatron.energon as real
    import megatron.energon.epathlib
    assert real.__name__ == "megatron.energon"
    import megatron_energon_lite.as_energon
    import megatron_energon_lite
    import megatron
    # Replaced at once, before any new import: the entry and the parent's attribute.
    assert sys.modules["megatron.energon"] is megatron_energon_lite and megatron.energon is megatron_energon_lite
    import megatron.energon
    import megatron.energon.epathlib
    from megatron.energon.epathlib import EPath
    assert megatron.energon is megatron_energon_lite
    assert sys.modules["megatron.energon"] is megatron_energon_lite
    assert megatron.energon.epathlib is megatron_energon_lite.energon.epathlib
    assert EPath is megatron_energon_lite.energon.epathlib.EPath
    import megatron_energon_lite.as_energon as again  # a second import does nothing more
    print("done")
"""

UNINSTALL_WITH_ENERGON = """
    import sys
    import megatron.energon as real
    import megatron_energon_lite.as_energon as switch
    import megatron.energon
    import megatron.energon.source_info
    from megatron_energon_lite import energon_mode
    assert megatron.energon.__name__ == "megatron_energon_lite"

    switch.uninstall()
    assert not energon_mode.enabled()
    assert not any(type(f).__module__ == "megatron_energon_lite.as_energon" for f in sys.meta_path)
    # Our alias is gone: the name is the real Energon's module again, or nothing.
    assert getattr(sys.modules.get("megatron.energon.source_info"), "__name__", "megatron.energon.source_info") == "megatron.energon.source_info"
    import megatron.energon
    assert megatron.energon is real  # the real Energon that was there before comes back
    assert sys.modules["megatron.energon"] is real

    import megatron_energon_lite.as_energon  # importing again switches again
    import megatron.energon
    assert megatron.energon.__name__ == "megatron_energon_lite" and energon_mode.enabled()
"""

UNINSTALL_WITHOUT_ENERGON = """
    import sys
    import megatron_energon_lite.as_energon as switch
    import megatron.energon.source_info
    switch.uninstall()
    assert [n for n in sys.modules if n.startswith("megatron.energon")] == []
    assert "megatron_energon_lite.source_info" in sys.modules  # our own modules stay loaded
"""

PLACEHOLDER_PARENT = """
    import sys
    from importlib.machinery import PathFinder

    # Hide every installed `megatron` package (megatron-core, Energon) from the path finder.
    original = PathFinder.find_spec.__func__
    def hiding(cls, name, path=None, target=None):
        return None if name == "megatron" else original(cls, name, path, target)
    PathFinder.find_spec = classmethod(hiding)

    try:
        import megatron
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("megatron was not hidden")

    import megatron_energon_lite.as_energon as switch
    import megatron.energon
    import megatron_energon_lite
    assert megatron.energon is megatron_energon_lite
    assert list(megatron.__path__) == []
    switch.uninstall()
    assert "megatron" not in sys.modules
"""

# A fake megatron-core (a regular `megatron` package with `core`) first on the path; the fixture
# below writes it and passes its folder in FAKE_CORE.
MEGATRON_CORE = """
    import os, sys
    sys.path.insert(0, os.environ["FAKE_CORE"])
    import megatron_energon_lite.as_energon
    import megatron.core
    import megatron.energon
    import megatron_energon_lite
    assert megatron.core.VALUE == 42
    assert megatron.__file__.startswith(os.environ["FAKE_CORE"])
    assert megatron.energon is megatron_energon_lite
"""

# Real clients call importlib.metadata.version("megatron-energon") at import, unguarded.
VERSION_PROBE = """
    import importlib.metadata as md
    import os
    from packaging.version import Version

    try:
        before = md.version("megatron-energon")  # the real Energon, where one is installed
    except md.PackageNotFoundError:
        before = None
    ours = md.version("megatron-energon-lite")
    import megatron_energon_lite.as_energon as switch
    import megatron.energon
    from megatron_energon_lite._version import ENERGON_VERSION

    probed = md.version("megatron-energon")
    assert probed == megatron.energon.__version__, (probed, megatron.energon.__version__)
    assert Version(probed).public == ENERGON_VERSION and ours in Version(probed).local, probed
    assert probed >= "7.0.0" and Version(probed) >= Version("7.0.0")  # the clients' two ways
    assert md.metadata("megatron_energon")["Name"] == "megatron-energon"
    assert os.environ[switch.ENV_VAR] == "1"

    switch.uninstall()
    assert switch.ENV_VAR not in os.environ
    import megatron_energon_lite
    assert megatron_energon_lite.__version__ == ours
    if before is None:
        try:
            md.version("megatron-energon")
        except md.PackageNotFoundError:
            pass
        else:
            raise SystemExit("a megatron-energon distribution outlived the switch")
    else:
        assert md.version("megatron-energon") == before  # the real one answers again
    print("ok")
"""

SAYS_SO_ONCE = """
import logging
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)
logging.getLogger("megatron_energon_lite").addHandler(Keep())
logging.getLogger("megatron_energon_lite").setLevel(logging.INFO)
import megatron_energon_lite.as_energon as switch
switch.install()  # again: nothing more to say
import megatron.energon
said = [r for r in records if r.levelno == logging.INFO and "megatron.energon now resolves to megatron_energon_lite" in r.getMessage()]
assert len(said) == 1, [r.getMessage() for r in records]
assert "uninstall()" in said[0].getMessage() and switch.ENV_VAR in said[0].getMessage()
print("ok")
"""

CASES = {
    "says_so_once": SAYS_SO_ONCE,
    "version_probe": VERSION_PROBE,
    "aliases": ALIASES,
    "from_import": FROM_IMPORT,
    "missing_module": MISSING_MODULE,
    "forked_child": FORKED_CHILD,
    "real_energon_first": REAL_ENERGON_FIRST,
    "uninstall_with_energon": UNINSTALL_WITH_ENERGON,
    "uninstall_without_energon": UNINSTALL_WITHOUT_ENERGON,
    "placeholder_parent": PLACEHOLDER_PARENT,
    "megatron_core": MEGATRON_CORE,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, subprocess.Popen]]:
    fake_core = tmp_path_factory.mktemp("fake_core")
    (fake_core / "megatron" / "core").mkdir(parents=True)
    (fake_core / "megatron" / "__init__.py").write_text("")
    (fake_core / "megatron" / "core" / "__init__.py").write_text("VALUE = 42\n")
    env = {**os.environ, "FAKE_CORE": str(fake_core)}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for name, code in CASES.items()
        if HAS_ENERGON or name not in ("real_energon_first", "uninstall_with_energon")
    }
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def finish(runs: dict[str, subprocess.Popen], name: str) -> str:
    """Waits for scenario ``name``; fails with its output unless it exited cleanly; returns its stdout."""
    stdout, stderr = runs[name].communicate(timeout=300)
    assert runs[name].returncode == 0, f"scenario {name} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    return stdout


def test_megatron_energon_is_our_package_and_its_modules(runs) -> None:
    assert finish(runs, "aliases").strip() == "ok"


def test_from_import_gives_the_same_objects_and_isinstance_agrees(runs) -> None:
    finish(runs, "from_import")


def test_a_missing_energon_module_names_both_paths(runs) -> None:
    finish(runs, "missing_module")


def test_a_forked_child_sees_the_switch(runs) -> None:
    finish(runs, "forked_child")


@needs_energon
def test_the_switch_wins_over_an_energon_imported_before_and_warns_once(runs) -> None:
    out = finish(runs, "real_energon_first")
    warnings = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "imported before megatron_energon_lite.as_energon" in warnings[0], out
    assert out.strip().endswith("done")


@needs_energon
def test_uninstall_restores_the_energon_imported_before(runs) -> None:
    finish(runs, "uninstall_with_energon")


def test_uninstall_leaves_no_alias(runs) -> None:
    finish(runs, "uninstall_without_energon")


def test_a_placeholder_megatron_parent_when_none_is_installed(runs) -> None:
    finish(runs, "placeholder_parent")


def test_megatron_core_style_siblings_still_import(runs) -> None:
    finish(runs, "megatron_core")


def test_the_switch_says_once_at_info_that_it_took_effect(runs) -> None:
    assert finish(runs, "says_so_once").strip() == "ok"


def test_the_version_probe_answers_with_energons_version_marked_as_ours(runs) -> None:
    assert finish(runs, "version_probe").strip() == "ok"
