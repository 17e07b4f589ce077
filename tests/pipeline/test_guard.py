from __future__ import annotations

import logging

import pytest

from megatron_energon_lite.errors import (
    ConfigError,
    DecodeError,
    FatalSampleError,
    MissingDependencyError,
    SkipSample,
    StateError,
)
from megatron_energon_lite.pipeline.guard import DROPPED, SampleGuard, describe_item
from megatron_energon_lite.worker import log_exception


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, exc: BaseException, item: object, sources: object) -> None:
        self.calls.append((exc, item, sources))


def raiser(exc: BaseException):
    def fn(*_args):
        raise exc

    return fn


def item(i: int, **extra) -> dict:
    return {"__key__": f"sample-{i}", "__restore_key__": ("List", i), **extra}


def test_success_returns_the_value_and_keeps_the_counter() -> None:
    guard = SampleGuard(Recorder(), stage="encode")
    assert guard.call(item(0), lambda a, b: a + b, 2, 3) == 5
    assert guard.failures == 0


def test_skip_sample_drops_without_counting() -> None:
    handler = Recorder()
    guard = SampleGuard(handler, tolerance=2)
    guard.call(item(0), raiser(ValueError("bad")))
    assert guard.call(item(1), raiser(SkipSample())) is DROPPED
    assert guard.failures == 1 and len(handler.calls) == 1


def test_failure_calls_the_handler_and_drops() -> None:
    handler = Recorder()
    guard = SampleGuard(handler, tolerance=0)
    exc = DecodeError("broken jpeg")
    sample = item(4, __sources__=("src-a",))
    assert guard.call(sample, raiser(exc)) is DROPPED
    assert handler.calls == [(exc, sample, ("src-a",))]
    assert guard.failures == 1
    guard.passed()
    assert guard.failures == 0


def test_handler_gets_the_sources_of_every_member_of_a_list() -> None:
    handler = Recorder()
    batch = [item(0, __sources__=("a",)), item(1), item(2, __sources__=("b", "c"))]
    SampleGuard(handler).call(batch, raiser(ValueError()))
    assert handler.calls[0][2] == ["a", "b", "c"]


@pytest.mark.parametrize(
    "exc",
    [
        SystemError("x"),
        SyntaxError("x"),
        ImportError("x"),
        MissingDependencyError("x"),
        MemoryError(),
        RecursionError(),
        NameError("x"),
        UnboundLocalError("x"),
        KeyboardInterrupt(),
        FatalSampleError("x"),
        StateError("x"),
        ConfigError("x"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_system_exceptions_propagate(exc: BaseException) -> None:
    handler = Recorder()
    guard = SampleGuard(handler)
    with pytest.raises(type(exc)) as info:
        guard.call(item(0), raiser(exc))
    assert info.value is exc
    assert handler.calls == [] and guard.failures == 0


def test_stop_iteration_from_a_hook_stops_the_run() -> None:
    with pytest.raises(FatalSampleError, match="StopIteration") as info:
        SampleGuard(Recorder(), stage="my_hook").call(item(0), raiser(StopIteration()))
    assert isinstance(info.value.__cause__, StopIteration)


def test_tolerance_raises_fatal_error_naming_stage_keys_and_exception() -> None:
    handler = Recorder()
    guard = SampleGuard(handler, tolerance=3, stage="encode_sample")
    for i in range(2):
        assert guard.call(item(i), raiser(ValueError(f"bad value {i}"))) is DROPPED
    with pytest.raises(FatalSampleError) as info:
        guard.call(item(2), raiser(ValueError("bad value 2")))
    message = str(info.value)
    assert "encode_sample" in message and "3 samples in a row" in message
    for i in range(3):
        assert f"sample-{i}" in message and f"('List', {i})" in message
    assert "ValueError: bad value 2" in message
    assert "failure_tolerance" in message
    assert isinstance(info.value.__cause__, ValueError)
    assert len(handler.calls) == 3  # the handler also sees the failure that stops the run


def test_success_between_failures_resets_the_run() -> None:
    guard = SampleGuard(Recorder(), tolerance=2)
    for i in range(10):
        guard.call(item(i), raiser(ValueError()))
        guard.passed()
    assert guard.failures == 0


def test_zero_tolerance_is_unlimited() -> None:
    guard = SampleGuard(Recorder(), tolerance=0)
    for i in range(500):
        guard.call(item(i), raiser(ValueError()))
    assert guard.failures == 500


def test_restored_counter_keeps_counting() -> None:
    guard = SampleGuard(Recorder(), tolerance=3)
    guard.reset(2)
    with pytest.raises(FatalSampleError):
        guard.call(item(0), raiser(ValueError()))


@pytest.mark.parametrize("tolerance", [-1, 1.5, True, "3"])
def test_invalid_tolerance(tolerance: object) -> None:
    with pytest.raises(ConfigError, match="tolerance"):
        SampleGuard(tolerance=tolerance)  # type: ignore[arg-type]


def test_default_handler_logs(caplog: pytest.LogCaptureFixture) -> None:
    guard = SampleGuard()
    assert guard.handler is log_exception
    with caplog.at_level(logging.WARNING):
        guard.call(item(7), raiser(ValueError("broken part")))
    assert "sample-7" in caplog.text and "broken part" in caplog.text


def test_describe_item() -> None:
    assert describe_item(item(3)) == "'sample-3' (restore key ('List', 3))"
    assert "5 samples" in describe_item([item(i) for i in range(5)])
    assert "without __key__" in describe_item(42)
