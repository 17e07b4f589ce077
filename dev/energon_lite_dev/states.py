"""Reading loader states in tests: which blended datasets a rank still reads from what an
elastic restore carried over to it."""

from __future__ import annotations

from typing import Any


def carried_datasets(state: Any, datasets: int) -> list[bool]:
    """Per blended dataset (or ``[x]`` for one dataset), whether a worker of the rank whose state
    this is (``save_state_rank()``) still reads what it carried over from another topology.

    A Source keeps ``carried`` until it starts its next epoch, which it does only when asked for
    one more sample: a sample delivered while its dataset still shows ``carried`` (in the state
    saved right after it) is one of the carried epoch.
    """
    found: dict[int, bool] = {}

    def walk(node: Any, dataset: int) -> None:
        if isinstance(node, dict):
            if node.get("stage") == "Blend":
                for k, child in enumerate(node["sources"]):
                    walk(child, k)
                return
            if node.get("stage") == "Source" and node.get("carried"):
                found[dataset] = True
            for value in node.values():
                walk(value, dataset)
        elif isinstance(node, list):
            for value in node:
                walk(value, dataset)

    walk(state, 0)
    return [found.get(k, False) for k in range(datasets)]
