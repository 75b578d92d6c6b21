"""Pricing verified runs: phase 2's expected cost (circuits.plan.verify_cost) against enumeration, `attribute --plan
--verify` printing both phases, the service accepting and pricing the same spec, and attribute --verify's tables."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from circuitstat.circuits.plan import (exact_subset_cost, expected_batch_examples, graph_of, method_cost,
                                       verify_cost)
from circuitstat.core.errors import InputError
from circuitstat.pipelines.cli import app as APP

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"


def _cfg():
    from circuitstat.pipelines.sources import LOCAL

    return LOCAL.skeleton(MODEL).cfg


@pytest.mark.parametrize("N, n, B", [(8, 3, 2), (9, 4, 4), (7, 7, 3), (10, 1, 3)])
def test_expected_batch_examples_equals_enumeration(N, n, B):
    """The whole batches exact_subset runs, averaged over every n-subset (each equally likely under the draw)."""
    total, count = 0, 0
    for rows in itertools.combinations(range(N), n):
        batches = {r // B for r in rows}
        total += sum(min(B, N - b * B) for b in batches)
        count += 1
    assert expected_batch_examples(N, n, B) == pytest.approx(total / count, rel=1e-12)


def test_verify_cost_matches_exact_cost_and_the_average_edge():
    cfg = _cfg()
    g = graph_of(cfg)
    P = 12
    # every prompt and every edge: phase 2 is exact on everything
    full = verify_cost(cfg, n=16, N=16, positions=P, batch_size=4)
    assert full.flops == pytest.approx(method_cost(cfg, "exact", n=16, positions=P, batch_size=4).flops, rel=1e-12)
    assert full.flops == pytest.approx(exact_subset_cost(cfg, np.arange(g.n_edges), n=16, positions=P,
                                                         batch_size=4).flops, rel=1e-12)
    # k edges priced at the average edge: the mean over every k-subset's exact cost (k = 1: each edge alone)
    one = verify_cost(cfg, n=16, N=16, positions=P, n_edges=1, batch_size=4)
    each = [exact_subset_cost(cfg, [e], n=16, positions=P, batch_size=4).flops for e in range(g.n_edges)]
    assert one.flops == pytest.approx(np.mean(each), rel=1e-12)
    # fewer prompts cost less; fewer edges cost less
    assert verify_cost(cfg, n=4, N=64, positions=P, batch_size=4).flops < verify_cost(cfg, n=16, N=64, positions=P,
                                                                                      batch_size=4).flops
    assert one.flops < full.flops


def _invoke(*args):
    r = CliRunner().invoke(APP, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def test_attribute_plan_prices_both_phases():
    r = _invoke("attribute", "--model", MODEL, "--task-option", "seq_len=5", "--n", 64, "--batch-size", 8, "--plan",
                "--verify", 16)
    assert r.exit_code == 0, r.output
    cfg = _cfg()
    P = int(re.search(r"plan: 64 examples x (\d+) positions", r.output).group(1))
    lines = r.output.splitlines()
    p1 = next(ln for ln in lines if ln.strip().startswith("phase 1"))
    p2 = next(ln for ln in lines if ln.strip().startswith("phase 2"))
    both = next(ln for ln in lines if ln.strip().startswith("both"))
    flops = [float(re.search(r"FLOPs\s+(\S+)", ln).group(1)) for ln in (p1, p2, both)]
    want1 = method_cost(cfg, "eap", n=64, positions=P, batch_size=8).flops
    want2 = verify_cost(cfg, n=16, N=64, positions=P, batch_size=8).flops
    exact = method_cost(cfg, "exact", n=64, positions=P, batch_size=8).flops
    assert flops[0] == pytest.approx(want1, rel=5e-3) and flops[1] == pytest.approx(want2, rel=5e-3)
    assert flops[2] == pytest.approx(want1 + want2, rel=5e-3)
    share = float(re.search(r"= ([\d.]+)% of exact on all 64 by FLOPs", both).group(1))
    assert share == pytest.approx(100 * (want1 + want2) / exact, abs=0.06)
    assert "exact on 16 of them (every edge)" in r.output


@pytest.mark.parametrize("args, words", [
    (["--verify-edges", "3,4"], "need --verify N"),
    (["--verify", 8, "--verify-edges", "3"], "TOP,RANDOM"),
    (["--verify", 8, "--verify-edges", "3,4"], "needs verify.tau"),
    (["--verify", 63], "--verify <= 62"),
    (["--verify", 8, "--method", "exact"], "add eap"),
    (["--verify-correction", "by"], "need --verify N"),
    (["--verify", 8, "--verify-correction", "holm"], "--verify-correction"),
])
def test_attribute_verify_options_refused_before_work(tmp_path, args, words):
    out = tmp_path / "run"
    r = _invoke("attribute", "--model", MODEL, "--n", 64, "--out", out, *args)
    assert r.exit_code == 2 and words in r.output, r.output
    assert not out.exists()


def test_attribute_verify_writes_the_tables(tmp_path):
    """attribute --verify: the verified table equals verified_means on the same prompts' exact scores, computed here
    by a separate exact attribution run."""
    from circuitstat.circuits import load_model
    from circuitstat.circuits.attribution import attribute
    from circuitstat.pipelines.build import build_task
    from circuitstat.pipelines.sources import LOCAL
    from circuitstat.stats.verified import verified_means

    out = tmp_path / "run"
    r = _invoke("attribute", "--model", MODEL, "--task-option", "seq_len=5", "--n", 20, "--batch-size", 4,
                "--out", out, "--verify", 6, "--verify-seed", 2)
    assert r.exit_code == 0, r.output
    assert "verified: eap verified on 6 of 20 prompts" in r.output
    rows = pq.read_table(out / "verified_prompts.parquet").column("row").to_numpy()
    assert np.array_equal(rows, np.sort(np.random.default_rng(2).choice(20, 6, replace=False)))
    m = LOCAL.load(MODEL)
    t = build_task(m, "induction", n=20, seed=0, seq_len=5)
    exact = attribute(m, t, "exact", batch_size=4, progress=False).scores
    eap = attribute(m, t, "eap", batch_size=4, progress=False).scores
    want = verified_means(eap, exact[rows], rows)
    got = pq.read_table(out / "verified.parquet").to_pandas()
    np.testing.assert_allclose(got["estimate"], want.estimate, atol=1e-9)
    np.testing.assert_allclose(got["ci_high"], want.confidence_interval.high, atol=1e-9)


def test_service_accepts_and_prices_the_verify_spec():
    from circuitstat.pipelines.service.runner import check_work
    from circuitstat.pipelines.sources import LOCAL
    from circuitstat.pipelines.service.submission import parse_kind
    from circuitstat.pipelines.build import task_positions

    base = {"model": MODEL, "task": {"name": "induction", "n": 64, "options": {"seq_len": 5}}, "methods": ["eap"],
            "batch_size": 8}
    plain = parse_kind("audit", base)
    ver = parse_kind("audit", {**base, "verify": {"n": 16, "edges": {"top": 5, "random": 10}, "tau": 0.1}})
    assert ver.verify.n == 16 and ver.verify.edges.random == 10
    cfg = _cfg()
    P = task_positions("induction", {"seq_len": 5})
    extra = check_work("audit", ver, 1e30, LOCAL) - check_work("audit", plain, 1e30, LOCAL)
    assert extra == pytest.approx(verify_cost(cfg, n=16, N=64, positions=P, n_edges=15, batch_size=8).flops, rel=1e-9)
    # with exact on every prompt already, phase 2 costs nothing more: only the faithfulness of the circuits
    # selected from the verified estimates (eap+verified) is added
    from circuitstat.circuits.plan import forward_flops
    from circuitstat.pipelines.runs.audit.pricing import faithfulness_forwards

    both = {**base, "methods": ["exact", "eap"]}
    both_ver = parse_kind("audit", {**both, "verify": {"n": 16}})
    assert check_work("audit", both_ver, 1e30, LOCAL) - check_work("audit", parse_kind("audit", both), 1e30, LOCAL) \
        == pytest.approx(faithfulness_forwards(both_ver) * forward_flops(cfg, P), rel=1e-9)
    att = parse_kind("attribute", {"model": MODEL, "n": 64, "batch_size": 8, "verify": {"n": 16}})
    assert att.verify.n == 16
    with pytest.raises(InputError, match="verify.n <= 62"):
        parse_kind("audit", {**base, "verify": {"n": 63}})
    with pytest.raises(InputError, match="add eap"):
        parse_kind("attribute", {"model": MODEL, "method": "exact", "verify": {"n": 8}})


def test_verify_share_prints_the_largest_run_of_each_design_within_it(tmp_path):
    """--plan --verify-share S: the uniform n and active B printed are the largest whose two phases cost at most S of
    exact on all N by FLOPs, checked against circuits.plan's prices of n, n + 1, B and B + 1; refused without --plan."""
    from circuitstat.circuits.plan import verify_cost
    from circuitstat.pipelines.build import build_task
    from circuitstat.pipelines.plan import plan_costs
    from circuitstat.pipelines.sources import LOCAL
    from circuitstat.pipelines.verify import active_phase2_cost

    r = _invoke("attribute", "--model", MODEL, "--task-option", "seq_len=5", "--n", 64, "--batch-size", 4,
                "--plan", "--verify-share", 0.8)
    assert r.exit_code == 0, r.output
    k = int(re.search(r"uniform  --verify (\d+)", r.output).group(1))
    b = int(re.search(r"active   --verify-design active --verify-budget (\d+)", r.output).group(1))
    m = LOCAL.load(MODEL)
    t = build_task(m, "induction", n=64, seed=0, seq_len=5)
    costs = plan_costs(m, t, batch_size=4)
    p1, ex = costs["eap"], costs["exact"]
    P = int(t.clean.shape[1])
    kw = dict(max_rows=ex.max_rows, itemsize=4)
    uni = lambda x: (p1.flops + verify_cost(m.cfg, n=x, N=64, positions=P, batch_size=4, **kw).flops) / ex.flops  # noqa: E731
    act = lambda x: (p1.flops + active_phase2_cost(m.cfg, x, N=64, positions=P, n_methods=1, batch_size=4,  # noqa: E731
                                                   **kw)[0].flops) / ex.flops
    assert uni(k) <= 0.8 < uni(k + 1) and act(b) <= 0.8 < act(b + 1)
    assert 4 <= k < 62 and 4 <= b < 64  # an interior answer: the bound binds on both designs
    r = _invoke("attribute", "--model", MODEL, "--task-option", "seq_len=5", "--n", 64, "--plan", "--verify-share",
                0.01)
    assert r.exit_code == 0 and "none fits" in r.output, r.output
    r = _invoke("attribute", "--model", MODEL, "--task-option", "seq_len=5", "--n", 64, "--out", tmp_path / "x",
                "--verify-share", 0.1)
    assert r.exit_code == 2 and "add --plan" in r.output and not (tmp_path / "x").exists()
