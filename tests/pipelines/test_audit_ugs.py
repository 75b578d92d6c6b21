"""UGS as a mask-learned method of the audit and of ``attribute``: the same tables and stability layer as edge
pruning, its circuit equal to fit_ugs called directly (fit and refits, bit for bit), and its options checked."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from builders import small_mask_audit_spec
from circuitstat.core.errors import InputError
from circuitstat.pipelines.runs.audit.run import run_audit
from circuitstat.pipelines.spec import parse_spec

SPEC = small_mask_audit_spec(["ugs"], ugs={"steps": 3, "n_refits": 3, "n_samples": 2})


def _without(doc: dict, key: str) -> dict:
    """``doc`` without ``key``: a mask method's section is refused when its method is not run (issue 45 item 6)."""
    return {k: v for k, v in doc.items() if k != key}


def _read(out, name):
    return pq.read_table(out / f"{name}.parquet").to_pandas()


def test_audit_with_ugs_writes_the_mask_tables_and_its_fits_are_fit_ugs(tmp_path):
    from circuitstat.circuits.ugs import fit_ugs
    from circuitstat.core.rundir import RunDir
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.pipelines.runs.audit.run import prepare_audit, refit_plan

    spec = parse_spec(SPEC)
    out = run_audit(spec, tmp_path / "run")
    masks, fits, notes = _read(out, "edge_masks"), _read(out, "mask_fits"), _read(out, "method_notes")
    assert set(masks["method"]) == {"ugs"} and sorted(fits["fit"].unique()) == [0, 1, 2, 3]
    assert {"edge_stats", "approximation"} <= set(notes["table"])
    # what ran is named: the UGS optimiser under the run's counterfactual ablation is not Li & Janson's UGS
    assert set(masks["label"]) == {"UGS optimiser, counterfactual ablation"}
    assert masks["target_sparsity"].isna().all()
    assert np.allclose(masks["reached_sparsity"], 1 - masks["in_mask"].mean())
    G = np.stack([fits[fits.fit == f].sort_values("edge")["gate"].to_numpy() for f in range(4)])
    L = np.stack([fits[fits.fit == f].sort_values("edge")["log_alpha"].to_numpy() for f in range(4)])
    np.testing.assert_allclose(G, 1 / (1 + np.exp(-L)), rtol=1e-12)  # UGS's gate is the keep probability
    assert np.array_equal(masks.sort_values("edge")["refit_frequency"].to_numpy(), (G[1:] > 0.5).mean(0))
    # oracle: fit 0 is fit_ugs at the spec's seed; refit i is fit_ugs on resample i (counts as weights), child i
    _, model, task = prepare_audit(spec)
    opts = {"steps": 3, "n_samples": 2, "batch_size": 6}
    assert np.array_equal(L[0], fit_ugs(model, task, seed=5, **opts).log_alpha.astype(np.float64))
    with RunDir(out, spec=spec.model_dump()) as rd:
        plan = refit_plan(spec, 12, None, rd.stage_seed("resampling"), "ugs")
    assert plan.n_resamples == 3
    want = fit_ugs(model, task, weights=plan.counts[1], seed=spawn_seeds(5, 3)[1], **opts).log_alpha
    assert np.array_equal(L[2], want.astype(np.float64)) and not np.array_equal(L[0], L[2])
    stab = _read(out, "stability_vs_k")
    assert set(stab["method"]) == {"ugs"} and stab["jaccard_mean"].between(0, 1).all()
    f = _read(out, "faithfulness_vs_k")
    assert (f["method"] == "ugs").all() and f["f_selected"].notna().all()


@pytest.mark.parametrize("change, words", [
    ({"ugs": {"n_samples": 0}}, "n_samples"),
    ({"ugs": {"lr": 0}}, "lr"),
    ({"ugs": {"n_refits": 1}}, "n_refits"),
    ({"ugs": {"objective": "mse"}}, "objective"),
    ({"methods": ["ugs"], "verify": {"n": 4}}, "per-example scores"),
])
def test_ugs_spec_errors(change, words):
    with pytest.raises(InputError, match=words):
        parse_spec({**SPEC, **change})


def test_attribute_command_fits_ugs_and_refuses_bad_options(tmp_path):
    """`circuitstat attribute --method ugs`: fit_ugs at --seed; --n-samples elsewhere or out of bounds: exit 2."""
    from typer.testing import CliRunner

    from circuitstat.circuits.ugs import fit_ugs
    from circuitstat.pipelines.runs.audit.run import prepare_audit
    from circuitstat.pipelines.cli import app

    args = ["attribute", "--model", SPEC["model"], "--task", "induction", "--task-option", "seq_len=5", "--n", "8",
            "--seed", "2", "--steps", "3", "--n-samples", "2"]
    res = CliRunner().invoke(app, [*args, "--method", "ugs", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    masks = _read(tmp_path / "a", "edge_masks")
    _, model, task = prepare_audit(
        parse_spec({**_without(SPEC, "ugs"), "task": {**SPEC["task"], "n": 8, "seed": 2}, "methods": ["eap"]}))
    want = fit_ugs(model, task, steps=3, n_samples=2, seed=2, batch_size=16).log_alpha
    assert np.array_equal(masks.sort_values("edge")["log_alpha"].to_numpy(), want.astype(np.float64))
    for method, samples in (("edge-pruning", "2"), ("eap", "2"), ("ugs", "0")):
        bad = CliRunner().invoke(app, [*args[:-1], samples, "--method", method, "--out", str(tmp_path / method)])
        assert bad.exit_code == 2, (method, bad.output)
        assert not (tmp_path / method).exists()


def test_plan_prices_a_ugs_step_as_n_samples_masked_passes():
    from circuitstat.circuits.plan import pruning_cost
    from circuitstat.pipelines.runs.audit.stages import audit_flops
    from circuitstat.pipelines.sources import LOCAL

    cfg = LOCAL.skeleton(SPEC["model"]).cfg
    base = {**SPEC, "methods": ["eap", "ugs"], "faithfulness": False}
    with_ugs, without = parse_spec(base), parse_spec({**_without(base, "ugs"), "methods": ["eap"]})
    one = pruning_cost(cfg, n=12, positions=10, steps=3 * 2, batch_size=6).flops  # 3 steps of 2 draws
    assert audit_flops(with_ugs, cfg) - audit_flops(without, cfg) == pytest.approx(4 * one)  # the fit + 3 refits


def test_attribute_jobs_take_ugs_options_and_check_them():
    """The attribute kind's spec (service jobs, recorded runs): a ugs section for method ugs, checked as the command."""
    from circuitstat.pipelines.kinds import kind

    k = kind("attribute")
    spec = k.parse({"model": "m", "method": "ugs", "ugs": {"n_samples": 3, "steps": 2}, "n_refits": 2}, "job")
    assert spec.ugs.n_samples == 3 and k.stages(spec) == ["masks"]
    for bad, words in (({"method": "ugs", "ugs": {"n_samples": 0}}, "n_samples"),
                       ({"method": "eap", "ugs": {"steps": 2}}, "method edge-pruning or ugs, not eap"),
                       ({"method": "edge-pruning", "ugs": {"steps": 2}}, "method ugs")):
        with pytest.raises(InputError, match=words):
            k.parse({"model": "m", **bad}, "job")
