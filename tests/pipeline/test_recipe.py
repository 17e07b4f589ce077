"""Recipes (``pipeline/recipe.py``): how a dataset's passes end, decided once from its recipe tree."""

from __future__ import annotations

from typing import Any

import pytest

from megatron_energon_lite.pipeline.recipe import (
    CUT_FROM_STREAM,
    ENDLESS,
    ENDS_WITH_DATA,
    Blend,
    Map,
    Pass,
    Recipe,
    Repeat,
    Watchdog,
    pass_end,
    passes_continue,
)
from megatron_energon_lite.worker import WorkerConfig

WC = WorkerConfig(rank=0, world_size=1, num_workers=0)


class Items(Recipe[Any]):
    """A source the loader knows nothing about (a dataset class of the user's own)."""

    worker_config = WC


def _same(item: Any) -> Any:
    return item


def _trees() -> list[tuple[str, Recipe[Any], str]]:
    source = Items()
    endless = Repeat(source, WC)
    return [
        ("source", source, ENDS_WITH_DATA),
        ("map over a source", Map(source, WC, _same), ENDS_WITH_DATA),
        ("repeat of a fixed count", Repeat(source, WC, 2), ENDS_WITH_DATA),
        ("endless repeat", endless, ENDLESS),
        ("map over an endless repeat", Map(endless, WC, _same), ENDLESS),
        ("blend of a finite and an endless input", Blend((Repeat(source, WC, 1), endless), WC, (1, 1)), ENDLESS),
        ("fixed repeat of an endless repeat", Repeat(endless, WC, 2), ENDLESS),
        ("virtual epochs", Pass(endless, WC, 10), CUT_FROM_STREAM),
        ("limit", Pass(source, WC, 10, restart=True, capped=True), CUT_FROM_STREAM),
        ("map over a limit (composed)", Map(Pass(source, WC, 10), WC, _same), CUT_FROM_STREAM),
        ("endless repeat of a limit", Repeat(Pass(source, WC, 10), WC), CUT_FROM_STREAM),
        ("watchdog over virtual epochs", Watchdog(Pass(endless, WC, 10), WC), CUT_FROM_STREAM),
    ]


@pytest.mark.parametrize("name, recipe, expected", _trees(), ids=[name for name, _, _ in _trees()])
def test_pass_end_of_a_recipe_tree(name: str, recipe: Recipe[Any], expected: str) -> None:
    assert pass_end(recipe) == expected
    assert passes_continue(recipe) == (expected == CUT_FROM_STREAM)
