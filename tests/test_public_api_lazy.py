"""The package's public names are resolved lazily: each is the object of its defining module,
``from megatron_energon_lite import X`` works for all of them, and a bare import stays light."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import megatron_energon_lite as lite


def _fresh(code: str) -> object:
    """Runs ``code`` in a new interpreter; it prints one JSON value, returned here."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _static_imports() -> dict[str, str]:
    """Name -> module (relative, ``.cache``) of every import in ``__init__.py``, the
    ``if TYPE_CHECKING:`` block included: what type checkers and IDEs see."""
    tree = ast.parse(Path(lite.__file__).read_text())
    return {
        alias.asname or alias.name: "." * node.level + (node.module or "")
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level > 0
        for alias in node.names
    }


def test_every_public_name_is_the_object_of_its_defining_module() -> None:
    static = _static_imports()
    assert set(static) == set(lite.__all__)  # the static view names exactly the public names
    for name in lite.__all__:
        defining = importlib.import_module(static[name], lite.__name__)
        assert getattr(lite, name) is getattr(defining, name), name
        if name in lite._LAZY:
            assert lite._LAZY[name] == static[name], name


def test_from_import_works_for_every_name() -> None:
    for name in lite.__all__:
        namespace: dict[str, object] = {}
        exec(f"from megatron_energon_lite import {name}", namespace)
        assert namespace[name] is getattr(lite, name)


def test_dir_lists_every_public_name() -> None:
    assert set(lite.__all__) <= set(dir(lite))


def test_unknown_names_raise_attribute_error() -> None:
    assert not hasattr(lite, "no_such_name")
    with pytest.raises(AttributeError, match="no_such_name"):
        lite.no_such_name  # noqa: B018


def test_submodules_an_eager_init_loaded_are_still_attributes() -> None:
    for name, path in lite._SUBMODULES.items():
        module = getattr(lite, name)
        assert isinstance(module, types.ModuleType) and module.__name__ == f"megatron_energon_lite{path}"


def test_an_attribute_look_up_never_switches_megatron_energon() -> None:
    found = _fresh(
        "import json, sys, megatron_energon_lite as lite; "
        "print(json.dumps([hasattr(lite, 'as_energon'), 'megatron_energon_lite.as_energon' in sys.modules]))"
    )
    assert found == [False, False]


def test_edataclass_stays_the_decorator() -> None:
    import megatron_energon_lite.edataclass  # noqa: F401  (binds the submodule's name on the package)

    assert callable(lite.edataclass) and not isinstance(lite.edataclass, types.ModuleType)
    from megatron_energon_lite import edataclass

    assert edataclass is sys.modules["megatron_energon_lite.edataclass"].edataclass


def test_a_bare_import_loads_no_heavy_module() -> None:
    loaded = _fresh(
        "import json, sys, megatron_energon_lite; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('megatron_energon_lite', 'torch', 'av', 'numpy'))))"
    )
    assert loaded == ["megatron_energon_lite", "megatron_energon_lite._version", "megatron_energon_lite.edataclass"]


def test_star_import_and_energon_alias_in_a_fresh_interpreter() -> None:
    names = _fresh(
        "import json\n"
        "import megatron_energon_lite.as_energon\n"
        "from megatron.energon import get_train_dataset, TextSample, WorkerConfig\n"
        "import megatron_energon_lite.loader as loader, megatron_energon_lite.samples as samples\n"
        "assert get_train_dataset is loader.get_train_dataset and TextSample is samples.TextSample\n"
        "namespace = {}\n"
        "exec('from megatron.energon import *', namespace)\n"
        "print(json.dumps(sorted(n for n in namespace if n != '__builtins__')))"
    )
    assert names == sorted(lite.__all__)
