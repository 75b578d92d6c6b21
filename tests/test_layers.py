"""Layering rules: imports run one way (DESIGN.md, "Layout").

* ``reports/`` is the ground floor: the contracts every package may import (errors, the Result and
  Estimator bases, JSON conversion, atomic writes, seeds, top-k) and the run directory's I/O. It
  imports nothing of circuits/, stats/ or pipelines/ (its ``html/`` part reads tables only).
* ``circuits/`` and ``stats/`` stand side by side on the floor and never import each other.
* ``pipelines/`` is on top: it may import every layer, but only their public names.
* ``stats/`` and ``reports/`` never import torch.

Every import counts: module level, inside functions, under ``TYPE_CHECKING`` and
``importlib.import_module("...")`` with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reports", "circuits", "stats", "pipelines")
# which other packages each package may import
ALLOWED = {"reports": set(), "circuits": {"reports"}, "stats": {"reports"},
           "pipelines": {"reports", "circuits", "stats"}}
NO_TORCH = ("reports", "stats")
LOWER = ("circuits", "stats", "reports")


def _imports(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) of every import in a parsed file; relative ones are skipped
    (they stay inside their own package)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and not node.args[0].value.startswith(".")
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            found.append((node.lineno, node.args[0].value, []))
    return found


def layer_violations(path: Path, package: str) -> list[str]:
    """Return every import in ``path`` (a file of ``package``) that breaks the direction rules."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = []
    for line, module, _ in _imports(tree):
        top = module.split(".")[0]
        if top in PACKAGES and top != package and top not in ALLOWED[package]:
            bad.append(f"{path.name}:{line} {package} imports {module}")
        if top == "torch" and package in NO_TORCH:
            bad.append(f"{path.name}:{line} {package} imports torch")
    return bad


def _private_imports(path: Path) -> list[str]:
    """`from <lower layer> import _name` uses in one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.name}:{line} {module}.{name}" for line, module, names in _imports(tree)
            if module.split(".")[0] in LOWER for name in names if name.startswith("_")]


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_run_one_way(package: str) -> None:
    bad = [v for path in _files(package) for v in layer_violations(path, package)]
    assert bad == [], "\n".join(bad)


def test_no_floor_module_imports_the_html_renderer() -> None:
    # reports/html renders tables; the floor and the I/O modules below it must not depend on it
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in _files("reports") if "html" not in p.relative_to(ROOT).parts
           for line, module, _ in _imports(ast.parse(p.read_text())) if module.startswith("circuitstat.reports.html")]
    assert bad == []


@pytest.mark.parametrize("path", sorted((ROOT / "pipelines").rglob("*.py")),  # subpackages too
                         ids=lambda p: str(p.relative_to(ROOT / "pipelines")))
def test_pipelines_import_nothing_private_from_lower_layers(path: Path) -> None:
    assert _private_imports(path) == []


def test_the_rules_catch_planted_bad_imports(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import importlib\n"
        "from circuitstat.core.results import Result\n"          # allowed everywhere
        "from circuitstat.circuits.model import CircuitModel\n"     # stats -> circuits: forbidden
        "def f():\n"
        "    from circuitstat.pipelines.audit.run import run_audit\n"   # lazy, still forbidden
        "    import torch\n"                            # stats never imports torch
        "    return importlib.import_module('circuitstat.circuits.scores')\n"
        "from .resampling import ResamplingPlan\n")     # relative: inside the package
    assert layer_violations(bad, "stats") == [
        "bad.py:3 stats imports circuitstat.circuits.model", "bad.py:5 stats imports circuitstat.pipelines.audit.run", "bad.py:6 stats imports torch",
        "bad.py:7 stats imports circuitstat.circuits.scores"]
    assert layer_violations(bad, "pipelines") == []
    assert layer_violations(bad, "reports")[:1] == ["bad.py:3 reports imports circuitstat.circuits.model"]
    private = tmp_path / "private.py"
    private.write_text("from circuitstat.circuits.model import _norm\nfrom circuitstat.core.results import Result\n")
    assert _private_imports(private) == ["private.py:1 circuitstat.circuits.model._norm"]
