"""Data that runs code when read: pickle parts and a dataset's sample_loader.py.

Four cases each: refused by default with a message naming the opt-ins; allowed by an argument;
allowed by an environment variable (for programs one cannot edit); allowed in Energon mode
(``import megatron_energon_lite.as_energon``), which logs once per dataset.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite import (
    ConfigError,
    DecodeError,
    SampleDecoder,
    WorkerConfig,
    energon_mode,
    get_loader,
    policy,
    get_train_dataset,
)
from megatron_energon_lite.decode import TRUST_PICKLE_ENV, UntrustedDataError
from megatron_energon_lite.format.dataset_config import (
    TRUST_DATASET_CODE_ENV,
    load_dataset_config,
)
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.energon.task_encoder import DefaultTaskEncoder

SAMPLES = 6


@pytest.fixture
def plain_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """No opt-in from the environment or Energon mode; a fresh once-per-process log."""
    monkeypatch.delenv(TRUST_PICKLE_ENV, raising=False)
    monkeypatch.delenv(TRUST_DATASET_CODE_ENV, raising=False)
    monkeypatch.setattr(energon_mode, "_enabled", False)
    monkeypatch.setattr(policy, "_logged", set())


def _dataset(root: Path, dataset_yaml: str, parts) -> Path:
    write_tar(root / "shard_000.tar", [(f"k{i:03d}", parts(i)) for i in range(SAMPLES)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text(dataset_yaml)
    return root


@pytest.fixture
def pickled(tmp_path: Path) -> Path:
    """TextSample.text holds an unpickled dict (a pkl part)."""
    yaml = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: pkl\n"
    return _dataset(tmp_path / "pickled", yaml, lambda i: {"pkl": pickle.dumps({"i": i}), "txt": b"x"})


@pytest.fixture
def with_code(tmp_path: Path) -> Path:
    """A legacy dataset.yaml whose sample_loader.py upper-cases the text."""
    yaml = (
        "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\n"
        "sample_loader: sample_loader.py:sample_loader\npart_filter: [txt]\n"
    )
    root = _dataset(tmp_path / "coded", yaml, lambda i: {"txt": f"text {i}".encode()})
    (root / ".nv-meta/sample_loader.py").write_text("def sample_loader(raw):\n    return dict(text=raw['txt'].upper())\n")
    return root


def _texts(path: Path, **kwargs) -> list:
    ds = get_train_dataset(
        path, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=None,
        shuffle_buffer_size=None, max_samples_per_sequence=None, repeat=False, **kwargs,
    )
    return sorted((sample.text for sample in get_loader(ds)), key=str)


def _energon_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "megatron_energon_lite.energon_mode"]


# --- pickle parts -----------------------------------------------------------------------------


def test_pickle_refused_by_default_stops_the_run_with_the_opt_ins(pickled: Path, plain_mode: None) -> None:
    with pytest.raises(DecodeError) as info:  # not skipped sample by sample: the first one stops
        _texts(pickled)
    assert isinstance(info.value, UntrustedDataError)
    message = str(info.value)
    assert "part 'pkl' of sample 'k0" in message
    assert "SampleDecoder(allow_pickle=True)" in message and f"{TRUST_PICKLE_ENV}=1" in message


def test_pickle_allowed_by_the_decoder_argument(pickled: Path, plain_mode: None) -> None:
    class Trusting(DefaultTaskEncoder):
        decoder = SampleDecoder(allow_pickle=True)

    assert _texts(pickled, task_encoder=Trusting()) == [{"i": i} for i in range(SAMPLES)]


def test_pickle_allowed_by_the_environment(pickled: Path, plain_mode: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(TRUST_PICKLE_ENV, "1")
    with caplog.at_level(logging.WARNING):
        assert _texts(pickled) == [{"i": i} for i in range(SAMPLES)]
    assert len(_energon_logs(caplog)) == 1


def test_pickle_in_energon_mode(pickled: Path, plain_mode: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(energon_mode, "_enabled", True)
    with caplog.at_level(logging.WARNING):
        assert _texts(pickled) == [{"i": i} for i in range(SAMPLES)]
        assert _texts(pickled) == [{"i": i} for i in range(SAMPLES)]
    logs = _energon_logs(caplog)
    assert len(logs) == 1 and "as Energon does" in logs[0]


# --- sample_loader.py -------------------------------------------------------------------------


def test_dataset_code_refused_by_default_with_the_opt_ins(with_code: Path, plain_mode: None) -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset_config(with_code)
    message = str(info.value)
    assert "sample_loader.py" in message and "trust_dataset_code=True" in message and f"{TRUST_DATASET_CODE_ENV}=1" in message
    with pytest.raises(ConfigError, match="trust_dataset_code"):
        _texts(with_code)


def test_dataset_code_allowed_by_the_argument(with_code: Path, plain_mode: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert _texts(with_code, trust_dataset_code=True) == [f"TEXT {i}" for i in range(SAMPLES)]
    assert _energon_logs(caplog) == []


def test_dataset_code_allowed_by_the_environment(with_code: Path, plain_mode: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(TRUST_DATASET_CODE_ENV, "yes")
    with caplog.at_level(logging.WARNING):
        assert _texts(with_code) == [f"TEXT {i}" for i in range(SAMPLES)]
        load_dataset_config(with_code)
    logs = _energon_logs(caplog)
    assert len(logs) == 1 and TRUST_DATASET_CODE_ENV in logs[0] and str(with_code) in logs[0]


def test_dataset_code_in_energon_mode_logs_once_per_dataset(with_code: Path, tmp_path: Path, plain_mode: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(energon_mode, "_enabled", True)
    other = tmp_path / "other"
    other.mkdir()
    (other / ".nv-meta").mkdir()
    for name in ("dataset.yaml", "sample_loader.py"):
        (other / ".nv-meta" / name).write_text((with_code / ".nv-meta" / name).read_text())
    with caplog.at_level(logging.WARNING):
        assert _texts(with_code) == [f"TEXT {i}" for i in range(SAMPLES)]
        load_dataset_config(with_code, policy=policy.ENERGON)  # what a spec planned under the switch passes
        assert load_dataset_config(other, policy=policy.ENERGON).sample_loader({"txt": "a"}) == {"text": "A"}
    logs = _energon_logs(caplog)
    assert len(logs) == 2 and all("as Energon does" in line for line in logs)
    assert str(with_code) in logs[0] and str(other) in logs[1]
