"""One import root: everything installs under ``circuitstat``, so a user's own ``stats.py`` breaks nothing.

A research folder often holds a ``stats.py``, a ``circuits.py`` or a ``reports/`` folder of its own. Python puts
the script's folder (or the current one) first on ``sys.path``, so a library installed as bare ``stats`` would be
shadowed by it. These tests run the README's Python example and a small audit from such a folder, check that no
bare layer name is importable from an installed circuitstat, and build the wheel to check what it installs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("core", "circuits", "stats", "pipelines", "reports")


def _python_block() -> str:
    """The README's one Python example."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n") + len("```python\n")
    return text[start:text.index("```", start)]


def _research_folder(path: Path) -> Path:
    """A user's folder with their own stats.py, circuits.py, reports/ and pipelines/ (each says it was imported)."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("stats.py", "circuits.py", "core.py"):
        (path / name).write_text(f"USER_MODULE = {name!r}\n")
    for name in ("reports", "pipelines"):
        (path / name).mkdir(exist_ok=True)
        (path / name / "__init__.py").write_text(f"USER_MODULE = {name!r}\n")
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what is installed
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_readme_example_runs_beside_a_users_own_stats_py(tmp_path: Path) -> None:
    folder = _research_folder(tmp_path / "research")
    script = folder / "example.py"
    # the user's own modules stay theirs, and circuitstat's run beside them
    script.write_text(_python_block() + "\nimport stats, circuits, reports, pipelines\n"
                      "assert stats.USER_MODULE == 'stats.py' and reports.USER_MODULE == 'reports'\n"
                      "print('README example ran')\n")
    done = _run([sys.executable, str(script)], folder)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "README example ran" in done.stdout
    assert "stability" in done.stdout.lower()  # the example's own summary printed


def test_the_hello_world_is_one_import(tmp_path: Path) -> None:
    code = ("from circuitstat import load_model, attribute, bootstrap_edges, circuit_stability, Circuit, build_task\n"
            "import sys\n"
            "print(sorted(m for m in ('torch', 'scipy') if m in sys.modules))\n")
    done = _run([sys.executable, "-c", "import circuitstat; import sys; print('torch' in sys.modules)"], tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "False"  # the root package imports no torch
    done = _run([sys.executable, "-c", code], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]


def test_no_bare_layer_name_is_importable(tmp_path: Path) -> None:
    code = ("import importlib.util as u\n"
            f"print([n for n in {LAYERS!r} if u.find_spec(n) is not None])\n")
    done = _run([sys.executable, "-c", code], tmp_path)  # an empty folder: nothing of the user's
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_command_line_runs_an_audit_and_its_report_from_a_research_folder(tmp_path: Path) -> None:
    folder = _research_folder(tmp_path / "research")
    (folder / "spec.yaml").write_text(
        "model: random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64\n"
        "task: {name: induction, n: 32, options: {seq_len: 6}}\n"
        "methods: [eap]\nbootstrap: {n_resamples: 50}\nk: [3]\nranking: absolute\n")
    exe = shutil.which("circuitstat", path=str(Path(sys.executable).parent)) or "circuitstat"
    done = _run([exe, "audit", "spec.yaml", "--out", "run", "--n-jobs", "1"], folder)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (folder / "run" / "edge_stats.parquet").exists() and (folder / "run" / "report.html").exists()
    done = _run([sys.executable, "-m", "circuitstat", "report", "run"], folder)  # python -m circuitstat too
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_the_wheel_installs_one_root_with_every_subpackage_and_its_data(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for name in ("circuitstat", *LAYERS):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    done = _run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w",
                 str(tmp_path / "dist"), str(src)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # no setuptools warnings (a license table and unlisted data folders gave ~150 lines of them on install)
    out = done.stdout + done.stderr
    assert [ln for ln in out.splitlines() if re.search(r"(BuildBackend|SetuptoolsDeprecation)Warning", ln)] == []
    (wheel,) = (tmp_path / "dist").glob("circuitstat-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"circuitstat"}
    # every package folder of the tree is in the wheel (setup.py maps them; a new subpackage is not left out)
    for layer in LAYERS:
        for init in (ROOT / layer).rglob("__init__.py"):
            rel = init.relative_to(ROOT)
            if "migrations" in rel.parts:
                continue
            assert f"circuitstat/{rel.as_posix()}" in names, rel
    assert "circuitstat/pipelines/service/templates/base.html" in names or any(
        n.startswith("circuitstat/pipelines/service/templates/") for n in names)
    for f in ("migrations/env.py", "migrations/script.py.mako", "migrations/versions/0001_initial.py"):
        assert f"circuitstat/pipelines/service/{f}" in names, f  # the migrations ship (loaded by path)
    meta = next(n for n in names if n.endswith("METADATA"))
    assert "License-Expression: MIT" in zipfile.ZipFile(wheel).read(meta).decode()
