"""The README's Python example runs as written and its command lines parse as written.

Commands are parsed by the real CLI (click's make_context: every option, argument and choice is
checked) without running them, since several train models or read runs; the Python block runs.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def _command_lines() -> list[list[str]]:
    """Each `circuitstat ...` line of the README's unlabelled code blocks, comments stripped."""
    lines = []
    for block in _blocks(""):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("circuitstat "):
                lines.append(shlex.split(line)[1:])
    return lines


def test_readme_has_commands_and_python() -> None:
    assert len(_command_lines()) >= 10 and len(_blocks("python")) >= 1


@pytest.mark.parametrize("argv", _command_lines(), ids=lambda a: " ".join(a[:2]))
def test_readme_command_parses(argv: list[str]) -> None:
    import typer

    from pipelines.cli import app

    group = typer.main.get_command(app)
    cmd, args, name = group, list(argv), "circuitstat"
    while args and hasattr(cmd, "commands") and args[0] in cmd.commands:
        name, cmd = args[0], cmd.commands[args.pop(0)]
    assert not hasattr(cmd, "commands"), f"README command {argv} names no subcommand"
    args = [a for a in args if a != "..."]  # the README's ellipsis for "more of the same"
    cmd.make_context(name, args)  # raises click.UsageError on an unknown option or bad value


def test_readme_python_example_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (code,) = _blocks("python")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    ci = namespace["ci"]
    assert ci.edge_names is not None and len(ci.edge_names) == namespace["S"].scores.shape[1]
    assert "edge_name" in ci.to_table().column_names
