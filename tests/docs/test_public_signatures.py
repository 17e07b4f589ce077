"""What ``help()`` shows of the public API: no sentinel objects and no private parameters."""

import importlib
import inspect
import re

import pytest

import megatron_energon_lite as lite
from megatron_energon_lite.energon import ALIASES

# The entry points a user calls and the dataset factories (Energon's names) they construct.
PUBLIC = ["get_train_dataset", "get_val_dataset", "get_val_datasets", "get_loader", "get_savable_loader", "get_map_dataset", "WorkerConfig", "SampleDecoder", "Blender", "CaptioningWebdataset", "CrudeWebdataset", "DefaultDecoderWebdatasetFactory"]


@pytest.mark.parametrize("name", PUBLIC)
def test_signature_shows_no_sentinel_or_private_parameter(name):
    signature = inspect.signature(getattr(lite, name))
    assert "object at 0x" not in str(signature), f"{name}{signature}"
    private = [parameter for parameter in signature.parameters if parameter.startswith("_")]
    assert private == [], f"{name} has private parameters {private}"


def test_task_encoder_default_is_none():
    assert inspect.signature(lite.get_train_dataset).parameters["task_encoder"].default is None
    assert inspect.signature(lite.get_val_dataset).parameters["task_encoder"].default is None


def test_the_package_ships_its_type_marker():
    from importlib.resources import files

    assert files("megatron_energon_lite").joinpath("py.typed").is_file()


# Every module a user imports names from: the root package and each one ``megatron.energon...``
# resolves to under the switch (``megatron_energon_lite.energon``'s ALIASES).
PUBLIC_MODULES = sorted({"megatron_energon_lite", *ALIASES.values()})
PRIVATE_NAME = re.compile(r"(?<!\w)_[A-Za-z]\w*")  # a private name, not a dunder like __key__


def _public_callables():
    """(where, callable) for every exported function and class, its constructor and its public methods."""
    seen = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            value = getattr(module, name)
            members = [(name, value)]
            if inspect.isclass(value):
                members += [(f"{name}.{attr}", member) for attr, member in vars(value).items() if callable(member) and (attr == "__init__" or not attr.startswith("_"))]
            elif not callable(value):
                continue
            for where, member in members:
                if id(member) not in seen:
                    seen.add(id(member))
                    yield f"{module_name}.{where}", member


def signature_problems(function) -> list[str]:
    """What ``help(function)`` would show that a user should not see: a ``= None`` default on a
    type that does not admit None, a default that prints as ``<object object at 0x...>``, a
    private parameter, or a private type in an annotation."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # builtins without a signature
        return []
    problems = []
    for parameter in signature.parameters.values():
        annotation = "" if parameter.annotation is inspect.Parameter.empty else inspect.formatannotation(parameter.annotation).replace("'", "")
        if parameter.default is None and annotation and not re.search(r"\bNone\b|Optional|^(typing\.)?Any$", annotation):
            problems.append(f"{parameter.name}: {annotation} = None")
        if parameter.default is not inspect.Parameter.empty and "object at 0x" in repr(parameter.default):
            problems.append(f"{parameter.name} = {parameter.default!r}")
        if parameter.name.startswith("_") and not parameter.name.endswith("__"):
            problems.append(f"private parameter {parameter.name}")
        if PRIVATE_NAME.search(annotation):
            problems.append(f"{parameter.name}: private type in {annotation}")
    if signature.return_annotation is not inspect.Signature.empty and PRIVATE_NAME.search(inspect.formatannotation(signature.return_annotation).replace("'", "")):
        problems.append(f"returns a private type: {signature.return_annotation}")
    return problems


def test_every_public_signature_is_clean():
    found = {where: problems for where, member in _public_callables() if (problems := signature_problems(member))}
    assert found == {}


def test_the_signature_check_catches_each_kind():
    sentinel = object()

    class _Hidden:
        pass

    def bad(rank: int = None, token=sentinel, _cache=None, *, helper: _Hidden | None = None, key__: str = "") -> _Hidden:  # type: ignore[assignment]
        ...

    def good(rank: int | None = None, data: "Any" = None, *, name: "Optional[str]" = None, __key__: str = "") -> int:
        ...

    problems = signature_problems(bad)
    assert [problem.split(":")[0].split(" =")[0] for problem in problems] == ["rank", "token", "private parameter _cache", "helper", "returns a private type"]
    assert signature_problems(good) == []
