"""The node contract (``pipeline/node.py``): five methods in the base, the rest opt-in."""

from __future__ import annotations

from typing import Any

import pytest
from resume import ListSource, check_resume_at_every_step

from megatron_energon_lite.errors import NotSupportedError
from megatron_energon_lite.loader.elastic import check_elastic
from megatron_energon_lite.pipeline.concat import ConcatNode
from megatron_energon_lite.pipeline.filter import FilterNode
from megatron_energon_lite.pipeline.node import Elastic, Node, PassThroughNode, Remainder, State
from megatron_energon_lite.pipeline.passes import on_top
from megatron_energon_lite.pipeline.state_check import check_count, check_stage, nested

VALUES = list(range(7))


def test_the_base_contract_is_next_get_state_reset_restore_inputs() -> None:
    methods = {name for name, value in vars(Node).items() if callable(value) and not name.startswith("_")}
    assert methods == {"next", "get_state", "reset", "restore", "inputs"}


class Tally(PassThroughNode[Any]):
    """A stage written to the base contract only: counts the items that pass."""

    tag = "Tally"

    def __init__(self, source: Node[Any]) -> None:
        super().__init__(source)
        self.seen = 0

    def next(self) -> Any:
        item = self.source.next()
        self.seen += 1
        return {**item, "seen": self.seen}

    def get_state(self) -> State:
        return {"stage": self.tag, "seen": self.seen, "source": self.source.get_state()}

    def reset(self, state: State | None = None) -> None:
        if state is None:
            self.source.reset(None)
            self.seen = 0
            return
        check_stage(state, self.tag, "seen", "source")
        seen = check_count(state["seen"], "seen", stage=self.tag)
        with nested("source"):
            self.source.reset(state["source"])
        self.seen = seen


def test_a_stage_of_the_base_contract_alone_resumes_at_every_step() -> None:
    stream = check_resume_at_every_step(lambda: Tally(ListSource(VALUES)), steps=len(VALUES) + 1, check_restore=False)
    assert [item["seen"] for _, item in stream[:-1]] == list(range(1, len(VALUES) + 1))


class ElasticList(ListSource, Elastic):
    """A list source that says what it has still to read (the elastic protocol)."""

    def undelivered(self) -> Remainder:
        return Remainder.of_one(self.epoch, [(self.position, len(self.values))])

    def carry_in(self, remainder: Remainder) -> None:
        self.epoch, self.position = remainder.epochs[0], remainder.ranges[0][0][0]


def test_elastic_resume_takes_a_chain_whose_every_stage_implements_the_protocol() -> None:
    pipeline = on_top(FilterNode(ElasticList(VALUES), lambda item, index: True), restart=True)
    assert check_elastic(pipeline) is pipeline
    pipeline.next()
    assert pipeline.undelivered().ranges == ([(1, len(VALUES))],)


@pytest.mark.parametrize(
    "make, named",
    [
        # A pass-through stage of one's own: its state would be lost on another topology.
        (lambda: FilterNode(Tally(ElasticList(VALUES)), lambda item, index: True), r"Tally stage \(Tally\)"),
        (lambda: ConcatNode([ElasticList(VALUES), ElasticList(VALUES)]), r"Concat stage \(ConcatNode\)"),
        (lambda: FilterNode(ListSource(VALUES), lambda item, index: True), r"List stage \(ListSource\)"),
    ],
    ids=["pass-through", "concat", "source"],
)
def test_elastic_resume_refuses_a_chain_with_a_stage_without_the_protocol_naming_it(make, named: str) -> None:
    with pytest.raises(NotSupportedError, match=named):
        check_elastic(on_top(make(), restart=True))
