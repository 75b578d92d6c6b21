"""Layering rule: pipelines/ uses only the public names of the layers below it (circuits, stats, reports)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOWER = ("circuits", "stats", "reports")


def _private_imports(path: Path) -> list[str]:
    """`from <lower layer> import _name` and `<lower module>._name` uses in one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LOWER:
            found += [f"{path.name}:{node.lineno} {node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_")]
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "pipelines").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT / "pipelines")))
def test_pipelines_import_nothing_private_from_lower_layers(path: Path) -> None:
    assert _private_imports(path) == []


def test_the_rule_catches_a_private_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from circuits.model import _norm\nfrom stats.results import Result\n")
    assert _private_imports(bad) == ["bad.py:1 circuits.model._norm"]
