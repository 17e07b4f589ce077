"""Exit status of `energon-lite` against Energon's `energon` in the same situations (both run here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from energon_lite_dev.synthetic import write_tar

from megatron_energon_lite.cli.main import cli

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::ResourceWarning")]

P = ("--non-interactive", "--no-progress", "--num-workers", "1")
TEXT = ("--sample-type", "TextSample", "--field-map", '{"text": "txt"}')


def shards(root: Path, duplicate: bool = False) -> Path:
    for shard in range(2):
        write_tar(root / f"shards/part_{shard}.tar", [(f"{0 if duplicate else shard}_{i:04d}", {"txt": f"t {shard} {i}".encode()}) for i in range(3)])
    return root


def ours(*args: str) -> int:
    return CliRunner().invoke(cli, list(args)).exit_code


def energon(*args: str) -> int:
    main = pytest.importorskip("megatron.energon.cli.main").main
    return CliRunner().invoke(main, list(args)).exit_code


def prepared(root: Path) -> Path:
    assert ours("prepare", str(shards(root)), *P, "--split-ratio", "1,0,0", *TEXT) == 0
    return root


# (name, how to make the dataset folder, arguments after the folder)
SITUATIONS = [
    ("prepare: no tar files", lambda p: p.mkdir() or p, ("prepare", "{}", *P, "--split-ratio", "1,0,0")),
    ("prepare: all tars excluded", shards, ("prepare", "{}", *P, "--split-ratio", "1,0,0", "--exclude", "part")),
    ("prepare: missing path", lambda p: p, ("prepare", "{}", *P, "--split-ratio", "1,0,0")),
    ("prepare: no split ratio", shards, ("prepare", "{}", *P)),
    ("prepare: unknown sample type", shards, ("prepare", "{}", *P, "--split-ratio", "1,0,0", "--sample-type", "Nope")),
    ("prepare: field map is not JSON", shards, ("prepare", "{}", *P, "--split-ratio", "1,0,0", "--sample-type", "TextSample", "--field-map", "{bad")),
    ("prepare: field map without sample type", shards, ("prepare", "{}", *P, "--split-ratio", "1,0,0", "--field-map", '{"text": "txt"}')),
    ("prepare: sample type without field map", shards, ("prepare", "{}", *P, "--split-ratio", "1,0,0", "--sample-type", "TextSample")),
    ("prepare: split parts without a colon", shards, ("prepare", "{}", *P, "--split-parts", "nocolon")),
    ("prepare: split parts and ratio", shards, ("prepare", "{}", *P, "--split-parts", "train:shards/.*", "--split-ratio", "1,0,0", "--skip-dataset-yaml")),
    ("prepare: media with tar-index-only", prepared, ("prepare", "{}", *P, "--tar-index-only", "--media-metadata-by-extension")),
    ("prepare: tar-index-only", prepared, ("prepare", "{}", *P, "--tar-index-only")),
    ("prepare: ok", shards, ("prepare", "{}", *P, "--split-ratio", "1,0,0", *TEXT)),
    ("prepare: again without force", prepared, ("prepare", "{}", *P, "--split-ratio", "1,0,0")),
    ("prepare: again with force", prepared, ("prepare", "{}", *P, "--split-ratio", "1,0,0", "--force-overwrite", "--skip-dataset-yaml")),
    ("prepare: duplicate keys", lambda p: shards(p, duplicate=True), ("prepare", "{}", *P, "--split-ratio", "1,0,0", "--skip-dataset-yaml")),
    ("prepare: unknown option", shards, ("prepare", "{}", "--bogus")),
    ("info: missing path", lambda p: p, ("info", "{}")),
    ("info: not prepared", shards, ("info", "{}")),
    ("info: ok", prepared, ("info", "{}")),
    ("lint: missing path", lambda p: p, ("lint", "{}")),
    ("lint: not prepared", shards, ("lint", "{}")),
    ("lint: ok", prepared, ("lint", "{}")),
    ("preview: missing path", lambda p: p, ("preview", "{}")),
    ("preview: not prepared", shards, ("preview", "{}")),
    ("preview: ok", prepared, ("preview", "{}")),
]


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
@pytest.mark.parametrize(("name", "make", "args"), SITUATIONS, ids=[s[0] for s in SITUATIONS])
def test_exit_status_is_energons(tmp_path: Path, name: str, make, args: tuple[str, ...]) -> None:
    make(tmp_path / "theirs")
    make(tmp_path / "ours")
    expected = energon(*(str(tmp_path / "theirs") if a == "{}" else a for a in args))
    assert ours(*(str(tmp_path / "ours") if a == "{}" else a for a in args)) == expected, name


def test_no_command_and_unknown_command() -> None:
    assert ours() == energon() == 0
    assert ours("bogus") == energon("bogus") == 2


@pytest.mark.parametrize(
    ("name", "args", "energons", "reason"),
    [
        ("malformed ratio", ("--split-ratio", "1,1"), 0, "energon prints 'Invalid split. Stopping.' and exits 0"),
        ("unknown field", ("--split-ratio", "1,0,0", "--sample-type", "TextSample", "--field-map", '{"nope": "txt"}'), 0, "energon writes a dataset.yaml that cannot load"),
    ],
)
def test_deliberate_differences_fail_before_any_work(tmp_path: Path, name, args, energons: int, reason: str) -> None:
    shards(tmp_path / "theirs")
    shards(tmp_path / "ours")
    assert energon("prepare", str(tmp_path / "theirs"), *P, *args) == energons, reason
    assert ours("prepare", str(tmp_path / "ours"), *P, *args) == 1
    assert not (tmp_path / "ours/.nv-meta").exists()
