"""Comparing two jobs on the server (GET /api/v1/jobs/{a}/compare/{b} and its page), in process (inprocess.App:
no workers; jobs inserted as a finished worker leaves them, their run directories synthetic audits from
tests/report_builders.py). The oracle is the local `circuitstat compare` on the same two run directories."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: report_builders

from inprocess import App
from report_builders import EVIL, make_report_run, write_filled

from circuitstat.reports.compare import compare_runs


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app with users alice and bob, and two synthetic audit runs."""
    root = tmp_path_factory.mktemp("svc")
    app = App(root / "data")
    app.runs = {"a": make_report_run(root / "ra", seed=0, variance=False),
                "b": make_report_run(root / "rb", seed=1, variance=False)}
    yield app
    app.close()


def _numbers(doc: dict) -> dict:
    """A comparison's rows and counts (what must match), without the labels (paths locally, job ids on the server)."""
    return {k: doc[k] for k in ("counts", "edges", "stability", "faithfulness", "claims", "estimands")}


def test_the_server_compares_two_jobs_with_the_local_commands_numbers(server) -> None:
    a = server.add_job("alice", server.runs["a"], name="before", model="zoo:attn-only-2l/seed-0")
    b = server.add_job("alice", server.runs["b"], name="after", model="zoo:attn-only-2l/seed-1")
    r = server.get("alice", f"/api/v1/jobs/{a}/compare/{b}")
    assert r.status_code == 200, r.text
    local = json.loads(json.dumps(compare_runs(server.runs["a"], server.runs["b"]).to_dict()))
    assert _numbers(r.json()) == _numbers(local) and r.json()["counts"]["edges_flagged"] > 0
    assert r.json()["runs"]["a"]["label"] == a and r.json()["runs"]["b"]["models"] == ["zoo:attn-only-2l/seed-1"]
    data = str(server.svc.cfg.data)
    assert data not in r.text and str(server.runs["a"]) not in r.text  # no path of either side
    page = server.page("alice", f"/jobs/{a}/compare/{b}")
    assert page.status_code == 200 and "Comparison: B minus A" in page.text
    assert EVIL not in page.text and "&lt;script&gt;" in page.text and data not in page.text
    flagged = page.text.split('id="flagged"')[1].split("</table>")[0]
    assert flagged.count("<tr>") == 1 + r.json()["counts"]["edges_flagged"]  # header + every flagged edge
    # the page compares stability on the column the local command leads with (J_{N/2} for these runs)
    assert r.json()["estimands"]["stability"].startswith("jaccard_half: ")
    assert "jaccard_half with its interval" in page.text
    form = server.page("alice", f"/jobs/{a}/compare", params={"other": b}, follow_redirects=False)
    assert form.status_code == 303 and form.headers["location"] == f"/jobs/{a}/compare/{b}"


def test_compare_is_404_on_either_job_of_another_user_and_409_unfinished(server) -> None:
    mine = server.add_job("bob", server.runs["a"])
    theirs = server.add_job("alice", server.runs["b"])
    missing = "0" * 32
    nothing = server.get("bob", f"/api/v1/jobs/{mine}/compare/{missing}")
    assert nothing.status_code == 404
    for path in (f"/api/v1/jobs/{mine}/compare/{theirs}", f"/api/v1/jobs/{theirs}/compare/{mine}",
                 f"/api/v1/jobs/{theirs}/compare/{theirs}"):
        r = server.get("bob", path)
        assert r.status_code == 404 and r.json()["detail"] == nothing.json()["detail"], path
    assert server.get("alice", f"/api/v1/jobs/{theirs}/compare/{theirs}").status_code == 200  # the owner may
    blank = server.page("bob", f"/jobs/{mine}/compare/{missing}")
    for path in (f"/jobs/{mine}/compare/{theirs}", f"/jobs/{theirs}/compare/{mine}"):
        page = server.page("bob", path)
        assert page.status_code == 404 == blank.status_code and theirs not in page.text.replace(path, ""), path
    queued = server.add_job("bob", None, state="queued")
    r = server.get("bob", f"/api/v1/jobs/{mine}/compare/{queued}")
    assert r.status_code == 409 and "queued" in r.json()["detail"]


def test_runs_sharing_no_edge_are_422_named_by_job(server, tmp_path) -> None:
    other = make_report_run(tmp_path / "o", seed=0, variance=False)
    for name in ("edges", "edge_stats"):
        t = pq.read_table(other / f"{name}.parquet").to_pydict()
        t["name"] = ["x:" + n for n in t["name"]]
        write_filled(t, other / f"{name}.parquet")
    a, b = server.add_job("alice", server.runs["a"]), server.add_job("alice", other)
    r = server.get("alice", f"/api/v1/jobs/{a}/compare/{b}")
    assert r.status_code == 422 and "share no edge" in r.json()["detail"] and a in r.json()["detail"]
    assert str(server.svc.cfg.data) not in r.text


def test_the_compare_command_with_server_prints_the_servers_comparison(server, monkeypatch) -> None:
    import httpx
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app as cli

    a = server.add_job("alice", server.runs["a"], model="zoo:attn-only-2l/seed-0")
    b = server.add_job("alice", server.runs["b"], model="zoo:attn-only-2l/seed-0")
    monkeypatch.setattr(httpx, "Client", lambda base_url, timeout, headers: TestClient(
        server.app, base_url=base_url, headers=headers))  # the client's requests go to the in-process app
    monkeypatch.setenv("CIRCUITSTAT_TOKEN", server.tokens["alice"])
    r = CliRunner().invoke(cli, ["compare", a, b, "--server", "http://testserver", "--json"])
    assert r.exit_code == 0, r.output
    api = server.get("alice", f"/api/v1/jobs/{a}/compare/{b}").json()
    assert json.loads(r.output) == {k: v for k, v in api.items() if k != "links"}
    local = CliRunner().invoke(cli, ["compare", str(server.runs["a"]), str(server.runs["b"]), "--top", "5"])
    remote = CliRunner().invoke(cli, ["compare", a, b, "--server", "http://testserver", "--top", "5"])
    assert remote.exit_code == 0 == local.exit_code
    tail = lambda text: text.split("Edges whose intervals")[1]  # noqa: E731 - past the head naming the runs
    assert tail(remote.output) == tail(local.output)  # the same text, row for row
    monkeypatch.setenv("CIRCUITSTAT_TOKEN", server.tokens["bob"])
    r = CliRunner().invoke(cli, ["compare", a, b, "--server", "http://testserver"])
    assert r.exit_code == 2 and "404" in r.output
