"""The catalogue of published findings (examples/catalogue/) end to end on random weights of the right shape.

Each entry's spec, circuit file and claims are used as shipped; only the model is swapped for random
weights (GPT-2 small's 12 layers of 12 heads with a tiny width, so every head the papers name exists) and the
sizes made small. The verdicts mean nothing on random weights: the test checks that each task builds, the
circuit file fits the graph, every claim evaluates (holds or fails, never 'cannot be evaluated'), and that a
deliberately false claim fails, and (the negative control of issue 47) that none of the entry's own claims
passes there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from builders import GPT2_SHAPED
from circuitstat.pipelines.runs.audit.run import run_audit
from circuitstat.pipelines.claims import check
from circuitstat.pipelines.spec import load_spec

CATALOGUE = Path(__file__).resolve().parents[2] / "examples" / "catalogue"
RANDOM = {"ioi-gpt2": GPT2_SHAPED, "greater-than-gpt2": GPT2_SHAPED,
          "induction-zoo": "random:gpt2?n_layer=2&n_head=4&n_embd=32&vocab_size=128&n_positions=64&seed=3"}


# the refusals a claim may give on random weights, where effects rest on a few prompts and f can be undefined:
# the claim was read against the run, and the run's numbers cannot answer it (never a missing table or name)
DATA_REFUSAL = re.compile(r"flagged unreliable|no_tail_seen = false|is NaN|undefined")


def test_the_catalogue_lists_these_entries():
    assert sorted(p.name for p in CATALOGUE.iterdir() if p.is_dir()) == sorted(RANDOM)


@pytest.mark.parametrize("entry", [pytest.param(e, marks=pytest.mark.slow) if RANDOM[e] == GPT2_SHAPED else e
                                   for e in sorted(RANDOM)])  # GPT-2-shaped: 32,491 edges, ~15 s each
def test_catalogue_entry_runs_and_its_claims_evaluate(entry, tmp_path):
    spec = load_spec(CATALOGUE / entry / "spec.yaml")
    assert spec.circuit is not None and Path(spec.circuit.file).is_file()
    small = spec.model_copy(update={"model": RANDOM[entry], "task": spec.task.model_copy(update={"n": 16}),
                                    "bootstrap": spec.bootstrap.model_copy(update={"n_resamples": 40}),
                                    "faithfulness": False, "batch_size": 16, "ig_steps": 2})
    run = run_audit(small, tmp_path / "run")
    claims = yaml.safe_load((CATALOGUE / entry / "claims.yaml").read_text())["claims"]
    method = claims[-1]["method"]
    claims.append({"kind": "published_circuit", "name": "deliberately false", "method": method,
                   "statistic": "share_unsupported", "max": -0.5})
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": claims}))
    report = check(path, run)
    assert len(report.results) == len(claims)
    for r in report.results:  # each claim found what it needs in the run: its method, edges, tables, columns
        assert r.status in ("pass", "fail") or (not r.missing and DATA_REFUSAL.search(r.reason)), (r.name, r.reason)
    status = {r.claim.name: r.status for r in report.results}
    assert status["deliberately false"] == "fail"
    # the negative control (issue 47): no claim of the entry passes on random weights of its shape -- a claim that
    # did would be no evidence about the trained model (sign and q alone passed there; effect sizes do not)
    passing = [(r.claim.name, r.reason) for r in report.results if r.status == "pass"]
    assert not passing, f"claims of {entry} pass on random weights: {passing}"
    assert report.exit_code == (2 if "error" in status.values() else 1)  # a refused claim outranks a failed one
