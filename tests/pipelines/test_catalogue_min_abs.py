"""The GPT-2-shaped catalogue entries' edge claims fail on random weights because of their effect size, min_abs
(issue 47): on the random-weight model the audit mostly refuses them (a few prompts carry the effect, or it is NaN),
so test_catalogue.py cannot show what makes them fail. Here each entry's own edge_effect claims, as shipped, are
read against edge_stats that the audit's own statistics (edge_stats_table, the entry's bootstrap settings) compute
on the graph of that model from per-example effects drawn with numpy at the size random weights gave (|mean|
4.6e-7, issue 47), every edge with an effect as on random weights, the claimed edge with the claimed sign: the
sign and q hold, so without min_abs each claim passes, and with it each fails, on the effect size alone. The same
claim passes at three times its min_abs (the bound is no blanket refusal)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from builders import GPT2_SHAPED
from circuitstat.core.rundir import RunDir
from circuitstat.core.schema import fill
from circuitstat.pipelines.claims import evaluate_claims, parse_claims

CATALOGUE = Path(__file__).resolve().parents[2] / "examples" / "catalogue"
ENTRIES = ("ioi-gpt2", "greater-than-gpt2")
RANDOM_SIZE = 4.6e-7  # the size of an effect on random weights of this shape (greater-than, m9->logits: issue 47)
N = 16  # the catalogue test's prompts


@pytest.fixture(scope="module")
def names() -> list[str]:
    from circuitstat.circuits import load_model

    return list(load_model(GPT2_SHAPED).graph.edge_names)


def _claims(entry: str) -> list[dict]:
    claims = yaml.safe_load((CATALOGUE / entry / "claims.yaml").read_text())["claims"]
    return [c for c in claims if c["kind"] == "edge_effect"]


def _run(tmp: Path, entry: str, names: list[str], scale: dict[str, float]) -> Path:
    """A run whose edge_stats the audit's statistics computed from numpy-drawn effects: every edge an effect of the
    random-weight size, the claimed edges ``scale[edge]`` in the claimed direction (sd a fifth of it)."""
    from circuitstat.pipelines.runs.audit.tables import edge_stats_table
    from circuitstat.pipelines.spec import load_spec
    from circuitstat.stats import ResamplingPlan

    rng = np.random.default_rng(0)
    E = len(names)
    mu = RANDOM_SIZE * rng.standard_normal(E)
    S = mu + 0.2 * np.abs(mu) * rng.standard_normal((N, E))
    idx = {n: i for i, n in enumerate(names)}
    for c in _claims(entry):
        size = scale[c["edge"]] * (1 if c["sign"] == "positive" else -1)
        S[:, idx[c["edge"]]] = size + 0.2 * abs(size) * rng.standard_normal(N)
    spec = load_spec(CATALOGUE / entry / "spec.yaml")
    spec = spec.model_copy(update={"bootstrap": spec.bootstrap.model_copy(update={"n_resamples": 200})})
    method = _claims(entry)[0]["method"]
    t = edge_stats_table(S.astype(np.float32), names, method, ResamplingPlan.bootstrap(N, 200, 0), spec, 1)
    out = tmp / entry
    with RunDir(out, spec={}, seed=0) as run:
        run.write_table("edge_stats", fill("edge_stats", t, E))
    return out


def _evaluate(run: Path, claims: list[dict]):
    return evaluate_claims(parse_claims({"claims": claims}), run)


@pytest.mark.parametrize("entry", ENTRIES)
def test_min_abs_alone_fails_the_entrys_edge_claims_at_the_random_weight_size(entry, names, tmp_path):
    claims = _claims(entry)
    assert claims and all(c.get("min_abs") for c in claims)
    run = _run(tmp_path, entry, names, {c["edge"]: RANDOM_SIZE for c in claims})
    without = [{k: v for k, v in c.items() if k != "min_abs"} for c in claims]
    for r in _evaluate(run, without):  # sign and q hold: the claim as it was before min_abs passes
        assert r.status == "pass", (r.claim.name, r.reason)
    for r in _evaluate(run, claims):  # the entry's claim as shipped fails on its effect size and nothing else
        assert r.status == "fail" and "below the claimed effect size" in r.reason, (r.claim.name, r.reason)
        assert r.observed["q"] <= r.claim.max_q and abs(r.observed["estimate"]) < 10 * RANDOM_SIZE


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_same_claims_pass_at_three_times_their_effect_size(entry, names, tmp_path):
    claims = _claims(entry)
    run = _run(tmp_path, entry, names, {c["edge"]: 3 * c["min_abs"] for c in claims})
    for r in _evaluate(run, claims):
        assert r.status == "pass", (r.claim.name, r.reason)
