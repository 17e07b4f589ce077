"""The default error handlers, now in errors.py (Energon's megatron.energon.errors)."""

from __future__ import annotations

import logging

import pytest

from megatron_energon_lite import errors, worker
from megatron_energon_lite.samples import TextSample


def test_handlers_live_in_errors_and_worker_reexports_them() -> None:
    assert worker.log_exception is errors.log_exception
    assert worker.reraise_exception is errors.reraise_exception
    assert worker.WorkerConfig(rank=0, world_size=1, num_workers=0).global_error_handler is errors.log_exception


def test_log_exception_logs_the_key_and_returns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="megatron_energon_lite.errors"):
        errors.log_exception(ValueError("broken"), TextSample(__key__="s/7", text=""), None)
        errors.log_exception(KeyError("x"), {"__key__": "crude/1"})
    assert "s/7" in caplog.records[0].getMessage() and "ValueError: broken" in caplog.records[0].getMessage()
    assert "crude/1" in caplog.records[1].getMessage()


def test_reraise_exception_raises_the_same_exception() -> None:
    exc = ValueError("stop")
    with pytest.raises(ValueError) as info:
        errors.reraise_exception(exc, None)
    assert info.value is exc


def test_not_supported_is_in_the_tree() -> None:
    assert issubclass(errors.NotSupportedError, errors.EnergonLiteError)
    assert issubclass(errors.NotSupportedError, NotImplementedError)
    assert "NotSupportedError" in errors.__all__
