"""``energon-lite --help``, ``info`` and ``lint`` start without torch or PyAV (issue 15, item 3).

Each command runs in a fresh interpreter, which then reports the top-level packages and the
command modules it imported; no timing is asserted (benchmarks/bench_cli_start.py measures it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from energon_lite_dev.synthetic import (
    generate_captioning_dataset,
    generate_text_dataset,
)

from megatron_energon_lite.format.prepare import prepare_dataset

#: What no command here may import: torch, and PyAV (a video dataset needs it, these do not).
HEAVY = ("torch", "av")

# Runs `energon-lite ARGS...` as the console script does, then prints one JSON line.
_PROBE = """
import json, sys
from megatron_energon_lite.cli.main import main
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code or 0
print(json.dumps({
    "exit": code,
    "heavy": sorted({name.split(".")[0] for name in sys.modules} & set(%r)),
    "commands": sorted(name for name in sys.modules if name.startswith("megatron_energon_lite.cli.") and name != "megatron_energon_lite.cli.main"),
}))
""" % (HEAVY,)


def _energon_lite(*args: str) -> tuple[dict, str]:
    """Runs the command in a new interpreter: (its report, what the command itself printed)."""
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=300)
    *printed, report = done.stdout.splitlines() or [""]
    assert done.returncode == 0 and report.startswith("{"), done.stdout + done.stderr
    return json.loads(report), "\n".join(printed) + done.stderr


CAPTION_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"
TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A prepared image-caption dataset, a prepared text dataset and a metadataset blending both."""
    base = tmp_path_factory.mktemp("startup")
    images, texts = base / "images", base / "texts"
    generate_captioning_dataset(images, num_shards=2, samples_per_shard=6, image_size=16)
    prepare_dataset(images, split_ratio=(1, 0, 1), progress=False, num_workers=1, dataset_yaml=CAPTION_YAML)
    generate_text_dataset(texts, num_shards=2, samples_per_shard=5, max_words=20)
    prepare_dataset(texts, split_ratio=(1, 0, 1), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    blend = base / "blend.yaml"
    blend.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - weight: 1\n        path: {images}\n      - weight: 2\n        path: {texts}\n"
    )
    return {"images": images, "texts": texts, "blend": blend}


def test_help_imports_no_command_module() -> None:
    report, printed = _energon_lite("--help")
    assert report == {"exit": 0, "heavy": [], "commands": []}
    for name in ("prepare", "prepare-media", "info", "lint", "preview", "analyze-debug", "checkpoint"):
        assert f"\n  {name} " in printed


@pytest.mark.parametrize("dataset", ["images", "texts", "blend"])
def test_info_imports_neither_torch_nor_av(datasets: dict[str, Path], dataset: str) -> None:
    report, printed = _energon_lite("info", str(datasets[dataset]))
    assert report["exit"] == 0, printed
    assert report["heavy"] == []
    assert "megatron_energon_lite.cli.lint" not in report["commands"]  # only the modules of `info`
    assert ("Metadataset" if dataset == "blend" else "Dataset") in printed


@pytest.mark.parametrize("dataset", ["images", "texts", "blend"])
def test_lint_imports_neither_torch_nor_av(datasets: dict[str, Path], dataset: str) -> None:
    report, printed = _energon_lite("lint", str(datasets[dataset]), "--no-progress")
    assert report["exit"] == 0, printed
    assert report["heavy"] == []
    assert "OK" in printed


def test_listed_help_is_each_commands_own() -> None:
    """``--help`` lists the sentence recorded in main._COMMANDS; it must be what the command says."""
    from megatron_energon_lite.cli import main

    assert set(main.cli.commands) == set(main._COMMANDS)
    for name, (_, _, sentence) in main._COMMANDS.items():
        command = main.cli.commands[name]  # loads it
        assert isinstance(command, click.Command) and command.name == name and not command.hidden
        stand_in = click.Command(name, help=sentence)
        for limit in range(20, 200, 3):  # every width a terminal may give click
            assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit), (name, limit)


def test_lazy_commands_behave_as_a_dict() -> None:
    from megatron_energon_lite.cli.main import _COMMANDS, _LazyCommands

    commands = _LazyCommands(_COMMANDS)
    assert len(commands) == len(_COMMANDS) and "info" in commands and "nope" not in commands
    assert commands.get("nope") is None
    info = commands["info"]
    assert commands["info"] is info and list(commands).count("info") == 1
    extra = click.Command("extra")
    commands["extra"] = extra
    assert commands["extra"] is extra and len(commands) == len(_COMMANDS) + 1
    del commands["lint"], commands["extra"]
    assert "lint" not in commands and "extra" not in commands and len(commands) == len(_COMMANDS) - 1


def test_energon_name_of_the_prepare_media_command() -> None:
    from megatron_energon_lite.cli import main

    assert main.prepare_media_command is main.cli.commands["prepare-media"]
    with pytest.raises(AttributeError):
        main.no_such_name  # noqa: B018
