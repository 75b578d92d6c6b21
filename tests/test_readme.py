"""The README and the docs it points to: their commands parse, their examples run, their tables match the code.

The README's Python block runs, and its task-file example is built into a task; every page's command
lines, Python blocks, family lists and names are checked in tests/test_docs.py. Output blocks are
fenced as ```text and are not commands.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_blocks import blocks

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = tuple(sorted(p.name for p in (ROOT / "docs").glob("*.md")))  # every page (tests/test_docs.py checks their code)


def _blocks(lang: str, path: Path = README) -> list[str]:
    """The fenced code blocks of ``path`` whose fence names ``lang`` ("" for unlabelled), in order."""
    return blocks(path, (lang,))


def test_readme_is_a_short_entry_point_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    (first, *_) = _blocks("")
    assert first.startswith("make demo") and "\nmake test " in first
    assert len(_blocks("python")) == 1


def test_readme_and_docs_links_resolve() -> None:
    for path in (README, *(ROOT / "docs" / d for d in DOCS)):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.name} links to {target}, which does not exist"
    text = README.read_text()
    assert all(f"docs/{d}" in text for d in DOCS)  # every moved document is reachable from the README


def test_model_family_table_lists_every_supported_architecture() -> None:
    from circuitstat.circuits.convert import SUPPORTED

    section = README.read_text().split("## Supported models", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| family")]
    listed = {m for r in rows for m in re.findall(r"^\|[^|]*\| `([a-z0-9_]+)` \|", r)}
    assert listed == set(SUPPORTED), f"README table lists {sorted(listed)}, the converter supports {SUPPORTED}"


def test_readme_task_file_example_is_a_valid_task(tmp_path) -> None:
    from circuitstat.circuits import load_model
    from circuitstat.pipelines.build import build_task

    (rows,) = _blocks("jsonl")
    path = tmp_path / "ioi.jsonl"
    path.write_text(rows)
    model = load_model("random:gpt2?n_layer=1&n_head=2&n_embd=16")  # the GPT-2 tokenizer
    task = build_task(model, str(path), n=5)
    assert len(task) == 5 and task.group is not None and int(task.group.unique().numel()) == 3
    assert task.clean.shape == task.corrupted.shape


def test_readme_claims_example_is_a_valid_claims_file() -> None:
    import yaml

    from circuitstat.pipelines.claims import parse_claims

    (block,) = [b for b in _blocks("yaml") if b.lstrip().startswith("spec:")]
    claims = parse_claims(yaml.safe_load(block), "README.md")
    assert len(claims.claims) == 1 and claims.claims[0].statistic == "jaccard_data_ci_low"


def test_readme_ci_example_uses_options_check_has() -> None:
    import yaml
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    (block,) = [b for b in _blocks("yaml") if "--server" in b]
    steps = yaml.safe_load(block)
    command = next(s["run"] for s in steps if "check" in s["run"]).split()
    assert command[:2] == ["circuitstat", "check"] and "CIRCUITSTAT_TOKEN" in steps[-1]["env"]
    usage = CliRunner().invoke(app, ["check", "--help"]).output
    for flag in (w for w in command if w.startswith("--")):
        assert flag in usage, flag


def test_readme_python_example_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (code,) = _blocks("python")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    ci = namespace["ci"]
    assert ci.edge_names is not None and len(ci.edge_names) == namespace["S"].scores.shape[1]
    assert "edge_name" in ci.to_table().column_names


# --- the moved documents against the code and the examples ------------------------------------------
def test_calibration_doc_output_is_the_study_summary_format_with_todays_estimands() -> None:
    from circuitstat.pipelines.runs.calibration.study import summary_lines
    from circuitstat.stats.calibration_kinds import FAITHFULNESS_ESTIMANDS, STABILITY_ESTIMANDS
    from circuitstat.stats.intervals import ESTIMAND

    doc = ROOT / "docs" / "calibration.md"
    outputs = [b for b in _blocks("text", doc) if b.startswith("interval ")]
    assert len(outputs) == 3  # the zoo example, the held-out population, and a heavy-tail population (edges only)
    estimands = {"edge/*": ESTIMAND, **{f"stability/{k}": v for k, v in STABILITY_ESTIMANDS.items()},
                 **{f"faithfulness/{k}": v for k, v in FAITHFULNESS_ESTIMANDS.items()}}
    for block in outputs:
        lines = block.splitlines()
        assert lines[0] == summary_lines([], 0.95, "x")[0]  # the header the study prints today
        listed = dict(ln.strip().split(": ", 1) for ln in lines if ln.startswith("  "))
        # every family (or the edge family alone), each checked against the estimand the code states
        assert listed == estimands or listed == {"edge/*": ESTIMAND}
        assert lines[-1].startswith("nominal 0.95; ±MC: Monte Carlo SE of coverage, each dataset one unit")


def test_calibration_doc_table_holds_the_coverage_the_library_quotes() -> None:
    from circuitstat.stats.intervals.result import COVERAGE_NOTE

    text = (ROOT / "docs" / "calibration.md").read_text()
    quoted = dict(re.findall(r"(\w+) (0\.\d+)", COVERAGE_NOTE.split(":", 1)[1]))
    names = {"studentized_symmetric": "**symmetric studentized (default)**", "t": "t", "percentile": "percentile",
             "bca": "BCa (the former default)"}
    for method, value in quoted.items():
        (row,) = re.findall(rf"^\| zoo \| {re.escape(names[method])} \|(.*)$", text, flags=re.M)
        n64 = row.split("|")[1].split("/")[0].strip()  # columns N = 32, 64, 128; coverage / null rate
        assert n64 == value, (method, n64, value)


def test_results_doc_and_the_false_claims_example_agree_on_the_observed_values() -> None:
    comments = re.findall(r"# observed (\d\.\d+)", (ROOT / "examples" / "claims-zoo-false.yaml").read_text())
    (block,) = [b for b in _blocks("text", ROOT / "docs" / "results.md") if b.startswith("claim ")]
    observed = [float(ln.split("FAIL")[1].split()[0]) for ln in block.splitlines() if " FAIL " in ln]
    assert len(comments) == len(observed) == 2
    assert [f"{v:.3f}" for v in observed] == comments
