"""The import graph's shape: one acyclic core with Energon's API as a layer of adapters on top
(docs: /work/shared/DESIGN.md, "Layout"). The graph is read from the source, imports inside
functions included and ``if TYPE_CHECKING:`` ones left out (tests/import_graph.py)."""

from __future__ import annotations

import pytest
from import_graph import cycles, describe_cycles, import_graph, layer_violations

#: Energon's API, adapters the core never imports (module names below megatron_energon_lite;
#: a prefix covers its submodules). Once the layer moves under megatron_energon_lite/energon/,
#: this becomes ("energon",). task_encoder/ is left out for now: it mixes the hooks the core
#: reads (pipeline/hooks.py, build.py) with Energon's build_* methods until those are split.
ENERGON_LAYER = ("flavors", "wrappers", "metadataset", "epathlib", "av", "media", "tools", "dataset_config")

#: The modules above the layer, allowed to import it: the CLI, previews, the public names
#: (the package root) and the as_energon alias table.
ABOVE_THE_LAYER = ("cli", "preview", "__init__", "as_energon")


# Report mode until pipeline/, task_encoder/, wrappers/ and loader.py are restructured (another
# branch): the edges that remain are printed in the failure (see the module docstring).
PENDING = pytest.mark.xfail(strict=False, reason="edges from modules being restructured on another branch")


@pytest.fixture(scope="module")
def graph():
    return import_graph()


@PENDING
def test_no_import_cycles(graph) -> None:
    found = cycles(graph)
    assert not found, "import cycles (strongly connected components):\n" + describe_cycles(graph, found)


@PENDING
def test_the_core_does_not_import_the_energon_layer(graph) -> None:
    found = layer_violations(graph, ENERGON_LAYER, ABOVE_THE_LAYER)
    assert not found, "core modules importing the Energon layer:\n" + "\n".join(f"    {edge}" for edge in found)
