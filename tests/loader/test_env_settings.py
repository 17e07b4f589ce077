"""The loader's ``ENERGON_LITE_*`` numbers: unset gives the default, 0 turns the feature off, and
anything that is not a finite number >= 0 is a ConfigError naming the variable."""

from __future__ import annotations

import pytest

from megatron_energon_lite.loader.handover.bundles import BUNDLE_MS_ENV, bundle_seconds_from_env
from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.loader.handover.slabs import SLAB_MIB_ENV, slab_bytes_from_env
from megatron_energon_lite.loader.worker_start import (
    WORKER_START_ENV,
    worker_start_seconds_from_env,
)

READERS = [
    # variable, reader, value when unset, "2.5" read as
    (SLAB_MIB_ENV, slab_bytes_from_env, 64 << 20, int(2.5 * (1 << 20)) // 64 * 64),
    (BUNDLE_MS_ENV, bundle_seconds_from_env, 0.005, 0.0025),
    (WORKER_START_ENV, worker_start_seconds_from_env, 120.0, 2.5),
]


@pytest.mark.parametrize(("name", "read", "default", "two_and_a_half"), READERS, ids=[r[0] for r in READERS])
def test_unset_default_zero_and_a_number(monkeypatch: pytest.MonkeyPatch, name, read, default, two_and_a_half) -> None:
    monkeypatch.delenv(name, raising=False)
    assert read() == default
    monkeypatch.setenv(name, " ")
    assert read() == default
    monkeypatch.setenv(name, "0")
    assert read() == 0
    monkeypatch.setenv(name, "2.5")
    assert read() == pytest.approx(two_and_a_half)


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf", "1e400"])
@pytest.mark.parametrize(("name", "read"), [(r[0], r[1]) for r in READERS], ids=[r[0] for r in READERS])
def test_anything_else_is_an_error_that_names_the_variable(monkeypatch: pytest.MonkeyPatch, name, read, value) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"(?s){name} must be a finite number.*found: '{value}'.*set 0 to"):
        read()
