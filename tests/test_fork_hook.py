"""fork_hook: callbacks around os.fork, held weakly so registering never keeps an object alive."""

from __future__ import annotations

import gc
import logging
import multiprocessing
from dataclasses import dataclass, field

import pytest

from megatron_energon_lite.fork_hook import (
    DataclassForkMixin,
    ForkMixin,
    WeakCallbacks,
    after_in_child_fork_hook,
    after_in_parent_fork_hook,
    before_fork_hook,
)


def run_in_fork(target) -> int:
    """Runs ``target`` in a forked child; returns the child's exit code (0: it returned)."""
    process = multiprocessing.get_context("fork").Process(target=target)
    process.start()
    process.join(timeout=60)
    return process.exitcode


class Counter:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def hook(self, *args) -> None:
        self.calls.append(args)


def test_methods_and_functions_drop_out_when_collected() -> None:
    registry = WeakCallbacks()
    owner = Counter()
    seen = []

    def function(value) -> None:
        seen.append(value)

    registry.add_hook(owner.hook)
    registry.add_hook(owner.hook)  # the same method again: still one entry
    registry.add_hook(function)
    registry.run(7)
    assert owner.calls == [(7,)] and seen == [7] and len(registry) == 2

    del owner
    gc.collect()
    assert len(registry) == 1
    del function
    gc.collect()
    assert len(registry) == 0
    registry.run(8)  # nothing left to call
    assert seen == [7]


def test_persistent_hooks_keep_lambdas_alive() -> None:
    registry = WeakCallbacks()
    seen = []
    registry.add_hook(lambda: seen.append("strong"), make_persistent=True)
    registry.add_hook(lambda: seen.append("weak"))  # collected at once: a lambda nobody holds
    gc.collect()
    registry.run()
    assert seen == ["strong"] and len(registry) == 1


def test_two_methods_of_one_object_are_two_hooks() -> None:
    class Two:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def a(self) -> None:
            self.seen.append("a")

        def b(self) -> None:
            self.seen.append("b")

    registry = WeakCallbacks()
    two = Two()
    registry.add_hook(two.a)
    registry.add_hook(two.b)
    registry.run()
    assert two.seen == ["a", "b"]


def test_a_failing_fork_hook_is_logged_and_the_others_run(caplog: pytest.LogCaptureFixture) -> None:
    registry = WeakCallbacks()
    after = Counter()

    def broken() -> None:
        raise RuntimeError("boom")

    registry.add_hook(broken)
    registry.add_hook(after.hook)
    with caplog.at_level(logging.ERROR, logger="megatron_energon_lite.fork_hook"):
        registry.run_logged()
    assert after.calls == [()]
    assert "boom" in caplog.text
    with pytest.raises(RuntimeError, match="boom"):
        registry.run()  # called directly, an error propagates


class Connection(ForkMixin):
    """What the mixin is for: a handle that must not be shared with a forked child."""

    def __init__(self) -> None:
        super().__init__()
        self.handle: object | None = object()
        self.forks_seen = 0

    def __before_fork__(self) -> None:
        self.forks_seen += 1

    def __after_in_child_fork__(self) -> None:
        self.handle = None

    def __after_in_parent_fork__(self) -> None:
        self.forks_seen += 10


@dataclass
class Settings(DataclassForkMixin):
    name: str
    in_child: bool = False
    post_init_ran: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.post_init_ran = True

    def __after_in_child_fork__(self) -> None:
        self.in_child = True


def test_mixins_run_in_the_child_and_the_parent() -> None:
    connection = Connection()
    settings = Settings("s")
    assert settings.post_init_ran

    def child() -> None:
        if connection.handle is not None or not settings.in_child or connection.forks_seen != 1:
            raise SystemExit(3)

    assert run_in_fork(child) == 0
    assert connection.handle is not None and not settings.in_child
    assert connection.forks_seen == 11  # before (1) and after in the parent (10)


def test_module_level_hooks_and_collected_objects() -> None:
    events: list[str] = []

    def before() -> None:
        events.append("before")

    def parent() -> None:
        events.append("parent")

    def child() -> None:
        events.append("child")

    before_fork_hook(before)
    after_in_parent_fork_hook(parent)
    after_in_child_fork_hook(child)

    def check_child() -> None:
        if events != ["before", "child"]:
            raise SystemExit(4)

    assert run_in_fork(check_child) == 0
    assert events == ["before", "parent"]

    # A collected object's hooks are gone: the fork does not call (or resurrect) it.
    gone = Connection()
    del gone, before, parent, child
    gc.collect()
    events.clear()
    assert run_in_fork(lambda: None) == 0
    assert events == []


def test_unchanged_mixin_methods_are_not_registered() -> None:
    from megatron_energon_lite import fork_hook

    class Plain(ForkMixin):
        pass

    counts = [len(r) for r in (fork_hook._before_fork_hooks, fork_hook._after_in_child_fork_hooks)]
    plain = Plain()
    assert [len(r) for r in (fork_hook._before_fork_hooks, fork_hook._after_in_child_fork_hooks)] == counts
    del plain
