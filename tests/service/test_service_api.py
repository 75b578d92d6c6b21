"""The service end to end on a real server (uvicorn on loopback) with a real client (httpx), twice:
on SQLite and on a real PostgreSQL. One server per database serves every test of the module.

The oracle of every result is the CLI itself in this process: the service's tables equal those of
`circuitstat audit` / `attribute` on the same spec, table by table, and its claims verdicts those of
a local `circuitstat check`.
"""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from support import (AUDIT, TINY, TINY_BPE, assert_same_tables, database, fetch_tables, job_rows, make_user,
                     manifest, run_cli_audit, submit, wait_job, write_yaml)

from circuitstat.pipelines.cli import app

USERS = ("alice", "bob", "carol", "quota", "ratey", "small")  # quotas of the last three: support.SETTINGS
CLAIMS = {"claims": [
    {"kind": "circuit_stability", "name": "stable top-2", "method": "exact", "k": 2, "statistic": "jaccard_mean",
     "min": 0.1},
    {"kind": "circuit_stability", "name": "implausibly stable", "method": "eap", "k": 5,
     "statistic": "jaccard_mean", "min": 0.999},
    {"kind": "faithfulness", "name": "faithful eap", "method": "eap", "k": 5, "statistic": "f_ratio", "min": -100},
    {"kind": "edge_effect", "name": "no such edge", "edge": "a9.h9->logits", "method": "exact", "sign": "positive",
     "max_q": 0.05},
]}
XSS = '<script>alert("x")</script>'


@pytest.fixture(scope="module")
def servers(fleet, tmp_path_factory):
    """The session's SQLite and PostgreSQL servers (support.Fleet), users, and alice's finished audit on each;
    the CLI's reference audit runs here while their workers warm up."""
    started = {"sqlite": fleet.sqlite}
    if fleet.pg_url is not None:
        started["postgresql"] = fleet.pg()
    reference = run_cli_audit(AUDIT, tmp_path_factory.mktemp("cli"))
    envs = {}
    for backend, server in started.items():
        tokens = {u: fleet.token(server, u) for u in USERS}
        server.wait_ready()
        clients = {u: server.client(t) for u, t in tokens.items()}
        r = submit(clients["alice"], AUDIT, name="alice's audit")
        assert r.status_code == 202, r.text
        envs[backend] = {"server": server, "tokens": tokens, "c": clients, "job": r.json(), "reference": reference}
    for env in envs.values():
        env["job"] = wait_job(env["c"]["alice"], env["job"]["id"])
        assert env["job"]["state"] == "completed", env["job"]
    yield envs
    for env in envs.values():
        for c in env["c"].values():
            c.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def env(request, servers):
    """A running server on SQLite or on PostgreSQL, with users and alice's finished audit."""
    if request.param not in servers:
        pytest.skip("PostgreSQL not installed and CIRCUITSTAT_ALLOW_NO_POSTGRES=1")
    return servers[request.param]


@pytest.fixture(scope="module")
def reference(servers):
    """`circuitstat audit` of AUDIT in this process (the oracle)."""
    return servers["sqlite"]["reference"]


def _run_dir(env, job_id: str) -> Path:
    return env["server"].data / "jobs" / job_id / "run"


# ----- results --------------------------------------------------------------------------------------------
def test_submit_poll_fetch_equals_the_cli_audit(env, reference, tmp_path):
    from circuitstat.pipelines.service.progress import planned_stages
    from circuitstat.pipelines.spec import parse_spec

    c, job = env["c"]["alice"], env["job"]
    assert job["progress"] == 1.0 and job["attempts"] == 1 and job["owner"] == "alice" and job["model"] == TINY
    got = fetch_tables(c, job["id"], tmp_path / "fetched")
    assert_same_tables(got, reference)  # table by table: schema and every value
    stages = c.get(f"/api/v1/jobs/{job['id']}/manifest").json()["stages"]
    assert list(stages) == planned_stages("audit", parse_spec(AUDIT))  # the progress denominator is right
    assert all(s["status"] == "done" for s in stages.values())
    # JSON rows are the same values as the Parquet table
    rows = c.get(f"/api/v1/jobs/{job['id']}/tables/stability_vs_k.json").json()
    import pyarrow.parquet as pq

    want = pq.read_table(reference / "stability_vs_k.parquet").to_pylist()
    assert rows["total_rows"] == len(want) and [r["k"] for r in rows["rows"]] == [r["k"] for r in want]
    assert [r["jaccard_mean"] for r in rows["rows"]] == pytest.approx([r["jaccard_mean"] for r in want], abs=0)
    # the manifest records neither the server's command line nor its database
    doc = manifest(_run_dir(env, job["id"]))
    assert doc["command"][:3] == ["circuitstat", "serve", "job"] and "postgres" not in json.dumps(doc["command"])


# a model whose exact patching takes seconds (not the tiny audit's milliseconds): jobs that must be seen running
LONG_MODEL = "random:gpt2?n_layer=4&n_head=4&n_embd=64&vocab_size=64&n_positions=64&seed=1"


def test_status_progress_and_log_while_running(env):
    c = env["c"]["carol"]
    # several seconds of exact patching (4 layers, 200 prompts), so that polls see it mid-way on an idle machine too
    job = submit(c, {**AUDIT, "model": LONG_MODEL, "task": {"name": "induction", "n": 200, "options": {"seq_len": 16}},
                     "bootstrap": {"n_resamples": 1000}}).json()
    seen = wait_job(c, job["id"], states=("running",))
    polls = []
    while seen["state"] == "running":
        polls.append(seen)
        seen = c.get(f"/api/v1/jobs/{job['id']}").json()
    assert seen["state"] == "completed" and seen["progress"] == 1.0
    fractions = [p["progress"] for p in polls if p["progress"] is not None]
    assert fractions == sorted(fractions) and all(0 <= f <= 1 for f in fractions)
    mid = [p for p in polls if p["progress"] and 0 < p["progress"] < 1]
    assert mid and all(p["stage"] and (p["eta_seconds"] is None or p["eta_seconds"] >= 0) for p in mid)
    for a, b in zip(mid, mid[1:]):  # while progress is flat the ETA counts down or becomes unknown, never rises
        if a["progress"] == b["progress"] and a["eta_seconds"] is not None:
            assert b["eta_seconds"] is None or b["eta_seconds"] <= a["eta_seconds"], (a, b)
        if a["progress"] == b["progress"] and a["eta_seconds"] is None:
            assert b["eta_seconds"] is None, (a, b)
    assert seen["stage"] == list(c.get(f"/api/v1/jobs/{job['id']}/manifest").json()["stages"])[-1]  # the last stage
    log = c.get(f"/api/v1/jobs/{job['id']}/log").text
    assert "stage stability: done" in log and str(env["server"].data) not in log


def test_claims_endpoint_gives_the_local_checks_verdicts_and_junit(env, reference, tmp_path):
    c, job = env["c"]["alice"], env["job"]
    claims = write_yaml(tmp_path / "claims.yaml", CLAIMS)
    local = CliRunner().invoke(app, ["check", str(claims), "--run", str(reference), "--junit", str(tmp_path / "l.xml")])
    assert local.exit_code == 2  # one claim cannot be evaluated: the strongest outcome wins, as locally
    r = c.post(f"/api/v1/jobs/{job['id']}/claims", files={"claims": ("claims.yaml", claims.read_bytes())})
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["exit_code"] == local.exit_code
    statuses = [res["status"] for res in doc["results"]]
    assert statuses == ["pass", "fail", "pass", "error"]
    for line in doc["table"].splitlines():  # the same table the local command prints
        assert line in local.output
    remote_suites = ET.fromstring(doc["junit"])
    local_suites = ET.fromstring((tmp_path / "l.xml").read_bytes())
    names = [tc.get("name") for tc in remote_suites.iter("testcase")]
    assert names == [tc.get("name") for tc in local_suites.iter("testcase")] == [x["name"] for x in CLAIMS["claims"]]
    assert remote_suites.get("failures") == "1" and remote_suites.get("errors") == "1"
    # the client command exits as a local check does and writes the same JUnit
    runner = CliRunner(env={"CIRCUITSTAT_TOKEN": env["tokens"]["alice"]})
    remote = runner.invoke(app, ["check", str(claims), "--server", env["server"].url, "--run", job["id"],
                                 "--junit", str(tmp_path / "r.xml")])
    assert remote.exit_code == local.exit_code, remote.output
    assert [tc.get("name") for tc in ET.fromstring((tmp_path / "r.xml").read_bytes()).iter("testcase")] == names
    holds = write_yaml(tmp_path / "holds.yaml", {"claims": CLAIMS["claims"][:1]})
    assert runner.invoke(app, ["check", str(holds), "--server", env["server"].url, "--run", job["id"]]).exit_code == 0
    fails = write_yaml(tmp_path / "fails.yaml", {"claims": CLAIMS["claims"][:2]})
    assert runner.invoke(app, ["check", str(fails), "--server", env["server"].url, "--run", job["id"]]).exit_code == 1
    stored = c.get(doc["links"]["self"]).json()
    assert stored["results"] == doc["results"] and c.get(doc["links"]["junit"]).text == doc["junit"]


VARIANCE = {"model": TINY, "task": {"name": "induction", "n": 12, "options": {"seq_len": 4}},
            "estimators": {"methods": ["exact", "eap"]}, "counterfactual": {"n_draws": 2}, "dataset": {"n_fresh": 0},
            "bootstrap": {"n_resamples": 100, "ci_method": "percentile"}, "k": [2, 4], "n_top": 4,
            "selection": {"enabled": False}}


@pytest.fixture(scope="module")
def attribute_cli(tmp_path_factory) -> Path:
    """A spec of attribute's options naming a task file beside it, and `circuitstat attribute` run on it."""
    root = tmp_path_factory.mktemp("attribute")
    rows = [{"clean": f"The cat sat on mat {i}", "corrupted": f"The dog ran to box {i}", "answer": " the",
             "wrong_answer": " a"} for i in range(4)]
    (root / "data").mkdir()
    task = root / "data" / "pairs.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_yaml(root / "attr.yaml", {"model": TINY_BPE, "task": "data/pairs.jsonl", "method": "eap", "n": 4,
                                    "batch_size": 2})
    cli = CliRunner().invoke(app, ["attribute", "--model", TINY_BPE, "--task", str(task), "--method", "eap", "--n", "4",
                                   "--batch-size", "2", "--out", str(root / "want")])
    assert cli.exit_code == 0, cli.output
    return root


@pytest.fixture(scope="module")
def variance_cli(tmp_path_factory) -> Path:
    """`circuitstat study variance` of VARIANCE."""
    root = tmp_path_factory.mktemp("variance")
    path = write_yaml(root / "variance.yaml", VARIANCE)
    cli = CliRunner().invoke(app, ["study", "variance", str(path), "--out", str(root / "want"), "--no-report"])
    assert cli.exit_code == 0, cli.output
    return root / "want"


def test_the_submit_command_runs_an_attribute_job_with_an_uploaded_task_file(env, attribute_cli, tmp_path):
    """`circuitstat submit --server` uploads the task file the spec names; the run equals `circuitstat attribute`."""
    runner = CliRunner(env={"CIRCUITSTAT_TOKEN": env["tokens"]["bob"]})
    r = runner.invoke(app, ["submit", str(attribute_cli / "attr.yaml"), "--server", env["server"].url,
                            "--kind", "attribute", "--out", str(tmp_path / "got")])
    assert r.exit_code == 0, r.output
    assert_same_tables(tmp_path / "got", attribute_cli / "want")
    assert (tmp_path / "got" / "manifest.json").is_file() and "<html" in (tmp_path / "got" / "report.html").read_text()
    quick = runner.invoke(app, ["submit", str(attribute_cli / "attr.yaml"), "--server", env["server"].url,
                                "--kind", "attribute", "--no-wait"])
    assert quick.exit_code == 0 and re.search(r"job [0-9a-f]{32} queued", quick.output), quick.output


def test_a_variance_study_spec_runs_as_the_cli_runs_it(env, variance_cli, tmp_path):
    from circuitstat.pipelines.service.progress import planned_stages
    from circuitstat.pipelines.runs.variance import parse_variance_spec

    c = env["c"]["bob"]
    r = submit(c, VARIANCE, kind="variance")
    assert r.status_code == 202, r.text
    job = wait_job(c, r.json()["id"])
    assert job["state"] == "completed", job
    stages = c.get(f"/api/v1/jobs/{job['id']}/manifest").json()["stages"]
    assert list(stages) == planned_stages("variance", parse_variance_spec(VARIANCE))
    assert_same_tables(fetch_tables(c, job["id"], tmp_path / "got"), variance_cli)


def test_a_rerun_runs_the_same_spec_into_the_same_tables(env, reference, tmp_path):
    c, parent = env["c"]["alice"], env["job"]
    r = c.post(f"/api/v1/jobs/{parent['id']}/rerun")
    assert r.status_code == 202, r.text
    child = wait_job(c, r.json()["id"])
    assert child["state"] == "completed" and child["parent_id"] == parent["id"] and child["queue_position"] is None
    assert_same_tables(fetch_tables(c, child["id"], tmp_path / "rerun"), reference)
    assert manifest(_run_dir(env, child["id"]))["spec_sha256"] == manifest(_run_dir(env, parent["id"]))["spec_sha256"]


def test_list_filter_cancel_and_conflicts(env):
    c = env["c"]["carol"]
    # long enough that the cancel always lands while it runs: exact patching of 2,000 prompts on a 4-layer model is
    # about a minute of one core (its first stage), where the tiny audit finished within a heartbeat on an idle machine
    big = submit(c, {**AUDIT, "model": LONG_MODEL, "task": {"name": "induction", "n": 2000, "options": {"seq_len": 16}}},
                 name="long one").json()
    wait_job(c, big["id"], states=("running",))
    assert c.get(f"/api/v1/jobs/{big['id']}/tables").status_code == 409  # not finished yet
    assert c.post(f"/api/v1/jobs/{big['id']}/cancel").status_code == 200
    assert wait_job(c, big["id"])["state"] == "cancelled"
    assert c.post(f"/api/v1/jobs/{big['id']}/cancel").status_code == 409
    mine = c.get("/api/v1/jobs", params={"scope": "own"}).json()
    assert {j["owner"] for j in mine["jobs"]} == {"carol"} and mine["total"] == len(mine["jobs"]) >= 2
    cancelled = c.get("/api/v1/jobs", params={"state": "cancelled"}).json()["jobs"]
    assert [j["id"] for j in cancelled] == [big["id"]]
    assert c.get("/api/v1/jobs", params={"kind": "attribute", "scope": "own"}).json()["total"] == 0
    assert c.get("/api/v1/jobs", params={"state": "nonsense"}).status_code == 422


def test_sharing_and_public_runs(env):
    alice, bob, carol = env["c"]["alice"], env["c"]["bob"], env["c"]["carol"]
    job = env["job"]["id"]
    assert carol.get(f"/api/v1/jobs/{job}").status_code == 404
    r = alice.put(f"/api/v1/jobs/{job}/sharing", json={"users": ["carol"]})
    assert r.status_code == 200 and r.json()["shared_with"] == ["carol"]
    assert carol.get(f"/api/v1/jobs/{job}").status_code == 200
    assert carol.get(f"/api/v1/jobs/{job}").json()["shared_with"] is None  # only the owner sees whom
    assert carol.get(f"/api/v1/jobs/{job}/tables/edges.parquet").status_code == 200
    assert job in [j["id"] for j in carol.get("/api/v1/jobs", params={"scope": "others"}).json()["jobs"]]
    assert carol.post(f"/api/v1/jobs/{job}/cancel").status_code == 404  # seeing is not owning
    assert carol.put(f"/api/v1/jobs/{job}/sharing", json={"public": True}).status_code == 404
    assert bob.get(f"/api/v1/jobs/{job}").status_code == 404
    assert alice.put(f"/api/v1/jobs/{job}/sharing", json={"public": True, "users": []}).status_code == 200
    assert bob.get(f"/api/v1/jobs/{job}").status_code == 200 and carol.get(f"/api/v1/jobs/{job}").status_code == 200
    assert alice.put(f"/api/v1/jobs/{job}/sharing", json={"users": ["nobody-such"]}).status_code == 422
    assert alice.put(f"/api/v1/jobs/{job}/sharing", json={"public": False}).status_code == 200
    assert bob.get(f"/api/v1/jobs/{job}").status_code == 404 and carol.get(f"/api/v1/jobs/{job}").status_code == 404


def test_health_and_metrics(env):
    from prometheus_client.parser import text_string_to_metric_families

    s = env["server"]
    deadline = time.monotonic() + 300
    while any(r["state"] in ("queued", "running") for r in job_rows(s.database_url, "jobs")):
        assert time.monotonic() < deadline, "jobs of earlier tests never ended"
        time.sleep(0.1)  # the counts below are then stable
    health = httpx.get(s.url + "/healthz").json()
    assert health["status"] == "ok" and health["workers_ready"] == 2
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(s.url + "/metrics").text)}
    states = {smp.labels["state"]: smp.value for smp in families["circuitstat_jobs"].samples}
    rows = job_rows(s.database_url, "jobs")
    assert states["completed"] == sum(r["state"] == "completed" for r in rows) >= 1
    assert families["circuitstat_queue_length"].samples[0].value == sum(r["state"] == "queued" for r in rows)
    assert any(smp.value >= 1 for smp in families["circuitstat_job_duration_seconds"].samples
               if smp.name.endswith("_count"))
    assert any(smp.labels.get("status") == "202" for smp in families["circuitstat_http_requests"].samples)
    assert httpx.get(s.url + "/api/v1/openapi.json").json()["paths"]["/api/v1/jobs"]["post"]


def test_unreadable_requests_are_400_and_refused_specs_422(env):
    c = env["c"]["bob"]
    r = c.post("/api/v1/jobs", data={"kind": "audit"}, files={"spec": ("spec.yaml", b"model: [unclosed")})
    assert r.status_code == 400 and "spec.yaml" in r.json()["detail"] and str(env["server"].data) not in r.text
    assert c.post("/api/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}).status_code == 400
    assert c.post("/api/v1/jobs", content=b"kind=audit", headers={"content-type": "text/plain"}).status_code == 400
    r = c.post("/api/v1/jobs", json={"kind": "audit", "spec": {**AUDIT, "methods": ["nope"]}})
    assert r.status_code == 422 and "methods" in r.json()["detail"]
    assert c.post("/api/v1/jobs", json={"kind": "train", "spec": AUDIT}).status_code == 422
    r = env["c"]["alice"].post(f"/api/v1/jobs/{env['job']['id']}/claims", content=b"claims: [")
    assert r.status_code == 400


# ----- quotas ---------------------------------------------------------------------------------------------
def test_quotas_active_jobs_rate_and_work(env):
    q = env["c"]["quota"]
    first = submit(q, AUDIT)
    assert first.status_code == 202
    second = submit(q, AUDIT)
    assert second.status_code == 429 and second.headers["content-type"] == "application/problem+json"
    assert "queued or running" in second.json()["detail"] and second.headers["retry-after"]
    q.post(f"/api/v1/jobs/{first.json()['id']}/cancel")
    wait_job(q, first.json()["id"])
    third = submit(q, AUDIT)  # the slot is free again
    assert third.status_code == 202
    q.post(f"/api/v1/jobs/{third.json()['id']}/cancel")

    r = env["c"]["ratey"]
    codes = [r.get("/api/v1/jobs").status_code for _ in range(6)]
    assert codes[:5] == [200] * 5 and codes[5] == 429

    small = env["c"]["small"]
    job = wait_job(small, submit(small, AUDIT).json()["id"])
    assert job["state"] == "failed" and job["error_kind"] == "quota" and "FLOPs" in job["error"]
    assert not list(_run_dir(env, job["id"]).glob("*.parquet"))  # refused before any work


# ----- security, one test per item ------------------------------------------------------------------------
def test_no_wrong_or_revoked_token_is_401(env):
    s = env["server"]
    for headers in ({}, {"Authorization": "Bearer csk_000000000000_" + "x" * 43}, {"Authorization": "Basic abc"},
                    {"Authorization": f"Bearer {_other_last(env['tokens']['alice'])}"}):
        for method, path in (("GET", "/api/v1/jobs"), ("GET", f"/api/v1/jobs/{env['job']['id']}"),
                             ("POST", "/api/v1/jobs"), ("POST", "/api/v1/query")):
            r = httpx.request(method, s.url + path, headers=headers)
            assert r.status_code == 401, (headers, path, r.text)
            assert r.headers["content-type"] == "application/problem+json" and "Bearer" in r.headers["www-authenticate"]
    assert httpx.get(s.url + "/jobs", follow_redirects=False).headers["location"] == "/login"
    db = database(s.database_url)
    token = make_user(db, "leaver")
    assert httpx.get(s.url + "/api/v1/me", headers={"Authorization": f"Bearer {token}"}).json()["user"] == "leaver"
    ident = token.split("_")[1]
    out = CliRunner().invoke(app, ["users", "revoke", ident, "--data", str(s.data)] if "sqlite" in s.database_url
                             else ["users", "revoke", ident, "--database", s.database_url])
    assert out.exit_code == 0, out.output
    db.dispose()
    assert httpx.get(s.url + "/api/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 401


def _other_last(token: str) -> str:
    """``token`` with its last character changed (a wrong secret of the right length)."""
    return token[:-1] + ("A" if token[-1] != "A" else "B")


def _endpoints(job: str, check: str) -> list[tuple[str, str, dict]]:
    """Every endpoint that names a job, with a request that would succeed for its owner."""
    claims = yaml.safe_dump({"claims": CLAIMS["claims"][:1]}).encode()
    api = f"/api/v1/jobs/{job}"
    return [("GET", api, {}), ("GET", f"{api}/log", {}), ("GET", f"{api}/manifest", {}), ("GET", f"{api}/tables", {}),
            ("GET", f"{api}/tables/edges.parquet", {}), ("GET", f"{api}/tables/edges.json", {}),
            ("GET", f"{api}/report", {}), ("POST", f"{api}/claims", {"files": {"claims": ("c.yaml", claims)}}),
            ("GET", f"{api}/claims/{check}", {}), ("GET", f"{api}/claims/{check}/junit.xml", {}),
            ("GET", f"{api}/compare/{job}", {}), ("POST", f"{api}/rerun", {}),
            ("POST", "/api/v1/query", {"json": {"sql": "SELECT count(*) AS n FROM edges", "jobs": [job]}}),
            ("PUT", f"{api}/sharing", {"json": {"public": False}}), ("POST", f"{api}/cancel", {})]


def test_another_users_run_is_404_on_every_endpoint(env):
    alice, bob, job = env["c"]["alice"], env["c"]["bob"], env["job"]["id"]
    check = alice.post(f"/api/v1/jobs/{job}/claims", content=yaml.safe_dump(CLAIMS).encode()).json()["id"]
    missing = "0" * 32
    for method, path, kw in _endpoints(job, check):
        expect = 409 if path.endswith("/cancel") else (201 if method == "POST" and "claims" in path else
                                                       202 if path.endswith("/rerun") else 200)
        assert alice.request(method, path, **kw).status_code == expect, path  # the owner may
        theirs = bob.request(method, path, **kw)
        nothing = bob.request(method, path.replace(job, missing), **kw)
        assert theirs.status_code == 404 == nothing.status_code, (path, theirs.text)
        assert theirs.json()["detail"] == nothing.json()["detail"]  # indistinguishable from no job at all
    assert job not in [j["id"] for j in bob.get("/api/v1/jobs").json()["jobs"]]
    assert bob.get("/api/v1/jobs").json()["total"] == len(bob.get("/api/v1/jobs").json()["jobs"])
    theirs, nothing = bob.delete(f"/api/v1/jobs/{job}"), bob.delete(f"/api/v1/jobs/{missing}")  # DELETE too
    assert theirs.status_code == 404 == nothing.status_code and theirs.json()["detail"] == nothing.json()["detail"]
    assert alice.get(f"/api/v1/jobs/{job}").json()["state"] == "completed"  # (its owner's deletes: test_service_ops)
    browser = _browser_cookie(env, "bob")
    for path in (f"/jobs/{job}", f"/jobs/{job}/report", f"/jobs/{job}/claims/{check}", f"/jobs/{job}/compare/{job}"):
        r = httpx.get(env["server"].url + path, cookies=browser)
        assert r.status_code == 404 and job not in r.text.replace(path, ""), path
    assert job not in httpx.get(env["server"].url + "/jobs", cookies=browser).text


def _browser_cookie(env, user: str) -> dict:
    r = httpx.post(env["server"].url + "/login", data={"token": env["tokens"][user]}, follow_redirects=False,
                   headers={"Origin": env["server"].url})
    assert r.status_code == 303, r.text
    return {"circuitstat_session": r.cookies["circuitstat_session"]}


def test_path_traversal_in_run_ids_and_table_names_is_404(env, tmp_path):
    alice, job = env["c"]["alice"], env["job"]["id"]
    run = _run_dir(env, job)
    secret = tmp_path / "outside.parquet"
    secret.write_bytes((run / "edges.parquet").read_bytes())
    (run / "planted.parquet").symlink_to(secret)  # a symbolic link inside the run directory is never served
    try:
        for bad in ("..", "../..", "..%2F..%2Fservice.db", "%2e%2e", job + "%2F..", job[:-1], job.upper(), "*",
                    "..%5C..", job + "%2F..%2F" + job):
            r = alice.get(f"/api/v1/jobs/{bad}/manifest")
            assert r.status_code == 404, (bad, r.status_code)
        for name in ("..%2Fmanifest.json", "manifest.json", "..%2F..%2F..%2Fservice.db.parquet", "planted.parquet",
                     ".edges.parquet", "edges", "edges.csv", "edges.parquet%00.json", "%2e%2e.parquet",
                     "report.html", "edges.PARQUET"):
            r = alice.get(f"/api/v1/jobs/{job}/tables/{name}")
            assert r.status_code == 404, (name, r.status_code)
        assert "planted" not in [t["name"] for t in alice.get(f"/api/v1/jobs/{job}/tables").json()["tables"]]
        q = alice.post("/api/v1/query", json={"sql": "SELECT * FROM planted", "jobs": [job]})
        # a file no manifest records makes the job's run damaged for a query (core/run_check.py), never a view
        assert q.status_code == 409 and "planted.parquet" in q.text and str(run) not in q.text, q.text
    finally:
        (run / "planted.parquet").unlink()


@pytest.mark.parametrize("source", [
    "/etc", "../models/x", "~/model", "./local-model", "zoo:attn-only-2l/../../../../etc",
    "zoo:attn-only-2l/seed-0/../../x", "zoo:not-a-recipe/seed-0", "openai-community/gpt2", "file:///etc/passwd",
    "random:gpt2?n_layer=1/../../x", "pickled-model",
])
def test_a_server_path_or_a_pickle_is_never_a_model_source(env, tmp_path, source):
    if source == "pickled-model":  # a directory of pickled weights next to the spec: a path, refused as such
        import torch

        d = tmp_path / source
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_head": 1, "n_embd": 4,
                                                   "vocab_size": 8}))
        torch.save({}, d / "pytorch_model.bin")
        source = str(d)
    c = env["c"]["bob"]
    before = len(list((env["server"].data / "jobs").iterdir()))
    r = submit(c, {**AUDIT, "model": source})
    assert r.status_code == 422, r.text
    # the operator's allow-list, or before it the source grammar every entry point reads (model_source)
    assert re.search("not allowed on this server|not a model source|must be a positive integer", r.json()["detail"])
    assert len(list((env["server"].data / "jobs").iterdir())) == before  # nothing left behind


def test_a_named_model_runs_and_no_server_path_reaches_its_user(env, fleet, tmp_path, monkeypatch):
    """The operator's model by its name on an uploaded task file: the CLI's tables on that directory and file, and
    no server path (the model's directory, the data directory, the job's inputs) in anything the user can fetch:
    status, log, manifest, report, the job's pages, tables with their metadata, and /query over the catalog."""
    import shutil

    from support import AUDIT_FILE, IOI_FILE, SERVED_BPE

    c = env["c"]["bob"]
    r = submit(c, {**AUDIT_FILE, "model": SERVED_BPE}, files={"ioi.jsonl": IOI_FILE})
    assert r.status_code == 202, r.text
    job = wait_job(c, r.json()["id"])
    assert job["state"] == "completed" and job["model"] == SERVED_BPE, job
    got = fetch_tables(c, job["id"], tmp_path / "got")
    local = tmp_path / "cli"
    shutil.copytree(fleet.served.parent / SERVED_BPE, local / "copy")  # the CLI's spec names a model beside it
    (local / "ioi.jsonl").write_bytes(IOI_FILE)
    write_yaml(local / "spec.yaml", {**AUDIT_FILE, "model": "copy"})
    monkeypatch.chdir(local)  # `circuitstat audit spec.yaml` beside its task file
    cli = CliRunner().invoke(app, ["audit", "spec.yaml", "--out", "run", "--no-report"])
    assert cli.exit_code == 0, cli.output
    assert_same_tables(got, local / "run")
    api = f"/api/v1/jobs/{job['id']}"
    cookie = _browser_cookie(env, "bob")
    catalog = {sql: c.post("/api/v1/query", json={"sql": sql, "jobs": [job["id"]]}).text for sql in (
        "SELECT * FROM duckdb_views()", "SELECT * FROM duckdb_tables()", "SELECT * FROM duckdb_databases()",
        "SELECT * FROM duckdb_settings()", "SELECT * FROM edge_stats")}
    seen = {"status": json.dumps(c.get(api).json()), "log": c.get(f"{api}/log").text,
            "manifest": c.get(f"{api}/manifest").text, "report": c.get(f"{api}/report").text,
            "tables": c.get(f"{api}/tables").text, "list": c.get("/api/v1/jobs").text,
            "page": httpx.get(env["server"].url + f"/jobs/{job['id']}", cookies=cookie).text,
            "report page": httpx.get(env["server"].url + f"/jobs/{job['id']}/report", cookies=cookie).text,
            "jobs page": httpx.get(env["server"].url + "/jobs", cookies=cookie).text,
            **catalog, **{p.name: p.read_bytes().decode("latin-1") for p in got.glob("*.parquet")}}
    doc = json.loads(seen["manifest"])
    assert doc["spec"]["model"] == f"served:{SERVED_BPE}"  # what the run was asked for
    assert doc["spec"]["task"]["name"] == "ioi.jsonl" and doc["provenance"]["task"]["meta"]["source"] == "ioi.jsonl"
    assert re.search(r"<title>[^<]*ioi\.jsonl", seen["report"])
    want = manifest(local / "run")  # the same spec but the model's name: the same hash once the name is the same
    from circuitstat.core.provenance import hash_json

    assert doc["spec"] == {**want["spec"], "model": f"served:{SERVED_BPE}"}
    assert doc["spec_sha256"] == hash_json(doc["spec"]) and want["spec_sha256"] == hash_json(want["spec"])
    inputs = env["server"].data / "jobs" / job["id"] / "inputs"
    secrets = (str(fleet.served.parent), str(fleet.served.resolve().parent), str(env["server"].data.resolve()),
               str(fleet.root), str(inputs), str(inputs.resolve()))
    for what, text in seen.items():
        assert not [x for x in secrets if x in text], what
    # the server's copy damaged (a table edited on its disk): a claims check refuses it, naming the job, no path
    table = _run_dir(env, job["id"]) / "stability_vs_k.parquet"
    table.write_bytes(table.read_bytes()[:-8])
    claims = yaml.safe_dump({"claims": CLAIMS["claims"][:1]}).encode()
    r = c.post(f"{api}/claims", files={"claims": ("claims.yaml", claims)})
    assert r.status_code == 409 and "stability_vs_k.parquet (stage stability)" in r.json()["detail"], r.text
    assert job["id"] in r.json()["detail"] and not [x for x in secrets if x in r.text]
    # and a query of it too (issue 38: query read edited tables), naming the job, no path
    r = c.post("/api/v1/query", json={"sql": "SELECT count(*) AS n FROM edges", "jobs": [job["id"]]})
    assert r.status_code == 409 and "stability_vs_k.parquet" in r.json()["detail"], r.text
    assert job["id"] in r.json()["detail"] and not [x for x in secrets if x in r.text]
    # a zoo model the server has not trained: the error says how to build it, not where the cache is
    r = submit(c, {**AUDIT, "model": "zoo:attn-only-2l/seed-987654"})
    failed = wait_job(c, r.json()["id"])
    assert failed["state"] == "failed" and "not trained yet" in failed["error"], failed
    from circuitstat.pipelines.zoo import recipe_dir

    log = c.get(f"/api/v1/jobs/{failed['id']}/log").text
    assert str(recipe_dir("attn-only-2l")) not in failed["error"] + log and "zoo cache" in failed["error"]


def test_cli_only_limits_cannot_be_lifted_from_a_request(env):
    c = env["c"]["bob"]
    for extra in ({"allow_large": True}, {"allow_pickle": True}, {"allow_outside": True}):
        r = submit(c, {**AUDIT, **extra})
        assert r.status_code == 422 and "unknown key" in r.json()["detail"], r.text
        r = c.post("/api/v1/jobs", json={"kind": "audit", "spec": AUDIT, **extra})
        assert r.status_code == 422, r.text
    r = submit(c, {**AUDIT, "task": {"name": "file", "n": 4, "options": {"path": "/etc/passwd"}}})
    assert r.status_code == 422 and "neither a built-in task nor a file uploaded" in r.json()["detail"]
    r = submit(c, {**AUDIT, "circuit": {"file": "/etc/passwd"}})  # a published circuit is a path on the server
    assert r.status_code == 422 and "circuit files" in r.json()["detail"] and "passwd" not in r.json()["detail"]
    before = len(list((env["server"].data / "jobs").iterdir()))
    for model in ("random:gpt2?n_layer=48&n_head=64&n_embd=16384&vocab_size=64&n_positions=64",
                  "random:gpt2?n_layer=48&n_head=25&n_embd=1600&vocab_size=50257"):  # 1.5 B parameters (GPT-2 XL)
        r = submit(c, {**AUDIT, "model": model})  # priced from the spec at submission: no job, no model built
        assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", r.text
        assert "max_parameters" in r.json()["detail"], r.text
    r = submit(c, {**AUDIT, "model": None, "models": [TINY] * 200})
    assert r.status_code == 422 and "max_models_per_job" in r.json()["detail"], r.text
    assert len(list((env["server"].data / "jobs").iterdir())) == before


def test_html_injection_is_escaped_on_every_page(env):
    s, alice = env["server"], env["c"]["alice"]
    rows = [{"clean": "a b c", "corrupted": "d e f", "answer": XSS, "wrong_answer": " a"}] * 2
    files = {"task.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode()}
    bad_task = submit(alice, {"model": TINY_BPE, "task": "task.jsonl", "n": 2}, kind="attribute", files=files,
                      name=XSS).json()
    failed = wait_job(alice, bad_task["id"])
    assert failed["state"] == "failed" and XSS in failed["error"]  # the CLI's message quotes the task's string
    claims = {"claims": [{**CLAIMS["claims"][0], "name": XSS}]}
    check = alice.post(f"/api/v1/jobs/{env['job']['id']}/claims", content=yaml.safe_dump(claims).encode()).json()
    cookie = _browser_cookie(env, "alice")
    injected = {"/jobs": 1, f"/jobs/{bad_task['id']}": 3, check["links"]["page"]: 1, f"/jobs/{env['job']['id']}": 0}
    for path, shown in injected.items():  # shown: how often the page shows the hostile text (name, error, claim)
        r = httpx.get(s.url + path, cookies=cookie)
        assert r.status_code == 200, path
        assert XSS not in r.text and "<script" not in r.text, path
        assert r.text.count("&lt;script&gt;") >= shown, path  # the text is there, escaped
        csp = r.headers["content-security-policy"]
        assert "script-src" not in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    report = httpx.get(s.url + f"/jobs/{env['job']['id']}/report", cookies=cookie)
    from circuitstat.reports.html.assets import CSP

    assert report.headers["content-security-policy"].startswith(CSP)


def test_an_oversized_body_is_413(env):
    c = env["c"]["alice"]
    big = b"x" * 300_000
    r = submit(c, AUDIT, files={"big.jsonl": big})
    assert r.status_code == 413 and r.headers["content-type"] == "application/problem+json", r.text

    def chunks():
        for _ in range(30):
            yield b"y" * 10_000
    r = c.post("/api/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    r = c.post(f"/api/v1/jobs/{env['job']['id']}/claims", content=big)
    assert r.status_code == 413


@pytest.mark.parametrize("sql", [
    "COPY edges TO '/tmp/stolen.csv'", "ATTACH '/tmp/x.db' AS x", "INSTALL httpfs", "LOAD httpfs",
    "SET enable_external_access = true", "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_parquet('/etc/*.parquet')", "SELECT 1; SELECT 2", "CREATE TABLE t AS SELECT 1",
    "SELECT * FROM read_text('/etc/hostname')", "SELECT * FROM no_such_table", "PRAGMA database_list",
])
def test_the_query_endpoints_refusals(env, sql):
    c, job = env["c"]["alice"], env["job"]["id"]
    r = c.post("/api/v1/query", json={"sql": sql, "jobs": [job]})
    assert r.status_code == 422, (sql, r.text)
    assert r.headers["content-type"] == "application/problem+json"
    assert not Path("/tmp/stolen.csv").exists()
    ok = c.post("/api/v1/query", json={"sql": "SELECT run, count(*) AS n FROM edges GROUP BY run", "jobs": [job]})
    assert ok.status_code == 200 and ok.json()["rows"] == [{"run": job, "n": ok.json()["rows"][0]["n"]}]


@pytest.mark.parametrize("sql", [
    "SELECT sql FROM duckdb_views() WHERE NOT internal", "SELECT * FROM duckdb_views()",
    "SELECT * FROM duckdb_settings()", "SELECT current_setting('allowed_paths') AS p",
    "SELECT * FROM no_such_table", "SELECT * FROM read_parquet('/nonexistent/x.parquet')",
])
def test_a_query_learns_no_server_path(env, sql):
    c, job = env["c"]["alice"], env["job"]["id"]
    r = c.post("/api/v1/query", json={"sql": sql, "jobs": [job]})
    data = env["server"].data
    for secret in {str(data), str(data.resolve()), str(_run_dir(env, job)), str(Path.home())}:
        assert secret not in r.text, (sql, r.status_code)


def test_query_slots_are_fair_between_users() -> None:
    """One user's queries never hold every slot while another user's query waits: an ordering, not a time."""
    import threading

    from circuitstat.pipelines.service.query_slots import FairSlots, QueryBusy

    slots, order, release = FairSlots(total=2, per_user=1), [], threading.Event()
    a_started = threading.Event()

    def heavy(tag):
        with slots.slot("alice"):
            order.append(f"start {tag}")
            a_started.set()
            release.wait(timeout=60)
            order.append(f"end {tag}")

    threads = [threading.Thread(target=heavy, args=(f"a{i}",)) for i in range(2)]
    for th in threads:
        th.start()
    assert a_started.wait(timeout=60)
    with slots.slot("bob", wait_s=60):  # alice's second query waits for her first; bob gets the other slot
        order.append("bob")
    assert slots.held() == {"alice": 1}
    release.set()
    for th in threads:
        th.join(timeout=60)
    assert order.index("bob") < order.index("end a0") and order.count("start a0") + order.count("start a1") == 2
    assert order.index("bob") < max(order.index("start a0"), order.index("start a1"))  # before alice's second
    # a slot that never frees is a 503 after the configured wait, not a hang
    hold = threading.Event()

    def carol():
        with slots.slot("carol"):
            hold.wait(timeout=60)

    busy = threading.Thread(target=carol)
    busy.start()
    while slots.held() != {"carol": 1}:
        threading.Event().wait(0.01)
    with pytest.raises(QueryBusy):
        with slots.slot("carol", wait_s=0.05):
            pass
    hold.set()
    busy.join(timeout=60)


def test_a_browser_logs_in_sees_its_jobs_only_and_opens_the_report(servers):
    """Debian's chromium through chromium-driver (selenium): rendered content, not only status codes. (Once,
    on the SQLite server: what the browser sees does not depend on the database.)"""
    from browser import chrome

    import pyarrow.parquet as pq

    from circuitstat.reports.html.sections import shown_sections
    from circuitstat.reports.tableset import Tables

    env = servers["sqlite"]
    s = env["server"]
    stats = pq.read_table(_run_dir(env, env["job"]["id"]) / "edge_stats.parquet").to_pylist()
    top_edge = max(stats, key=lambda r: abs(r["estimate"]))["name"]
    bob_job = wait_job(env["c"]["bob"], submit(env["c"]["bob"], AUDIT, name="bob's private audit").json()["id"])
    with chrome() as driver:
        driver.get(s.url + "/jobs")
        assert driver.current_url.endswith("/login")
        driver.find_element("id", "token").send_keys("csk_000000000000_" + "x" * 43)
        driver.find_element("id", "login").click()
        assert "not valid" in driver.find_element("id", "login-error").text
        driver.find_element("id", "token").send_keys(env["tokens"]["alice"])
        driver.find_element("id", "login").click()
        assert driver.find_element("id", "user").text == "alice"
        table = driver.find_element("id", "jobs").text
        assert "alice's audit" in table and "bob's private audit" not in table
        rows = driver.find_elements("css selector", "#jobs tbody tr")
        assert bob_job["id"] not in [r.get_attribute("data-job") for r in rows]
        driver.find_element("link text", "alice's audit").click()
        assert driver.find_element("id", "state").text.startswith("completed")
        stages = driver.find_element("id", "stages").text
        assert "scores_exact" in stages and "faithfulness" in stages
        assert "edge_stats" in driver.find_element("id", "tables").text
        driver.find_element("id", "report-link").click()
        headings = [h.text for h in driver.find_elements("tag name", "h2")]
        assert headings == [sec.heading for sec in shown_sections(Tables(_run_dir(env, env["job"]["id"])))]
        assert "Verdict" in headings and "Circuit graph" in headings
        assert driver.find_element("tag name", "html").get_attribute("data-report-js") == "ok"
        assert top_edge in driver.find_element("id", "forest").text  # the run's own numbers, rendered
        driver.get(s.url + f"/jobs/{bob_job['id']}")
        assert "no job with this id" in driver.find_element("id", "problem").text


def test_no_token_in_any_log_line(env):
    """Runs last in the module: every request above, with good, bad and revoked tokens, was logged."""
    s = env["server"]
    httpx.get(s.url + f"/api/v1/jobs/{env['tokens']['bob']}")  # a token typed into a path
    httpx.get(s.url + "/api/v1/jobs", headers={"Authorization": f"Bearer {env['tokens']['carol']}x"})
    text = s.log_file.read_text() + s.out_file.read_text()
    lines = [json.loads(line) for line in s.log_file.read_text().splitlines()]
    assert sum(line.get("message") == "request" for line in lines) > 50  # the log is not empty
    assert {"alice", "bob"} <= {line.get("user") for line in lines}
    for token in env["tokens"].values():
        secret = token.split("_", 2)[2]
        assert token not in text and secret not in text
    assert not re.search(r"csk_[0-9a-f]{12}_[A-Za-z0-9_-]{10,}", text)
    assert "[redacted]" in text  # the typed-in token was there and was redacted
