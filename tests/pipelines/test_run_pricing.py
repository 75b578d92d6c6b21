"""Every run kind is priced before work by the ``--plan`` arithmetic and refused above the work limit (issue 45
item 4): an absurd request whose every value is inside its range exits 2 naming the estimate, the maximum and
``--allow-large``, with no model pass run and nothing written; ``--allow-large`` lifts the refusal (the negative
control: the same request then reaches the work)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

M = "random:gpt2?n_layer=2&n_head=4&n_embd=64&vocab_size=512&n_positions=64"
runner = CliRunner()


class Reached(Exception):
    """Raised by a patched work function: the request got past its pricing."""


def _reached(res) -> bool:
    """Whether a CLI run stopped at a patched work function (the CLI reports it as an internal error)."""
    return isinstance(res.exception, Reached) or "Reached" in res.output


@pytest.fixture
def passes(monkeypatch):
    """Counts CircuitModel.run calls (every forward, gradient and suffix run goes through it)."""
    from circuitstat.circuits.model import CircuitModel

    calls, real = [0], CircuitModel.run

    def run(self, *a, **k):
        calls[0] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(CircuitModel, "run", run)
    return calls


def _refused(args: list, *needles: str) -> float:
    """The estimated operations a refusal names (exit 2, one line, the maximum and --allow-large named)."""
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 2, res.output + repr(res.exception)
    err = res.stderr.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    for needle in ("above the maximum of 1e+15", "--allow-large", *needles):
        assert needle in err, (needle, err)
    return float(re.search(r"needs about ([0-9.e+]+) operations", err).group(1))


UGS = ["attribute", "--model", M, "--task", "induction", "--task-option", "seq_len=8", "--n", "4096",
       "--method", "ugs", "--steps", "100000", "--n-samples", "1000"]


def test_the_issue_ugs_request_is_refused_with_the_plans_price_before_any_pass(tmp_path, passes):
    from circuitstat.circuits.plan import pruning_cost
    from circuitstat.pipelines.sources import LOCAL

    out = tmp_path / "run"
    ops = _refused([*UGS, "--out", out], "attribute run", "--n-samples")
    assert passes[0] == 0 and not out.exists()
    # the refusal's number is the plan's ugs row on the same shapes (the task's length bounded by 2 seq_len)
    cfg = LOCAL.skeleton(M, weights=False).cfg
    plan = [pruning_cost(cfg, n=4096, positions=p, steps=100_000 * 1000, fits=1).flops for p in (15, 16)]
    assert plan[0] <= ops * 1.05 and ops <= plan[1] * 1.05, (ops, plan)


def test_edge_pruning_with_many_steps_and_refits_is_refused(tmp_path, passes):
    out = tmp_path / "run"
    _refused(["attribute", "--model", M, "--n", "512", "--method", "edge-pruning", "--steps", "100000",
              "--n-refits", "1000", "--out", out], "--n-refits")
    assert passes[0] == 0 and not out.exists()


def test_a_small_mask_fit_is_not_refused_and_allow_large_lifts_the_limit(tmp_path, monkeypatch, passes):
    import circuitstat.pipelines.runs.attribute.run as attribute

    def reached(*a, **k):
        raise Reached

    monkeypatch.setattr(attribute, "masks_into", reached)
    for args in (["--n", "8", "--method", "ugs", "--steps", "2"], [*UGS[5:], "--allow-large"]):
        res = runner.invoke(app, ["attribute", "--model", M, *args, "--out", str(tmp_path / "run")])
        assert _reached(res), res.output
    assert passes[0] == 0


@pytest.mark.parametrize("method", ["exact", "eap", "eap-ig-inputs", "eap-ig-activations", "clean-corrupted",
                                    "atp-qkfix", "atp-graddrop", "atpstar", "ensemble"])
def test_every_attribution_method_is_priced_before_its_model_loads(tmp_path, monkeypatch, method):
    import circuitstat.pipelines.build as build

    def loaded(*a, **k):
        raise AssertionError("the model was loaded before the run was priced")

    monkeypatch.setattr(build, "load_with_graph", loaded)  # the weights are never read: priced from the shapes
    wide = "random:gpt2?n_layer=6&n_head=8&n_embd=512&vocab_size=512&n_positions=64"  # shapes only: no weights
    out = tmp_path / "run"
    _refused(["attribute", "--model", wide, "--method", method, "--n", "1000000", "--out", out], "attribute run")
    assert not out.exists()


def _audit(tmp_path, **extra) -> list:
    doc = {"model": M, "task": {"name": "induction", "n": 4096}, "methods": ["eap"], "k": [3],
           "bootstrap": {"n_resamples": 100}, "faithfulness": False, **extra}
    spec = tmp_path / "audit.yaml"
    spec.write_text(yaml.safe_dump(doc))
    return ["audit", spec, "--out", tmp_path / "run", "--no-report"]


@pytest.mark.parametrize("extra", [
    {"methods": ["eap", "ugs"], "ugs": {"steps": 100_000, "n_samples": 1000, "n_refits": 1000}},
    {"methods": ["eap", "edge-pruning"], "edge_pruning": {"steps": 100_000, "n_refits": 1000}},
    {"tests": {"k": 3, "n_random": 10_000, "n_permutations": 100_000}},
], ids=["ugs", "edge_pruning", "tests"])
def test_an_audit_section_of_absurd_size_is_refused_before_any_pass(tmp_path, passes, extra):
    args = _audit(tmp_path, **extra)
    _refused(args, "audit run")
    assert passes[0] == 0 and not (tmp_path / "run").exists()


def test_the_same_audit_with_small_sections_passes_its_price(tmp_path, monkeypatch, passes):
    import circuitstat.pipelines.runs.audit.common as run  # the audit's stages call attribution_scores there

    def reached(*a, **k):
        raise Reached

    monkeypatch.setattr(run, "attribution_scores", reached)
    res = runner.invoke(app, [str(a) for a in _audit(tmp_path, tests={"k": 3, "n_random": 29})])
    assert _reached(res), res.output
    res = runner.invoke(app, [str(a) for a in _audit(tmp_path, tests={"k": 3, "n_random": 10_000,
                                                                     "n_permutations": 100_000})] + ["--allow-large"])
    assert _reached(res), res.output


def test_a_variance_study_of_absurd_size_is_refused_before_any_pass(tmp_path, passes):
    spec = tmp_path / "variance.yaml"
    spec.write_text(yaml.safe_dump({"model": M, "task": {"name": "induction", "n": 20_000},
                                    "estimators": {"methods": ["exact", "eap-ig-inputs"], "ig_steps": [1000]},
                                    "counterfactual": {"n_draws": 64}, "dataset": {"n_fresh": 64}}))
    out = tmp_path / "run"
    _refused(["study", "variance", spec, "--out", out], "study variance run")
    assert passes[0] == 0 and not out.exists()


def _pilot() -> tuple[np.ndarray, list[str]]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((32, 110)), [f"e{i}" for i in range(110)]


def test_sample_size_at_ten_million_prompts_is_refused_before_simulating(monkeypatch):
    import circuitstat.stats.sample_size as stats_ss
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.runs.sample_size.simulate import sample_size

    def reached(*a, **k):
        raise Reached

    monkeypatch.setattr(stats_ss, "predict_widths", reached)
    S, names = _pilot()
    with pytest.raises(InputError, match=r"sample-size up to N = 10,000,000.*--allow-large"):
        sample_size(S, names, "eap", [10_000_000], [5], 0.5)
    with pytest.raises(Reached):  # the negative controls: a small N, and the same N with the limit lifted
        sample_size(S, names, "eap", [64], [5], 0.5)
    with pytest.raises(Reached):
        sample_size(S, names, "eap", [10_000_000], [5], 0.5, allow_large=True)


def test_the_sample_size_price_grows_with_its_work():
    from circuitstat.pipelines.work import sample_size_operations

    base = sample_size_operations(32, 110, [64], n_datasets=20, n_resamples=1000, n_ks=3)
    assert sample_size_operations(32, 110, [6400], n_datasets=20, n_resamples=1000, n_ks=3)[0] > 50 * base[0]
    assert sample_size_operations(32, 110, [64], n_datasets=200, n_resamples=1000, n_ks=3)[0] > 5 * base[0]
    assert sample_size_operations(32, 110, [16], n_datasets=20, n_resamples=1000, n_ks=3)[0] < base[0] / 10


def test_heads_with_millions_of_probe_prompts_is_refused_before_any_pass(tmp_path, monkeypatch, passes):
    from circuitstat.pipelines.runs.heads.stability import HeadStability

    def reached(self, *a, **k):
        raise Reached

    monkeypatch.setattr(HeadStability, "fit", reached)
    models = ["--models", f"{M}&seed=1", "--models", f"{M}&seed=2"]
    out = tmp_path / "run"
    _refused(["heads", *models, "--n-probe", "10000000", "--out", out], "heads (2 models x 10,000,000 probe prompts")
    assert passes[0] == 0 and not out.exists()
    for extra in (["--n-probe", "100"], ["--n-probe", "10000000", "--allow-large"]):  # the negative controls
        res = runner.invoke(app, ["heads", *models, *extra, "--out", str(out)])
        assert _reached(res), res.output


def test_the_head_study_and_heads_share_one_analysis_price():
    from types import SimpleNamespace

    from circuitstat.pipelines.sources import LOCAL
    from circuitstat.pipelines.work import check_heads, head_analysis_operations

    cfg = LOCAL.skeleton(M, weights=False).cfg
    est = SimpleNamespace(probe_len=None, null="prompts", n_null=None, n_probe=100, n_resamples=200,
                          n_resamples_cka=None, n_permutations=9999)
    models = [SimpleNamespace(cfg=cfg)] * 3
    assert check_heads(est, models) == head_analysis_operations(cfg, 3, 100, 64, n_null=50, n_resamples=200,
                                                                n_resamples_cka=200, n_permutations=9999)
    more = SimpleNamespace(**{**vars(est), "n_probe": 1000})
    assert check_heads(more, models) > 10 * check_heads(est, models)  # the CKA term is quadratic in the prompts
