"""The smaller defects of issue 44, in process (inprocess.App, no workers)."""

from __future__ import annotations

import pytest
import yaml

from inprocess import App
from support import AUDIT

from circuitstat.pipelines.service import accounts, queue
from circuitstat.pipelines.service.db import Job


@pytest.fixture
def server(tmp_path):
    app = App(tmp_path / "data", users=("alice", "root"))
    with app.svc.db.session() as s:
        accounts.set_admin(s, "root", True)
    yield app
    app.close()


def test_an_admins_cancel_is_named_as_the_admins_not_the_owners(server):
    queued, running, own = (server.add_job("alice", state=st) for st in ("queued", "running", "queued"))
    assert server.post("root", f"/api/v1/jobs/{queued}/cancel").json()["error"] == "cancelled by admin root"
    assert server.post("root", f"/api/v1/jobs/{running}/cancel").status_code == 200
    assert server.post("alice", f"/api/v1/jobs/{own}/cancel").json()["error"] == "cancelled by its owner"
    with server.svc.db.session() as s:  # what the worker writes when the running job stops
        assert queue.cancelled_by(s, running) == "admin root"
        assert s.get(Job, own).error == "cancelled by its owner"


def _submit(server: App, spec: dict):
    files = [("spec", ("spec.yaml", yaml.safe_dump(spec).encode()))]
    return server.post("alice", "/api/v1/jobs", data={"kind": "audit"}, files=files)


def test_the_k_list_is_capped_at_submission(server):
    r = _submit(server, {**AUDIT, "k": list(range(1, 66))})
    assert r.status_code == 422 and "65 circuit sizes, above the limit of 64" in r.json()["detail"], r.text
    ok = _submit(server, {**AUDIT, "k": list(range(1, 65))})  # the control: at the limit it is taken
    assert ok.status_code == 202, ok.text


@pytest.mark.parametrize("field", ["name", "model"])
def test_a_control_character_in_a_search_is_422_not_every_job(server, field):
    server.add_job("alice", name="one")
    server.add_job("alice", name="two")
    for bad in ("\x00", "a\x00", "\x1f"):
        r = server.get("alice", "/api/v1/jobs", params={field: bad})
        assert r.status_code == 422 and "control character" in r.json()["detail"], r.text
    assert server.get("alice", "/api/v1/jobs", params={"name": "one"}).json()["total"] == 1  # the control


def test_the_openapi_document_lists_its_security_schemes(server):
    doc = server.client.get("/api/v1/openapi.json").json()
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    assert schemes["session"]["in"] == "cookie" and schemes["session"]["name"] == "circuitstat_session"
    ops = [(path, m, op) for path, o in doc["paths"].items() if path.startswith("/api/v1/") for m, op in o.items()]
    assert len(ops) > 20 and all({"bearer": []} in op["security"] for _, _, op in ops)
    assert all(({"session": []} in op["security"]) == (m in ("get", "head")) for _, m, op in ops)


def test_the_served_manifest_history_names_no_host_and_no_process(server, tmp_path):
    import json
    import os
    import socket

    from circuitstat.core.rundir import RunDir

    run = tmp_path / "run"
    for _ in range(2):  # two attempts open the run
        with RunDir(run, seed=0) as r:
            r.stage("effects", lambda: {"effects": {"edge": ["a"], "estimate": [1.0]}}, ["effects"])
    job = server.add_job("alice", run)
    stored = json.loads((server.svc.cfg.jobs_dir / job / "run" / "manifest.json").read_text())
    assert stored["history"][0]["host"] == socket.gethostname() and stored["history"][0]["pid"] == os.getpid()
    served = server.get("alice", f"/api/v1/jobs/{job}/manifest").json()
    assert len(served["history"]) == len(stored["history"]) >= 1
    for h, s in zip(served["history"], stored["history"]):
        assert "host" not in h and "pid" not in h and h == {k: v for k, v in s.items() if k not in ("host", "pid")}


def test_a_large_mixtral_is_priced_at_submission_and_no_server_error_advises_a_cli_flag(server):
    """Issue 44: a random:mixtral was not priced at submission (the worker refused it), and a worker's size error
    advised --allow-large, which server users do not have."""
    from circuitstat.circuits.limits import LIFT, check_bytes
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.service.pricing import random_shape
    from circuitstat.pipelines.service.runner import _outcome

    big = "random:mixtral?hidden_size=1024&num_hidden_layers=16&intermediate_size=4096&num_local_experts=8"
    assert random_shape(big).parameters > 8 * 16 * 3 * 1024 * 4096  # every expert counted
    r = _submit(server, {**AUDIT, "model": big})
    assert r.status_code == 422 and "max_parameters" in r.json()["detail"], r.text
    small = _submit(server, {**AUDIT, "model": "random:mixtral?num_hidden_layers=1"})
    assert small.status_code == 202, small.text  # the control: a small one is taken
    try:
        check_bytes(1e12, "the model")
    except InputError as e:
        assert LIFT in str(e)  # the CLI's advice
        out = _outcome(e)
    assert out["kind"] == "quota" and LIFT not in out["error"] and "ask the operator" in out["error"], out
