"""``check-circuit --claims`` checks every claim against the audit its options describe before any work (issue 47,
item 5): a claim it cannot answer is exit 2 with zero model forwards, and the k grid holds the claims' k."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"
CIRCUIT = "input->a0.h1<v>\na0.h1->a1.h0<k>\na1.h0->logits\nm1->logits\n"
ARGS = ["--model", MODEL, "--task", "induction", "--task-option", "seq_len=5", "--n", "12", "--batch-size", "4",
        "--n-resamples", "40", "--seed", "1", "--method", "eap"]


@pytest.fixture
def forwards(monkeypatch):
    """Count the model's forward passes and the audits started."""
    from circuitstat.circuits.engine.run import Forward

    calls = {"forward": 0, "audit": 0}
    run = Forward.run

    def counted(self, *a, **kw):
        calls["forward"] += 1
        return run(self, *a, **kw)

    import circuitstat.pipelines.runs.audit.run as audit

    real_audit = audit.run_audit

    def counted_audit(*a, **kw):
        calls["audit"] += 1
        return real_audit(*a, **kw)

    monkeypatch.setattr(Forward, "run", counted)
    monkeypatch.setattr(audit, "run_audit", counted_audit)
    return calls


def _cli(tmp_path, claims, *extra):
    (tmp_path / "circuit.txt").write_text(CIRCUIT)
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": claims}))
    r = CliRunner().invoke(app, ["check-circuit", str(tmp_path / "circuit.txt"), *ARGS, "--out", str(tmp_path / "run"),
                                 "--claims", str(tmp_path / "claims.yaml"), *extra])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    return r


def test_an_unanswerable_claim_is_exit_2_before_any_forward(tmp_path, forwards):
    claims = [{"kind": "edge_effect", "edge": "m1->logits", "method": "eap-ig-inputs", "sign": "negative", "max_q": 0.05},
              {"kind": "circuit_sufficient"},
              {"kind": "published_circuit", "method": "eap", "statistic": "f_ci_low", "min": 0.5}]
    r = _cli(tmp_path, claims)
    out = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert forwards == {"forward": 0, "audit": 0}
    assert "cannot answer 2 claim(s)" in out and "nothing was run" in out
    assert "method 'eap-ig-inputs' is not in the spec's methods ['eap']" in out
    assert "tests stage" in out
    assert not (tmp_path / "run").exists()


def test_the_k_grid_holds_the_claims_k(tmp_path, forwards):
    """Positive control: answerable claims run (the counter counts), and k = 7, which --k does not list, is in the
    run's grid and answered."""
    claims = [{"kind": "edge_in_circuit", "edge": "a1.h0->logits", "method": "eap", "k": 7, "min_inclusion": 0.0},
              {"kind": "published_circuit", "method": "eap", "statistic": "share_unsupported", "max": 1.0}]
    r = _cli(tmp_path, claims)
    assert r.exit_code == 0, r.output
    assert forwards["audit"] == 1 and forwards["forward"] > 0
    ks = set(pq.read_table(tmp_path / "run" / "inclusion.parquet").column("k").to_pylist())
    assert 7 in ks


def test_a_claims_file_naming_another_spec_is_exit_2_before_any_forward(tmp_path, forwards):
    spec = {"model": MODEL, "task": {"name": "induction", "n": 64}, "methods": ["eap"], "circuit": {"file": "circuit.txt"}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "circuit.txt").write_text(CIRCUIT)
    doc = {"spec": "spec.yaml", "claims": [{"kind": "published_circuit", "method": "eap", "statistic": "cpr", "min": 0}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["check-circuit", str(tmp_path / "circuit.txt"), *ARGS, "--out", str(tmp_path / "run"),
                                 "--claims", str(tmp_path / "c.yaml")])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and forwards == {"forward": 0, "audit": 0}, r.output
    assert "task.n: 64 in the spec, 12 in the run" in out
