"""``megatron_energon_lite.energon.tools``: Energon's module paths, each the command of ``energon-lite``."""

from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner

from megatron_energon_lite.cli.main import cli

# module -> (attribute, click name): as Energon's megatron.energon.tools.<module>
TOOLS = {
    "prepare": ("command", "prepare"),
    "info": ("command", "info"),
    "lint": ("command", "lint"),
    "preview": ("command", "preview"),
    "analyze_debug": ("command", "analyze-debug"),
    "checkpoint": ("command", "checkpoint"),
}


@pytest.mark.parametrize("module", sorted(TOOLS))
def test_tools_module_is_the_cli_command(module: str) -> None:
    attribute, name = TOOLS[module]
    command = getattr(importlib.import_module(f"megatron_energon_lite.energon.tools.{module}"), attribute)
    assert isinstance(command, click.Command) and command.name == name
    assert cli.commands[name] is command  # a re-export: the real command lives in cli/


def test_checkpoint_subcommands() -> None:
    from megatron_energon_lite.energon.tools import checkpoint

    assert checkpoint.command_redist.name == "redist" and checkpoint.command_info.name == "info"
    assert checkpoint.command.commands == {"redist": checkpoint.command_redist, "info": checkpoint.command_info}


def test_a_tool_run_on_its_own_reports_errors_cleanly(tmp_path) -> None:
    from megatron_energon_lite.energon.tools.info import command

    (tmp_path / ".nv-meta").mkdir()
    (tmp_path / ".nv-meta/.info.json").write_text("{not json")
    result = CliRunner().invoke(command, [str(tmp_path)])
    assert result.exit_code == 1 and result.output.startswith("Error: ") and result.exception is not None
    assert "Traceback" not in result.output
