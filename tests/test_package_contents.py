"""The installed package carries no test support: the local S3 server, the resume checker and test
fixtures live in the separate dev distribution (``dev/``, package ``energon_lite_dev``), which the
library never imports and the ``megatron-energon-lite`` wheel does not contain.  Synthetic datasets
are the library's (``megatron_energon_lite.synthetic``): the examples make one when no dataset is
given."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

import megatron_energon_lite

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIR = Path(megatron_energon_lite.__file__).resolve().parent
MOVED = ("testing", "s3server", "resume")
DEV_PACKAGE = "energon_lite_dev"


def _find_config(pyproject: Path) -> dict:
    tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")
    return tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"]["find"]


def _shipped_packages() -> list[str]:
    """The packages setuptools puts in the wheel, found the way pyproject.toml configures it."""
    setuptools = pytest.importorskip("setuptools")
    find = _find_config(REPO / "pyproject.toml")
    finder = setuptools.find_namespace_packages if find.get("namespaces", True) else setuptools.find_packages
    return [
        name
        for where in find.get("where", ["."])
        for name in finder(str(REPO / where), include=find.get("include", ["*"]), exclude=find.get("exclude", []))
    ]


@pytest.mark.parametrize("name", MOVED)
def test_test_support_is_not_a_submodule(name: str) -> None:
    assert importlib.util.find_spec(f"megatron_energon_lite.{name}") is None
    assert not (PACKAGE_DIR / f"{name}.py").exists()
    assert not (PACKAGE_DIR / name).exists()


def test_the_wheel_would_ship_only_the_library() -> None:
    packages = _shipped_packages()
    assert "megatron_energon_lite" in packages
    assert all(p == "megatron_energon_lite" or p.startswith("megatron_energon_lite.") for p in packages), packages
    assert not [p for p in packages if "." in p and p.split(".")[1] in MOVED], packages
    assert DEV_PACKAGE not in packages


def test_the_dev_package_is_separate_and_importable() -> None:
    spec = importlib.util.find_spec(DEV_PACKAGE)
    assert spec is not None and spec.origin is not None, "run scripts/setup.sh (pip install --no-deps -e ./dev)"
    origin = Path(spec.origin).resolve()
    assert PACKAGE_DIR not in origin.parents
    dev_find = _find_config(REPO / "dev" / "pyproject.toml")
    assert dev_find["include"] == [f"{DEV_PACKAGE}*"]
    for name in ("synthetic", "s3server"):
        assert importlib.util.find_spec(f"{DEV_PACKAGE}.{name}") is not None


def test_the_library_never_imports_the_dev_package() -> None:
    offenders = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == DEV_PACKAGE]
    assert not offenders
