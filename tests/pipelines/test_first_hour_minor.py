"""The minor frictions of the first hour (issue 38): install warnings, a misspelt spec key, a changed stage's
message, and attribute's printed top 10. Each test fails on the code before the fix."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
TINY = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1&initializer_range=1.0"


@pytest.mark.slow
def test_a_misspelt_spec_key_gets_the_nearest_key():
    """Before: 'method: unknown key' and nothing else."""
    from circuitstat.pipelines.spec import AuditSpec, validate_spec
    from circuitstat.core.errors import InputError

    base = {"model": TINY, "task": {"name": "induction", "n": 8}}
    with pytest.raises(InputError) as e:
        validate_spec(AuditSpec, {**base, "method": ["exact"]}, "spec.yaml")
    assert "method: unknown key; did you mean 'methods'?" in str(e.value) and "methods" in str(e.value)
    with pytest.raises(InputError) as e:
        validate_spec(AuditSpec, {**base, "bootstrap": {"n_resample": 100}}, "spec.yaml")
    assert "bootstrap.n_resample: unknown key; did you mean 'n_resamples'?" in str(e.value)
    with pytest.raises(InputError) as e:  # nothing close: no guess, but the keys that are allowed
        validate_spec(AuditSpec, {**base, "zzzz": 1}, "spec.yaml")
    assert "did you mean" not in str(e.value) and "the keys here are" in str(e.value)


def test_a_changed_stage_names_the_flag_and_every_changed_value_in_full(tmp_path):
    """Before: 'Pass force=True' on the command line, and 'bootstrap: {"ci_method": null, ... -> ...' cut at '...'."""
    from circuitstat.core.rundir import RunDir, StageSpecChangedError

    def run(n_resamples: int, k: list[int]):
        boot = {"ci_method": None, "confidence_level": 0.95, "n_resamples": n_resamples, "scheme": "examples"}
        with RunDir(tmp_path / "r", spec={}, seed=0) as rd:
            rd.stage("s", lambda: {"s": {"x": [1]}}, ["s"], params={"bootstrap": boot, "k": k})

    run(1000, [5, 10, 20, 50])
    with pytest.raises(StageSpecChangedError) as e:
        run(500, [5, 10, 20])
    msg = str(e.value)
    assert "bootstrap.n_resamples: 1000 -> 500" in msg and "k: [5, 10, 20, 50] -> [5, 10, 20]" in msg
    assert "..." not in msg and "--force" in msg and "confidence_level" not in msg


def _printed_top(output: str) -> list[str]:
    return re.findall(r"^\s+\d+\s+-?[\d.]+\s+[\d.]+\s+(\S+)$", output, re.M)


def test_attributes_printed_top_10_follows_ranking(tmp_path):
    """Before: no --ranking on attribute; the list was always by |mean|."""
    import pyarrow.parquet as pq

    from circuitstat.pipelines.cli import app

    tops = {}
    for ranking in ("signed", "absolute"):
        out = tmp_path / ranking
        r = CliRunner().invoke(app, ["attribute", "--model", TINY, "--out", str(out), "--n", "4", "--method", "exact",
                                     "--ranking", ranking])
        assert r.exit_code == 0, r.output
        assert f"(--ranking {ranking})" in r.output
        S = np.asarray(pq.read_table(out / "scores.parquet").column("scores").to_pylist(), dtype=np.float64)
        names = pq.read_table(out / "edges.parquet").column("name").to_pylist()
        mean = S.mean(0)
        key = mean if ranking == "signed" else np.abs(mean)
        want = [names[i] for i in np.argsort(-key, kind="stable")[:10]]
        tops[ranking] = _printed_top(r.output)
        assert tops[ranking] == want
    assert tops["signed"] != tops["absolute"]  # the fixture has large negative effects
