"""/query reaches no server path by any route (issue 44, defect 1): the differential fuzz of query_fuzz.py on
two in-process servers that differ only in their paths, one on SQLite and one on PostgreSQL (two on SQLite
where PostgreSQL is not installed), and its negative controls: planted leaks that the fuzz must catch."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from inprocess import App
from query_fuzz import Fuzz, differences, leaks, transforms
from support import AUDIT, run_cli_audit

import circuitstat
import circuitstat.core.query as core_query


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished audit's run directory (the CLI's), copied into each server as a job."""
    return run_cli_audit(AUDIT, tmp_path_factory.mktemp("cli"))


@pytest.fixture(scope="module")
def pair(run, tmp_path_factory, request):
    """Two servers (SQLite; PostgreSQL or SQLite) whose data directory, working directory and $HOME differ,
    each with alice's copy of the same finished job; {name: (app, job, ask)} and the server paths."""
    root = tmp_path_factory.mktemp("fuzz")
    try:
        pg = request.getfixturevalue("postgres").create_database("fuzz")
    except pytest.skip.Exception:
        pg = None
    real_home, real_cwd = str(Path.home()), os.getcwd()
    places = {"sqlite": root / "a", "postgresql": root / "second-server" / "with a longer name"}
    servers, secrets = {}, {real_home, real_cwd, sys.prefix, sys.base_prefix, str(root),
                            str(Path(circuitstat.__file__).resolve().parent)}
    for name, place in places.items():
        (place / "home").mkdir(parents=True)
        (place / "cwd").mkdir()
        db = {"database": pg} if name == "postgresql" and pg else {}
        app = App(place / "data", users=("alice",), **db)
        job = app.add_job("alice", run, job_id="0" * 32)  # the same job id on both: it names the run
        secrets |= {str(place), str(place / "data"), str(app.svc.cfg.jobs_dir / job / "run"), str(run)}

        def ask(sql, app=app, job=job, place=place):
            os.environ["HOME"] = str(place / "home")
            os.chdir(place / "cwd")
            try:
                return app.post("alice", "/api/v1/query", json={"sql": sql, "jobs": [job]}).text
            finally:
                os.environ["HOME"], _ = real_home, os.chdir(real_cwd)
        servers[name] = (app, job, ask)
    secrets |= {str(Path(s).resolve()) for s in secrets}
    yield servers, sorted(s for s in secrets if len(s) > 1)
    for app, _, _ in servers.values():
        app.close()


@pytest.mark.slow  # 334 s on the 2-core test machine under load 8: 173 transforms of ~6,000 strings, 10,048 pairs of ~950
def test_no_transform_of_a_server_path_in_any_query_result_or_error(pair):
    servers, secrets = pair
    outs, fuzzes = {}, {}
    for name, (_, _, ask) in servers.items():
        fuzzes[name] = Fuzz(ask)
        outs[name] = fuzzes[name].run(layers=2)
    a, b = outs.values()
    f = fuzzes["sqlite"]
    assert len(f.tables) >= 30 and len(f.settings) >= 100 and len(f.functions) >= 150  # it covers what DuckDB lists
    assert {"reverse", "upper", "hex", "to_base64", "replace", "string_split"} <= set(f.functions)
    assert sum(k.startswith("error ") for k in a) == sum(k.startswith("layer2 ") for k in a) == len(f.functions)
    ran = [k for k, t in a.items() if '"rows"' in t]
    assert all(k in ran for k in a if k.startswith("layer2 ")) and len(ran) >= len(f.functions) + 30  # not refused
    # the error channel carried the values: every function's error is error()'s; the functions that fail on some
    # string (format, printf: on a '{' or '%') also gave their own error, on the first such string
    assert all("Invalid Input Error" in t for k, t in a.items() if k.startswith("error "))
    assert {"raise format", "raise printf"} <= {k for k in a if k.startswith("raise ")}
    assert differences(a, b) == []
    found = transforms(f.functions, secrets)
    assert leaks(a, found) == [] and leaks(b, found) == []


def _planted(monkeypatch, how: str) -> None:
    if how == "duckdb defaults":  # the settings as DuckDB sets them: its home, secret and extension dirs from $HOME
        monkeypatch.setattr(core_query, "NEUTRAL_SETTINGS", {})
    else:  # the design before: a view whose SQL holds a server path (here the working directory)
        lock = core_query._lock_down

        def planted(con, limits=core_query.DEFAULT_LIMITS):
            con.execute(f"CREATE VIEW planted AS SELECT 1 AS x WHERE length('{os.getcwd()}') > 0")
            lock(con, limits)
        monkeypatch.setattr(core_query, "_lock_down", planted)


@pytest.mark.parametrize("how", ["duckdb defaults", "a view over a path"])
def test_the_fuzz_catches_a_planted_leak(pair, monkeypatch, how):
    """Negative control: each planted leak is seen by both checks, through a string function in one and in two
    layers, and the fuzz without the plant sees nothing (the same functions, same servers)."""
    servers, secrets = pair
    few = ["reverse", "upper", "hex", "md5", "to_base64"]
    clean = {name: Fuzz(ask, few).run(layers=2) for name, (_, _, ask) in servers.items()}
    assert differences(*clean.values()) == []
    _planted(monkeypatch, how)
    outs = {name: Fuzz(ask, few).run(layers=2) for name, (_, _, ask) in servers.items()}
    diff = differences(*outs.values())
    assert all('"rows"' in t for k, t in outs["sqlite"].items() if k.startswith("layer2 "))
    for f in few:
        assert f"error {f}" in diff and f"layer2 {f}" in diff, (f, diff)  # one layer and two layers
    found = transforms(Fuzz(servers["sqlite"][2], few).functions, secrets)
    seen = {what.split("(")[0] for what in (x.split(": ", 1)[1] for x in leaks(outs["sqlite"], found))}
    # reverse(path), upper(path), hex(path) found in a response (a hash or base64 of a longer string holding a
    # path is not a transform of the path: the differential check above is the one that sees those)
    assert {"reverse", "upper", "hex"} <= seen, seen
